/* Golden tests of the language-model ops against PyTorch 2.15 and transformers 5: every case of
 * tests/data/golden_lm_ops.safetensors (made by scripts/golden_lm_ops.py) on every available
 * device (the CPU, PoCL's OpenCL device, CUDA): LlamaRMSNorm, SiLU(gate) * up,
 * LlamaRotaryEmbedding's tables for the default, linear and llama3 rope types,
 * apply_rotary_pos_emb, and scaled_dot_product_attention with grouped-query heads, a cache
 * offset and key padding. float32 within 1e-5 relative (gradients, from float64, within
 * 1e-4); bfloat16 results within one bf16 rounding of PyTorch's bf16 ones, with the number of
 * bit-identical elements printed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ember/ember.h>
/* backend_ops_util.h's targets and op_supported only (the conformance of the new ops) */
#pragma GCC diagnostic ignored "-Wunused-function"
#include "backend_ops_util.h"

static em_safetensors *g_file;
static em_device g_dev;
static const char *g_case;

static em_tensor *get(const char *name) {
    char key[160];
    snprintf(key, sizeof key, "%s/%s", g_case, name);
    for (int i = 0; i < em_safetensors_count(g_file); i++)
        if (!strcmp(em_safetensors_name(g_file, i), key)) return em_to(em_safetensors_get(g_file, key), g_dev);
    return NULL;
}
static em_tensor *leaf(const char *name) {
    em_tensor *t = em_clone(get(name));
    if (t) em_set_requires_grad(t, true);
    return t;
}
static double meta_num(const char *key) {
    const char *m = em_safetensors_metadata(g_file, g_case);
    size_t kl = strlen(key);
    for (const char *p = m; p && *p;) {
        if (!strncmp(p, key, kl) && p[kl] == '=') return strtod(p + kl + 1, NULL);
        p = strchr(p, ' ');
        if (p) p++;
    }
    return NAN;
}

/* got against want: float32 within atol + rtol |want|; bf16 within atol plus one bf16 unit of
 * want (2^-7 relative: a rounding one way or the other), reporting the bit-identical share */
static void expect(const char *what, em_tensor *got, em_tensor *want, double atol, double rtol) {
    char label[200];
    snprintf(label, sizeof label, "%s %s %s", em_device_str(g_dev).s, g_case, what);
    if (!got || !want) {
        fprintf(stderr, "  %s: missing (%s)\n", label, em_failed() ? em_last_error() : "no error");
        CHECK(got && want);
        em_clear_error();
        return;
    }
    CHECK(em_numel(got) == em_numel(want) && em_dtype_of(got) == em_dtype_of(want));
    if (em_numel(got) != em_numel(want)) return;
    int64_t n = em_numel(want), same = 0;
    double *x = malloc(sizeof(double) * (size_t)(n + 1)), *y = malloc(sizeof(double) * (size_t)(n + 1));
    CHECK_OK(em_copy_to_host(em_to_dtype(em_cpu(em_contiguous(got)), EM_F64), x, (size_t)n * sizeof *x));
    CHECK_OK(em_copy_to_host(em_to_dtype(em_cpu(want), EM_F64), y, (size_t)n * sizeof *y));
    bool low = em_dtype_of(want) == EM_BF16;
    double worst = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        same += x[i] == y[i];
        double tol = low ? atol + ldexp(fabs(y[i]) > 1e-30 ? fabs(y[i]) : 1e-30, -7) : atol + rtol * fabs(y[i]);
        double e = fabs(x[i] - y[i]) / tol;
        if (!(e <= worst)) worst = e, at = i;
    }
    if (low) printf("  %s: %lld of %lld bit-identical to PyTorch\n", label, (long long)same, (long long)n);
    if (!(worst <= 1)) fprintf(stderr, "  %s: element %lld is %.9g, expected %.9g\n", label, (long long)at, x[at], y[at]);
    CHECK(worst <= 1);
    free(x);
    free(y);
}

static bool is(const char *prefix) { return !strncmp(g_case, prefix, strlen(prefix)); }
static bool bf16(void) { return strstr(g_case, "_bf16") != NULL; }

