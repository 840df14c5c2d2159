#define _POSIX_C_SOURCE 200809L
/* Convolution and pooling against PyTorch: replays tests/data/golden_conv.bin (made by
 * scripts/golden_conv.py) forward and backward, on the CPU in float64, float32, bfloat16 and
 * float16 (through oneDNN where it is built in, and through the portable im2col path) and on
 * every OpenCL and CUDA device (float32, bf16, f16, float64 where it has it). Each case on each configuration counts as one test. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ember/ember.h>
#include "core/internal_api.h"
#include "test.h"

#define MAXT 10

typedef struct gtensor {
    int ndim;
    int64_t shape[4];
    double *data;
    int64_t numel;
} gtensor;

typedef struct gcase {
    char name[64];
    int kind;
    int64_t p[12];
    int transposed;
    int nt;
    gtensor t[MAXT];
} gcase;

static gcase *g_cases;
static int g_ncases;

static bool rd(FILE *f, void *p, size_t n) { return fread(p, 1, n, f) == n; }

static bool load(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char magic[8];
    uint32_t n;
    bool ok = rd(f, magic, 8) && !memcmp(magic, "EMCONV01", 8) && rd(f, &n, 4) && n < 1000;
    if (ok) g_cases = calloc(n, sizeof *g_cases);
    for (uint32_t i = 0; ok && i < n; i++) {
        gcase *c = &g_cases[i];
        uint16_t len;
        uint8_t kind, tr, nt;
        ok = rd(f, &len, 2) && len < sizeof c->name && rd(f, c->name, len) && rd(f, &kind, 1) && rd(f, c->p, 96) &&
             rd(f, &tr, 1) && rd(f, &nt, 1) && nt <= MAXT;
        if (!ok) break;
        c->kind = kind, c->transposed = tr, c->nt = nt;
        g_ncases = (int)i + 1;
        for (int k = 0; ok && k < nt; k++) {
            gtensor *t = &c->t[k];
            uint8_t nd;
            ok = rd(f, &nd, 1) && nd >= 1 && nd <= 4 && rd(f, t->shape, 8 * (size_t)nd);
            if (!ok) break;
            t->ndim = nd;
            t->numel = 1;
            for (int d = 0; d < nd; d++) t->numel *= t->shape[d];
            t->data = malloc((size_t)t->numel * 8);
            ok = t->data && rd(f, t->data, (size_t)t->numel * 8);
        }
    }
    fclose(f);
    return ok && g_ncases == (int)n;
}

static void unload(void) {
    for (int i = 0; i < g_ncases; i++)
        for (int k = 0; k < g_cases[i].nt; k++) free(g_cases[i].t[k].data);
    free(g_cases);
}

/* the stored tensor on dev in dt; a transposed one is built swapped and transposed back */
static em_tensor *make(const gtensor *t, bool transposed, em_device dev, em_dtype dt) {
    em_shape s = {.ndim = t->ndim};
    for (int d = 0; d < t->ndim; d++) s.d[d] = t->shape[d];
    if (transposed) {
        s.d[t->ndim - 1] = t->shape[t->ndim - 2];
        s.d[t->ndim - 2] = t->shape[t->ndim - 1];
    }
    return em_from_data(t->data, EM_F64, s, EM_OPTS(.device = dev, .dtype = dt));
}

/* |got - want| <= tol * (max |want| + |want|), elementwise */
static bool close_to(const char *what, const gcase *c, em_tensor *got, const gtensor *want, double tol,
                     const char *cfg) {
    if (!got) {
        fprintf(stderr, "  %s [%s] %s: NULL (%s)\n", c->name, cfg, what, em_last_error());
        return false;
    }
    bool shape_ok = em_ndim(got) == want->ndim;
    for (int d = 0; shape_ok && d < want->ndim; d++) shape_ok = em_size(got, d) == want->shape[d];
    if (!shape_ok) {
        fprintf(stderr, "  %s [%s] %s: wrong shape\n", c->name, cfg, what);
        return false;
    }
    double *h = malloc((size_t)want->numel * 8);
    if (!h || em_copy_to_host(em_to_dtype(got, EM_F64), h, (size_t)want->numel * 8) != EM_OK) {
        free(h);
        return false;
    }
    double scale = 0;
    for (int64_t i = 0; i < want->numel; i++) scale = fabs(want->data[i]) > scale ? fabs(want->data[i]) : scale;
    bool ok = true;
    for (int64_t i = 0; i < want->numel && ok; i++) {
        double e = fabs(h[i] - want->data[i]);
        if (!(e <= tol * (scale + fabs(want->data[i])) + 1e-300)) {
            fprintf(stderr, "  %s [%s] %s[%lld]: got %.9g, PyTorch %.9g\n", c->name, cfg, what, (long long)i, h[i],
                    want->data[i]);
            ok = false;
        }
    }
    free(h);
    return ok;
}

