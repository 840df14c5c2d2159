/* Activation checkpointing (em_checkpoint, em_checkpoint_sequential): gradients equal the
 * un-checkpointed run's, dropout inside a segment reproduces its mask (the RNG is replayed),
 * the allocator's peak drops by about the activations not kept, bad input is refused
 * cleanly. */
#include <string.h>
#include <ember/amp.h>
#include <ember/memory.h>
#include "test.h"

/* An MLP with dropout: depth blocks of Linear(w, w), ReLU, Dropout(p). */
static em_module *mlp(int depth, int64_t w, double p) {
    em_module *m = em_nn_sequential(em_nn_linear(w, w));
    for (int i = 0; i < depth; i++) {
        em_sequential_append(m, em_nn_relu());
        em_sequential_append(m, em_nn_dropout(p));
        em_sequential_append(m, em_nn_linear(w, w));
    }
    return m;
}

#define MAXP 128
/* Forward (checkpointed with `segments`, or plain when 0) + backward of sum(out^2) from
 * a fixed seed; the parameters' gradients are cloned into grads[]. Returns their count. */
static int grads_of(em_module *m, em_tensor *x, int segments, em_tensor **grads) {
    em_named_tensor ps[MAXP];
    int np = em_module_parameters(m, ps, MAXP);
    for (int i = 0; i < np; i++) em_set_grad(ps[i].tensor, NULL);
    em_manual_seed(1234);
    em_tensor *y = segments ? em_checkpoint_sequential(m, segments, x) : em_forward(m, x);
    CHECK(y != NULL);
    if (!y) return 0;
    CHECK_OK(em_backward(em_sum(em_mul(y, y), EM_ALL_DIMS, false)));
    for (int i = 0; i < np; i++) {
        em_tensor *g = em_grad(ps[i].tensor);
        CHECK(g != NULL);
        grads[i] = g ? em_retain(em_clone(g)) : NULL;
    }
    return np;
}

static double max_abs_diff(em_tensor *a, em_tensor *b) {
    return em_item(em_max(em_abs(em_sub(a, b)), EM_ALL_DIMS, false));
}

static void test_grads_identical(void) {
    em_scope s = em_scope_begin();
    em_manual_seed(7);
    em_module *m = mlp(4, 16, 0.3);   /* 13 children */
    em_tensor *x = em_randn(EM_SHAPE(8, 16), EM_OPTS(0));
    em_tensor *plain[MAXP], *ck[MAXP];
    int np = grads_of(m, x, 0, plain);
    for (int seg = 1; seg <= 13; seg += 3) {
        int nc = grads_of(m, x, seg, ck);
        CHECK(nc == np);
        double worst = 0;
        for (int i = 0; i < np && i < nc; i++) {
            if (plain[i] && ck[i]) {
                double d = max_abs_diff(plain[i], ck[i]);
                if (d > worst) worst = d;
            }
            em_release(ck[i]);
        }
        CHECK(worst <= 1e-6);
    }
    for (int i = 0; i < np; i++) em_release(plain[i]);
    em_module_free(m);
    em_scope_end(s);
}

/* A dropout function, checkpointed: the mask in backward must be the forward's. */
static em_tensor *drop_fn(void *ctx, em_tensor *const *in, int n) {
    (void)n;
    return em_forward((em_module *)ctx, em_mul_scalar(in[0], 3.0));
}