static void case_rms_norm(void) {
    em_tensor *x = leaf("x"), *w = leaf("w");
    em_tensor *y = em_rms_norm(x, EM_SHAPE(64), w, meta_num("eps"));
    expect("y", y, get("y"), 1e-6, 1e-5);
    em_tensor *gy = get("gy");
    if (!gy) return;
    CHECK_OK(em_backward_with(y, gy, false));
    expect("dx", em_grad(x), get("dx"), 1e-5, 1e-4);
    expect("dw", em_grad(w), get("dw"), 1e-5, 1e-4);
}

static void case_swiglu(void) { expect("y", em_swiglu(get("gate"), get("up")), get("y"), 1e-6, 1e-5); }

static void case_rope_table(void) {
    const char *m = em_safetensors_metadata(g_file, g_case);
    em_rope_config cfg = {.head_dim = (int64_t)meta_num("head_dim"), .theta = meta_num("theta"),
                          .scaling = strstr(m, "scaling=llama3") ? EM_ROPE_LLAMA3
                                     : strstr(m, "scaling=linear") ? EM_ROPE_LINEAR : EM_ROPE_DEFAULT,
                          .factor = meta_num("factor"), .low_freq_factor = meta_num("low"),
                          .high_freq_factor = meta_num("high"), .original_max_position_embeddings = meta_num("original")};
    float inv[64];
    CHECK_OK(em_rope_inv_freq(&cfg, inv));
    em_tensor *want = get("inv_freq");
    if (!want) return;
    expect("inv_freq", em_from_data(inv, EM_F32, EM_SHAPE(cfg.head_dim / 2), EM_OPTS()), em_cpu(want), 0, 1.2e-7);
    em_tensor *cs = NULL, *sn = NULL, *cb = NULL, *sb = NULL;
    CHECK_OK(em_rope_tables(&cfg, get("positions"), EM_F32, g_dev, &cs, &sn));
    CHECK_OK(em_rope_tables(&cfg, get("positions"), EM_BF16, g_dev, &cb, &sb));
    /* cos and sin of the same float32 angle: one float32 rounding apart at most */
    expect("cos", cs, get("cos"), 1.2e-7, 1.2e-7);
    expect("sin", sn, get("sin"), 1.2e-7, 1.2e-7);
    expect("cos bf16", cb, get("cos_bf16"), 0, 0);
    expect("sin bf16", sb, get("sin_bf16"), 0, 0);
}

/* [B, H, T, D] values laid out as [B, T, H, D] (HF's transposed projections) */
static em_tensor *heads_view(em_tensor *t) {
    return t ? em_transpose(em_contiguous(em_transpose(t, 1, 2)), 1, 2) : NULL;
}

static void case_rope(void) {
    em_tensor *q = leaf("q"), *k = leaf("k"), *cs = get("cos"), *sn = get("sin");
    em_tensor *qe = em_rope(heads_view(q), cs, sn), *ke = em_rope(heads_view(k), cs, sn);
    expect("qe", qe, get("qe"), 1e-6, 1e-5);
    expect("ke", ke, get("ke"), 1e-6, 1e-5);
    if (!get("gq")) return;
    em_tensor *loss = em_add(em_sum(em_mul(qe, get("gq")), EM_ALL_DIMS, false), em_sum(em_mul(ke, get("gk")), EM_ALL_DIMS, false));
    CHECK_OK(em_backward(loss));
    expect("dq", em_grad(q), get("dq"), 1e-5, 1e-4);
    expect("dk", em_grad(k), get("dk"), 1e-5, 1e-4);
}