static bool is_lowp(em_dtype dt) { return dt == EM_BF16 || dt == EM_F16; }

static bool replay(const gcase *c, em_device dev, em_dtype dt, const char *cfg) {
    /* f16/bf16: the inputs are rounded to the dtype (8 or 11 significant bits), sums run in
     * float32 and the results are rounded once more: a few units of the last place */
    double tol = dt == EM_F64 ? 1e-11 : dt == EM_F32 ? 2e-5 : dt == EM_BF16 ? 1.0 / 64 : 1.0 / 512;
    em_scope s = em_scope_begin();
    em_tensor *xb = make(&c->t[0], c->transposed, dev, dt);
    bool ok = xb && em_set_requires_grad(xb, true) == EM_OK;
    em_tensor *x = c->transposed ? em_transpose(xb, -1, -2) : xb;
    em_tensor *y = NULL, *idx = NULL, *w = NULL, *b = NULL, *gy;
    const int64_t *p = c->p;
    int k = 1;
    if (c->kind == 0) {
        bool bias = p[7] != 0;
        w = make(&c->t[k++], false, dev, dt);
        if (bias) b = make(&c->t[k++], false, dev, dt);
        ok = ok && em_set_requires_grad(w, true) == EM_OK && (!bias || em_set_requires_grad(b, true) == EM_OK);
        gy = make(&c->t[k++], false, dev, dt);
        y = em_conv2d(x, w, b, EM_HW(p[0], p[1]), EM_HW(p[2], p[3]), EM_HW(p[4], p[5]), p[6]);
    } else {
        gy = make(&c->t[k++], false, dev, dt);
        if (c->kind == 1)
            y = em_max_pool2d_with_indices(x, EM_HW(p[0], p[1]), EM_HW(p[2], p[3]), EM_HW(p[4], p[5]),
                                           EM_HW(p[6], p[7]), p[8] != 0, &idx);
        else if (c->kind == 2)
            y = em_avg_pool2d(x, EM_HW(p[0], p[1]), EM_HW(p[2], p[3]), EM_HW(p[4], p[5]), p[6] != 0, p[7] != 0, p[8]);
        else
            y = em_adaptive_avg_pool2d(x, EM_HW(p[0], p[1]));
    }
    ok = ok && close_to("output", c, y, &c->t[k++], tol, cfg);
    if (ok && c->kind == 1) ok = close_to("indices", c, idx, &c->t[k++], 0, cfg);
    if (ok && em_backward_with(y, gy, false) != EM_OK) {
        fprintf(stderr, "  %s [%s] backward: %s\n", c->name, cfg, em_last_error());
        ok = false;
    }
    em_tensor *gx = ok ? em_grad(xb) : NULL;
    if (ok && c->transposed) gx = em_transpose(gx, -1, -2);
    ok = ok && close_to("input grad", c, gx, &c->t[k++], tol, cfg);
    if (c->kind == 0) {
        ok = ok && close_to("weight grad", c, em_grad(w), &c->t[k++], tol, cfg);
        if (b) ok = ok && close_to("bias grad", c, em_grad(b), &c->t[k++], tol, cfg);
    }
    if (em_failed()) {
        fprintf(stderr, "  %s [%s]: %s\n", c->name, cfg, em_last_error());
        em_clear_error();
        ok = false;
    }
    em_scope_end(s);
    return ok;
}

