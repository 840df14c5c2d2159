/* Golden tests against PyTorch for LayerNorm, BatchNorm, Embedding, scaled_dot_product_attention,
 * MultiheadAttention, index_add and scatter_add: forward and backward of every case of
 * tests/data/golden_transformer.safetensors (made by scripts/golden_transformer.py) on every
 * available device (the CPU, PoCL's OpenCL device, CUDA), compared within float32 tolerance. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ember/ember.h>
#include "test.h"

static em_safetensors *g_file;
static em_device g_dev;
static char g_case[64];
static int g_compared;

/* The case's tensor `name` on the device under test (NULL if the file has none). */
static em_tensor *get(const char *name) {
    char key[160];
    snprintf(key, sizeof key, "%s/%s", g_case, name);
    for (int i = 0; i < em_safetensors_count(g_file); i++)
        if (!strcmp(em_safetensors_name(g_file, i), key)) return em_to(em_safetensors_get(g_file, key), g_dev);
    return NULL;
}

/* A float input that records gradients. */
static em_tensor *leaf(const char *name) {
    em_tensor *g = get(name);
    em_tensor *t = g ? em_clone(g) : NULL;
    if (t) em_set_requires_grad(t, true);
    return t;
}

/* The same values laid out transposed in memory (a non-contiguous view). */
static em_tensor *noncontig(em_tensor *t) {
    if (!t || em_ndim(t) < 2) return t;
    return em_transpose(em_contiguous(em_transpose(t, -1, -2)), -1, -2);
}

static const char *meta(const char *key, char *buf, size_t size) {
    const char *m = em_safetensors_metadata(g_file, g_case);
    size_t kl = strlen(key);
    for (const char *p = m; p && *p;) {
        if (!strncmp(p, key, kl) && p[kl] == '=') {
            size_t n = strcspn(p + kl + 1, " ");
            snprintf(buf, size, "%.*s", (int)(n < size ? n : size - 1), p + kl + 1);
            return buf;
        }
        p = strchr(p, ' ');
        if (p) p++;
    }
    return NULL;
}
static double meta_num(const char *key) {
    char b[64];
    const char *v = meta(key, b, sizeof b);
    return v ? strtod(v, NULL) : NAN;
}

/* got within atol + rtol * |want| of want, element by element */
static void expect_close(const char *what, em_tensor *got, em_tensor *want) {
    char label[200];
    snprintf(label, sizeof label, "%s %s %s", em_device_str(g_dev).s, g_case, what);
    if (!got || !want) {
        fprintf(stderr, "  %s: %s is missing (%s)\n", label, got ? "the expected tensor" : "the result",
                em_failed() ? em_last_error() : "no error");
        CHECK(got && want);
        em_clear_error();
        return;
    }
    em_shape a = em_shape_of(got), b = em_shape_of(want);
    bool same = a.ndim == b.ndim;
    for (int i = 0; same && i < a.ndim; i++) same = a.d[i] == b.d[i];
    if (!same) {
        fprintf(stderr, "  %s: shape differs (ndim %d vs %d)\n", label, a.ndim, b.ndim);
        CHECK(same);
        return;
    }
    int64_t n = em_numel(want);
    double *x = malloc((size_t)(n + 1) * sizeof *x), *y = malloc((size_t)(n + 1) * sizeof *y);
    CHECK_OK(em_copy_to_host(em_to_dtype(em_cpu(got), EM_F64), x, (size_t)n * sizeof *x));
    CHECK_OK(em_copy_to_host(em_to_dtype(em_cpu(want), EM_F64), y, (size_t)n * sizeof *y));
    double worst = 0;
    int64_t at = -1;
    for (int64_t i = 0; i < n; i++) {
        double err = fabs(x[i] - y[i]) / (2e-5 + 1e-4 * fabs(y[i]));
        if (!(err <= worst)) worst = err, at = i;
    }
    if (worst > 1.0 || isnan(worst)) fprintf(stderr, "  %s: element %lld is %.8g, expected %.8g\n", label, (long long)at,
                                             x[at], y[at]);
    CHECK(worst <= 1.0);
    g_compared++;
    free(x);
    free(y);
}

static void expect_grad(const char *name, em_tensor *t) {
    char d[64];
    snprintf(d, sizeof d, "d%s", name);
    expect_close(d, em_grad(t), get(d));
}

