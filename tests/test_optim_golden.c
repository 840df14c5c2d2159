/* Training against PyTorch: replays scripts/golden_training.py's three runs (Adam, SGD with
 * momentum, AdamW with label smoothing and clipping) from the same initial weights and
 * batches, and requires every step's loss within 1e-4 relative of PyTorch's. The data files
 * (tests/data/training_*.bin) are described in the script. */
#include <stdint.h>
#include <stdlib.h>
#include "optim/optim_internal.h"
#include "test.h"

#define MAX_RECORDS 64

typedef struct record {
    char name[96];
    em_tensor *t;
} record;

typedef struct archive {
    record r[MAX_RECORDS];
    int n;
} archive;

static const char *data_dir(void) {
    const char *d = getenv("EMBER_TEST_DATA");
    return d ? d : "tests/data";
}

/* Reads an EMTD file: b"EMTD", u32 version, u32 count, records of (u32 name_len, name,
 * u32 dtype, u32 ndim, i64 shape[ndim], data). Tensors are kept (owned by the archive). */
static bool load(const char *file, archive *a) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", data_dir(), file);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "  cannot open %s\n", path);
        return false;
    }
    char magic[4];
    uint32_t version, count;
    bool ok = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "EMTD", 4) && fread(&version, 4, 1, f) == 1 &&
              version == 1 && fread(&count, 4, 1, f) == 1 && count <= MAX_RECORDS;
    a->n = 0;
    for (uint32_t i = 0; ok && i < count; i++) {
        record *r = &a->r[a->n];
        uint32_t len, dt, ndim;
        ok = fread(&len, 4, 1, f) == 1 && len < sizeof r->name && fread(r->name, 1, len, f) == len;
        if (!ok) break;
        r->name[len] = '\0';
        em_shape shape = {0};
        ok = fread(&dt, 4, 1, f) == 1 && fread(&ndim, 4, 1, f) == 1 && ndim <= EM_MAX_DIMS &&
             fread(shape.d, 8, ndim, f) == ndim;
        if (!ok) break;
        shape.ndim = (int)ndim;
        int64_t numel = 1;
        for (uint32_t k = 0; k < ndim; k++) numel *= shape.d[k];
        size_t bytes = (size_t)numel * em_dtype_size((em_dtype)dt);
        void *buf = malloc(bytes ? bytes : 1);
        ok = buf && fread(buf, 1, bytes, f) == bytes;
        if (ok) {
            em_scope s = em_scope_begin();
            r->t = em_keep(em_from_data(buf, (em_dtype)dt, shape, EM_OPTS(.dtype = (em_dtype)dt)));
            em_scope_end(s);
            ok = r->t != NULL;
            a->n += ok;
        }
        free(buf);
    }
    fclose(f);
    if (!ok) fprintf(stderr, "  %s: corrupt or truncated\n", path);
    return ok;
}

static em_tensor *get(const archive *a, const char *name) {
    for (int i = 0; i < a->n; i++)
        if (!strcmp(a->r[i].name, name)) return a->r[i].t;
    fprintf(stderr, "  missing record %s\n", name);
    return NULL;
}

static void unload(archive *a) {
    for (int i = 0; i < a->n; i++) em_release(a->r[i].t);
    a->n = 0;
}

static archive g_model, g_batches, g_runs;

static em_module *make_model(void) {
    em_module *m = em_nn_sequential(em_nn_linear(16, 32), em_nn_relu(), em_nn_linear(32, 32),
                                 em_nn_gelu(), em_nn_linear(32, 4));
    em_named_tensor ps[8];
    int n = em_module_parameters(m, ps, 8);
    CHECK(n == 6);
    em_grad_mode g = em_no_grad_begin();
    for (int i = 0; i < n; i++) {
        em_tensor *init = get(&g_model, ps[i].name);
        CHECK(init != NULL);
        if (init) CHECK_OK(em_copy_(ps[i].tensor, init));
    }
    em_no_grad_end(g);
    return m;
}

typedef enum { RUN_ADAM, RUN_SGD, RUN_ADAMW } run_kind;

