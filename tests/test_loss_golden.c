/* Golden tests of the losses against PyTorch 2.15: every case of
 * tests/data/golden_losses.safetensors (made by scripts/golden_losses.py): cross_entropy with
 * class indices ([N, C], [C], [N, C, d1, d2]) and with class probabilities, nll_loss and
 * mse_loss, for every reduction, with and without class weights, ignore_index (PyTorch's
 * default -100 and another) and label smoothing, and a batch whose every target is ignored.
 * The loss and the input's gradient (of sum(loss * gy)) against PyTorch's, computed in
 * float64: Ember in float64 on the CPU within 1e-10, and in float32 on every device within
 * 2e-5 relative. Then the options' bad arguments. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "test.h"

static em_safetensors *g_file;
static em_device g_dev;
static em_dtype g_dt;
static const char *g_case;

static em_tensor *get(const char *name) {
    char key[160];
    snprintf(key, sizeof key, "%s/%s", g_case, name);
    for (int i = 0; i < em_safetensors_count(g_file); i++)
        if (!strcmp(em_safetensors_name(g_file, i), key)) return em_to(em_safetensors_get(g_file, key), g_dev);
    return NULL;
}

/* the value of key=... in the case's metadata ("" when absent) */
static const char *meta(const char *key, char *buf, size_t size) {
    const char *m = em_safetensors_metadata(g_file, g_case);
    size_t kl = strlen(key);
    buf[0] = '\0';
    for (const char *p = m; p && *p;) {
        if (!strncmp(p, key, kl) && p[kl] == '=') {
            size_t n = strcspn(p + kl + 1, " ");
            snprintf(buf, size, "%.*s", (int)n, p + kl + 1);
            break;
        }
        p = strchr(p, ' ');
        if (p) p++;
    }
    return buf;
}

/* got against want (float64): within atol + rtol |want|, NaN where want is NaN */
static void expect(const char *what, em_tensor *got, em_tensor *want, double atol, double rtol) {
    char label[200];
    snprintf(label, sizeof label, "%s %s %s %s", em_device_str(g_dev).s, em_dtype_name(g_dt), g_case, what);
    if (!got || !want || em_numel(got) != em_numel(want)) {
        fprintf(stderr, "  %s: missing or of another size (%s)\n", label, em_failed() ? em_last_error() : "no error");
        CHECK(got && want && em_numel(got) == em_numel(want));
        em_clear_error();
        return;
    }
    CHECK(em_ndim(got) == em_ndim(want));
    int64_t n = em_numel(want);
    double *x = malloc(sizeof(double) * (size_t)(n + 1)), *y = malloc(sizeof(double) * (size_t)(n + 1));
    CHECK_OK(em_copy_to_host(em_to_dtype(em_cpu(em_contiguous(got)), EM_F64), x, (size_t)n * sizeof *x));
    CHECK_OK(em_copy_to_host(em_to_dtype(em_cpu(want), EM_F64), y, (size_t)n * sizeof *y));
    for (int64_t i = 0; i < n; i++) {
        bool ok = isnan(y[i]) ? isnan(x[i]) : fabs(x[i] - y[i]) <= atol + rtol * fabs(y[i]);
        if (!ok) {
            fprintf(stderr, "  %s: element %lld is %.12g, expected %.12g\n", label, (long long)i, x[i], y[i]);
            CHECK(ok);
            break;
        }
    }
    free(x);
    free(y);
}

