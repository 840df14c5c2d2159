/* ZeRO stages 1-3 (include/ember/zero.h) on 2 and 3 MPI ranks of this machine, on the CPU and
 * on PoCL devices: the same losses and weights as one unsharded process over 20 steps, each
 * rank's allocator peak against the paper's formulas, a model too big for EMBER_MEMORY_CAP
 * unsharded trained under ZeRO-3 within it, a checkpoint saved on 2 ranks resumed on 3 and
 * on 1, and a killed rank ending the job. ctest runs this program once; it starts itself
 * under mpirun (tests/dist_run.h) in several modes and checks what every rank reported. */
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <time.h>
#include <ember/zero.h>
#include "test.h"
#include "dist_run.h"

static int R, N; /* this rank, world size (in a rank) */
static em_device DEV = {EM_CPU, 0};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ================= what the ranks run ================= */

static em_module *mlp(int width, int blocks, int in, int out) {
    em_module *m = em_nn_sequential(em_nn_linear(in, width), em_nn_relu());
    for (int i = 0; i < blocks; i++) {
        em_sequential_append(m, em_nn_linear(width, width));
        em_sequential_append(m, em_nn_relu());
    }
    em_sequential_append(m, em_nn_linear(width, out));
    return m;
}

/* Every parameter of m, flattened and concatenated, float32 on the CPU. */
static em_tensor *flat_params(em_module *m) {
    em_named_tensor p[64];
    int n = em_module_parameters(m, p, 64);
    em_tensor *parts[64];
    for (int i = 0; i < n; i++) parts[i] = em_cpu(em_to_dtype(em_reshape(p[i].tensor, EM_SHAPE(-1)), EM_F32));
    return em_cat(parts, n, 0);
}

static double max_abs_diff(em_tensor *a, em_tensor *b) {
    return em_item(em_max(em_abs(em_sub(a, b)), EM_ALL_DIMS, false));
}

/* The batch of step `step`: 48 samples (split evenly over 1, 2 or 3 ranks). */
#define BATCH 48
static void batch_of(int step, em_tensor **x, em_tensor **y) {
    em_manual_seed(5000 + (uint64_t)step);
    *x = em_randn(EM_SHAPE(BATCH, 20), EM_OPTS(0));
    *y = em_randint(0, 5, EM_SHAPE(BATCH), EM_OPTS(.dtype = EM_I64));
}

/* This rank's loss on its part of step's batch (the graph kept for backward). */
static em_tensor *rank_loss(em_zero *z, int step) {
    em_tensor *x, *y;
    batch_of(step, &x, &y);
    int64_t part = BATCH / N;
    x = em_to(em_narrow(x, 0, R * part, part), DEV);
    y = em_to(em_narrow(y, 0, R * part, part), DEV);
    return em_cross_entropy(em_zero_forward(z, x), y, 0.0);
}

/* The mean of every rank's loss: the loss of the whole batch. */
static double global_loss(em_tensor *loss) {
    em_tensor *l = em_cpu(em_detach(loss));
    if (em_dist_all_reduce(NULL, l, EM_REDUCE_AVG) != EM_OK) return NAN;
    return em_item(l);
}

/* Stage `stage` over the ranks against one unsharded model on the whole batch, 20 AdamW steps. */
static void matches_unsharded(int stage, int steps) {
    em_manual_seed(7);
    em_module *a = mlp(32, 2, 20, 5);
    em_manual_seed(7);
    em_module *b = mlp(32, 2, 20, 5);
    CHECK_OK(em_module_to(a, DEV));
    CHECK_OK(em_module_to(b, DEV));
    em_optimizer *like = em_adamw(a, 1e-3);
    em_zero *z = em_zero_new(a, NULL, like, &(em_zero_opts){.stage = stage});
    em_optim_free(like);
    CHECK(z != NULL);
    if (!z) {
        fprintf(stderr, "rank %d: em_zero_new: %s\n", R, em_last_error());
        em_module_free(a);
        em_module_free(b);
        return;
    }
    CHECK(em_zero_num_units(z) == 4);
    em_optimizer *ob = em_adamw(b, 1e-3);
    double worst_loss = 0, worst_weight = 0;
    for (int step = 0; step < steps; step++) {
        em_scope s = em_scope_begin();
        CHECK_OK(em_zero_clear_grads(z));
        em_tensor *la = rank_loss(z, step);
        CHECK_OK(em_backward(la));
        CHECK_OK(em_zero_step(z));
        double lg = global_loss(la);
        em_tensor *x, *y;
        batch_of(step, &x, &y);
        em_zero_grad(ob);
        em_tensor *lb = em_cross_entropy(em_forward(b, em_to(x, DEV)), em_to(y, DEV), 0.0);
        CHECK_OK(em_backward(lb));
        CHECK_OK(em_step(ob));
        double dl = fabs(lg - em_item(lb));
        double dw = max_abs_diff(em_zero_full_parameters(z), flat_params(b));
        if (!(dl <= worst_loss)) worst_loss = dl;
        if (!(dw <= worst_weight)) worst_weight = dw;
        em_scope_end(s);
    }
    printf("rank %d: stage %d on %d ranks (%s) vs 1 unsharded, %d steps: worst loss difference %.3g, worst weight "
           "difference %.3g\n", R, stage, N, em_device_str(DEV).s, steps, worst_loss, worst_weight);
    CHECK(worst_loss <= 1e-5);
    CHECK(worst_weight <= 1e-5);
    em_optim_free(ob);
    CHECK_OK(em_zero_unshard(z));
    em_zero_free(z);
    /* the model keeps full parameters of its own */
    em_scope s = em_scope_begin();
    CHECK(max_abs_diff(flat_params(a), flat_params(b)) <= 1e-5);
    em_scope_end(s);
    em_module_free(a);
    em_module_free(b);
}

