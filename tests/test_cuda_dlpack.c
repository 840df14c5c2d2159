/* DLPack with CUDA tensors, over the fake driver (tests/cuda_fake_driver.h), whose "device
 * memory" is host memory: an export hands out the very device pointer of the tensor's first
 * element (kDLCUDA), an import wraps a device pointer without a copy, and its deleter runs
 * once when the last tensor over it goes. */
#include "test.h"

#ifdef EMBER_HAVE_CUDA_HEADERS

#include <ember/dlpack.h>
#include <ember/memory.h>
#include "cuda_fake_driver.h"

static em_cu_api g_cu;

static void install(void) {
    em__cuda_backend_reset();
    memset(&F, 0, sizeof F);
    t_ctx = -1;
    F.free_mem = (size_t)8 << 30;
    g_cu = fake_cu();
    em_cuda_fake_libs libs = {.cu = &g_cu, .nvrtc_reason = "none (fake)", .cublas_reason = "none (fake)",
                              .nvml_reason = "none (fake)"};
    em__cuda_loader_use_fakes(&libs);
}

static const em_device CUDA0 = {EM_CUDA, 0};
static int g_deleted;
static void (*g_inner)(DLManagedTensorVersioned *);
static void wrapped_delete(DLManagedTensorVersioned *self) {
    g_deleted++;
    g_inner(self);
}

static void test_cuda_round_trip_zero_copy(void) {
    const float src[6] = {1, 2, 3, 4, 5, 6};
    em_tensor *t = em_from_data(src, EM_F32, EM_SHAPE(2, 3), EM_OPTS(.device = CUDA0));
    CHECK(t != NULL);
    if (!t) return;
    em_tensor *col = em_select(t, 1, 1); /* [2, 5]: offset 1, stride 3 */
    DLManagedTensorVersioned *m = em_to_dlpack(col);
    CHECK(m != NULL);
    if (!m) return;
    DLTensor *d = &m->dl_tensor;
    CHECK(d->device.device_type == kDLCUDA && d->device.device_id == 0);
    CHECK(d->ndim == 1 && d->shape[0] == 2 && d->strides[0] == 3 && d->byte_offset == 0);
    const float *dev = d->data; /* the fake's device memory is host memory: read it in place */
    CHECK(dev[0] == 2 && dev[3] == 5);
    m->deleter(m);
    /* a contiguous row (offset 3) there and back: the same device memory */
    em_tensor *row = em_narrow(t, 0, 1, 1);
    m = em_to_dlpack(row);
    CHECK(m != NULL);
    if (!m) return;
    d = &m->dl_tensor;
    CHECK(d->shape[0] == 1 && d->shape[1] == 3 && d->strides[0] == 3 && d->strides[1] == 1);
    CHECK(((const float *)d->data)[0] == 4);
    g_inner = m->deleter;
    m->deleter = wrapped_delete;
    em_tensor *back = em_from_dlpack(m);
    CHECK(back && em_device_of(back).type == EM_CUDA && em_device_of(back).index == 0);
    float host[3] = {0};
    CHECK_OK(em_copy_to_host(back, host, sizeof host));
    CHECK(host[0] == 4 && host[1] == 5 && host[2] == 6);
    ((float *)d->data)[2] = 60; /* written at the pointer: the import sees it, no copy was made */
    CHECK_OK(em_copy_to_host(back, host, sizeof host));
    CHECK(host[2] == 60);
    em_release(row);
    em_release(col);
    em_release(t);
    CHECK(g_deleted == 0); /* back still holds the producer's memory */
    em_release(back);
    CHECK(g_deleted == 1);
    /* a device id the driver does not have */
    em_tensor *x = em_from_data(src, EM_F32, EM_SHAPE(6), EM_OPTS(.device = CUDA0));
    DLManagedTensorVersioned *m2 = em_to_dlpack(x);
    CHECK(m2 != NULL);
    if (m2) {
        m2->dl_tensor.device.device_id = 7;
        CHECK(em_from_dlpack(m2) == NULL);
        CHECK_ERROR(EM_ERR_DEVICE, "device cuda:7 does not exist");
        m2->deleter(m2);
    }
    em_release(x);
}

int main(void) {
    install(); /* before core's registry asks: it remembers the answer */
    RUN(test_cuda_round_trip_zero_copy);
    em_memory_empty_cache(CUDA0);
    CHECK(F.live_allocs == 0);
    em__cuda_backend_reset();
    return test_summary();
}

#else
int main(void) {
    test_skip_case("DLPack on CUDA", "built without the CUDA headers (cuda.h): the fake driver needs them");
    return test_summary();
}
#endif
