/* Float targets for regression: em_dataset_new keeps a floating y (float32, or float64 as
 * given) of any shape [N, ...], the loader batches it row by row like labels (shuffled or
 * not, on the CPU and on an OpenCL device), integer y stays int64, an MSE regression trains,
 * and a y with a different N is refused. */
#include <stdint.h>
#include <string.h>

#include "test.h"

#define N 37
#define K 3

/* x[i] = (i, -i); y[i][k] = i + 0.25 * k: a batch's targets tell which sample they are. */
static em_dataset *make(int ydim, em_dtype ydt) {
    float x[N * 2], y[N * K];
    for (int i = 0; i < N; i++) {
        x[i * 2] = (float)i;
        x[i * 2 + 1] = (float)-i;
        for (int k = 0; k < K; k++) y[i * K + k] = (float)i + 0.25f * (float)k;
    }
    em_scope s = em_scope_begin();
    em_tensor *tx = em_from_data(x, EM_F32, EM_SHAPE(N, 2), EM_OPTS(0));
    em_tensor *ty;
    if (ydim == 1) {
        float y1[N];
        for (int i = 0; i < N; i++) y1[i] = y[i * K];
        ty = em_from_data(y1, EM_F32, EM_SHAPE(N), EM_OPTS(.dtype = ydt));
    } else {
        ty = em_from_data(y, EM_F32, EM_SHAPE(N, K), EM_OPTS(.dtype = ydt));
    }
    em_dataset *ds = em_dataset_new(tx, ty);
    em_scope_end(s);
    return ds;
}

/* One epoch: every target row matches its x row, every sample seen once. */
static void check_epoch(em_dataset *ds, int ydim, em_dtype want, bool shuffle, em_device dev) {
    em_loader *l = em_loader_new(ds, (em_loader_opts){.batch_size = 8, .shuffle = shuffle, .seed = 5,
                                                      .device = dev});
    CHECK(l != NULL);
    if (!l) return;
    int seen[N] = {0};
    int total = 0;
    bool moved = false;
    em_batch b;
    while (em_loader_next(l, &b)) {
        CHECK(b.y != NULL);
        if (!b.y) break;
        CHECK(em_dtype_of(b.y) == want);
        CHECK(em_device_of(b.y).type == dev.type);
        CHECK(em_ndim(b.y) == ydim && em_size(b.y, 0) == b.size);
        if (ydim == 2) CHECK(em_size(b.y, 1) == K);
        em_scope s = em_scope_begin();
        em_tensor *yh = em_to_device_dtype(b.y, EM_DEVICE_CPU, EM_F32, false);
        em_tensor *xh = em_to_device_dtype(b.x, EM_DEVICE_CPU, EM_F32, false);
        float y[8 * K], x[8 * 2];
        CHECK_OK(em_copy_to_host(yh, y, (size_t)em_numel(yh) * sizeof(float)));
        CHECK_OK(em_copy_to_host(xh, x, (size_t)em_numel(xh) * sizeof(float)));
        for (int64_t i = 0; i < b.size; i++) {
            int idx = (int)x[i * 2];
            CHECK(idx >= 0 && idx < N);
            if (idx < 0 || idx >= N) continue;
            if (total + i != idx) moved = true;
            seen[idx]++;
            for (int k = 0; k < (ydim == 2 ? K : 1); k++)
                CHECK(y[i * (ydim == 2 ? K : 1) + k] == (float)idx + 0.25f * (float)k);
        }
        total += (int)b.size;
        em_scope_end(s);
    }
    CHECK_OK(em_last_status());
    CHECK(total == N);
    for (int i = 0; i < N; i++) CHECK(seen[i] == 1);
    CHECK(moved == shuffle);  /* shuffled epochs are not in order, plain ones are */
    em_loader_free(l);
}

static void test_roundtrip_cpu(void) {
    for (int ydim = 1; ydim <= 2; ydim++) {
        em_dataset *ds = make(ydim, EM_F32);
        CHECK(ds != NULL);
        if (!ds) return;
        check_epoch(ds, ydim, EM_F32, false, EM_DEVICE_CPU);
        check_epoch(ds, ydim, EM_F32, true, EM_DEVICE_CPU);
        em_dataset_free(ds);
    }
    em_dataset *ds = make(2, EM_F64);  /* float64 targets stay float64 */
    CHECK(ds != NULL);
    if (ds) check_epoch(ds, 2, EM_F64, true, EM_DEVICE_CPU);
    em_dataset_free(ds);
}