static void case_stage1(void) { matches_unsharded(1, 20); }
static void case_stage2(void) { matches_unsharded(2, 20); }
static void case_stage3(void) { matches_unsharded(3, 20); }

/* Mixed precision: bfloat16 parameters, float32 masters. The reference is the same recipe by
 * hand in one process: a bfloat16 model for forward and backward on the whole batch, its
 * gradients widened into a float32 copy that AdamW steps, the copy cast back. The ranks sum
 * bfloat16 gradients where the reference has one product, so they agree to bfloat16's
 * precision (a relative 2^-8 per rounding), not bit for bit. */
static void mixed_matches_by_hand(int stage) {
    em_manual_seed(7);
    em_module *a = mlp(32, 2, 20, 5);
    em_manual_seed(7);
    em_module *master = mlp(32, 2, 20, 5);
    em_manual_seed(7);
    em_module *b = mlp(32, 2, 20, 5);
    CHECK_OK(em_module_to_dtype(a, EM_BF16));
    CHECK_OK(em_module_to_dtype(b, EM_BF16));
    em_optimizer *like = em_adamw(a, 1e-3);
    em_zero *z = em_zero_new(a, NULL, like, &(em_zero_opts){.stage = stage});
    em_optim_free(like);
    CHECK(z != NULL);
    if (!z) return;
    em_optimizer *om = em_adamw(master, 1e-3);
    em_named_tensor pm[16], pb[16];
    int n = em_module_parameters(master, pm, 16);
    CHECK(em_module_parameters(b, pb, 16) == n);
    double worst = 0, worst_w = 0;
    for (int step = 0; step < 20; step++) {
        em_scope s = em_scope_begin();
        CHECK_OK(em_zero_clear_grads(z));
        em_tensor *x, *y;
        batch_of(step, &x, &y);
        int64_t part = BATCH / N;
        em_tensor *la = em_cross_entropy(em_to_dtype(em_zero_forward(z, em_to_dtype(em_narrow(x, 0, R * part, part), EM_BF16)), EM_F32),
                                         em_narrow(y, 0, R * part, part), 0.0);
        CHECK_OK(em_backward(la));
        CHECK_OK(em_zero_step(z));
        double lg = global_loss(la);
        for (int i = 0; i < n; i++) em_set_grad(pb[i].tensor, NULL);
        em_tensor *lb = em_cross_entropy(em_to_dtype(em_forward(b, em_to_dtype(x, EM_BF16)), EM_F32), y, 0.0);
        CHECK_OK(em_backward(lb));
        for (int i = 0; i < n; i++) CHECK_OK(em_set_grad(pm[i].tensor, em_to_dtype(em_grad(pb[i].tensor), EM_F32)));
        CHECK_OK(em_step(om));
        em_grad_mode mode = em_no_grad_begin();
        for (int i = 0; i < n; i++) CHECK_OK(em_copy_(pb[i].tensor, pm[i].tensor));
        em_no_grad_end(mode);
        double dl = fabs(lg - em_item(lb)) / fabs(em_item(lb));
        double dw = max_abs_diff(em_zero_full_parameters(z), flat_params(master));
        if (!(dl <= worst)) worst = dl;
        if (!(dw <= worst_w)) worst_w = dw;
        em_scope_end(s);
    }
    printf("rank %d: stage %d bfloat16 with float32 masters on %d ranks vs the same by hand, 20 steps: worst relative "
           "loss difference %.3g, worst master weight difference %.3g\n", R, stage, N, worst, worst_w);
    CHECK(worst <= 2e-2);
    CHECK(worst_w <= 5e-3);
    em_optim_free(om);
    em_zero_free(z);
    em_module_free(a);
    em_module_free(b);
    em_module_free(master);
}