static void case_attention(void) {
    em_tensor *q = leaf("q"), *k = leaf("k"), *v = leaf("v");
    em_attention_opts o = {.causal = meta_num("causal") == 1, .past = (int64_t)meta_num("past"), .key_mask = get("key_mask")};
    em_tensor *y = em_attention(q, k, v, &o);
    const char *node = y ? em_grad_fn_name(y) : NULL;
    bool fused = g_dev.type == EM_CPU || (node && !strcmp(node, "ScaledDotProductAttentionBackward"));
    if (bf16() && !fused) { /* composed: the scores and probabilities are rounded to bf16 too */
        em_tensor *want = get("y");
        em_tensor *d = em_sub(em_to_dtype(y, EM_F32), em_to_dtype(want, EM_F32));
        double err = em_item(em_max(em_abs(d), EM_ALL_DIMS, false));
        printf("  %s %s: composed bf16, max |difference| %.3g\n", em_device_str(g_dev).s, g_case, err);
        CHECK(err < 0.05);
        return;
    }
    /* bf16: PyTorch's CPU kernel rounds the probabilities to bf16 before multiplying by v, Ember
     * keeps them in float32: the outputs (|v| ~ 1) differ by about one bf16 unit of 1 */
    expect("y", y, get("y"), bf16() ? 1.0 / 128 : 1e-6, 1e-5);
    if (!get("gy")) return;
    CHECK_OK(em_backward_with(y, get("gy"), false));
    expect("dq", em_grad(q), get("dq"), 1e-5, 1e-4);
    expect("dk", em_grad(k), get("dk"), 1e-5, 1e-4);
    expect("dv", em_grad(v), get("dv"), 1e-5, 1e-4);
}

static void run_device(em_device d) {
    g_dev = d;
    int cases = 0;
    for (int i = 0; i < em_safetensors_count(g_file); i++) {
        const char *name = em_safetensors_name(g_file, i), *slash = strchr(name, '/');
        static char seen[64][64];
        char c[64];
        snprintf(c, sizeof c, "%.*s", (int)(slash - name), name);
        bool done = false;
        for (int k = 0; k < cases && !done; k++) done = !strcmp(seen[k], c);
        if (done || cases == 64) continue;
        snprintf(seen[cases++], 64, "%s", c);
        g_case = seen[cases - 1];
        em_scope s = em_scope_begin();
        if (is("rms_norm")) case_rms_norm();
        else if (is("swiglu")) case_swiglu();
        else if (is("rope_table")) case_rope_table();
        else if (is("rope")) case_rope();
        else if (is("attn")) case_attention();
        else CHECK(!"a case of an unknown op");
        if (em_failed()) {
            fprintf(stderr, "  %s %s: %s\n", em_device_str(d).s, g_case, em_last_error());
            CHECK(!em_failed());
            em_clear_error();
        }
        em_scope_end(s);
    }
    CHECK(cases == 19);
}

/* Each backend runs the ops tests/required_ops.txt requires of it (a decline off the list is
 * reported as a skip): the fused ops in f32, bf16 and f16 (the CPU's rope in f32: 16-bit
 * composes faster there), the attention in f32 (the CPU's kernels and the GPUs'). */
static void test_required(void) {
    targets_init();
    static const em_op ops[] = {EM_OP_RMS_NORM, EM_OP_RMS_NORM_BACKWARD, EM_OP_SWIGLU, EM_OP_SWIGLU_BACKWARD, EM_OP_ROPE};
    static const em_dtype dts[] = {EM_F32, EM_BF16, EM_F16};
    for (int t = 0; t < g_ntargets; t++) {
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
            for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
                if (!(ops[o] == EM_OP_ROPE && dts[d] != EM_F32 && g_targets[t].dev.type == EM_CPU))
                    op_supported(&g_targets[t], ops[o], dts[d]);
        op_supported(&g_targets[t], EM_OP_SDPA, EM_F32);
        op_supported(&g_targets[t], EM_OP_SDPA_BACKWARD, EM_F32);
    }
}

static void test_cpu(void) { run_device(EM_DEVICE_CPU); }
static void test_opencl(void) {
    if (em_device_count(EM_OPENCL) == 0) SKIP("no OpenCL device");
    run_device(EM_DEVICE(EM_OPENCL, 0));
}
static void test_cuda(void) {
    if (em_device_count(EM_CUDA) == 0) SKIP("no CUDA device");
    run_device(EM_DEVICE(EM_CUDA, 0));
}

int main(void) {
    g_file = em_safetensors_load("tests/data/golden_lm_ops.safetensors", EM_DEVICE_CPU);
    if (!g_file) {
        fprintf(stderr, "cannot load the golden file (run from the source root): %s\n", em_last_error());
        return 1;
    }
    RUN(test_required);
    RUN(test_cpu);
    RUN(test_opencl);
    RUN(test_cuda);
    em_safetensors_free(g_file);
    declines_report();
    return test_summary();
}