static void run_case(void) {
    char op[32], red[16], ign[32], smooth[32], weight[8];
    meta("op", op, sizeof op);
    meta("reduction", red, sizeof red);
    meta("ignore_index", ign, sizeof ign);
    meta("label_smoothing", smooth, sizeof smooth);
    meta("weight", weight, sizeof weight);
    int64_t ignore_index = strtoll(ign, NULL, 10);
    em_loss_opts o = {
        .reduction = !strcmp(red, "none") ? EM_REDUCTION_NONE : !strcmp(red, "sum") ? EM_REDUCTION_SUM : EM_REDUCTION_MEAN,
        .weight = !strcmp(weight, "1") ? em_to_dtype(get("weight"), g_dt) : NULL,
        .ignore_index = strcmp(ign, "none") ? &ignore_index : NULL,
        .label_smoothing = strtod(smooth, NULL),
    };
    em_tensor *x = em_clone(em_to_dtype(get("x"), g_dt)), *target = get("target");
    CHECK(x && target);
    if (em_dtype_is_floating(em_dtype_of(target))) target = em_to_dtype(target, g_dt);
    em_set_requires_grad(x, true);
    em_tensor *loss = !strcmp(op, "cross_entropy") ? em_cross_entropy_ex(x, target, &o)
                      : !strcmp(op, "nll_loss")    ? em_nll_loss_ex(x, target, &o)
                                                   : em_mse_loss_ex(x, target, &o);
    bool f64 = g_dt == EM_F64;
    expect("loss", loss, get("loss"), f64 ? 1e-12 : 1e-6, f64 ? 1e-10 : 2e-5);
    CHECK_OK(em_backward(em_sum(em_mul(loss, em_to_dtype(get("gy"), g_dt)), EM_ALL_DIMS, false)));
    expect("dx", em_grad(x), get("dx"), f64 ? 1e-12 : 1e-6, f64 ? 1e-10 : 2e-5);
    /* the old entry points are the defaults of the new ones */
    if (o.reduction == EM_REDUCTION_MEAN && !o.weight && !o.ignore_index) {
        em_tensor *old = !strcmp(op, "cross_entropy") ? em_cross_entropy(x, target, o.label_smoothing)
                         : !strcmp(op, "nll_loss")    ? em_nll_loss(x, target)
                                                      : em_mse_loss(x, target);
        expect("loss (old entry point)", old, get("loss"), f64 ? 1e-12 : 1e-6, f64 ? 1e-10 : 2e-5);
    }
}

static void run_device(em_device d, em_dtype dt) {
    g_dev = d;
    g_dt = dt;
    int cases = 0;
    for (int i = 0; i < em_safetensors_count(g_file); i++) {
        const char *name = em_safetensors_name(g_file, i), *slash = strchr(name, '/');
        if (!slash || strcmp(slash, "/loss")) continue;
        char c[64];
        snprintf(c, sizeof c, "%.*s", (int)(slash - name), name);
        g_case = c;
        cases++;
        em_scope s = em_scope_begin();
        run_case();
        if (em_failed()) {
            fprintf(stderr, "  %s %s: %s\n", em_device_str(d).s, g_case, em_last_error());
            CHECK(!em_failed());
            em_clear_error();
        }
        em_scope_end(s);
    }
    CHECK(cases == 105);
}

static void test_cpu_f64(void) { run_device(EM_DEVICE_CPU, EM_F64); }
static void test_cpu_f32(void) { run_device(EM_DEVICE_CPU, EM_F32); }
static void test_opencl_f32(void) {
    if (em_device_count(EM_OPENCL) == 0) SKIP("no OpenCL device");
    run_device(EM_DEVICE(EM_OPENCL, 0), EM_F32);
}
static void test_cuda_f32(void) {
    if (em_device_count(EM_CUDA) == 0) SKIP("no CUDA device");
    run_device(EM_DEVICE(EM_CUDA, 0), EM_F32);
}