static void case_mixed1(void) { mixed_matches_by_hand(1); }
static void case_mixed3(void) { mixed_matches_by_hand(3); }

/* Each rank's allocator peak over two steps against the formula. The model: 8 blocks of
 * Linear(512, 512) (2.1 M parameters, so the states dominate), batch 8/rank. Tolerance: the
 * peak may exceed the formula by the activations (counted below) plus the transients of one
 * unit (a block): stage 1 its gradient shard in float32 and the step's all-gather source;
 * stages 2-3 the unit's flat gradient for the reduce-scatter and its gradients being formed;
 * stage 3 also the gathered parameters: at most 3 x the largest unit in float32. It may not
 * be below 98% of the formula. */
static void peak_matches_formula(int stage, em_dtype dt) {
    if (DEV.type != EM_CPU) SKIP("the peak is measured on the CPU allocator");
    const int width = 512, blocks = 8;
    em_memory_empty_cache(DEV);
    int64_t base = em_memory_allocated(DEV);
    em_manual_seed(3);
    em_module *m = mlp(width, blocks - 2, width, width);
    CHECK_OK(em_module_to_dtype(m, dt));
    double P = (double)em_module_num_parameters(m);
    em_optimizer *like = em_adamw(m, 1e-4);
    em_zero *z = em_zero_new(m, NULL, like, &(em_zero_opts){.stage = stage});
    em_optim_free(like);
    CHECK(z != NULL);
    if (!z) {
        em_module_free(m);
        return;
    }
    em_memory_reset_peak_stats(DEV);
    for (int step = 0; step < 2; step++) {
        em_scope s = em_scope_begin();
        em_manual_seed(100 + (uint64_t)step);
        em_tensor *x = em_to_dtype(em_randn(EM_SHAPE(8, width), EM_OPTS(0)), dt);
        em_tensor *y = em_randint(0, width, EM_SHAPE(8), EM_OPTS(.dtype = EM_I64));
        CHECK_OK(em_zero_clear_grads(z));
        CHECK_OK(em_backward(em_cross_entropy(em_to_dtype(em_zero_forward(z, x), EM_F32), y, 0.0)));
        CHECK_OK(em_zero_step(z));
        em_scope_end(s);
    }
    double peak = (double)(em_memory_max_allocated(DEV) - base);
    em_zero_memory f;
    CHECK_OK(em_zero_estimate(P, stage, N, dt != EM_F32, &f));
    double unit = (double)width * (width + 1) * 4;
    double act = 8.0 * width * (2 * blocks + 4) * 4 + 8.0 * width * 4 * 3; /* outputs, masks, logits' softmax */
    double slack = act + 3 * unit;
    printf("rank %d: stage %d, %s, %d ranks, P = %.0f: peak %.3f MB, formula %.3f MB (+%.1f%%), allowed up to +%.3f MB\n",
           R, stage, em_dtype_name(dt), N, P, peak / 1e6, f.total / 1e6, 100 * (peak - f.total) / f.total, slack / 1e6);
    CHECK(peak >= 0.98 * f.total);
    CHECK(peak <= f.total + slack);
    em_zero_free(z);
    em_module_free(m);
    em_memory_empty_cache(DEV);
}

static void case_peak_f32_1(void) { peak_matches_formula(1, EM_F32); }
static void case_peak_f32_2(void) { peak_matches_formula(2, EM_F32); }
static void case_peak_f32_3(void) { peak_matches_formula(3, EM_F32); }
static void case_peak_bf16_1(void) { peak_matches_formula(1, EM_BF16); }
static void case_peak_bf16_2(void) { peak_matches_formula(2, EM_BF16); }
static void case_peak_bf16_3(void) { peak_matches_formula(3, EM_BF16); }

/* EMBER_MEMORY_CAP (set by the parent) holds ZeRO-3 on 3 ranks but not one unsharded rank:
 * 8 blocks of Linear(512, 512) with AdamW need 16P = 33.6 MB unsharded. */
