/* Elementwise op dispatch: broadcasting, promotion, scalars, unary math, where, in-place ops,
 * device checks and error paths. Every test runs in a scope. */
#include "test_core_util.h"
#include "autograd/record.h"

#define BEGIN em_scope sc__ = em_scope_begin()
#define END em_scope_end(sc__)

static void test_binary_basic(void) {
    BEGIN;
    em_tensor *a = TF32(EM_SHAPE(2, 2), 1, 2, 3, 4), *b = TF32(EM_SHAPE(2, 2), 10, 20, 30, 40);
    CHECK_VALUES(em_add(a, b), 0, 11, 22, 33, 44);
    CHECK_VALUES(em_sub(a, b), 0, -9, -18, -27, -36);
    CHECK_VALUES(em_mul(a, b), 0, 10, 40, 90, 160);
    CHECK_VALUES(em_div(b, a), 1e-6, 10, 10, 10, 10);
    CHECK_VALUES(em_pow(a, TF32(EM_SHAPE(2, 2), 2, 0.5, 0, -1)), 1e-6, 1, 1.41421356, 1, 0.25);
    CHECK_VALUES(em_maximum(a, TF32(EM_SHAPE(2, 2), 0, 5, 3, -1)), 0, 1, 5, 3, 4);
    CHECK_VALUES(em_minimum(a, TF32(EM_SHAPE(2, 2), 0, 5, 3, -1)), 0, 0, 2, 3, -1);
    em_tensor *eq = em_eq(a, TF32(EM_SHAPE(2, 2), 1, 0, 3, 0));
    CHECK(em_dtype_of(eq) == EM_BOOL);
    CHECK_VALUES(eq, 0, 1, 0, 1, 0);
    CHECK_VALUES(em_ne(a, TF32(EM_SHAPE(2, 2), 1, 0, 3, 0)), 0, 0, 1, 0, 1);
    em_tensor *two = em_full(EM_SHAPE(2, 2), 2, (em_opts){0});
    CHECK_VALUES(em_lt(a, two), 0, 1, 0, 0, 0);
    CHECK_VALUES(em_le(a, two), 0, 1, 1, 0, 0);
    CHECK_VALUES(em_gt(a, two), 0, 0, 0, 1, 1);
    CHECK_VALUES(em_ge(a, two), 0, 0, 1, 1, 1);
    END;
}

static void test_broadcast(void) {
    BEGIN;
    em_tensor *col = TF32(EM_SHAPE(3, 1), 1, 2, 3), *row = TF32(EM_SHAPE(4), 10, 20, 30, 40);
    em_tensor *s = em_add(col, row);
    CHECK_SHAPE(s, 3, 4);
    CHECK_VALUES(s, 0, 11, 21, 31, 41, 12, 22, 32, 42, 13, 23, 33, 43);
    em_tensor *z = em_scalar(2, (em_opts){0});
    CHECK_VALUES(em_mul(row, z), 0, 20, 40, 60, 80);
    CHECK_SHAPE0(em_mul(z, z));
    em_tensor *a = em_ones(EM_SHAPE(2, 3), (em_opts){0});
    CHECK(em_add(a, row) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "em_add: shapes [2, 3] and [4] cannot be broadcast: dim -1 is 3 vs 4");
    CHECK(em_mul(row, a) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "em_mul: shapes [4] and [2, 3] cannot be broadcast: dim -1 is 4 vs 3");
    CHECK(em_sub(em_ones(EM_SHAPE(2, 1, 3), (em_opts){0}), em_ones(EM_SHAPE(4, 2), (em_opts){0})) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "shapes [2, 1, 3] and [4, 2] cannot be broadcast: dim -1 is 3 vs 2");
    /* Broadcasting against an empty dim gives an empty result. */
    em_tensor *e = em_add(em_ones(EM_SHAPE(0, 1), (em_opts){0}), row);
    CHECK_SHAPE(e, 0, 4);
    END;
}