static void case_layer_norm(void) {
    em_tensor *x = leaf("x"), *w = leaf("w"), *b = leaf("b");
    bool nc = meta_num("nc") == 1;
    int k = (int)meta_num("nshape");
    em_shape xs = em_shape_of(x), ns = {.ndim = k};
    for (int i = 0; i < k; i++) ns.d[i] = xs.d[xs.ndim - k + i];
    em_tensor *y = em_layer_norm(nc ? noncontig(x) : x, ns, w, b, meta_num("eps"));
    expect_close("y", y, get("y"));
    CHECK_OK(em_backward_with(y, get("gy"), false));
    expect_grad("x", x);
    if (w) expect_grad("w", w), expect_grad("b", b);
}

static void case_batch_norm(void) {
    em_tensor *x = leaf("x"), *w = leaf("w"), *b = leaf("b");
    em_tensor *rm = em_clone(get("rm")), *rv = em_clone(get("rv"));
    bool train = meta_num("train") == 1, nc = meta_num("nc") == 1;
    em_tensor *y = em_batch_norm(nc ? noncontig(x) : x, rm, rv, w, b, train, meta_num("momentum"), meta_num("eps"));
    expect_close("y", y, get("y"));
    CHECK_OK(em_backward_with(y, get("gy"), false));
    expect_grad("x", x);
    expect_grad("w", w);
    expect_grad("b", b);
    if (train) {
        expect_close("running_mean", rm, get("rm_after"));
        expect_close("running_var", rv, get("rv_after"));
    } else {
        expect_close("running_mean (unchanged)", rm, get("rm"));
    }
}

static em_tensor *param(em_module *m, const char *name) {
    em_named_tensor list[16];
    int n = em_module_parameters(m, list, 16);
    for (int i = 0; i < n && i < 16; i++)
        if (!strcmp(list[i].name, name)) return list[i].tensor;
    n = em_module_buffers(m, list, 16);
    for (int i = 0; i < n && i < 16; i++)
        if (!strcmp(list[i].name, name)) return list[i].tensor;
    return NULL;
}

static void set_param(em_module *m, const char *name, em_tensor *v) {
    em_grad_mode g = em_no_grad_begin();
    em_tensor *p = param(m, name);
    CHECK(p != NULL);
    if (p) CHECK_OK(em_copy_(p, v));
    em_no_grad_end(g);
}

static void case_bn_module(void) {
    em_module *m = em_nn_batch_norm2d(3);
    CHECK_OK(em_module_to(m, g_dev));
    set_param(m, "weight", get("w"));
    set_param(m, "bias", get("b"));
    for (int s = 0; s < 3; s++) {
        char n[4][8];
        snprintf(n[0], 8, "x%d", s), snprintf(n[1], 8, "y%d", s), snprintf(n[2], 8, "rm%d", s), snprintf(n[3], 8, "rv%d", s);
        expect_close(n[1], em_forward(m, get(n[0])), get(n[1]));
        expect_close(n[2], param(m, "running_mean"), get(n[2]));
        expect_close(n[3], param(m, "running_var"), get(n[3]));
    }
    em_module_eval(m);
    expect_close("eval y", em_forward(m, get("xe")), get("ye"));
    expect_close("num_batches_tracked", param(m, "num_batches_tracked"), get("nbt"));
    expect_close("running_mean unchanged by eval", param(m, "running_mean"), get("rm2"));
    em_module_free(m);
}

static void case_embedding(void) {
    em_tensor *w = leaf("w");
    char b[32];
    const char *p = meta("padding_idx", b, sizeof b);
    int64_t pad = !p || !strcmp(p, "none") ? EM_NO_PADDING_IDX : strtoll(p, NULL, 10);
    em_tensor *y = em_embedding(get("idx"), w, pad);
    expect_close("y", y, get("y"));
    CHECK_OK(em_backward_with(y, get("gy"), false));
    expect_grad("w", w);
}

static void case_sdpa(void) {
    em_tensor *q = leaf("q"), *k = leaf("k"), *v = leaf("v");
    bool nc = meta_num("nc") == 1;
    em_tensor *y = em_scaled_dot_product_attention(nc ? noncontig(q) : q, nc ? noncontig(k) : k, v, get("mask"), 0.0,
                                                   meta_num("causal") == 1);
    expect_close("y", y, get("y"));
    CHECK_OK(em_backward_with(y, get("gy"), false));
    expect_grad("q", q);
    expect_grad("k", k);
    expect_grad("v", v);
}