static void case_cap(void) {
    int64_t cap = em_memory_get_cap(DEV);
    CHECK(cap > 0);
    em_manual_seed(3);
    em_module *m = mlp(512, 6, 512, 512);
    double P = (double)em_module_num_parameters(m);
    CHECK(16 * P > (double)cap);
    em_status plain = EM_OK;
    {   /* unsharded: the cap stops it */
        em_optimizer *opt = em_adamw(m, 1e-4);
        for (int step = 0; step < 2 && plain == EM_OK; step++) {
            em_scope s = em_scope_begin();
            em_tensor *x = em_randn(EM_SHAPE(8, 512), EM_OPTS(0));
            em_tensor *y = em_randint(0, 512, EM_SHAPE(8), EM_OPTS(.dtype = EM_I64));
            em_zero_grad(opt);
            em_tensor *loss = em_cross_entropy(em_forward(m, x), y, 0.0);
            plain = loss ? em_backward(loss) : em_last_status();
            if (plain == EM_OK) plain = em_step(opt);
            em_scope_end(s);
        }
        printf("rank %d: unsharded under a cap of %.1f MB: %s\n", R, cap / 1e6, plain == EM_OK ? "fit" : em_last_error());
        em_clear_error();
        em_zero_grad(opt);
        em_optim_free(opt);
        em_memory_empty_cache(DEV);
    }
    CHECK(plain == EM_ERR_OUT_OF_MEMORY);
    em_optimizer *like = em_adamw(m, 1e-4);
    em_zero *z = em_zero_new(m, NULL, like, &(em_zero_opts){.stage = 3});
    em_optim_free(like);
    CHECK(z != NULL);
    double first = NAN, last = NAN;
    em_memory_reset_peak_stats(DEV);
    for (int step = 0; z && step < 5; step++) {
        em_scope s = em_scope_begin();
        em_manual_seed(100);   /* one batch, learnt */
        em_tensor *x = em_randn(EM_SHAPE(8, 512), EM_OPTS(0));
        em_tensor *y = em_randint(0, 512, EM_SHAPE(8), EM_OPTS(.dtype = EM_I64));
        CHECK_OK(em_zero_clear_grads(z));
        em_tensor *loss = em_cross_entropy(em_zero_forward(z, x), y, 0.0);
        CHECK(loss != NULL);
        if (!loss) fprintf(stderr, "rank %d: %s\n", R, em_last_error());
        CHECK_OK(em_backward(loss));
        CHECK_OK(em_zero_step(z));
        if (step == 0) first = global_loss(loss);
        last = global_loss(loss);
        em_scope_end(s);
    }
    printf("rank %d: ZeRO-3 on %d ranks under the cap: peak reserved %.1f MB of %.1f MB, loss %.4f -> %.4f\n", R, N,
           em_memory_max_reserved(DEV) / 1e6, cap / 1e6, first, last);
    CHECK(last < first);
    em_zero_free(z);
    em_module_free(m);
}

/* ---- checkpoints: 5 steps and a save on 2 ranks; the next step's loss from the save on
 * any number of ranks ---- */
static const char *ckpt_dir(void) { return getenv("EMBER_TEST_ZERO_DIR"); }

static void case_ckpt_save(void) {
    em_manual_seed(11);
    em_module *m = mlp(32, 2, 20, 5);
    em_optimizer *like = em_adamw(m, 1e-2);
    em_zero *z = em_zero_new(m, NULL, like, &(em_zero_opts){.stage = 3});
    em_optim_free(like);
    CHECK(z != NULL);
    for (int step = 0; z && step < 5; step++) {
        em_scope s = em_scope_begin();
        CHECK_OK(em_zero_clear_grads(z));
        CHECK_OK(em_backward(rank_loss(z, step)));
        CHECK_OK(em_zero_step(z));
        em_scope_end(s);
    }
    const char *keys[] = {"step"}, *values[] = {"5"};
    CHECK_OK(em_zero_save(z, ckpt_dir(), keys, values, 1));
    em_scope s = em_scope_begin();
    CHECK_OK(em_zero_clear_grads(z));
    em_tensor *loss = rank_loss(z, 5);
    CHECK_OK(em_backward(loss));
    CHECK_OK(em_zero_step(z));
    double next = global_loss(rank_loss(z, 6));
    if (R == 0) printf("next-step loss %.9f\n", next);
    em_scope_end(s);
    em_zero_free(z);
    em_module_free(m);
}

static void case_ckpt_load(void) {
    const char *stage_s = getenv("EMBER_TEST_ZERO_STAGE");
    int stage = stage_s ? atoi(stage_s) : 3;
    em_manual_seed(999);   /* another init: everything must come from the folder */
    em_module *m = mlp(32, 2, 20, 5);
    em_optimizer *like = em_adamw(m, 1e-5);
    em_zero *z = em_zero_new(m, NULL, like, &(em_zero_opts){.stage = stage});
    em_optim_free(like);
    CHECK(z != NULL);
    em_safetensors *meta = NULL;
    CHECK_OK(em_zero_load(z, ckpt_dir(), &meta));
    CHECK(meta && em_safetensors_metadata(meta, "step") && !strcmp(em_safetensors_metadata(meta, "step"), "5"));
    em_safetensors_free(meta);
    CHECK(fabs(em_optim_lr(em_zero_optimizer(z)) - 1e-2) < 1e-12);
    em_scope s = em_scope_begin();
    CHECK_OK(em_zero_clear_grads(z));
    CHECK_OK(em_backward(rank_loss(z, 5)));
    CHECK_OK(em_zero_step(z));
    double next = global_loss(rank_loss(z, 6));
    if (R == 0) printf("next-step loss %.9f\n", next);
    em_scope_end(s);
    /* a folder of another model is refused, naming what differs */
    em_module *other = mlp(16, 2, 20, 5);
    em_optimizer *l2 = em_adamw(other, 1e-3);
    em_zero *z2 = em_zero_new(other, NULL, l2, &(em_zero_opts){.stage = 1});
    em_optim_free(l2);
    CHECK(em_zero_load(z2, ckpt_dir(), NULL) == EM_ERR_ARGUMENT);
    CHECK(strstr(em_last_error(), "holds other parameters than this model's") != NULL);
    em_clear_error();
    em_zero_free(z2);
    em_module_free(other);
    em_zero_free(z);
    em_module_free(m);
}

