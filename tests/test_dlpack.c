/* DLPack export and import (include/ember/dlpack.h): zero copy both ways, strides, the
 * deleter run exactly once, read-only imports, the 0.x form, and bad managed tensors. */
#include "test_core_util.h"
#include <ember/dlpack.h>

/* ---- a producer of our own: malloc'd memory and a deleter that counts its calls ---- */
static int g_deleted;
static void count_delete(DLManagedTensorVersioned *self) {
    g_deleted++;
    free(self->dl_tensor.data);
    free(self->dl_tensor.shape);
    free(self);
}
static void count_delete_legacy(DLManagedTensor *self) {
    g_deleted++;
    free(self->dl_tensor.data);
    free(self->dl_tensor.shape);
    free(self);
}

/* A float32 2-d DLPack tensor over `elems` floats 0, 1, 2... with the given shape and
 * strides (shape and strides live in one malloc'd block of four int64). */
static DLManagedTensorVersioned *make_producer(int64_t rows, int64_t cols, int64_t s0, int64_t s1, int elems) {
    DLManagedTensorVersioned *m = calloc(1, sizeof *m);
    float *data = malloc(sizeof(float) * (size_t)elems);
    int64_t *dims = malloc(4 * sizeof(int64_t));
    for (int i = 0; i < elems; i++) data[i] = (float)i;
    dims[0] = rows, dims[1] = cols, dims[2] = s0, dims[3] = s1;
    m->version = (DLPackVersion){1, 0};
    m->deleter = count_delete;
    m->dl_tensor = (DLTensor){.data = data, .device = {kDLCPU, 0}, .ndim = 2, .dtype = {kDLFloat, 32, 1},
                              .shape = dims, .strides = dims + 2, .byte_offset = 0};
    return m;
}

/* The sum of t's elements as a double. */
static double tsum(em_tensor *t) {
    em_tensor *s = em_sum(t, EM_ALL_DIMS, false);
    double v = em_item(s);
    em_release(s);
    return v;
}

/* Wraps an Ember export's deleter to count its calls. */
static void (*g_inner)(DLManagedTensorVersioned *);
static void wrapped_delete(DLManagedTensorVersioned *self) {
    g_deleted++;
    g_inner(self);
}

static void test_export_cpu(void) {
    em_tensor *t = em_arange(0, 6, 1, (em_opts){0});
    em_tensor *v = em_view(t, EM_SHAPE(2, 3));
    DLManagedTensorVersioned *m = em_to_dlpack(v);
    CHECK(m != NULL);
    if (!m) return;
    CHECK(m->version.major == DLPACK_MAJOR_VERSION && m->version.minor == DLPACK_MINOR_VERSION);
    CHECK(m->flags == 0);
    DLTensor *d = &m->dl_tensor;
    CHECK(d->device.device_type == kDLCPU && d->device.device_id == 0);
    CHECK(d->dtype.code == kDLFloat && d->dtype.bits == 32 && d->dtype.lanes == 1);
    CHECK(d->ndim == 2 && d->shape[0] == 2 && d->shape[1] == 3 && d->strides[0] == 3 && d->strides[1] == 1);
    CHECK(d->data == em_data_ptr(v) && d->byte_offset == 0); /* the same memory: no copy */
    /* the export keeps the memory alive after Ember lets go of it, and writes are shared */
    float *p = d->data;
    em_release(v);
    em_release(t);
    CHECK(p[5] == 5.0f);
    p[5] = 42;
    m->deleter(m);
}

static void test_export_strided(void) {
    em_tensor *t = em_arange(0, 24, 1, (em_opts){0});
    em_tensor *a = em_view(t, EM_SHAPE(2, 3, 4));
    em_tensor *tr = em_transpose(a, 0, 2);                   /* [4, 3, 2], strides 1, 4, 12 */
    em_tensor *sl = em_slice(tr, 0, 1, 4, 2);                 /* rows 1 and 3: offset 1, stride 2 */
    DLManagedTensorVersioned *m = em_to_dlpack(sl);
    CHECK(m != NULL);
    if (m) {
        DLTensor *d = &m->dl_tensor;
        CHECK(d->ndim == 3 && d->shape[0] == 2 && d->shape[1] == 3 && d->shape[2] == 2);
        CHECK(d->strides[0] == 2 && d->strides[1] == 4 && d->strides[2] == 12);
        const float *base = em_data_ptr(t);
        CHECK((const float *)d->data == base + 1); /* the first element, offset included */
        /* element [1][2][1] of the slice is a[1][2][3] = 12 + 8 + 3 */
        const float *e = (const float *)d->data + 1 * d->strides[0] + 2 * d->strides[1] + 1 * d->strides[2];
        CHECK(*e == 23.0f);
        m->deleter(m);
    }
    em_release(sl); em_release(tr); em_release(a); em_release(t);
}