static void test_int_targets_stay_int64(void) {
    int32_t y[N];
    float x[N];
    for (int i = 0; i < N; i++) x[i] = (float)(y[i] = i % 4);
    em_scope s = em_scope_begin();
    em_dataset *ds = em_dataset_new(em_from_data(x, EM_F32, EM_SHAPE(N, 1), EM_OPTS(0)),
                                    em_from_data(y, EM_I32, EM_SHAPE(N), EM_OPTS(.dtype = EM_I32)));
    em_scope_end(s);
    CHECK(ds != NULL);
    if (!ds) return;
    em_loader *l = em_loader_new(ds, (em_loader_opts){.batch_size = 10});
    em_batch b;
    CHECK(l && em_loader_next(l, &b));
    if (l && b.y) {
        CHECK(em_dtype_of(b.y) == EM_I64 && em_ndim(b.y) == 1);
        int64_t v[10];
        CHECK_OK(em_copy_to_host(b.y, v, sizeof v));
        for (int i = 0; i < 10; i++) CHECK(v[i] == i % 4);
    }
    em_loader_free(l);
    em_dataset_free(ds);
}

static void test_bad_n(void) {
    float x[N * 2] = {0}, y[N - 1] = {0};
    em_scope s = em_scope_begin();
    em_dataset *ds = em_dataset_new(em_from_data(x, EM_F32, EM_SHAPE(N, 2), EM_OPTS(0)),
                                    em_from_data(y, EM_F32, EM_SHAPE(N - 1), EM_OPTS(0)));
    em_scope_end(s);
    CHECK(ds == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "37 samples but 36 labels");
}

/* y = 2 * x0 - x1 + 1 learnt by a linear layer with MSE over float-target batches. */
static void test_mse_trains(void) {
    float x[64 * 2], y[64];
    for (int i = 0; i < 64; i++) {
        x[i * 2] = (float)(i % 8) / 8.0f;
        x[i * 2 + 1] = (float)(i / 8) / 8.0f;
        y[i] = 2.0f * x[i * 2] - x[i * 2 + 1] + 1.0f;
    }
    em_manual_seed(1);
    em_scope s = em_scope_begin();
    em_dataset *ds = em_dataset_new(em_from_data(x, EM_F32, EM_SHAPE(64, 2), EM_OPTS(0)),
                                    em_from_data(y, EM_F32, EM_SHAPE(64, 1), EM_OPTS(0)));
    em_scope_end(s);
    CHECK(ds != NULL);
    if (!ds) return;
    em_module *m = em_nn_linear(2, 1);
    em_optimizer *opt = em_sgd(m, 0.2);
    em_loader *l = em_loader_new(ds, (em_loader_opts){.batch_size = 16, .shuffle = true, .seed = 3});
    CHECK(m && opt && l);
    double first = -1, last = -1;
    for (int ep = 0; l && ep < 30; ep++) {
        double sum = 0;
        em_batch b;
        while (em_loader_next(l, &b)) {
            em_scope bs = em_scope_begin();
            em_tensor *loss = em_mse_loss(em_forward(m, b.x), b.y);
            CHECK_OK(em_zero_grad(opt));
            CHECK_OK(em_backward(loss));
            CHECK_OK(em_step(opt));
            sum += em_item(loss);
            em_scope_end(bs);
        }
        if (ep == 0) first = sum;
        last = sum;
    }
    fprintf(stderr, "  mse: epoch 1 %.4f, epoch 30 %.6f\n", first / 4, last / 4);
    CHECK(first > 0 && last < first * 0.05);
    em_loader_free(l);
    em_optim_free(opt);
    em_module_free(m);
    em_dataset_free(ds);
}

static void test_opencl(void) {
    if (!em_device_available(EM_OPENCL)) SKIP("no OpenCL device");
    em_device dev = EM_DEVICE(EM_OPENCL, 0);
    em_dataset *ds = make(2, EM_F32);
    CHECK(ds != NULL);
    if (ds) {
        check_epoch(ds, 2, EM_F32, true, dev);
        check_epoch(ds, 2, EM_F32, false, dev);
    }
    em_dataset_free(ds);
}

int main(void) {
    RUN(test_roundtrip_cpu);
    RUN(test_int_targets_stay_int64);
    RUN(test_bad_n);
    RUN(test_mse_trains);
    RUN(test_opencl);
    return test_summary();
}