static void test_non_contiguous_inputs(void) {
    BEGIN;
    em_tensor *m = em_view(em_arange(0, 6, 1, (em_opts){0}), EM_SHAPE(2, 3));
    em_tensor *t = em_transpose(m, 0, 1); /* [[0, 3], [1, 4], [2, 5]] */
    em_tensor *r = em_add(t, t);
    CHECK(em_is_contiguous(r));
    CHECK_VALUES(r, 0, 0, 6, 2, 8, 4, 10);
    em_tensor *sl = em_slice(em_arange(0, 10, 1, (em_opts){0}), 0, 1, 10, 3); /* 1, 4, 7 */
    CHECK_VALUES(em_mul(sl, em_expand(em_scalar(2, (em_opts){0}), EM_SHAPE(3))), 0, 2, 8, 14);
    CHECK_VALUES(em_exp(em_select(t, 1, 0)), 1e-5, 1, 2.718281828, 7.389056099);
    END;
}

static void test_promotion(void) {
    BEGIN;
    em_tensor *i = TI64(EM_SHAPE(3), 1, 2, 3);
    em_tensor *f = TF32(EM_SHAPE(3), 0.5, 0.5, 0.5);
    em_tensor *h = em_ones(EM_SHAPE(3), EM_OPTS(.dtype = EM_F16));
    em_tensor *bf = em_ones(EM_SHAPE(3), EM_OPTS(.dtype = EM_BF16));
    em_tensor *b = em_from_data((const uint8_t[]){1, 0, 1}, EM_BOOL, EM_SHAPE(3), EM_OPTS(.dtype = EM_BOOL));
    em_tensor *i32 = em_ones(EM_SHAPE(3), EM_OPTS(.dtype = EM_I32));
    CHECK(em_dtype_of(em_add(i, f)) == EM_F32);
    CHECK_VALUES(em_add(i, f), 0, 1.5, 2.5, 3.5);
    CHECK(em_dtype_of(em_add(h, bf)) == EM_F32);
    CHECK(em_dtype_of(em_mul(h, f)) == EM_F32);
    CHECK(em_dtype_of(em_mul(i, h)) == EM_F16);
    CHECK(em_dtype_of(em_add(b, i32)) == EM_I32);
    CHECK(em_dtype_of(em_add(i32, i)) == EM_I64);
    CHECK(em_dtype_of(em_add(b, b)) == EM_BOOL);
    /* A 0-d tensor widens only across categories. */
    em_tensor *d0 = em_scalar(2.5, EM_OPTS(.dtype = EM_F64));
    CHECK(em_dtype_of(em_mul(h, d0)) == EM_F16);
    CHECK(em_dtype_of(em_mul(i32, d0)) == EM_F64);
    CHECK(em_dtype_of(em_mul(i32, em_scalar(2, EM_OPTS(.dtype = EM_I64)))) == EM_I32);
    CHECK(em_dtype_of(em_mul(d0, em_scalar(1, EM_OPTS(.dtype = EM_F32)))) == EM_F64);
    /* True division and float math of integers give float32. */
    em_tensor *q = em_div(i, TI64(EM_SHAPE(3), 2, 2, 2));
    CHECK(em_dtype_of(q) == EM_F32);
    CHECK_VALUES(q, 0, 0.5, 1, 1.5);
    CHECK(em_dtype_of(em_sqrt(i)) == EM_F32);
    CHECK(em_dtype_of(em_exp(b)) == EM_F32);
    CHECK(em_dtype_of(em_sigmoid(h)) == EM_F16);
    CHECK(em_dtype_of(em_neg(i32)) == EM_I32);
    CHECK(em_dtype_of(em_lt(i, f)) == EM_BOOL);
    CHECK_VALUES(em_lt(f, i), 0, 1, 1, 1);
    CHECK(em_sub(b, b) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "Subtraction, the `-` operator, with two bool tensors is not supported");
    CHECK(em_neg(b) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "Negation, the `-` operator, on a bool tensor is not supported");
    END;
}