/* ---- bad arguments ---- */
/* ---- units given by the caller, with a forward of its own (em_zero_run_unit) ----
 * The MLP's Linear children as units by name (unit_of: "2.weight" is unit 1), its forward
 * written here, with AdamW's decay on the matrices only and clipping to a norm the gradients
 * exceed: against the unsharded model with the same options. */
static int unit_by_child(void *ctx, const char *name) {
    (void)ctx;
    return atoi(name) / 2;   /* children 0, 2, 4, 6 are the Linear layers */
}

static em_tensor *run_child(void *ctx, em_tensor *const *in, int n) {
    (void)n;
    return em_forward(ctx, in[0]);
}

static em_tensor *caller_forward(em_zero *z, em_module *m, em_tensor *x) {
    for (int i = 0; x && em_module_child(m, i); i++)
        x = i % 2 == 0 ? em_zero_run_unit(z, i / 2, run_child, em_module_child(m, i), NULL, &x, 1)
                       : em_forward(em_module_child(m, i), x);
    return x;
}

static void caller_units(int stage) {
    em_manual_seed(7);
    em_module *a = mlp(32, 2, 20, 5);
    em_manual_seed(7);
    em_module *b = mlp(32, 2, 20, 5);
    em_adam_opts o = em_adam_defaults(1e-2);
    o.weight_decay = 0.5;
    o.decay_matrices_only = true;
    /* Adam's first update is lr g / (|g| + eps), whose slope at g = 0 is lr / eps. With the
     * default 1e-8, a weight whose gradient is zero but for float32 rounding (a unit that is
     * nearly dead) moves by a sizeable part of lr depending on the order in which the ranks'
     * sums were added: 1.3e-5 on an AVX2 machine. An eps far above that rounding keeps the
     * comparison about the sharding. */
    o.eps = 1e-4;
    em_optimizer *like = em_adamw_ex(a, o);
    em_zero *z = em_zero_new(a, NULL, like, &(em_zero_opts){.stage = stage, .unit_of = unit_by_child});
    em_optim_free(like);
    CHECK(z != NULL && em_zero_num_units(z) == 4);
    if (!z) {
        em_module_free(a);
        em_module_free(b);
        return;
    }
    em_module *block = a;
    CHECK_OK(em_zero_unit_info(z, 1, NULL, NULL, &block));
    CHECK(block == NULL);   /* no block of its own: the caller runs it */
    em_optimizer *ob = em_adamw_ex(b, o);
    double worst_norm = 0, worst_weight = 0;
    for (int step = 0; step < 6; step++) {
        em_scope s = em_scope_begin();
        CHECK_OK(em_zero_clear_grads(z));
        em_tensor *x, *y;
        batch_of(step, &x, &y);
        int64_t part = BATCH / N;
        em_tensor *la = em_cross_entropy(caller_forward(z, a, em_narrow(x, 0, R * part, part)),
                                         em_narrow(y, 0, R * part, part), 0.0);
        CHECK_OK(em_backward(la));
        double na = em_zero_clip_grad_norm(z, 0.05);
        CHECK_OK(em_zero_step(z));
        em_zero_grad(ob);
        CHECK_OK(em_backward(em_cross_entropy(em_forward(b, x), y, 0.0)));
        double nb = em_clip_grad_norm(b, 0.05);
        CHECK(nb > 0.05);   /* clipping happened */
        CHECK_OK(em_step(ob));
        double dn = fabs(na - nb) / nb, dw = max_abs_diff(em_zero_full_parameters(z), flat_params(b));
        if (!(dn <= worst_norm)) worst_norm = dn;
        if (!(dw <= worst_weight)) worst_weight = dw;
        em_scope_end(s);
    }
    printf("rank %d: stage %d, the caller's units and forward on %d ranks, AdamW decaying matrices only, clipped: "
           "worst norm difference %.3g (relative), worst weight difference %.3g\n", R, stage, N, worst_norm,
           worst_weight);
    CHECK(worst_norm <= 1e-5);
    CHECK(worst_weight <= 1e-5);
    /* stage 3 has no forward of its own for such units; a unit out of range */
    em_scope s = em_scope_begin();
    em_tensor *x = em_zeros(EM_SHAPE(2, 20), EM_OPTS(0));
    if (stage == 3) {
        CHECK(em_zero_forward(z, x) == NULL && strstr(em_last_error(), "em_zero_run_unit") != NULL);
        em_clear_error();
    }
    CHECK(em_zero_run_unit(z, 4, run_child, a, NULL, &x, 1) == NULL &&
          strstr(em_last_error(), "unit 4 out of range (4 units)") != NULL);
    em_clear_error();
    em_scope_end(s);
    em_optim_free(ob);
    CHECK_OK(em_zero_unshard_to(z, 0));
    if (stage == 3) CHECK(em_zero_step(z) == EM_ERR_ARGUMENT);   /* the optimizer went with the unshard */
    em_clear_error();
    em_zero_free(z);
    if (R == 0 || stage < 3) {   /* root alone keeps the weights at stage 3 */
        em_scope t = em_scope_begin();
        CHECK(max_abs_diff(flat_params(a), flat_params(b)) <= 1e-5);
        em_scope_end(t);
    }
    em_module_free(a);
    em_module_free(b);
}
static void case_caller_units1(void) { caller_units(1); }
static void case_caller_units2(void) { caller_units(2); }
static void case_caller_units3(void) { caller_units(3); }