static void test_round_trip_deleter_once(void) {
    em_tensor *t = em_randn(EM_SHAPE(3, 5), (em_opts){0});
    em_tensor *tt = em_transpose(t, 0, 1);
    DLManagedTensorVersioned *m = em_to_dlpack(tt);
    CHECK(m != NULL);
    if (!m) return;
    g_inner = m->deleter;
    m->deleter = wrapped_delete;
    g_deleted = 0;
    em_tensor *back = em_from_dlpack(m);
    CHECK(back != NULL);
    CHECK(em_data_ptr(back) == em_data_ptr(tt));
    CHECK(em_stride(back, 0) == 1 && em_stride(back, 1) == 5 && em_size(back, 0) == 5);
    em_tensor *eq = em_eq(back, tt);
    CHECK(tsum(eq) == 15);
    em_release(eq);
    /* a view of the import keeps the producer's memory: no deleter until the last goes */
    em_tensor *row = em_select(back, 0, 4);
    em_release(back);
    CHECK(g_deleted == 0);
    CHECK(tval(row, 2) == tval(t, 2 * 5 + 4));
    em_release(row);
    CHECK(g_deleted == 1);
    em_release(tt);
    em_release(t);
    CHECK(g_deleted == 1);
}

static void test_import_foreign_strides(void) {
    /* a column-major 3x4 matrix (strides 1, 3) inside 12 floats, and a byte_offset */
    g_deleted = 0;
    DLManagedTensorVersioned *m = make_producer(3, 4, 1, 3, 12);
    em_tensor *t = em_from_dlpack(m);
    CHECK(t != NULL);
    CHECK(em_data_ptr(t) == m->dl_tensor.data);
    CHECK(!em_is_contiguous(t) && em_stride(t, 0) == 1 && em_stride(t, 1) == 3);
    CHECK_VALUES(t, 0, 0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11);
    /* in place through Ember: the producer's memory changes */
    em_tensor *col = em_select(t, 1, 0);
    CHECK_OK(em_fill_(col, -1));
    em_release(col);
    CHECK(((float *)m->dl_tensor.data)[2] == -1.0f);
    em_release(t);
    CHECK(g_deleted == 1);

    /* byte_offset on the CPU: one row further; NULL strides: compact row-major */
    m = make_producer(2, 2, 0, 0, 6);
    m->dl_tensor.strides = NULL;
    m->dl_tensor.byte_offset = 2 * sizeof(float);
    t = em_from_dlpack(m);
    CHECK_VALUES(t, 0, 2, 3, 4, 5);
    em_release(t);
    CHECK(g_deleted == 2);
}

static void test_dtypes_and_shapes(void) {
    em_dtype dts[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I64, EM_I32, EM_U8, EM_BOOL};
    uint8_t codes[] = {kDLFloat, kDLFloat, kDLFloat, kDLBfloat, kDLInt, kDLInt, kDLUInt, kDLBool};
    uint8_t bits[] = {32, 64, 16, 16, 64, 32, 8, 8};
    for (int i = 0; i < 8; i++) {
        em_tensor *t = em_ones(EM_SHAPE(2, 2), EM_OPTS(.dtype = dts[i]));
        DLManagedTensorVersioned *m = em_to_dlpack(t);
        CHECK(m && m->dl_tensor.dtype.code == codes[i] && m->dl_tensor.dtype.bits == bits[i]);
        em_tensor *back = m ? em_from_dlpack(m) : NULL;
        CHECK(back && em_dtype_of(back) == dts[i] && tsum(back) == 4);
        em_release(back);
        em_release(t);
    }
    /* 0-d and empty tensors */
    em_tensor *s = em_scalar(7, EM_OPTS(.dtype = EM_I64));
    em_tensor *back = em_from_dlpack(em_to_dlpack(s));
    CHECK(back && em_ndim(back) == 0 && em_item(back) == 7);
    em_release(back);
    em_release(s);
    em_tensor *e = em_empty(EM_SHAPE(0, 3), (em_opts){0});
    back = em_from_dlpack(em_to_dlpack(e));
    CHECK(back && em_numel(back) == 0 && em_size(back, 1) == 3);
    em_release(back);
    em_release(e);
}