static void replay_all(em_device dev, em_dtype dt, bool portable, const char *label) {
    char cfg[96];
    snprintf(cfg, sizeof cfg, "%s %s%s", em_device_str(dev).s, em_dtype_name(dt), label);
    bool prev = em__conv_force_portable(portable);
    int pass = 0, fail = 0, maxpools = 0;
    for (int i = 0; i < g_ncases; i++) {
        /* rounding to f16/bf16 can tie a window's maximum, and PyTorch's float64 index then
         * need not be Ember's: test_conv_lowp checks max pool against float32 on the same values */
        if (is_lowp(dt) && g_cases[i].kind == 1) {
            maxpools++;
            continue;
        }
        if (replay(&g_cases[i], dev, dt, cfg)) {
            pass++;
            test__passed++;
        } else {
            fail++;
            test__failed++;
            fprintf(stderr, "FAIL golden %s [%s]\n", g_cases[i].name, cfg);
        }
    }
    em__conv_force_portable(prev);
    printf("%-40s %d passed, %d failed\n", cfg, pass, fail);
    if (maxpools) {
        char name[128];
        snprintf(name, sizeof name, "golden max pool [%s]", cfg);
        test_skip_case(name, "%d case(s): ties after rounding (test_conv_lowp covers max pool in %s)", maxpools,
                       em_dtype_name(dt));
    }
}

static void test_file_covers_every_kind(void) {
    int kinds[4] = {0};
    for (int i = 0; i < g_ncases; i++)
        if (g_cases[i].kind >= 0 && g_cases[i].kind < 4) kinds[g_cases[i].kind]++;
    CHECK(g_ncases >= 20);
    for (int k = 0; k < 4; k++) CHECK(kinds[k] >= 4);
}

int main(void) {
    const char *dir = getenv("EMBER_TEST_DATA");
    char path[512];
    snprintf(path, sizeof path, "%s/golden_conv.bin", dir && *dir ? dir : "tests/data");
    if (!load(path)) {
        fprintf(stderr, "cannot read %s\n", path);
        unload();
        return 1;
    }
    RUN(test_file_covers_every_kind);
    em_device cpu = EM_DEVICE(EM_CPU, 0);
    replay_all(cpu, EM_F64, false, "");
#ifdef EMBER_HAVE_DNNL
    replay_all(cpu, EM_F32, false, " (oneDNN)");
#else
    test_skip_case("cpu float32 through oneDNN", "built without oneDNN (EMBER_HAVE_DNNL)");
#endif
    replay_all(cpu, EM_F32, true, " (portable im2col)");
    /* ---- bf16/f16 (float32 accumulation) against the same float64 answers ---- */
#ifdef EMBER_HAVE_DNNL
    replay_all(cpu, EM_BF16, false, " (oneDNN)");
    replay_all(cpu, EM_F16, false, " (oneDNN on float32 copies)");
    setenv("EMBER_CPU_LOWP_GEMM", "portable", 1); /* bf16 too through float32 copies */
    replay_all(cpu, EM_BF16, false, " (oneDNN on float32 copies)");
    unsetenv("EMBER_CPU_LOWP_GEMM");
#else
    test_skip_case("cpu bf16/f16 through oneDNN", "built without oneDNN (EMBER_HAVE_DNNL)");
#endif
    replay_all(cpu, EM_BF16, true, " (portable im2col)");
    replay_all(cpu, EM_F16, true, " (portable im2col)");
    static const em_device_type gpus[] = {EM_OPENCL, EM_CUDA};
    for (int t = 0; t < 2; t++) {
        if (!em_device_available(gpus[t])) {
            char name[64];
            snprintf(name, sizeof name, "golden conv on %s", em_device_type_name(gpus[t]));
            test_skip_case(name, "not available: %s", em_device_unavailable_reason(gpus[t]));
            continue;
        }
        for (int i = 0; i < em_device_count(gpus[t]); i++) {
            em_device d = EM_DEVICE(gpus[t], i);
            replay_all(d, EM_F32, false, "");
            replay_all(d, EM_BF16, false, "");
            replay_all(d, EM_F16, false, "");
            /* float64 where the device has it: a small probe decides */
            em_scope s = em_scope_begin();
            em_tensor *probe = em_ones(EM_SHAPE(1, 1, 2, 2), EM_OPTS(.device = d, .dtype = EM_F64));
            bool f64 = em_conv2d(probe, probe, NULL, EM_HW1(1), EM_HW1(0), EM_HW1(1), 1) != NULL;
            char why[256];
            snprintf(why, sizeof why, "%s", em_last_error());
            em_clear_error();
            em_scope_end(s);
            if (f64) replay_all(d, EM_F64, false, "");
            else test_skip_case("golden conv float64 on a GPU", "%s: %s", em_device_str(d).s, why);
        }
    }
    unload();
    return test_summary();
}
