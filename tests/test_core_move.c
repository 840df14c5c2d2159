/* em_to / em_to_dtype / em_clone / em_cpu, host access on devices. The cross-device parts run
 * on every non-CPU device this build can reach (PoCL gives OpenCL devices on any machine). */
#include <stdlib.h>
#include "test_core_util.h"

static void test_same_device(void) {
    em_scope s = em_scope_begin();
    em_tensor *a = TF32(EM_SHAPE(2, 2), 1, 2, 3, 4);
    int before = atomic_load(&a->refcount);
    em_tensor *same = em_to(a, EM_DEVICE_CPU);
    CHECK(same == a);
    CHECK(atomic_load(&a->refcount) == before + 1); /* a new reference, owned by the scope */
    CHECK(em_to_dtype(a, EM_F32) == a);
    CHECK(em_cpu(a) == a);
    CHECK(em_to_device_dtype(a, EM_DEVICE(EM_CPU, -1), EM_F32, true) == a);
    em_tensor *h = em_to_dtype(a, EM_F16);
    CHECK(h != a && em_dtype_of(h) == EM_F16 && !em_shares_storage(a, h));
    CHECK_VALUES(h, 0, 1, 2, 3, 4);
    em_tensor *i = em_to_dtype(TF32(EM_SHAPE(3), -1.7, 2.9, 100), EM_I32);
    CHECK_VALUES(i, 0, -1, 2, 100); /* truncation toward zero */
    em_tensor *t = em_transpose(a, 0, 1);
    em_tensor *d = em_to_dtype(t, EM_F64);
    CHECK(em_is_contiguous(d));
    CHECK_VALUES(d, 0, 1, 3, 2, 4);
    em_tensor *c = em_clone(t);
    CHECK(c != t && em_is_contiguous(c) && !em_shares_storage(c, a));
    CHECK_OK(em_fill_(a, 0));
    CHECK_VALUES(c, 0, 1, 3, 2, 4); /* nothing shared */
    CHECK(em_to(a, EM_DEVICE(EM_MPS, 0)) == NULL);
    CHECK_ERROR(EM_ERR_UNAVAILABLE, "em_to: mps is not available: MPS needs Apple Silicon");
    CHECK(em_to_dtype(a, (em_dtype)99) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "em_to: invalid dtype 99");
    CHECK(em_to(NULL, EM_DEVICE_CPU) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_to: argument 't' is NULL");
    CHECK(em_clone(NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_clone");
    em_scope_end(s);
}

static void test_empty_and_scalar_moves(void) {
    em_scope s = em_scope_begin();
    em_tensor *e = em_to_dtype(em_zeros(EM_SHAPE(0, 4), (em_opts){0}), EM_I64);
    CHECK_SHAPE(e, 0, 4);
    CHECK(em_dtype_of(e) == EM_I64);
    em_tensor *z = em_to_dtype(em_scalar(1.5, (em_opts){0}), EM_F64);
    CHECK_SHAPE0(z);
    CHECK(em_item(z) == 1.5);
    em_scope_end(s);
}

/* ---- on a device ---- */

static em_device g_dev;   /* the first non-CPU device found */
static em_device g_dev2;  /* a second one (index 1 of the same type), if any */
static bool g_have_two;

static void test_round_trip(void) {
    em_scope s = em_scope_begin();
    em_tensor *a = TF32(EM_SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
    em_tensor *d = em_to(a, g_dev);
    CHECK(d && em_device_equal(em_device_of(d), g_dev));
    CHECK(em_to(d, g_dev) == d); /* already there */
    em_tensor *back = em_cpu(d);
    CHECK(back && em_device_of(back).type == EM_CPU);
    CHECK_VALUES(back, 0, 1, 2, 3, 4, 5, 6);
    CHECK_VALUES(d, 0, 1, 2, 3, 4, 5, 6); /* tval reads through em_copy_to_host */
    /* Casting on the way in and out, and non-contiguous sources on both sides. */
    em_tensor *h = em_to_device_dtype(em_transpose(a, 0, 1), g_dev, EM_F16, false);
    CHECK(em_dtype_of(h) == EM_F16 && em_device_equal(em_device_of(h), g_dev));
    CHECK_VALUES(h, 0, 1, 4, 2, 5, 3, 6);
    em_tensor *i = em_to_device_dtype(em_transpose(d, 0, 1), EM_DEVICE_CPU, EM_I64, false);
    CHECK(em_dtype_of(i) == EM_I64 && em_device_of(i).type == EM_CPU);
    CHECK_VALUES(i, 0, 1, 4, 2, 5, 3, 6);
    em_tensor *small = em_to_device_dtype(d, EM_DEVICE_CPU, EM_U8, false);
    CHECK_VALUES(small, 0, 1, 2, 3, 4, 5, 6);
    CHECK(em_item(em_select(em_select(d, 0, 1), 0, 2)) == 6);
    /* Creation straight on the device. */
    CHECK_VALUES(em_from_data((const int64_t[]){7, 8}, EM_I64, EM_SHAPE(2), EM_OPTS(.device = g_dev)), 0, 7, 8);
    em_scope_end(s);
}

static void test_device_host_access(void) {
    em_scope s = em_scope_begin();
    em_tensor *d = em_ones(EM_SHAPE(3), EM_OPTS(.device = g_dev));
    CHECK(em_data_ptr(d) == NULL);
    char want[256];
    snprintf(want, sizeof want,
             "em_data_ptr: tensor is on %s; host pointers exist only for CPU tensors. Move it first: "
             "em_to(t, EM_DEVICE_CPU)", em_device_str(g_dev).s);
    CHECK(strcmp(em_last_error(), want) == 0);
    em_clear_error();
    float out[3];
    CHECK(em_copy_to_host(d, out, 4) == EM_ERR_ARGUMENT);
    em_clear_error();
    CHECK_OK(em_copy_to_host(d, out, sizeof out));
    CHECK(out[0] == 1 && out[2] == 1);
    char buf[256], expect[256];
    em_format(d, buf, sizeof buf);
    snprintf(expect, sizeof expect, "tensor([1., 1., 1.], device='%s')", em_device_str(g_dev).s);
    CHECK(strcmp(buf, expect) == 0);
    em_format(em_to_dtype(d, EM_F16), buf, sizeof buf);
    snprintf(expect, sizeof expect, "tensor([1., 1., 1.], device='%s', dtype=torch.float16)", em_device_str(g_dev).s);
    CHECK(strcmp(buf, expect) == 0);
    em_scope_end(s);
}

static void test_mixed_devices_error(void) {
    em_scope s = em_scope_begin();
    em_tensor *c = em_ones(EM_SHAPE(2), (em_opts){0});
    em_tensor *d = em_ones(EM_SHAPE(2), EM_OPTS(.device = g_dev));
    char want[256];
    CHECK(em_add(d, c) == NULL);
    snprintf(want, sizeof want, "em_add: Expected all tensors to be on the same device, but found at least two "
                                "devices, %s and cpu!", em_device_str(g_dev).s);
    CHECK(strcmp(em_last_error(), want) == 0);
    CHECK(em_last_status() == EM_ERR_DEVICE);
    em_clear_error();
    /* copy_ crosses devices by design. */
    CHECK_OK(em_copy_(c, em_full(EM_SHAPE(2), 3, EM_OPTS(.device = g_dev))));
    CHECK_VALUES(c, 0, 3, 3);
    CHECK_OK(em_copy_(d, TF32(EM_SHAPE(1), 5)));
    CHECK_VALUES(d, 0, 5, 5);
    em_scope_end(s);
}

static void test_pinned_non_blocking(void) {
    em_scope s = em_scope_begin();
    em_tensor *p = em_full(EM_SHAPE(1000), 2, EM_OPTS(.pin_memory = true));
    em_tensor *d = em_to_device_dtype(p, g_dev, EM_F32, true);
    CHECK_OK(em_device_synchronize(g_dev));
    CHECK(tval(d, 999) == 2);
    em_scope_end(s);
}

static void test_device_to_device(void) {
    em_scope s = em_scope_begin();
    em_tensor *a = em_to(TF32(EM_SHAPE(2, 2), 1, 2, 3, 4), g_dev);
    em_tensor *b = em_to(em_transpose(a, 0, 1), g_dev2);
    CHECK(b && em_device_equal(em_device_of(b), g_dev2));
    CHECK_VALUES(b, 0, 1, 3, 2, 4);
    em_tensor *c = em_to_device_dtype(a, g_dev2, EM_F64, false);
    CHECK(em_dtype_of(c) == EM_F64);
    CHECK_VALUES(c, 0, 1, 2, 3, 4);
    em_tensor *e = em_to_device_dtype(c, g_dev, EM_BF16, false);
    CHECK_VALUES(e, 0, 1, 2, 3, 4);
    em_scope_end(s);
}

int main(void) {
    setenv("POCL_DEVICES", "pthread pthread", 0); /* two PoCL devices, for device-to-device */
    RUN(test_same_device);
    RUN(test_empty_and_scalar_moves);
    em_device_type types[] = {EM_CUDA, EM_OPENCL};
    bool found = false;
    for (int i = 0; i < 2 && !found; i++) {
        if (em_device_count(types[i]) > 0) {
            found = true;
            g_dev = EM_DEVICE(types[i], 0);
            g_have_two = em_device_count(types[i]) > 1;
            g_dev2 = EM_DEVICE(types[i], 1);
        }
    }
    if (found) {
        printf("(device tests on %s)\n", em_device_str(g_dev).s);
        RUN(test_round_trip);
        RUN(test_device_host_access);
        RUN(test_mixed_devices_error);
        RUN(test_pinned_non_blocking);
        if (g_have_two) RUN(test_device_to_device);
        else test_skip_case("test_device_to_device", "needs two devices of one type, found one %s",
                            em_device_type_name(g_dev.type));
    } else {
        test_skip_case("device tests", "no CUDA or OpenCL device");
    }
    return test_summary();
}