static int unit_with_gap(void *ctx, const char *name) {
    (void)ctx;
    return atoi(name);   /* 0, 2, 4, 6: units 1, 3 and 5 get nothing */
}

static void case_bad_arguments(void) {
    em_module *m = mlp(8, 0, 4, 2);
    em_optimizer *like = em_adamw(m, 1e-3);
    CHECK(em_zero_new(m, NULL, like, &(em_zero_opts){.stage = 4}) == NULL);
    CHECK(strstr(em_last_error(), "expected stage 1, 2 or 3, got 4") != NULL);
    em_clear_error();
    CHECK(em_zero_new(NULL, NULL, like, &(em_zero_opts){.stage = 1}) == NULL);
    em_clear_error();
    em_zero_memory f;
    CHECK(em_zero_estimate(-1, 1, 2, false, &f) == EM_ERR_ARGUMENT);
    CHECK(em_zero_estimate(1e9, 1, 0, false, &f) == EM_ERR_ARGUMENT);
    em_clear_error();
    /* the paper's numbers: 7.5 B parameters on 64 ranks, mixed precision */
    CHECK_OK(em_zero_estimate(7.5e9, 0, 64, true, &f));
    CHECK_NEAR(f.total / 1e9, 120, 1e-9);
    CHECK_OK(em_zero_estimate(7.5e9, 1, 64, true, &f));
    CHECK_NEAR(f.total / 1e9, 31.40625, 1e-9);
    CHECK_OK(em_zero_estimate(7.5e9, 2, 64, true, &f));
    CHECK_NEAR(f.total / 1e9, 16.640625, 1e-9);
    CHECK_OK(em_zero_estimate(7.5e9, 3, 64, true, &f));
    CHECK_NEAR(f.total / 1e9, 1.875, 1e-9);
    CHECK_OK(em_zero_estimate(1e6, 1, 4, false, &f));
    CHECK_NEAR(f.total, 8e6 + 2e6, 1e-6);
    CHECK(em_zero_new(m, NULL, like, &(em_zero_opts){.stage = 2, .unit_of = unit_with_gap}) == NULL);
    CHECK(strstr(em_last_error(), "unit_of gave unit 1 no parameter") != NULL);
    em_clear_error();
    em_optim_free(like);
    em_module_free(m);
}

/* ---- a long run, for the parent to kill a rank of ---- */
static void case_long(void) {
    em_manual_seed(7);
    em_module *m = mlp(32, 2, 20, 5);
    em_optimizer *like = em_adamw(m, 1e-3);
    em_zero *z = em_zero_new(m, NULL, like, &(em_zero_opts){.stage = 2});
    em_optim_free(like);
    printf("rank %d: training\n", R);
    fflush(stdout);
    em_status st = EM_OK;
    double t0 = now_s();
    for (int step = 0; st == EM_OK && now_s() - t0 < 120; step++) {
        em_scope s = em_scope_begin();
        em_zero_clear_grads(z);
        st = em_backward(rank_loss(z, step % 50));
        if (st == EM_OK) st = em_zero_step(z);
        em_scope_end(s);
    }
    if (st != EM_OK) fprintf(stderr, "rank %d: %s\n", R, em_last_error());
    _exit(st == EM_OK ? 0 : 1);
}