static void test_legacy(void) {
    em_tensor *t = em_arange(0, 4, 1, EM_OPTS(.dtype = EM_I32));
    DLManagedTensor *m = em_to_dlpack_legacy(t);
    CHECK(m && m->dl_tensor.dtype.code == kDLInt && m->dl_tensor.dtype.bits == 32 && m->dl_tensor.data == em_data_ptr(t));
    em_tensor *back = m ? em_from_dlpack_legacy(m) : NULL;
    CHECK(back && em_data_ptr(back) == em_data_ptr(t) && !em_is_read_only(back));
    CHECK_VALUES(back, 0, 0, 1, 2, 3);
    em_release(back);
    em_release(t);

    /* a 0.x producer: its deleter runs once */
    g_deleted = 0;
    DLManagedTensorVersioned *v = make_producer(2, 3, 3, 1, 6);
    DLManagedTensor *l = calloc(1, sizeof *l);
    l->dl_tensor = v->dl_tensor;
    l->deleter = count_delete_legacy;
    free(v);
    em_tensor *x = em_from_dlpack_legacy(l);
    CHECK_VALUES(x, 0, 0, 1, 2, 3, 4, 5);
    em_release(x);
    CHECK(g_deleted == 1);
}

static void test_read_only(void) {
    g_deleted = 0;
    DLManagedTensorVersioned *m = make_producer(2, 3, 3, 1, 6);
    m->flags = DLPACK_FLAG_BITMASK_READ_ONLY;
    em_tensor *t = em_from_dlpack(m);
    CHECK(t && em_is_read_only(t));
    CHECK(em_fill_(t, 1) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_fill_: the tensor is read-only");
    em_tensor *one = em_ones(EM_SHAPE(3), (em_opts){0});
    em_tensor *row = em_select(t, 0, 1); /* views share the flag */
    CHECK(em_is_read_only(row));
    CHECK(em_add_(row, one, 1) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_add_: the tensor is read-only");
    em_tensor *zeros = em_zeros(EM_SHAPE(2, 3), (em_opts){0});
    CHECK(em_copy_(t, zeros) == EM_ERR_ARGUMENT);
    em_release(zeros);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_copy_: the tensor is read-only");
    CHECK(em_mul_scalar_(t, 2) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "read-only");
    CHECK_VALUES(t, 0, 0, 1, 2, 3, 4, 5); /* nothing was written */
    /* reading is fine, and a copy is writable */
    em_tensor *sum = em_add(row, one);
    CHECK_VALUES(sum, 0, 4, 5, 6);
    em_tensor *c = em_clone(t);
    CHECK(!em_is_read_only(c));
    CHECK_OK(em_fill_(c, 3));
    /* re-exported, it says read-only */
    DLManagedTensorVersioned *again = em_to_dlpack(row);
    CHECK(again && (again->flags & DLPACK_FLAG_BITMASK_READ_ONLY));
    if (again) again->deleter(again);
    em_release(c); em_release(sum); em_release(row); em_release(one); em_release(t);
    CHECK(g_deleted == 1);
}

static void test_bad_managed_tensors(void) {
    g_deleted = 0;
    CHECK(em_from_dlpack(NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_from_dlpack: argument 'm' is NULL");
    CHECK(em_to_dlpack(NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_to_dlpack: argument 't' is NULL");

    /* each refused one stays the caller's: Ember never called its deleter */
    DLManagedTensorVersioned *m = make_producer(2, 3, 3, 1, 6);
    m->version.major = 2;
    CHECK(em_from_dlpack(m) == NULL);
    CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "DLPack version 2.0; Ember reads major version 1");
    m->version.major = 1;
    m->dl_tensor.dtype = (DLDataType){kDLComplex, 64, 1};
    CHECK(em_from_dlpack(m) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "DLPack dtype (code 5: complex, 64 bits, 1 lanes) is not supported");
    m->dl_tensor.dtype = (DLDataType){kDLInt, 8, 1};
    CHECK(em_from_dlpack(m) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "code 0: int, 8 bits");
    m->dl_tensor.dtype = (DLDataType){kDLFloat, 32, 4};
    CHECK(em_from_dlpack(m) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "4 lanes");
    m->dl_tensor.dtype = (DLDataType){kDLFloat, 32, 1};
    m->dl_tensor.device = (DLDevice){kDLVulkan, 0};
    CHECK(em_from_dlpack(m) == NULL);
    CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "DLPack device type 7 (kDLVulkan) is not supported");
    m->dl_tensor.device = (DLDevice){kDLCPU, 0};
    m->dl_tensor.strides[1] = -1;
    CHECK(em_from_dlpack(m) == NULL);
    CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "stride -1 of dim 1 is negative");
    m->dl_tensor.strides[1] = 1;
    m->dl_tensor.ndim = 9;
    CHECK(em_from_dlpack(m) == NULL);
    CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "has 9 dims; Ember takes 0 to 8");
    m->dl_tensor.ndim = 2;
    m->dl_tensor.shape[0] = -2;
    CHECK(em_from_dlpack(m) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "negative dimension -2");
    m->dl_tensor.shape[0] = 2;
    m->dl_tensor.strides[0] = INT64_MAX / 2;
    CHECK(em_from_dlpack(m) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "reach past any addressable memory");
    m->dl_tensor.strides[0] = 3;
    void *data = m->dl_tensor.data;
    m->dl_tensor.data = NULL;
    CHECK(em_from_dlpack(m) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "has 6 elements but its data pointer is NULL");
    m->dl_tensor.data = data;
    if (!em_device_available(EM_CUDA)) {
        m->dl_tensor.device = (DLDevice){kDLCUDA, 0};
        CHECK(em_from_dlpack(m) == NULL);
        CHECK_ERROR(EM_ERR_UNAVAILABLE, "em_from_dlpack: cuda is not available");
        m->dl_tensor.device = (DLDevice){kDLCPU, 0};
    }
    CHECK(g_deleted == 0);

    /* consumed once: the same managed tensor again while Ember holds it */
    em_tensor *t = em_from_dlpack(m);
    CHECK(t != NULL);
    CHECK(em_from_dlpack(m) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "this DLPack tensor was already consumed");
    CHECK(g_deleted == 0);
    em_release(t);
    CHECK(g_deleted == 1);

    /* a refused one is still the caller's to delete: exactly one call in all */
    m = make_producer(1, 1, 1, 1, 1);
    m->dl_tensor.dtype.bits = 12;
    CHECK(em_from_dlpack(m) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "12 bits");
    m->deleter(m);
    CHECK(g_deleted == 2);

    /* export: a tensor that requires grad */
    em_tensor *w = em_ones(EM_SHAPE(2), EM_OPTS(.requires_grad = true));
    CHECK(em_to_dlpack(w) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Can't export tensors that require gradient, use em_detach(t) first");
    em_tensor *dw = em_detach(w);
    DLManagedTensorVersioned *ok = em_to_dlpack(dw);
    CHECK(ok != NULL);
    if (ok) ok->deleter(ok);
    em_release(dw);
    em_release(w);
}

/* OpenCL: kDLOpenCL with the cl_mem and byte_offset; a round trip shares the buffer. */
static void test_opencl(void) {
    if (!em_device_available(EM_OPENCL)) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    em_device dev = EM_DEVICE(EM_OPENCL, 0);
    em_tensor *t = em_arange(0, 12, 1, EM_OPTS(.device = dev));
    em_tensor *mat = em_view(t, EM_SHAPE(3, 4));
    em_tensor *part = em_slice(mat, 1, 1, 4, 2); /* [3, 2]: offset 1, strides 4, 2 */
    em_release(mat);
    DLManagedTensorVersioned *m = em_to_dlpack(part);
    CHECK(m != NULL);
    if (!m) return;
    DLTensor *d = &m->dl_tensor;
    CHECK(d->device.device_type == kDLOpenCL && d->device.device_id == 0 && d->data != NULL);
    CHECK(d->byte_offset % sizeof(float) == 0 && d->strides[0] == 4 && d->strides[1] == 2);
    em_release(part);
    em_tensor *back = em_from_dlpack(m);
    CHECK(back && em_device_of(back).type == EM_OPENCL);
    CHECK_VALUES(back, 0, 1, 3, 5, 7, 9, 11);
    /* written through the import, seen in the original: the same buffer */
    CHECK_OK(em_fill_(back, -2));
    CHECK_VALUES(t, 0, 0, -2, 2, -2, 4, -2, 6, -2, 8, -2, 10, -2);
    em_release(back);
    em_release(t);
}

static void test_cuda(void) {
    if (!em_device_available(EM_CUDA)) SKIP("no CUDA device: %s", em_device_unavailable_reason(EM_CUDA));
    em_tensor *t = em_arange(0, 6, 1, EM_OPTS(.device = EM_DEVICE(EM_CUDA, 0)));
    DLManagedTensorVersioned *m = em_to_dlpack(t);
    CHECK(m && m->dl_tensor.device.device_type == kDLCUDA && m->dl_tensor.byte_offset == 0);
    em_tensor *back = m ? em_from_dlpack(m) : NULL;
    CHECK_VALUES(back, 0, 0, 1, 2, 3, 4, 5);
    CHECK_OK(em_fill_(back, 1));
    CHECK_VALUES(t, 0, 1, 1, 1, 1, 1, 1);
    em_release(back);
    em_release(t);
}

int main(void) {
    RUN(test_export_cpu);
    RUN(test_export_strided);
    RUN(test_round_trip_deleter_once);
    RUN(test_import_foreign_strides);
    RUN(test_dtypes_and_shapes);
    RUN(test_legacy);
    RUN(test_read_only);
    RUN(test_bad_managed_tensors);
    RUN(test_opencl);
    RUN(test_cuda);
    return test_summary();
}