static void test_dropout_mask_replayed(void) {
    em_scope s = em_scope_begin();
    em_module *d = em_nn_dropout(0.5);
    em_tensor *x = em_ones(EM_SHAPE(4096), EM_OPTS(.requires_grad = true));
    em_manual_seed(99);
    em_tensor *y = em_checkpoint(drop_fn, d, &x, 1);
    CHECK(y != NULL);
    CHECK(y && em_grad_fn_name(y) && strcmp(em_grad_fn_name(y), "CheckpointFunctionBackward") == 0);
    /* draws between forward and backward move the generator on: the replay must undo that */
    em_randn(EM_SHAPE(1000), EM_OPTS(0));
    em_tensor *after_fwd = em_randn(EM_SHAPE(4), EM_OPTS(0));
    CHECK_OK(em_backward(em_sum(y, EM_ALL_DIMS, false)));
    /* y = 3 * x * mask / 0.5, so dy/dx = y (x is ones): the mask used in backward must be
     * the one the forward drew */
    em_tensor *g = em_grad(x);
    CHECK(g && max_abs_diff(g, y) == 0.0);
    /* and the caller's stream continues as if no replay had happened: the next draw after
     * backward is the one a run without the backward makes */
    em_tensor *next = em_randn(EM_SHAPE(4), EM_OPTS(0));
    em_manual_seed(99);
    em_tensor *ref_y = em_forward(d, em_mul_scalar(em_ones(EM_SHAPE(4096), EM_OPTS(0)), 3.0));
    em_randn(EM_SHAPE(1000), EM_OPTS(0));
    em_tensor *ref_after = em_randn(EM_SHAPE(4), EM_OPTS(0));
    em_tensor *ref_next = em_randn(EM_SHAPE(4), EM_OPTS(0));
    CHECK(max_abs_diff(ref_y, y) == 0.0);
    CHECK(max_abs_diff(after_fwd, ref_after) == 0.0);
    CHECK(max_abs_diff(next, ref_next) == 0.0);
    em_module_free(d);
    em_scope_end(s);
}

/* Peak memory: a deep MLP with big activations, plain vs checkpointed in 4 segments. */
static int64_t peak_of(em_module *m, em_tensor *x, int segments) {
    em_memory_reset_peak_stats(EM_DEVICE_CPU);
    int64_t base = em_memory_allocated(EM_DEVICE_CPU);
    em_scope s = em_scope_begin();
    em_tensor *y = segments ? em_checkpoint_sequential(m, segments, x) : em_forward(m, x);
    CHECK_OK(em_backward(em_mean(y, EM_ALL_DIMS, false)));
    em_scope_end(s);
    return em_memory_max_allocated(EM_DEVICE_CPU) - base;
}

static void test_peak_memory_lower(void) {
    em_scope s = em_scope_begin();
    em_manual_seed(3);
    const int depth = 16;
    const int64_t batch = 512, w = 256;
    em_module *m = em_nn_sequential(em_nn_linear(w, w));
    for (int i = 0; i < depth; i++) {
        em_sequential_append(m, em_nn_relu());
        em_sequential_append(m, em_nn_linear(w, w));
    }
    em_tensor *x = em_randn(EM_SHAPE(batch, w), EM_OPTS(0));
    em_named_tensor ps[MAXP];
    int np = em_module_parameters(m, ps, MAXP);
    /* a first backward makes every .grad, so both runs start from the same allocations */
    peak_of(m, x, 0);
    int64_t plain = peak_of(m, x, 0);
    int64_t ck = peak_of(m, x, 4);
    int64_t act = batch * w * 4;          /* one activation, bytes */
    printf("  peak above baseline: plain %.1f MiB, checkpointed (4 segments) %.1f MiB, one activation %.2f MiB\n",
           plain / 1048576.0, ck / 1048576.0, act / 1048576.0);
    /* plain keeps ~2 activations per block (linear output + relu output) for 16 blocks;
     * checkpointed keeps the 3 segment inputs plus one segment's and the last chunk's
     * activations: about half of plain at most. */
    CHECK(plain >= 28 * act && plain <= 36 * act);   /* 32 activations, give or take */
    CHECK(ck < plain);
    CHECK(plain - ck >= 14 * act);   /* about 18 activations (9 MiB) fewer were measured */
    for (int i = 0; i < np; i++) CHECK(em_grad(ps[i].tensor) != NULL);
    em_module_free(m);
    em_scope_end(s);
}