static int rank_main(const char *mode) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (em_dist_init("mpi") != EM_OK) {
        printf("rank ?: FAIL em_dist_init: %s\n", em_last_error());
        return 1;
    }
    R = em_dist_rank(NULL);
    N = em_dist_world_size(NULL);
    bool opencl = !strcmp(mode, "opencl");
    if (opencl) {
        int count = em_device_count(EM_OPENCL);
        if (count < 1) {
            printf("rank %d: SKIP no OpenCL device: %s\n", R, em_device_unavailable_reason(EM_OPENCL));
            printf("rank %d: PASS %s\n", R, mode);
            em_dist_finalize();
            return 0;
        }
        DEV = (em_device){EM_OPENCL, em_dist_local_rank() % count};
    }
    if (!strcmp(mode, "train") || opencl) {
        RUN(case_stage1);
        RUN(case_stage2);
        RUN(case_stage3);
        if (!opencl) {
            RUN(case_mixed1);
            RUN(case_mixed3);
            RUN(case_bad_arguments);
            RUN(case_caller_units1);
            RUN(case_caller_units2);
            RUN(case_caller_units3);
        }
    } else if (!strcmp(mode, "peak")) {
        RUN(case_peak_f32_1);
        RUN(case_peak_f32_2);
        RUN(case_peak_f32_3);
        RUN(case_peak_bf16_1);
        RUN(case_peak_bf16_2);
        RUN(case_peak_bf16_3);
    } else if (!strcmp(mode, "cap")) {
        RUN(case_cap);
    } else if (!strcmp(mode, "ckpt_save")) {
        RUN(case_ckpt_save);
    } else if (!strcmp(mode, "ckpt_load")) {
        RUN(case_ckpt_load);
    } else if (!strcmp(mode, "long")) {
        case_long();
    }
    int rc = test_summary();
    printf("rank %d: %s %s\n", R, rc == 1 ? "FAIL" : "PASS", mode);
    fflush(stdout);
    em_dist_finalize();
    return rc == 1 ? 1 : 0;
}

/* ================= the parent: what ctest runs ================= */

static char out[1 << 20];

static bool all_pass(int n, const char *mode, const char *env) {
    int st = dist_run(n, mode, env, out, sizeof out);
    char want[64];
    int passed = 0;
    for (int r = 0; r < n; r++) {
        snprintf(want, sizeof want, "rank %d: PASS %s", r, mode);
        passed += dist_count(out, want) == 1;
    }
    bool ok = st == 0 && passed == n;
    char title[96];
    snprintf(title, sizeof title, "%d ranks, %s: exit %d, %d of %d ranks passed", n, mode, st, passed, n);
    /* a pass in one line (the ranks' figures with EMBER_TEST_VERBOSE set), so that a failure's
     * output is near the start of the test's */
    if (!ok) dist_print_failure(title, out);
    else if (getenv("EMBER_TEST_VERBOSE")) printf("---- %s ----\n%s\n", title, out);
    else printf("---- %s ----\n", title);
    return ok;
}

static void test_train_cpu(void) {
    CHECK(all_pass(2, "train", ""));
    CHECK(all_pass(3, "train", ""));
}

static void test_train_pocl(void) {
    CHECK(all_pass(2, "opencl", "POCL_DEVICES='pthread pthread'"));
    CHECK(all_pass(3, "opencl", "POCL_DEVICES='pthread pthread'"));
}

static void test_peak(void) {
    CHECK(all_pass(2, "peak", ""));
    CHECK(all_pass(3, "peak", ""));
}

static void test_cap(void) { CHECK(all_pass(3, "cap", "EMBER_MEMORY_CAP=24MB")); }

static double next_loss(void) {
    const char *p = strstr(out, "next-step loss ");
    return p ? atof(p + strlen("next-step loss ")) : NAN;
}

static void test_checkpoint_reshard(void) {
    char dir[64], env[160];
    snprintf(dir, sizeof dir, "/tmp/ember-test-zero-%d", (int)getpid());
    snprintf(env, sizeof env, "EMBER_TEST_ZERO_DIR=%s", dir);
    CHECK(all_pass(2, "ckpt_save", env));
    double want = next_loss();
    CHECK(isfinite(want));
    snprintf(env, sizeof env, "EMBER_TEST_ZERO_DIR=%s EMBER_TEST_ZERO_STAGE=3", dir);
    CHECK(all_pass(3, "ckpt_load", env));
    double on3 = next_loss();
    snprintf(env, sizeof env, "EMBER_TEST_ZERO_DIR=%s EMBER_TEST_ZERO_STAGE=1", dir);
    CHECK(all_pass(1, "ckpt_load", env));
    double on1 = next_loss();
    printf("next-step loss: 2 ranks %.9f, resumed on 3 ranks (stage 3) %.9f, on 1 rank (stage 1) %.9f\n", want, on3, on1);
    CHECK(fabs(on3 - want) <= 1e-6);
    CHECK(fabs(on1 - want) <= 1e-6);
    for (int r = 0; r < 2; r++) {
        char path[128];
        snprintf(path, sizeof path, "%s/rank-%d.safetensors", dir, r);
        unlink(path);
    }
    rmdir(dir);
}