static void test_scalars(void) {
    BEGIN;
    em_tensor *i = TI64(EM_SHAPE(3), 1, 2, 3);
    em_tensor *h = em_full(EM_SHAPE(2), 1.5, EM_OPTS(.dtype = EM_F16));
    em_tensor *b = em_from_data((const uint8_t[]){1, 0}, EM_BOOL, EM_SHAPE(2), EM_OPTS(.dtype = EM_BOOL));
    em_tensor *r = em_add_scalar(i, 2.5);
    CHECK(em_dtype_of(r) == EM_F32);
    CHECK_VALUES(r, 0, 3.5, 4.5, 5.5);
    r = em_add_scalar(i, 2);
    CHECK(em_dtype_of(r) == EM_I64);
    CHECK_VALUES(r, 0, 3, 4, 5);
    r = em_mul_scalar(h, 2.0);
    CHECK(em_dtype_of(r) == EM_F16);
    CHECK_VALUES(r, 0, 3, 3);
    CHECK(em_dtype_of(em_mul_scalar(b, 3)) == EM_I64);
    CHECK_VALUES(em_mul_scalar(b, 3), 0, 3, 0);
    CHECK(em_dtype_of(em_mul_scalar(b, 0.5)) == EM_F32);
    CHECK_VALUES(em_sub_scalar(i, 1), 0, 0, 1, 2);
    CHECK(em_sub_scalar(b, 1) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "with a bool tensor is not supported");
    r = em_div_scalar(i, 2);
    CHECK(em_dtype_of(r) == EM_F32);
    CHECK_VALUES(r, 0, 0.5, 1, 1.5);
    CHECK(em_dtype_of(em_div_scalar(h, 4)) == EM_F16);
    r = em_pow_scalar(i, 2);
    CHECK(em_dtype_of(r) == EM_I64);
    CHECK_VALUES(r, 0, 1, 4, 9);
    CHECK_VALUES(em_pow_scalar(i, 0.5), 1e-6, 1, 1.414213562, 1.732050808);
    CHECK(em_pow_scalar(i, -1) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Integers to negative integer powers are not allowed.");
    CHECK_VALUES(em_pow_scalar(TF32(EM_SHAPE(2), 2, 4), -1), 0, 0.5, 0.25);
    em_tensor *c = em_clamp(TI64(EM_SHAPE(4), -5, 0, 5, 10), -INFINITY, 6);
    CHECK(em_dtype_of(c) == EM_I64); /* an infinite bound is no bound: no promotion */
    CHECK_VALUES(c, 0, -5, 0, 5, 6);
    CHECK_VALUES(em_clamp(TF32(EM_SHAPE(4), -5, 0, 5, 10), 0, INFINITY), 0, 0, 0, 5, 10);
    c = em_clamp(TI64(EM_SHAPE(2), 0, 3), 0.5, 2.5);
    CHECK(em_dtype_of(c) == EM_F32);
    CHECK_VALUES(c, 0, 0.5, 2.5);
    END;
}

static void test_unary(void) {
    BEGIN;
    em_tensor *x = TF32(EM_SHAPE(4), -2, -0.5, 0, 3);
    CHECK_VALUES(em_neg(x), 0, 2, 0.5, 0, -3);
    CHECK_VALUES(em_abs(x), 0, 2, 0.5, 0, 3);
    CHECK_VALUES(em_relu(x), 0, 0, 0, 0, 3);
    CHECK_VALUES(em_exp(x), 1e-6, 0.135335283, 0.60653066, 1, 20.08553692);
    CHECK_VALUES(em_tanh(x), 1e-6, -0.96402758, -0.462117157, 0, 0.995054754);
    CHECK_VALUES(em_sigmoid(x), 1e-6, 0.119202922, 0.377540669, 0.5, 0.952574127);
    CHECK_VALUES(em_gelu(x), 1e-6, -0.045500264, -0.154268517, 0, 2.995950508);
    CHECK_VALUES(em_log(TF32(EM_SHAPE(3), 1, 2.718281828f, 0)), 1e-6, 0, 1, -INFINITY);
    CHECK_VALUES(em_sqrt(TF32(EM_SHAPE(3), 4, 2, -1)), 1e-6, 2, 1.414213562, NAN);
    CHECK_VALUES(em_abs(TI64(EM_SHAPE(2), -3, 3)), 0, 3, 3);
    em_tensor *z = em_exp(em_scalar(0, (em_opts){0}));
    CHECK_SHAPE0(z);
    CHECK(em_item(z) == 1);
    CHECK_SHAPE(em_tanh(em_zeros(EM_SHAPE(0, 3), (em_opts){0})), 0, 3);
    END;
}

static void test_where(void) {
    BEGIN;
    em_tensor *c = em_gt(TF32(EM_SHAPE(2, 1), 1, -1), em_scalar(0, (em_opts){0})); /* [[T], [F]] */
    em_tensor *a = TF32(EM_SHAPE(3), 1, 2, 3);
    em_tensor *w = em_where(c, a, em_scalar(-1, EM_OPTS(.dtype = EM_I64)));
    CHECK(em_dtype_of(w) == EM_F32);
    CHECK_SHAPE(w, 2, 3);
    CHECK_VALUES(w, 0, 1, 2, 3, -1, -1, -1);
    CHECK(em_where(a, a, a) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "where expected condition to be a boolean tensor, but got a tensor with dtype Float");
    CHECK(em_where(c, a, em_ones(EM_SHAPE(4), (em_opts){0})) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "em_where: shapes [3] and [4] cannot be broadcast");
    END;
}

static void test_inplace(void) {
    BEGIN;
    em_tensor *t = TF32(EM_SHAPE(2, 2), 1, 2, 3, 4);
    unsigned v0 = atomic_load(&t->storage->version);
    CHECK_OK(em_add_(t, TF32(EM_SHAPE(2), 10, 20), 0.5));
    CHECK_VALUES(t, 0, 6, 12, 8, 14);
    CHECK_OK(em_mul_scalar_(t, 2));
    CHECK_VALUES(t, 0, 12, 24, 16, 28);
    CHECK_OK(em_add_(t, t, 1)); /* the exact same view: allowed */
    CHECK_VALUES(t, 0, 24, 48, 32, 56);
    CHECK_OK(em_add_(t, em_transpose(t, 0, 1), 1)); /* an overlapping different view is read first */
    CHECK_VALUES(t, 0, 48, 80, 80, 112);
    CHECK_OK(em_zero_(t));
    CHECK_VALUES(t, 0, 0, 0, 0, 0);
    CHECK_OK(em_fill_(t, -1.5));
    CHECK_VALUES(t, 0, -1.5, -1.5, -1.5, -1.5);
    CHECK_OK(em_copy_(t, TI64(EM_SHAPE(2, 1), 7, 9)));
    CHECK_VALUES(t, 0, 7, 7, 9, 9);
    CHECK(atomic_load(&t->storage->version) == v0 + 7);
    /* Mixed dtypes: f16 += f32 computes in f32 and stores f16. */
    em_tensor *h = em_ones(EM_SHAPE(2), EM_OPTS(.dtype = EM_F16));
    CHECK_OK(em_add_(h, TF32(EM_SHAPE(2), 0.25, 1000), 1));
    CHECK(em_dtype_of(h) == EM_F16);
    CHECK_VALUES(h, 0, 1.25, 1001);
    em_tensor *i = TI64(EM_SHAPE(2), 1, 2);
    CHECK_OK(em_add_(i, TI64(EM_SHAPE(2), 1, 1), 3));
    CHECK_VALUES(i, 0, 4, 5);
    CHECK(em_add_(i, TF32(EM_SHAPE(2), 1, 1), 1) == EM_ERR_DTYPE);
    CHECK_ERROR(EM_ERR_DTYPE, "result type Float can't be cast to the desired output type Long");
    CHECK(em_add_(i, i, 0.5) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "alpha must not be a floating point number");
    CHECK(em_mul_scalar_(i, 0.5) == EM_ERR_DTYPE);
    CHECK_ERROR(EM_ERR_DTYPE, "result type Float can't be cast to the desired output type Long");
    CHECK(em_add_(t, TF32(EM_SHAPE(3), 1, 2, 3), 1) == EM_ERR_SHAPE);
    CHECK_ERROR(EM_ERR_SHAPE, "cannot be broadcast to the destination's shape [2, 2]");
    CHECK(em_copy_(em_select(t, 0, 0), t) == EM_ERR_SHAPE);
    em_clear_error();
    /* A leaf that requires grad cannot be written in place while grad mode would record. */
    em_tensor *w = em_ones(EM_SHAPE(2), EM_OPTS(.requires_grad = true));
    bool grad_on = em__grad_needed(1, &w);
    em_status st = em_mul_scalar_(w, 2);
    if (grad_on) {
        CHECK(st == EM_ERR_AUTOGRAD);
        CHECK_ERROR(EM_ERR_AUTOGRAD, "a leaf Variable that requires grad is being used in an in-place operation.");
    } else {
        CHECK(st == EM_OK);
    }
    /* Empty tensors: nothing to do, still fine. */
    CHECK_OK(em_fill_(em_zeros(EM_SHAPE(0), (em_opts){0}), 1));
    END;
}

/* mul_ and exp_ in place: the out-of-place op's values, broadcasting into the destination,
 * the same refusals as add_ */
static void test_inplace_mul_exp(void) {
    BEGIN;
    em_tensor *t = TF32(EM_SHAPE(2, 3), 1, 2, 3, -4, 0.5, 0);
    em_tensor *want = em_exp(em_mul(t, TF32(EM_SHAPE(2, 1), 0.5, -2)));
    unsigned v0 = atomic_load(&t->storage->version);
    CHECK_OK(em_mul_(t, TF32(EM_SHAPE(2, 1), 0.5, -2))); /* a row's scale, broadcast */
    CHECK_VALUES(t, 0, 0.5, 1, 1.5, 8, -1, 0);
    CHECK_OK(em_exp_(t));
    CHECK(test_same_bits(t, want));
    CHECK(atomic_load(&t->storage->version) == v0 + 2);
    CHECK_OK(em_mul_(t, t)); /* the exact same view */
    CHECK(test_same_bits(t, em_mul(want, want)));
    /* a strided destination: every other column */
    em_tensor *u = TF32(EM_SHAPE(2, 4), 0, 1, 2, 3, 4, 5, 6, 7);
    CHECK_OK(em_exp_(em_narrow(u, 1, 1, 2)));
    CHECK(fabs(em_item(em_select(em_select(u, 0, 0), 0, 1)) - exp(1.0)) < 1e-6);
    CHECK_VALUES(em_select(u, 1, 0), 0, 0, 4);
    /* f16 *= f32 computes in float32 and stores float16 */
    em_tensor *h = em_full(EM_SHAPE(2), 3, EM_OPTS(.dtype = EM_F16));
    CHECK_OK(em_mul_(h, TF32(EM_SHAPE(2), 0.5, 1000)));
    CHECK(em_dtype_of(h) == EM_F16);
    CHECK_VALUES(h, 0, 1.5, 3000);
    em_tensor *i = TI64(EM_SHAPE(2), 3, 4);
    CHECK_OK(em_mul_(i, TI64(EM_SHAPE(1), -2)));
    CHECK_VALUES(i, 0, -6, -8);
    CHECK(em_exp_(i) == EM_ERR_DTYPE);
    CHECK_ERROR(EM_ERR_DTYPE, "em_exp_: result type Float can't be cast to the desired output type Long");
    CHECK(em_mul_(i, TF32(EM_SHAPE(2), 1, 1)) == EM_ERR_DTYPE);
    CHECK_ERROR(EM_ERR_DTYPE, "result type Float can't be cast to the desired output type Long");
    CHECK(em_mul_(t, TF32(EM_SHAPE(3, 1), 1, 2, 3)) == EM_ERR_SHAPE);
    CHECK_ERROR(EM_ERR_SHAPE, "em_mul_: a tensor of shape [3, 1] cannot be broadcast to the destination's shape [2, 3]");
    CHECK(em_exp_(em_expand(TF32(EM_SHAPE(1), 1), EM_SHAPE(3))) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "more than one element of the written-to tensor refers to a single memory location");
    CHECK(em_exp_(NULL) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_exp_: argument 't' is NULL");
    CHECK(em_mul_(t, NULL) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_mul_: argument 'other' is NULL");
    END;
}

static void test_inplace_copy_cast_overlap(void) {
    BEGIN;
    em_tensor *a = em_arange(0, 6, 1, (em_opts){0});
    /* Shifting within one storage: the source is read before the destination is written. */
    CHECK_OK(em_copy_(em_narrow(a, 0, 1, 5), em_narrow(a, 0, 0, 5)));
    CHECK_VALUES(a, 0, 0, 0, 1, 2, 3, 4);
    em_tensor *u = em_zeros(EM_SHAPE(3), EM_OPTS(.dtype = EM_U8));
    CHECK_OK(em_copy_(u, TF32(EM_SHAPE(3), 1.9, 200, 7)));
    CHECK_VALUES(u, 0, 1, 200, 7);
    em_tensor *x = em_zeros(EM_SHAPE(2, 3), (em_opts){0});
    CHECK_OK(em_copy_(x, em_scalar(4, (em_opts){0})));
    CHECK_VALUES(x, 0, 4, 4, 4, 4, 4, 4);
    END;
}

static void test_devices_must_match(void) {
    /* Needs a second device type; with only the CPU, check the helper directly. */
    BEGIN;
    em_tensor *a = em_ones(EM_SHAPE(2), (em_opts){0});
    em_tensor fake = *a;
    em_storage fake_storage = *a->storage;
    fake_storage.device = EM_DEVICE(EM_CUDA, 0);
    fake.storage = &fake_storage;
    const em_tensor *ts[3] = {&fake, a, a};
    CHECK(em__check_same_device("em_add", 3, ts) == EM_ERR_DEVICE);
    CHECK_ERROR(EM_ERR_DEVICE, "em_add: Expected all tensors to be on the same device, but found at least two devices, "
                               "cuda:0 and cpu!");
    const em_tensor *ts2[3] = {a, a, &fake};
    CHECK(em__check_same_device("em_mul", 3, ts2) == EM_ERR_DEVICE);
    CHECK(strcmp(em_last_error(), "em_mul: Expected all tensors to be on the same device, but found at least two "
                                  "devices, cpu and cuda:0!") == 0);
    em_clear_error();
    /* And through an op (the kernel never runs). */
    CHECK(em_add(a, &fake) == NULL);
    CHECK(strcmp(em_last_error(), "em_add: Expected all tensors to be on the same device, but found at least two "
                                  "devices, cpu and cuda:0!") == 0);
    em_clear_error();
    CHECK(em_where(em_gt(a, a), &fake, a) == NULL);
    CHECK_ERROR(EM_ERR_DEVICE, "em_where: Expected all tensors to be on the same device, but found at least two "
                               "devices, cpu and cuda:0!");
    END;
}

/* Same type, another index: a fake CPU-only second device (cpu:1) shows that the index is
 * compared too, without needing two real devices of one type. */
static void test_device_index_must_match(void) {
    BEGIN;
    em_tensor *a = em_ones(EM_SHAPE(2), (em_opts){0});
    em_tensor fake = *a;
    em_storage fake_storage = *a->storage;
    fake_storage.device = EM_DEVICE(EM_CPU, 1);
    fake.storage = &fake_storage;
    const em_tensor *ts[2] = {a, &fake};
    CHECK(em__check_same_device("em_sub", 2, ts) == EM_ERR_DEVICE);
    /* (em_device_str prints every CPU index as "cpu": only the error kind and op are checked) */
    CHECK_ERROR(EM_ERR_DEVICE, "em_sub: Expected all tensors to be on the same device");
    const em_tensor *same[2] = {a, a};
    CHECK_OK(em__check_same_device("em_sub", 2, same));
    CHECK(em_add(&fake, a) == NULL);
    CHECK_ERROR(EM_ERR_DEVICE, "em_add: Expected all tensors to be on the same device");
    CHECK(em_matmul(a, &fake) == NULL);
    CHECK_ERROR(EM_ERR_DEVICE, "em_matmul: Expected all tensors to be on the same device");
    END;
}

static void test_null_and_chain(void) {
    BEGIN;
    em_tensor *a = em_ones(EM_SHAPE(2), (em_opts){0});
    CHECK(em_add(a, NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_add: argument 'b' is NULL");
    em_tensor *bad = em_add(a, em_ones(EM_SHAPE(3), (em_opts){0}));
    em_tensor *r = em_relu(em_mul_scalar(em_sub(bad, a), 2));
    CHECK(r == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "em_add: shapes [2] and [3] cannot be broadcast");
    CHECK(em_fill_(NULL, 1) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_fill_: argument 't' is NULL");
    END;
}

int main(void) {
    RUN(test_binary_basic);
    RUN(test_broadcast);
    RUN(test_non_contiguous_inputs);
    RUN(test_promotion);
    RUN(test_scalars);
    RUN(test_unary);
    RUN(test_where);
    RUN(test_inplace);
    RUN(test_inplace_mul_exp);
    RUN(test_inplace_copy_cast_overlap);
    RUN(test_devices_must_match);
    RUN(test_device_index_must_match);
    RUN(test_null_and_chain);
    return test_summary();
}
