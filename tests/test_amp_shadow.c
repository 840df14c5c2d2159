/* The fused Adam step's low-precision weight copy (src/core/lowp_shadow.c): after a
 * cast of a float32 parameter to bf16/f16 asked for one, the step writes the copy and the
 * next cast hands it out. Checked: the copy is bit for bit the cast of the new weights (bf16
 * and f16, a size the CPU splits across threads); a cast really took it; an in-place write to
 * the parameter, or to a handed-out copy, makes the next cast a fresh one; two casts never
 * share memory; gradients through it are float32 and exact; autocast regions get it too; an
 * optimizer asked for none (em_adam_opts' no_lowp_copy) keeps none and steps to the same bits. */
#include <stdlib.h>
#include <string.h>
#include "test.h"
#include "core/core_internal.h"

/* A Linear(in, out) trained by Adam on a fixed batch in dt (bf16 or f16), casting its
 * float32 weight by hand each step, as bench/amp_matmul.c does. */
typedef struct rig {
    em_module *m;
    em_optimizer *opt;
    em_tensor *w, *b, *x;
} rig;

static rig rig_new(int64_t in, int64_t out) {
    rig r;
    em_manual_seed(11);
    r.m = em_nn_linear(in, out);
    r.opt = em_adam(r.m, 1e-2);
    em_named_tensor p[2];
    CHECK(em_module_parameters(r.m, p, 2) == 2);
    r.w = p[0].tensor;
    r.b = p[1].tensor;
    r.x = em_keep(em_randn(EM_SHAPE(16, in), EM_OPTS(0)));
    return r;
}

static void rig_free(rig *r) {
    em_optim_free(r->opt);
    em_module_free(r->m);
    em_release(r->x);
}

/* One step; returns the cast of w this step's forward used (kept: the caller releases). */
static em_tensor *rig_step(rig *r, em_dtype dt) {
    em_scope s = em_scope_begin();
    CHECK_OK(em_zero_grad(r->opt));
    em_tensor *wl = em_to_dtype(r->w, dt);
    em_tensor *y = em_addmm(em_to_dtype(r->b, dt), em_to_dtype(r->x, dt), em_transpose(wl, 0, 1), 1.0, 1.0);
    em_tensor *yf = em_to_dtype(y, EM_F32);
    CHECK_OK(em_backward(em_mean(em_mul(yf, yf), EM_ALL_DIMS, false)));
    CHECK_OK(em_step(r->opt));
    em_keep(wl);
    em_scope_end(s);
    return wl;
}

/* The cast the copy must equal: of the same values, through a tensor that is no parameter. */
static em_tensor *plain_cast(em_tensor *w, em_dtype dt) { return em_to_dtype(em_clone(em_detach(w)), dt); }

static void check_copy_matches_cast(em_dtype dt) {
    int threads = em_get_num_threads();
    em_set_num_threads(2);
    em_scope s = em_scope_begin();
    rig r = rig_new(301, 257); /* 77357 weights: split across the two threads */
    em_storage *prev = NULL;
    for (int step = 0; step < 3; step++) {
        em_tensor *used = rig_step(&r, dt);
        if (step > 0) CHECK(used->storage == prev); /* the forward took the last step's copy */
        em_release(used);
        em_dtype asked = EM_F32;
        CHECK(em__shadow_of(r.w, &asked) != NULL && asked == dt);
        prev = em__shadow_of(r.w, NULL);
        em_scope in = em_scope_begin();
        em_tensor *got = em_to_dtype(r.w, dt);
        CHECK(got && got->storage == prev);                  /* handed out, not cast */
        CHECK(test_same_bits(got, plain_cast(r.w, dt)));          /* bit for bit the cast */
        CHECK(em_requires_grad(got) && em_grad_fn_name(got) != NULL); /* recorded like a cast */
        em_scope_end(in);
    }
    rig_free(&r);
    em_scope_end(s);
    em_set_num_threads(threads);
}

static void test_copy_is_the_cast_bf16(void) { check_copy_matches_cast(EM_BF16); }
static void test_copy_is_the_cast_f16(void) { check_copy_matches_cast(EM_F16); }