/* Every option's bad values: a clear error naming the loss, nothing made. */
static void test_bad_arguments(void) {
    em_scope s = em_scope_begin();
    em_tensor *x = em_randn(EM_SHAPE(4, 3), EM_OPTS(0));
    em_tensor *t = em_from_data((int64_t[]){0, 2, 1, 2}, EM_I64, EM_SHAPE(4), EM_OPTS(.dtype = EM_I64));
    CHECK(em_cross_entropy_ex(x, t, &(em_loss_opts){.reduction = (em_reduction)7}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "cross_entropy: reduction must be EM_REDUCTION_MEAN, EM_REDUCTION_SUM or EM_REDUCTION_NONE, got 7");
    CHECK(em_cross_entropy_ex(x, t, &(em_loss_opts){.label_smoothing = 1.5}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "label_smoothing must be between 0.0 and 1.0. Got: 1.5");
    CHECK(em_cross_entropy_ex(x, t, &(em_loss_opts){.label_smoothing = NAN}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "label_smoothing must be between 0.0 and 1.0");
    CHECK(em_cross_entropy_ex(x, t, &(em_loss_opts){.weight = em_ones(EM_SHAPE(4), EM_OPTS(0))}) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "weight tensor should be defined either for all 3 classes or no classes but got weight tensor of shape: [4]");
    CHECK(em_nll_loss_ex(x, t, &(em_loss_opts){.weight = em_ones(EM_SHAPE(1, 3), EM_OPTS(0))}) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "nll_loss: weight tensor should be defined either for all 3 classes");
    CHECK(em_cross_entropy_ex(x, t, &(em_loss_opts){.weight = em_ones(EM_SHAPE(3), EM_OPTS(.dtype = EM_I64))}) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "cross_entropy: expected a floating weight, got int64");
    /* a target out of range names its position; ignore_index itself is fine */
    em_tensor *bad = em_from_data((int64_t[]){0, 2, 7, 1}, EM_I64, EM_SHAPE(4), EM_OPTS(.dtype = EM_I64));
    CHECK(em_cross_entropy_ex(x, bad, NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "cross_entropy: Target 7 is out of bounds: target[2] must be a class index in [0, 3) or ignore_index (-100)");
    em_tensor *neg = em_from_data((int64_t[]){0, -1, 2, 1}, EM_I64, EM_SHAPE(4), EM_OPTS(.dtype = EM_I64));
    CHECK(em_nll_loss_ex(em_log_softmax(x, 1), neg, NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "nll_loss: Target -1 is out of bounds: target[1]");
    CHECK(em_nll_loss_ex(em_log_softmax(x, 1), neg, &(em_loss_opts){.ignore_index = &(int64_t){-1}}) != NULL);
    em_tensor *t3 = em_zeros(EM_SHAPE(2, 2, 2), EM_OPTS(.dtype = EM_I64));
    em_tensor *x3 = em_randn(EM_SHAPE(2, 3, 2, 2), EM_OPTS(0));
    em_copy_(em_select(em_select(em_select(t3, 0, 1), 0, 1), 0, 0), em_scalar(5, EM_OPTS(.dtype = EM_I64)));
    CHECK(em_cross_entropy_ex(x3, t3, NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "Target 5 is out of bounds: target[1, 1, 0]");
    /* probabilities: ignore_index must stay negative; the shape must be the input's */
    em_tensor *p = em_softmax(em_randn(EM_SHAPE(4, 3), EM_OPTS(0)), 1);
    CHECK(em_cross_entropy_ex(x, p, &(em_loss_opts){.ignore_index = &(int64_t){0}}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "cross_entropy: ignore_index is not supported for floating point target");
    CHECK(em_cross_entropy_ex(x, em_softmax(em_randn(EM_SHAPE(4, 2), EM_OPTS(0)), 1), NULL) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "cross_entropy: probability targets must have the input's shape [4, 3], got [4, 2]");
    CHECK(em_cross_entropy_ex(x, em_zeros(EM_SHAPE(3), EM_OPTS(.dtype = EM_I64)), NULL) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "cross_entropy: expected target size [4], got [3]");
    /* options a loss does not take */
    CHECK(em_nll_loss_ex(em_log_softmax(x, 1), t, &(em_loss_opts){.label_smoothing = 0.1}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "nll_loss: takes no label_smoothing (got 0.1)");
    CHECK(em_nll_loss_ex(x, p, NULL) == NULL);
    CHECK_ERROR(EM_ERR_DTYPE, "nll_loss: expected class indices (an integer target), got float32");
    CHECK(em_mse_loss_ex(x, p, &(em_loss_opts){.weight = em_ones(EM_SHAPE(3), EM_OPTS(0))}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "mse_loss: takes only a reduction");
    CHECK(em_mse_loss_ex(x, p, &(em_loss_opts){.reduction = (em_reduction)-1}) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "mse_loss: reduction must be");
    /* NULL inputs: reported when nothing is pending, else the earlier error is kept */
    CHECK(em_cross_entropy_ex(NULL, t, NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "cross_entropy: input is NULL");
    CHECK(em_mse_loss_ex(x, NULL, NULL) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "mse_loss: target is NULL");
    CHECK(em_cross_entropy_ex(em_zeros(EM_SHAPE(-1), EM_OPTS(0)), t, NULL) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "em_zeros");
    CHECK(em_cross_entropy_ex(em_scalar(1.0, EM_OPTS(0)), t, NULL) == NULL);
    CHECK_ERROR(EM_ERR_SHAPE, "cross_entropy: input must have a class dimension");
    em_scope_end(s);
}

int main(void) {
    g_file = em_safetensors_load("tests/data/golden_losses.safetensors", EM_DEVICE_CPU);
    if (!g_file) {
        fprintf(stderr, "cannot read the golden file: %s\n", em_last_error());
        return 1;
    }
    RUN(test_cpu_f64);
    RUN(test_cpu_f32);
    RUN(test_opencl_f32);
    RUN(test_cuda_f32);
    RUN(test_bad_arguments);
    em_safetensors_free(g_file);
    return test_summary();
}
