/* Tensor objects: creation, properties, reference counts, scopes, host access. */
#include <pthread.h>
#include "test_core_util.h"

static void test_zeros_ones_full(void) {
    em_tensor *z = em_zeros(EM_SHAPE(2, 3), (em_opts){0});
    CHECK_SHAPE(z, 2, 3);
    CHECK(em_dtype_of(z) == EM_F32);
    CHECK(em_device_of(z).type == EM_CPU);
    CHECK(em_numel(z) == 6 && em_nbytes(z) == 24);
    CHECK(em_is_contiguous(z));
    CHECK(em_stride(z, 0) == 3 && em_stride(z, 1) == 1 && em_stride(z, -2) == 3);
    CHECK_VALUES(z, 0, 0, 0, 0, 0, 0, 0);
    em_tensor *o = em_ones(EM_SHAPE(4), EM_OPTS(.dtype = EM_I32));
    CHECK(em_dtype_of(o) == EM_I32);
    CHECK_VALUES(o, 0, 1, 1, 1, 1);
    em_tensor *f = em_full(EM_SHAPE(1, 2), 2.5, EM_OPTS(.dtype = EM_F16));
    CHECK_VALUES(f, 0, 2.5, 2.5);
    em_tensor *s = em_scalar(-7, EM_OPTS(.dtype = EM_I64));
    CHECK(em_ndim(s) == 0 && em_numel(s) == 1);
    CHECK(em_item(s) == -7);
    em_tensor *e = em_empty(EM_SHAPE(0, 5), (em_opts){0});
    CHECK(em_numel(e) == 0 && em_nbytes(e) == 0 && em_is_contiguous(e));
    em_release(z); em_release(o); em_release(f); em_release(s); em_release(e);
}

static void test_bad_creation(void) {
    CHECK(em_zeros(EM_SHAPE(2, -3), (em_opts){0}) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "em_zeros: negative dimension -3 in shape [2, -3]");
    em_shape nine = {9, {1, 1, 1, 1, 1, 1, 1, 1}};
    CHECK(em_empty(nine, (em_opts){0}) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "0 to 8 dims, got 9");
    CHECK(em_ones(EM_SHAPE(2), EM_OPTS(.dtype = (em_dtype)77)) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "invalid dtype 77");
    CHECK(em_zeros(EM_SHAPE(2), EM_OPTS(.dtype = EM_I64, .requires_grad = true)) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "Only Tensors of floating point dtype can require gradients");
    CHECK(em_zeros(EM_SHAPE(1 << 30, 1 << 30, 1 << 30), (em_opts){0}) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "too many elements");
    CHECK(em_zeros(EM_SHAPE(2), EM_OPTS(.device = EM_DEVICE(EM_MPS, 0), .pin_memory = true)) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "pin_memory is only for CPU tensors");
    em_tensor *g = em_zeros(EM_SHAPE(2), EM_OPTS(.requires_grad = true));
    CHECK(g && g->requires_grad && g->is_leaf);
    em_release(g);
}

static void test_pinned(void) {
    em_tensor *p = em_ones(EM_SHAPE(3), EM_OPTS(.pin_memory = true));
    CHECK(p && p->storage->pinned);
    CHECK_VALUES(p, 0, 1, 1, 1);
    em_release(p);
}