static void test_inplace_write_drops_the_copy(void) {
    em_scope s = em_scope_begin();
    rig r = rig_new(8, 5);
    em_release(rig_step(&r, EM_BF16));
    em_storage *copy = em__shadow_of(r.w, NULL);
    CHECK(copy != NULL);
    em_grad_mode g = em_no_grad_begin();
    CHECK_OK(em_mul_scalar_(r.w, 3.0)); /* the parameter changes after the step */
    em_no_grad_end(g);
    em_tensor *got = em_to_dtype(r.w, EM_BF16);
    /* not the stale copy: its bits are the old weights'. (Comparing storage addresses would
     * not tell: the stale copy is freed inside the cast, whose new storage may reuse its
     * address.) */
    CHECK(got != NULL);
    CHECK(test_same_bits(got, plain_cast(r.w, EM_BF16)));
    CHECK(em__shadow_of(r.w, NULL) == NULL); /* the stale copy is freed at once */
    rig_free(&r);
    em_scope_end(s);
}

static void test_casts_never_share_memory(void) {
    em_scope s = em_scope_begin();
    rig r = rig_new(8, 5);
    em_release(rig_step(&r, EM_BF16));
    em_tensor *want = plain_cast(r.w, EM_BF16), *b;
    em_scope in = em_scope_begin();
    em_tensor *a = em_to_dtype(r.w, EM_BF16);
    b = em_keep(em_to_dtype(r.w, EM_BF16));
    CHECK(a->storage == em__shadow_of(r.w, NULL));
    CHECK(b->storage != a->storage); /* the copy is held: the second cast is a new one */
    em_grad_mode g = em_no_grad_begin();
    CHECK_OK(em_fill_(a, 7.0));      /* writing one cast leaves the other alone */
    em_no_grad_end(g);
    CHECK(test_same_bits(b, want));
    em_scope_end(in);                /* a goes; the copy it wrote is not handed out again */
    em_tensor *c = em_to_dtype(r.w, EM_BF16);
    CHECK(test_same_bits(c, want));
    CHECK(em__shadow_of(r.w, NULL) == NULL);
    em_release(b);
    rig_free(&r);
    em_scope_end(s);
}

/* d/dw sum(float(bf16(w)) * k) is k: float32 and exact where k is a bf16 value. */
static void test_gradient_through_the_copy(void) {
    em_scope s = em_scope_begin();
    rig r = rig_new(6, 4);
    em_release(rig_step(&r, EM_BF16));
    CHECK_OK(em_zero_grad(r.opt));
    float kv[24];
    for (int i = 0; i < 24; i++) kv[i] = (float)(i % 5) - 2.0f;
    em_tensor *k = em_from_data(kv, EM_F32, EM_SHAPE(4, 6), EM_OPTS(0));
    em_tensor *wl = em_to_dtype(r.w, EM_BF16);
    CHECK(wl->storage == em__shadow_of(r.w, NULL));
    CHECK_OK(em_backward(em_sum(em_mul(em_to_dtype(wl, EM_F32), k), EM_ALL_DIMS, false)));
    em_tensor *gw = em_grad(r.w);
    CHECK(gw && em_dtype_of(gw) == EM_F32 && test_same_bits(gw, k));
    rig_free(&r);
    em_scope_end(s);
}

/* Autocast's casts (Linear under a region) take the copy too, and see every step. */
static void test_autocast_region_uses_the_copy(void) {
    em_scope s = em_scope_begin();
    rig r = rig_new(12, 7);
    for (int step = 0; step < 3; step++) {
        em_scope st = em_scope_begin();
        CHECK_OK(em_zero_grad(r.opt));
        em_autocast ac = em_autocast_begin(EM_CPU, EM_BF16);
        em_storage *copy = em__shadow_of(r.w, NULL);
        em_tensor *y = em_forward(r.m, r.x);
        /* the same forward from a plain cast of the current weights */
        em_tensor *want = em_addmm(plain_cast(r.b, EM_BF16), em_to_dtype(r.x, EM_BF16),
                                   em_transpose(plain_cast(r.w, EM_BF16), 0, 1), 1.0, 1.0);
        CHECK(y && em_dtype_of(y) == EM_BF16 && test_same_bits(y, want));
        if (step > 0) CHECK(copy != NULL && em__shadow_of(r.w, NULL) == copy);
        CHECK_OK(em_backward(em_sum(em_mul(y, y), EM_ALL_DIMS, false)));
        CHECK_OK(em_autocast_end(ac));
        CHECK(em_dtype_of(em_grad(r.w)) == EM_F32);
        CHECK_OK(em_step(r.opt));
        em_scope_end(st);
    }
    rig_free(&r);
    em_scope_end(s);
}