static void mha_once(bool causal_flag) {
    char kind[16];
    meta("kind", kind, sizeof kind);
    em_module *m = em_nn_multihead_attention((int64_t)meta_num("embed_dim"), (int64_t)meta_num("num_heads"));
    CHECK_OK(em_module_to(m, g_dev));
    static const char *const names[] = {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"};
    for (int i = 0; i < 4; i++) {
        char n[64];
        snprintf(n, sizeof n, "p.%s", names[i]);
        set_param(m, names[i], get(n));
    }
    em_tensor *q = leaf("q"), *k = get("k") ? leaf("k") : q, *v = get("v") ? leaf("v") : q;
    em_tensor *mask = causal_flag ? NULL : get("mask");
    em_tensor *y = em_multihead_attention_forward(m, q, k, v, mask, causal_flag, NULL);
    expect_close(causal_flag ? "y (is_causal)" : "y", y, get("y"));
    CHECK_OK(em_backward_with(y, get("gy"), false));
    expect_grad("q", q);
    if (k != q) expect_grad("k", k), expect_grad("v", v);
    for (int i = 0; i < 4; i++) {
        char n[64];
        snprintf(n, sizeof n, "dp.%s", names[i]);
        expect_close(n, em_grad(param(m, names[i])), get(n));
    }
    em_module_free(m);
}

static void case_mha(void) {
    char kind[16];
    mha_once(false);
    if (!strcmp(meta("kind", kind, sizeof kind), "causal")) mha_once(true); /* the -inf mask == is_causal */
}

static void case_accumulate(bool scatter) {
    em_tensor *a = leaf("a"), *src = leaf("src");
    int dim = (int)meta_num("dim");
    em_tensor *y = scatter ? em_scatter_add(a, dim, get("idx"), src)
                           : em_index_add(a, dim, get("idx"), src, meta_num("alpha"));
    expect_close("y", y, get("y"));
    CHECK_OK(em_backward_with(y, get("gy"), false));
    expect_grad("a", a);
    expect_grad("src", src);
}

static void replay(em_device dev) {
    g_dev = dev;
    int cases = 0;
    g_compared = 0;
    char seen[128][64];
    int nseen = 0;
    for (int i = 0; i < em_safetensors_count(g_file); i++) {
        const char *name = em_safetensors_name(g_file, i);
        size_t n = strcspn(name, "/");
        snprintf(g_case, sizeof g_case, "%.*s", (int)n, name);
        bool dup = false;
        for (int s = 0; s < nseen && !dup; s++) dup = !strcmp(seen[s], g_case);
        if (dup || nseen >= 128) continue;
        snprintf(seen[nseen++], 64, "%s", g_case);
        char op[32];
        if (!meta("op", op, sizeof op)) {
            fprintf(stderr, "  case %s has no op\n", g_case);
            CHECK(false);
            continue;
        }
        em_scope s = em_scope_begin();
        if (!strcmp(op, "layer_norm")) case_layer_norm();
        else if (!strcmp(op, "batch_norm")) case_batch_norm();
        else if (!strcmp(op, "bn_module")) case_bn_module();
        else if (!strcmp(op, "embedding")) case_embedding();
        else if (!strcmp(op, "sdpa")) case_sdpa();
        else if (!strcmp(op, "mha")) case_mha();
        else if (!strcmp(op, "index_add")) case_accumulate(false);
        else if (!strcmp(op, "scatter_add")) case_accumulate(true);
        else {
            fprintf(stderr, "  case %s: unknown op %s\n", g_case, op);
            CHECK(false);
        }
        em_scope_end(s);
        if (em_failed()) fprintf(stderr, "  %s %s: %s\n", em_device_str(dev).s, g_case, em_last_error());
        CHECK(!em_failed());
        em_clear_error();
        cases++;
    }
    printf("%-9s %d golden cases, %d tensors compared\n", em_device_str(dev).s, cases, g_compared);
    CHECK(cases >= 39);
}

static void test_cpu(void) { replay(EM_DEVICE_CPU); }

static void test_opencl(void) {
    if (!em_device_available(EM_OPENCL)) SKIP("no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    for (int i = 0; i < em_device_count(EM_OPENCL); i++) replay(EM_DEVICE(EM_OPENCL, i));
}

static void test_cuda(void) {
    if (!em_device_available(EM_CUDA)) SKIP("no CUDA device: %s", em_device_unavailable_reason(EM_CUDA));
    for (int i = 0; i < em_device_count(EM_CUDA); i++) replay(EM_DEVICE(EM_CUDA, i));
}

int main(void) {
    const char *dir = getenv("EMBER_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/golden_transformer.safetensors", dir && *dir ? dir : "tests/data");
    g_file = em_safetensors_load(path, EM_DEVICE_CPU);
    if (!g_file) {
        fprintf(stderr, "cannot load %s: %s\n", path, em_last_error());
        return 1;
    }
    RUN(test_cpu);
    RUN(test_opencl);
    RUN(test_cuda);
    em_safetensors_free(g_file);
    return test_summary();
}