static void test_arange(void) {
    em_tensor *a = em_arange(0, 5, 1, (em_opts){0});
    CHECK_SHAPE(a, 5);
    CHECK_VALUES(a, 0, 0, 1, 2, 3, 4);
    em_tensor *b = em_arange(1, 2, 0.25, EM_OPTS(.dtype = EM_F64));
    CHECK_VALUES(b, 0, 1, 1.25, 1.5, 1.75);
    em_tensor *c = em_arange(5, 0, -2, EM_OPTS(.dtype = EM_I64));
    CHECK_VALUES(c, 0, 5, 3, 1);
    em_tensor *d = em_arange(3, 3, 1, (em_opts){0});
    CHECK(em_numel(d) == 0);
    CHECK(em_arange(0, 5, 0, (em_opts){0}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "step must be nonzero");
    CHECK(em_arange(0, 5, -1, (em_opts){0}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "inconsistent with step sign");
    CHECK(em_arange(0, INFINITY, 1, (em_opts){0}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "unsupported range");
    em_release(a); em_release(b); em_release(c); em_release(d);
}

static void test_linspace_eye(void) {
    em_tensor *l = em_linspace(0, 1, 5, (em_opts){0});
    CHECK_VALUES(l, 1e-7, 0, 0.25, 0.5, 0.75, 1);
    em_tensor *l3 = em_linspace(0.1, 0.7, 7, EM_OPTS(.dtype = EM_F64));
    CHECK(tval(l3, 6) == 0.7); /* the last element is exactly `end` */
    em_tensor *one = em_linspace(3, 9, 1, (em_opts){0});
    CHECK_VALUES(one, 0, 3);
    em_tensor *none = em_linspace(3, 9, 0, (em_opts){0});
    CHECK(none && em_numel(none) == 0);
    CHECK(em_linspace(0, 1, -1, (em_opts){0}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "non-negative");
    em_tensor *e = em_eye(3, -1, (em_opts){0});
    CHECK_SHAPE(e, 3, 3);
    CHECK_VALUES(e, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1);
    em_tensor *r = em_eye(2, 4, EM_OPTS(.dtype = EM_I64));
    CHECK_VALUES(r, 0, 1, 0, 0, 0, 0, 1, 0, 0);
    em_tensor *t = em_eye(3, 2, (em_opts){0});
    CHECK_VALUES(t, 0, 1, 0, 0, 1, 0, 0);
    em_tensor *z = em_eye(0, 3, (em_opts){0});
    CHECK_SHAPE(z, 0, 3);
    CHECK(em_eye(-2, 2, (em_opts){0}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "non-negative");
    em_release(l); em_release(l3); em_release(one); em_release(none); em_release(e); em_release(r);
    em_release(t); em_release(z);
}

static void test_from_data(void) {
    int64_t src[] = {1, -2, 300};
    em_tensor *f = em_from_data(src, EM_I64, EM_SHAPE(3), (em_opts){0});
    CHECK(em_dtype_of(f) == EM_F32);
    CHECK_VALUES(f, 0, 1, -2, 300);
    float fl[] = {1.75f, -2.5f, 65504.f, 1e6f};
    em_tensor *i = em_from_data(fl, EM_F32, EM_SHAPE(2, 2), EM_OPTS(.dtype = EM_I32));
    CHECK_VALUES(i, 0, 1, -2, 65504, 1000000); /* truncation toward zero, like a C cast */
    em_tensor *h = em_from_data(fl, EM_F32, EM_SHAPE(4), EM_OPTS(.dtype = EM_F16));
    CHECK_VALUES(h, 0, 1.75, -2.5, 65504, INFINITY);
    /* The tensor owns a copy: changing the source afterwards changes nothing. */
    fl[0] = 99;
    em_tensor *c = em_from_data(fl, EM_F32, EM_SHAPE(1), (em_opts){0});
    fl[0] = 5;
    CHECK_VALUES(c, 0, 99);
    CHECK(em_from_data(NULL, EM_F32, EM_SHAPE(2), (em_opts){0}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "'data' is NULL");
    em_tensor *empty = em_from_data(NULL, EM_F32, EM_SHAPE(0), (em_opts){0});
    CHECK(empty && em_numel(empty) == 0);
    em_tensor *g = em_from_data(fl, EM_F32, EM_SHAPE(2), EM_OPTS(.requires_grad = true));
    CHECK(g && g->requires_grad);
    em_release(f); em_release(i); em_release(h); em_release(c); em_release(empty); em_release(g);
}

static void test_like(void) {
    em_tensor *a = em_full(EM_SHAPE(2, 2), 3, EM_OPTS(.dtype = EM_F64, .requires_grad = true));
    em_tensor *z = em_zeros_like(a), *o = em_ones_like(a), *e = em_empty_like(a);
    CHECK(em_dtype_of(z) == EM_F64 && em_dtype_of(o) == EM_F64 && em_dtype_of(e) == EM_F64);
    CHECK_SHAPE(e, 2, 2);
    CHECK(!z->requires_grad);
    CHECK_VALUES(z, 0, 0, 0, 0, 0);
    CHECK_VALUES(o, 0, 1, 1, 1, 1);
    CHECK(em_zeros_like(NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_zeros_like: argument 't' is NULL");
    em_release(a); em_release(z); em_release(o); em_release(e);
}

static void test_refcounts(void) {
    em_tensor *a = em_ones(EM_SHAPE(4), (em_opts){0});
    CHECK(atomic_load(&a->refcount) == 1);
    CHECK(em_retain(a) == a);
    CHECK(atomic_load(&a->refcount) == 2);
    em_release(a);
    CHECK(atomic_load(&a->storage->refcount) == 1);
    em_tensor *v = em_narrow(a, 0, 1, 2);
    CHECK(atomic_load(&a->storage->refcount) == 2);
    CHECK(em_shares_storage(a, v));
    em_release(a); /* the view keeps the storage alive */
    CHECK_VALUES(v, 0, 1, 1);
    em_release(v);
    em_release(NULL);
    CHECK(em_retain(NULL) == NULL);
}

static void test_scopes(void) {
    em_tensor *kept;
    em_scope s = em_scope_begin();
    em_tensor *a = em_ones(EM_SHAPE(3), (em_opts){0});
    em_tensor *b = em_add(a, a);
    kept = em_keep(b);
    CHECK(atomic_load(&b->refcount) == 2);
    {
        em_scope inner = em_scope_begin();
        em_tensor *c = em_mul(b, b);
        CHECK(atomic_load(&c->refcount) == 1);
        em_tensor *d = em_keep(c);
        em_scope_end(inner);
        CHECK(atomic_load(&d->refcount) == 1);
        CHECK_VALUES(d, 0, 4, 4, 4);
        em_release(d);
    }
    em_scope_end(s);
    em_scope_end(s); /* ending twice does nothing */
    CHECK(atomic_load(&kept->refcount) == 1);
    CHECK_VALUES(kept, 0, 2, 2, 2);
    em_release(kept);
    /* Ending an outer scope also ends the ones inside it. */
    em_scope outer = em_scope_begin();
    em_scope inner = em_scope_begin();
    em_ones(EM_SHAPE(2), (em_opts){0});
    em_scope_end(outer);
    em_scope_end(inner); /* already covered */
    CHECK(em_keep(NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_keep");
    /* Without a scope, results belong to the caller. */
    em_tensor *free_me = em_ones(EM_SHAPE(1), (em_opts){0});
    CHECK(atomic_load(&free_me->refcount) == 1);
    em_release(free_me);
}

static void test_scope_loop(void) {
    /* Many iterations: no handle outlives its iteration (ASan's leak check verifies). */
    em_tensor *acc = em_zeros(EM_SHAPE(8), (em_opts){0});
    for (int i = 0; i < 200; i++) {
        em_scope s = em_scope_begin();
        em_tensor *x = em_full(EM_SHAPE(8), 1, (em_opts){0});
        em_tensor *y = em_mul_scalar(em_add(x, x), 0.5);
        CHECK_OK(em_add_(acc, y, 1));
        em_scope_end(s);
    }
    CHECK(tval(acc, 7) == 200);
    em_release(acc);
}

static void test_properties(void) {
    em_tensor *t = em_zeros(EM_SHAPE(2, 3, 4), EM_OPTS(.dtype = EM_I32));
    CHECK(em_ndim(t) == 3);
    CHECK(em_size(t, -1) == 4 && em_size(t, 0) == 2);
    CHECK(em_size(t, 3) == -1);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Dimension out of range (expected to be in range of [-3, 2], but got 3)");
    CHECK(em_stride(t, -4) == -1);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Dimension out of range");
    em_shape s = em_shape_of(t);
    CHECK(s.ndim == 3 && s.d[0] == 2 && s.d[1] == 3 && s.d[2] == 4);
    CHECK(em_nbytes(t) == 96);
    em_tensor *z = em_scalar(1, (em_opts){0});
    CHECK(em_size(z, 0) == -1);
    CHECK_ERROR(EM_ERR_ARGUMENT, "tensor has no dimensions");
    CHECK(em_ndim(NULL) == -1);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_ndim");
    CHECK(em_numel(NULL) == -1);
    em_clear_error();
    CHECK(!em_shares_storage(t, z) && !em_shares_storage(NULL, t));
    em_release(t);
    em_release(z);
}

static void test_host_access(void) {
    em_tensor *t = TF32(EM_SHAPE(2, 2), 1, 2, 3, 4);
    float *p = em_data_ptr(t);
    CHECK(p && p[3] == 4);
    p[0] = 10; /* writes through */
    em_scope s = em_scope_begin();
    CHECK(em_item(em_select(em_select(t, 0, 0), 0, 0)) == 10);
    em_scope_end(s);
    float out[4] = {0};
    CHECK(em_copy_to_host(t, out, 8) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "destination has 8 bytes, the tensor needs 16 (4 x float32)");
    CHECK_OK(em_copy_to_host(t, out, sizeof out));
    CHECK(out[0] == 10 && out[3] == 4);
    /* A transposed view reads back in its own row-major order. */
    em_tensor *tt = em_transpose(t, 0, 1);
    CHECK_OK(em_copy_to_host(tt, out, sizeof out));
    CHECK(out[0] == 10 && out[1] == 3 && out[2] == 2 && out[3] == 4);
    CHECK(isnan(em_item(t)));
    CHECK_ERROR(EM_ERR_ARGUMENT, "a Tensor with 4 elements cannot be converted to Scalar");
    CHECK(isnan(em_item(NULL)));
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_item");
    CHECK(em_data_ptr(NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_data_ptr");
    em_release(tt);
    em_release(t);
}

/* Each thread has its own scopes and error state; a shared input is only read. */
static em_tensor *g_shared;

static void *thread_work(void *arg) {
    intptr_t id = (intptr_t)arg;
    bool ok = true;
    for (int i = 0; i < 100 && ok; i++) {
        em_scope s = em_scope_begin();
        em_tensor *x = em_add_scalar(em_mul_scalar(g_shared, (double)id), 1);
        ok = x && tval(x, 3) == 3.0 * (double)id + 1 && !em_failed();
        em_scope_end(s);
    }
    if (id == 2) em_error(EM_ERR_IO, "only in thread 2");
    return (void *)(intptr_t)ok;
}

static void test_threads(void) {
    g_shared = em_arange(0, 8, 1, (em_opts){0});
    pthread_t th[4];
    for (intptr_t i = 0; i < 4; i++) pthread_create(&th[i], NULL, thread_work, (void *)i);
    for (int i = 0; i < 4; i++) {
        void *ok = NULL;
        pthread_join(th[i], &ok);
        CHECK(ok == (void *)1);
    }
    CHECK(!em_failed());
    CHECK(atomic_load(&g_shared->refcount) == 1);
    em_release(g_shared);
}

int main(void) {
    RUN(test_zeros_ones_full);
    RUN(test_bad_creation);
    RUN(test_pinned);
    RUN(test_arange);
    RUN(test_linspace_eye);
    RUN(test_from_data);
    RUN(test_like);
    RUN(test_refcounts);
    RUN(test_scopes);
    RUN(test_scope_loop);
    RUN(test_properties);
    RUN(test_host_access);
    RUN(test_threads);
    return test_summary();
}