/* fused: the backend's one-pass update (the default); else the op-by-op reference path */
static void replay(run_kind kind, const char *name, bool fused) {
    em_module *m = make_model();
    em_optimizer *opt = kind == RUN_ADAM ? em_adam(m, 1e-2)
                      : kind == RUN_SGD  ? em_sgd_ex(m, (em_sgd_opts){.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4})
                                         : em_adamw_ex(m, (em_adam_opts){.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999,
                                                                         .eps = 1e-8, .weight_decay = 0.1});
    if (opt) em__optim_set_fused(opt, fused);
    char key[128];
    snprintf(key, sizeof key, "%s.losses", name);
    em_tensor *ref = get(&g_runs, key);
    snprintf(key, sizeof key, "%s.norms", name);
    em_tensor *ref_norms = kind == RUN_ADAMW ? get(&g_runs, key) : NULL;
    em_tensor *xs = get(&g_batches, "x"), *ys = get(&g_batches, "y");
    if (!m || !opt || !ref || !xs || !ys || (kind == RUN_ADAMW && !ref_norms)) {
        CHECK(0);
        em_optim_free(opt);
        em_module_free(m);
        return;
    }
    double want[100], norms[100];
    CHECK_OK(em_copy_to_host(ref, want, sizeof want));
    if (ref_norms) CHECK_OK(em_copy_to_host(ref_norms, norms, sizeof norms));
    double worst = 0;
    int bad = 0;
    for (int step = 0; step < 100; step++) {
        em_scope s = em_scope_begin();
        em_tensor *loss = em_cross_entropy(em_forward(m, em_select(xs, 0, step)), em_select(ys, 0, step),
                                           kind == RUN_ADAMW ? 0.1 : 0.0);
        CHECK_OK(em_zero_grad(opt));
        CHECK_OK(em_backward(loss));
        if (kind == RUN_ADAMW) {
            double nrm = em_clip_grad_norm(m, 1.0);
            if (fabs(nrm - norms[step]) > 1e-4 * fabs(norms[step]) && bad++ < 5)
                fprintf(stderr, "  %s step %d: grad norm %.7g, PyTorch %.7g\n", name, step, nrm, norms[step]);
        }
        CHECK_OK(em_step(opt));
        double v = em_item(loss);
        double rel = fabs(v - want[step]) / fabs(want[step]);
        worst = rel > worst ? rel : worst;
        if (!(rel <= 1e-4) && bad++ < 5)
            fprintf(stderr, "  %s step %d: loss %.7g, PyTorch %.7g\n", name, step, v, want[step]);
        em_scope_end(s);
    }
    CHECK(bad == 0);
    printf("     %s (%s): 100 steps, worst relative loss difference %.2g, %lld fused updates\n", name,
           fused ? "fused" : "unfused", worst, (long long)em__optim_fused_updates(opt));
    /* the path asked for is the path taken */
    CHECK(fused ? em__optim_fused_updates(opt) > 0 : em__optim_fused_updates(opt) == 0);
    /* final weights */
    em_named_tensor ps[8];
    int n = em_module_parameters(m, ps, 8);
    em_scope s = em_scope_begin();
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof key, "%s.final.%s", name, ps[i].name);
        em_tensor *w = get(&g_runs, key);
        if (!w) {
            CHECK(0);
            continue;
        }
        double diff = em_item(em_max(em_abs(em_sub(ps[i].tensor, w)), EM_ALL_DIMS, false));
        if (!(diff < 1e-3)) fprintf(stderr, "  %s: final %s differs by %g\n", name, ps[i].name, diff);
        CHECK(diff < 1e-3);
    }
    em_scope_end(s);
    em_optim_free(opt);
    em_module_free(m);
}

static void test_adam(void) { replay(RUN_ADAM, "adam", true); }
static void test_sgd_momentum(void) { replay(RUN_SGD, "sgd", true); }
static void test_adamw_smoothing_clipping(void) { replay(RUN_ADAMW, "adamw", true); }
/* the unfused path against PyTorch too, not only against the fused one */
static void test_adam_unfused(void) { replay(RUN_ADAM, "adam", false); }
static void test_sgd_momentum_unfused(void) { replay(RUN_SGD, "sgd", false); }
static void test_adamw_unfused(void) { replay(RUN_ADAMW, "adamw", false); }

int main(void) {
    em_set_num_threads(1);
    bool ok = load("training_model.bin", &g_model) && load("training_batches.bin", &g_batches) &&
              load("training_runs.bin", &g_runs);
    if (!ok) {
        fprintf(stderr, "cannot read the golden training data (run scripts/golden_training.py)\n");
        unload(&g_model), unload(&g_batches), unload(&g_runs);
        printf("0 passed, 1 failed, 0 skipped\n");
        return 1;
    }
    RUN(test_adam);
    RUN(test_sgd_momentum);
    RUN(test_adamw_smoothing_clipping);
    RUN(test_adam_unfused);
    RUN(test_sgd_momentum_unfused);
    RUN(test_adamw_unfused);
    unload(&g_model), unload(&g_batches), unload(&g_runs);
    return test_summary();
}