/* Tensors that are not parameters, or not all of their storage, never get a copy. */
static void test_only_whole_parameters(void) {
    em_scope s = em_scope_begin();
    rig r = rig_new(8, 5);
    em_release(rig_step(&r, EM_BF16));
    em_tensor *row = em_narrow(r.w, 0, 1, 2);  /* a view: cast as usual */
    CHECK(em_to_dtype(row, EM_BF16)->storage != em__shadow_of(r.w, NULL));
    CHECK(em_to_dtype(em_detach(r.w), EM_BF16)->storage != em__shadow_of(r.w, NULL));
    CHECK(em__shadow_of(r.b, NULL) != NULL); /* the bias was cast too: it has one */
    rig_free(&r);
    em_scope_end(s);
}

/* em_adam_opts' no_lowp_copy: the steps keep no copy (every cast is a fresh one), and the
 * weights come out bit for bit as with the copies. */
static void test_optimizer_without_copies(void) {
    int threads = em_get_num_threads();
    em_set_num_threads(2);
    em_scope s = em_scope_begin();
    rig with = rig_new(301, 257), without = rig_new(301, 257); /* the same seed: the same weights */
    em_optim_free(without.opt);
    em_adam_opts o = em_adam_defaults(1e-2);
    o.no_lowp_copy = true;
    without.opt = em_adam_ex(without.m, o);
    CHECK(without.opt != NULL);
    for (int step = 0; step < 3 && without.opt; step++) {
        em_release(rig_step(&with, EM_BF16));
        em_tensor *used = rig_step(&without, EM_BF16);
        CHECK(used && used->storage != em__shadow_of(without.w, NULL));
        em_release(used);
        CHECK(em__shadow_of(with.w, NULL) != NULL);
        CHECK(em__shadow_of(without.w, NULL) == NULL && em__shadow_of(without.b, NULL) == NULL);
        CHECK(test_same_bits(with.w, without.w) && test_same_bits(with.b, without.b));
    }
    rig_free(&with);
    rig_free(&without);
    em_scope_end(s);
    em_set_num_threads(threads);
}

/* Without a copy, the cast of a parameter's transpose keeps the view's strides (as the copy
 * does, and PyTorch's .to()), so that the products reading it round alike either way; its
 * values are the contiguous cast's. A view that is not the whole parameter is cast as usual. */
static void test_cast_keeps_a_views_layout(void) {
    em_scope s = em_scope_begin();
    em_manual_seed(5);
    em_tensor *w = em_randn(EM_SHAPE(37, 19), EM_OPTS(.requires_grad = true));
    em_tensor *wt = em_transpose(w, 0, 1);
    em_tensor *kept = em_to_dtype(wt, EM_BF16);
    CHECK(kept && em_stride(kept, 0) == 1 && em_stride(kept, 1) == 19);
    em_tensor *plain = em_to_dtype(em_contiguous(em_detach(wt)), EM_BF16);
    CHECK(kept && plain && test_same_bits(em_contiguous(kept), plain));
    em_tensor *part = em_to_dtype(em_narrow(wt, 1, 0, 5), EM_BF16);
    CHECK(part && em_is_contiguous(part));
    /* the gradient still reaches the parameter, float32 and transposed back */
    CHECK_OK(em_backward(em_sum(em_to_dtype(kept, EM_F32), EM_ALL_DIMS, false)));
    CHECK(em_grad(w) && em_dtype_of(em_grad(w)) == EM_F32 && em_size(em_grad(w), 0) == 37);
    em_scope_end(s);
}

int main(void) {
    RUN(test_copy_is_the_cast_bf16);
    RUN(test_copy_is_the_cast_f16);
    RUN(test_inplace_write_drops_the_copy);
    RUN(test_casts_never_share_memory);
    RUN(test_gradient_through_the_copy);
    RUN(test_autocast_region_uses_the_copy);
    RUN(test_only_whole_parameters);
    RUN(test_optimizer_without_copies);
    RUN(test_cast_keeps_a_views_layout);
    return test_summary();
}