static void test_bad_input(void) {
    em_scope s = em_scope_begin();
    em_module *m = em_nn_sequential(em_nn_linear(4, 4), em_nn_relu(), em_nn_linear(4, 4));
    em_tensor *x = em_randn(EM_SHAPE(2, 4), EM_OPTS(0));
    em_module *lin = em_nn_linear(4, 4);
    int64_t before = em_memory_allocated(EM_DEVICE_CPU);
    CHECK(em_checkpoint_sequential(m, 0, x) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "segments must be between 1 and the number of layers (3), got 0");
    CHECK(em_checkpoint_sequential(m, 4, x) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "got 4");
    CHECK(em_checkpoint_sequential(m, -2, x) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "got -2");
    CHECK(em_checkpoint_sequential(NULL, 1, x) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "the model is NULL");
    em_clear_error();
    CHECK(em_checkpoint_sequential(m, 1, NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "the input is NULL");
    CHECK(em_checkpoint_sequential(lin, 1, x) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "expected a Sequential module, got Linear");
    CHECK(em_checkpoint(NULL, NULL, &x, 1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "fn=NULL");
    CHECK(em_checkpoint(drop_fn, NULL, NULL, 1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "inputs=NULL");
    em_clear_error();
    em_tensor *nul = NULL;
    CHECK(em_checkpoint(drop_fn, NULL, &nul, 1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "input 0 is NULL");
    CHECK(em_memory_allocated(EM_DEVICE_CPU) == before);
    em_clear_error();
    /* a second backward through a checkpoint whose saved inputs the first one freed */
    em_module *d = em_nn_dropout(0.5);
    em_tensor *xr = em_randn(EM_SHAPE(2, 4), EM_OPTS(.requires_grad = true));
    em_tensor *loss = em_sum(em_checkpoint(drop_fn, d, &xr, 1), EM_ALL_DIMS, false);
    CHECK_OK(em_backward_with(loss, NULL, true));   /* retained: a second one works */
    CHECK_OK(em_backward(loss));
    CHECK(em_backward(loss) != EM_OK);
    CHECK_ERROR(EM_ERR_AUTOGRAD, "checkpointed function a second time");
    em_clear_error();
    em_module_free(d);
    em_module_free(lin);
    em_module_free(m);
    em_scope_end(s);
}

/* In no-grad mode the function just runs (no node). */
static void test_no_grad(void) {
    em_scope s = em_scope_begin();
    em_module *m = em_nn_sequential(em_nn_linear(4, 4), em_nn_relu(), em_nn_linear(4, 4));
    em_tensor *x = em_randn(EM_SHAPE(2, 4), EM_OPTS(0));
    em_grad_mode g = em_no_grad_begin();
    em_tensor *a = em_checkpoint_sequential(m, 2, x);
    em_no_grad_end(g);
    em_tensor *b = em_forward(m, x);
    CHECK(a && !em_requires_grad(a));
    CHECK(a && b && max_abs_diff(a, b) == 0.0);
    em_module_free(m);
    em_scope_end(s);
}

/* Gradient hooks (what DDP starts its all-reduces from) see every parameter's gradient and
 * one "finished" per backward, though the recomputation runs a backward of its own. */
static int hook_leaves, hook_done;
static em_status count_hook(void *ctx, em_tensor *leaf) {
    (void)ctx;
    if (leaf) hook_leaves++;
    else hook_done++;
    return EM_OK;
}

static void test_hooks_once(void) {
    em_scope s = em_scope_begin();
    em_module *m = mlp(3, 8, 0.0);   /* 10 children, 4 Linear = 8 parameters */
    em_tensor *x = em_randn(EM_SHAPE(3, 8), EM_OPTS(0));
    int id = em_autograd_add_grad_hook(count_hook, NULL);
    CHECK(id >= 0);
    hook_leaves = hook_done = 0;
    CHECK_OK(em_backward(em_sum(em_checkpoint_sequential(m, 3, x), EM_ALL_DIMS, false)));
    em_autograd_remove_grad_hook(id);
    CHECK(hook_done == 1);
    CHECK(hook_leaves >= 8);   /* every parameter, plus the segments' anchor leaves */
    em_module_free(m);
    em_scope_end(s);
}

/* ---- transformer blocks, checkpointed one by one (ember train --model gpt --checkpoint-activations) ---- */

static em_tensor *tblock_forward(em_module *m, em_tensor *x) {
    em_tensor *h = em_forward(em_module_child(m, 0), x);
    x = em_add(x, em_multihead_attention_forward(em_module_child(m, 1), h, h, h, NULL, true, NULL));
    return em_add(x, em_forward(em_module_child(m, 3), em_forward(em_module_child(m, 2), x)));
}
static const em_module_ops tblock_ops = {.name = "Block", .forward = tblock_forward};

static em_module *tblock(int64_t d, int64_t heads, double dropout) {
    em_module *b = em_module_new(&tblock_ops, NULL);
    em_module_add_child(b, "ln1", em_nn_layer_norm(EM_SHAPE(d), 1e-5, true));
    em_module_add_child(b, "attn", em_nn_multihead_attention_ex(d, heads, dropout, true, true));
    em_module_add_child(b, "ln2", em_nn_layer_norm(EM_SHAPE(d), 1e-5, true));
    em_module_add_child(b, "mlp", em_nn_sequential(em_nn_linear(d, 4 * d), em_nn_gelu(), em_nn_dropout(dropout),
                                                em_nn_linear(4 * d, d)));
    return b;
}

static em_tensor *tblock_ckpt_fn(void *ctx, em_tensor *const *in, int n) {
    (void)n;
    return em_forward(ctx, in[0]);
}

/* Three AdamW steps of 3 blocks (dropout 0.1) on a fixed batch, each block under em_checkpoint
 * or not; the losses and the CPU allocator's peak over the steps. */
static int64_t train_blocks(bool ckpt, double *losses) {
    em_manual_seed(11);
    em_module *blocks = em_nn_sequential(tblock(32, 4, 0.1), tblock(32, 4, 0.1), tblock(32, 4, 0.1));
    em_optimizer *opt = em_adamw(blocks, 1e-2);
    em_scope s0 = em_scope_begin();
    em_tensor *x = em_keep(em_randn(EM_SHAPE(8, 24, 32), EM_OPTS(0)));
    em_scope_end(s0);
    int64_t base = em_memory_allocated(EM_DEVICE_CPU);
    em_memory_reset_peak_stats(EM_DEVICE_CPU);
    for (int step = 0; step < 3; step++) {
        em_scope s = em_scope_begin();
        em_tensor *h = x;
        for (int i = 0; i < 3 && h; i++)
            h = ckpt ? em_checkpoint(tblock_ckpt_fn, em_module_child(blocks, i), &h, 1)
                     : em_forward(em_module_child(blocks, i), h);
        em_tensor *loss = em_mean(em_mul(h, h), EM_ALL_DIMS, false);
        CHECK_OK(em_zero_grad(opt));
        CHECK_OK(em_backward(loss));
        CHECK_OK(em_step(opt));
        losses[step] = loss ? em_item(loss) : NAN;
        em_scope_end(s);
    }
    int64_t peak = em_memory_max_allocated(EM_DEVICE_CPU) - base;
    em_release(x);
    em_optim_free(opt);
    em_module_free(blocks);
    return peak;
}

/* Bit-identical losses: the recomputation runs the same kernels on the same inputs with the
 * dropout masks replayed, and every parameter gets its one gradient through the same ops, so
 * nothing is summed in another order. The peak is lower: two of the three blocks' activations
 * are not kept (the one being backpropagated is recomputed). */
/* Autocast: the recomputation runs in the forward's autocast state, whatever region the
 * backward runs in (torch.utils.checkpoint does the same). grads_of's forward under a bf16
 * region, backward outside it: the weights' gradients must equal the un-checkpointed run's
 * bit for bit (recomputed in float32 they would not); and a float32 forward whose backward
 * runs inside a region must recompute in float32. */
static em_tensor *grads_autocast(em_module *m, em_tensor *x, bool ckpt, bool region_fwd, bool region_bwd,
                                 em_tensor **out_dtype_probe) {
    em_named_tensor ps[MAXP];
    int np = em_module_parameters(m, ps, MAXP);
    for (int i = 0; i < np; i++) em_set_grad(ps[i].tensor, NULL);
    em_manual_seed(1234);
    em_autocast r = region_fwd ? em_autocast_begin(EM_CPU, EM_BF16) : (em_autocast){0};
    em_tensor *y = ckpt ? em_checkpoint_sequential(m, 2, x) : em_forward(m, x);
    if (region_fwd) CHECK_OK(em_autocast_end(r));
    CHECK(y != NULL);
    if (!y) return NULL;
    if (out_dtype_probe) *out_dtype_probe = y;
    em_tensor *loss = em_sum(em_mul(em_to_dtype(y, EM_F32), em_to_dtype(y, EM_F32)), EM_ALL_DIMS, false);
    em_autocast rb = region_bwd ? em_autocast_begin(EM_CPU, EM_BF16) : (em_autocast){0};
    CHECK_OK(em_backward(loss));
    if (region_bwd) CHECK_OK(em_autocast_end(rb));
    em_tensor *g = em_grad(ps[0].tensor);   /* the first Linear's weight: recomputed in backward */
    CHECK(g != NULL);
    return g ? em_retain(em_clone(g)) : NULL;
}

static void test_autocast_replayed(void) {
    em_scope s = em_scope_begin();
    em_manual_seed(5);
    em_module *m = mlp(3, 48, 0.0);
    em_tensor *x = em_randn(EM_SHAPE(16, 48), EM_OPTS(0));
    em_tensor *probe = NULL;
    em_tensor *plain = grads_autocast(m, x, false, true, false, &probe);
    CHECK(probe && em_dtype_of(probe) == EM_BF16);   /* the region really ran the Linears in bf16 */
    em_tensor *ck = grads_autocast(m, x, true, true, false, NULL);
    CHECK(plain && ck && em_dtype_of(ck) == EM_F32);   /* float32 leaves, float32 gradients */
    if (plain && ck) CHECK(max_abs_diff(plain, ck) == 0.0);
    em_tensor *f32 = grads_autocast(m, x, false, false, false, NULL);
    if (plain && f32) CHECK(max_abs_diff(plain, f32) > 0.0);   /* bf16 and f32 differ: the check can fail */
    em_tensor *ck_bwd_region = grads_autocast(m, x, true, false, true, NULL);
    if (f32 && ck_bwd_region) CHECK(max_abs_diff(f32, ck_bwd_region) == 0.0);
    em_release(plain);
    em_release(ck);
    em_release(f32);
    em_release(ck_bwd_region);
    em_module_free(m);
    em_scope_end(s);
}

static void test_transformer_blocks(void) {
    double plain[3], ck[3];
    int64_t p_plain = train_blocks(false, plain), p_ck = train_blocks(true, ck);
    for (int i = 0; i < 3; i++) {
        printf("  step %d: loss %.9f plain, %.9f checkpointed\n", i + 1, plain[i], ck[i]);
        CHECK(isfinite(plain[i]) && plain[i] == ck[i]);
    }
    CHECK(plain[2] < plain[0]);   /* it trains */
    printf("  peak over the steps: plain %.3f MB, each block checkpointed %.3f MB\n", p_plain / 1e6, p_ck / 1e6);
    CHECK(p_ck < p_plain);
}

int main(void) {
    RUN(test_grads_identical);
    RUN(test_dropout_mask_replayed);
    RUN(test_peak_memory_lower);
    RUN(test_bad_input);
    RUN(test_no_grad);
    RUN(test_hooks_once);
    RUN(test_transformer_blocks);
    RUN(test_autocast_replayed);
    return test_summary();
}