/* The pid of mpirun's child with OMPI_COMM_WORLD_RANK=rank, or -1 (as test_tool_train_dist). */
static pid_t rank_pid(pid_t mpirun, int rank) {
    char path[64], want[48];
    snprintf(want, sizeof want, "OMPI_COMM_WORLD_RANK=%d", rank);
    DIR *d = opendir("/proc");
    if (!d) return -1;
    pid_t found = -1;
    for (struct dirent *e; found < 0 && (e = readdir(d));) {
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid <= 0) continue;
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        int ppid = 0;
        char comm[64];
        if (fscanf(f, "%*d (%63[^)]) %*c %d", comm, &ppid) != 2) ppid = 0;
        fclose(f);
        if (ppid != mpirun) continue;
        snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
        f = fopen(path, "r");
        if (!f) continue;
        static char env[1 << 16];
        size_t n = fread(env, 1, sizeof env - 1, f);
        fclose(f);
        env[n] = '\0';
        for (size_t i = 0; i < n; i += strlen(env + i) + 1)
            if (!strcmp(env + i, want)) found = pid;
    }
    closedir(d);
    return found;
}

/* A rank killed with SIGKILL mid-training ends the job within 30 s, non-zero, naming it. */
static void test_rank_killed(void) {
    char log[64], self[PATH_MAX];
    snprintf(log, sizeof log, "/tmp/ember-test-zero-kill-%d.log", (int)getpid());
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(len > 0);
    if (len <= 0) return;
    self[len] = '\0';
    fflush(stdout);
    fflush(stderr);
    pid_t mpirun = fork();
    if (mpirun == 0) {
        FILE *f = freopen(log, "w", stdout);
        if (!f || dup2(fileno(stdout), 2) < 0) _exit(127);
        setenv("EMBER_TEST_DIST_MODE", "long", 1);
        execlp("mpirun", "mpirun", "--oversubscribe", "--allow-run-as-root", "--mca", "btl", "self,vader,tcp", "-np", "2",
               self, (char *)NULL);
        _exit(127);
    }
    CHECK(mpirun > 0);
    bool started = false;
    for (int i = 0; i < 600 && !started; i++) {
        usleep(100000);
        FILE *f = fopen(log, "r");
        if (!f) continue;
        size_t n = fread(out, 1, sizeof out - 1, f);
        out[n] = '\0';
        fclose(f);
        started = dist_count(out, ": training") == 2;
    }
    CHECK(started);
    usleep(300000);
    pid_t victim = rank_pid(mpirun, 1);
    CHECK(victim > 0);
    int status = 0;
    double t0 = now_s();
    if (victim > 0) kill(victim, SIGKILL);
    bool ended = false;
    while (!ended && now_s() - t0 < 60) {
        if (waitpid(mpirun, &status, WNOHANG) == mpirun) ended = true;
        else usleep(50000);
    }
    double took = now_s() - t0;
    if (!ended) {
        kill(mpirun, SIGKILL);
        waitpid(mpirun, &status, 0);
    }
    CHECK(ended && took < 30);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) != 0);
    FILE *f = fopen(log, "r");
    size_t n = f ? fread(out, 1, sizeof out - 1, f) : 0;
    out[n] = '\0';
    if (f) fclose(f);
    CHECK(strstr(out, "rank 1") != NULL && strstr(out, "signal 9") != NULL);
    printf("rank 1 killed during ZeRO-2 training: the job ended after %.2f s, exit %d\n", took,
           WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    if (!(ended && took < 30) || !strstr(out, "signal 9")) fprintf(stderr, "%s\n", out);
    unlink(log);
}

int main(void) {
    const char *mode = dist_mode();
    if (mode) return rank_main(mode);
    const char *why = dist_unavailable();
    if (why) {
        test_skip_case("test_zero", "%s", why);
        return test_summary();
    }
    RUN(test_train_cpu);
    RUN(test_train_pocl);
    RUN(test_peak);
    RUN(test_cap);
    RUN(test_checkpoint_reshard);
    RUN(test_rank_killed);
    return test_summary();
}
