/* `ember mem`: measured peaks next to the estimates (see mem_measured.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "mem_measured.h"
#include "mlp.h"
#include "model_cnn.h"
#include "train_ckpt.h"

bool mem_measure_fits(double bytes, double flops, char *why_not, size_t size) {
    if (bytes <= MEM_MEASURE_MAX_BYTES && flops <= MEM_MEASURE_MAX_FLOPS) return true;
    snprintf(why_not, size, "two steps would take %.3g GB at their peak and %.3g GFLOP; ember mem measures steps "
             "up to %.3g GB and %.3g GFLOP (the estimate above is the formula's)", bytes / 1e9, flops / 1e9,
             MEM_MEASURE_MAX_BYTES / 1e9, MEM_MEASURE_MAX_FLOPS / 1e9);
    return false;
}

void mem_print_measured(double estimate, double peak, const char *what, const char *why_not) {
    if (isnan(peak)) {
        if (why_not) printf("  measured peak     not measured: %s\n", why_not);
        else printf("  measured peak     not measured: the steps of %s failed\n", what);
        return;
    }
    printf("  measured peak     %9.2f MB  the CPU allocator's peak over %s (em_memory_max_allocated, reset "
           "first): the estimate is %+.1f%% of it\n", peak / 1e6, what, 100.0 * (estimate - peak) / peak);
}

static em_optimizer *make_optimizer(em_module *m, em_estimate_optimizer kind) {
    em_sgd_opts s = em_sgd_defaults(1e-2);
    switch (kind) {
    case EM_ESTIMATE_SGD: return em_sgd(m, 1e-2);
    case EM_ESTIMATE_SGD_MOMENTUM: s.momentum = 0.9; return em_sgd_ex(m, s);
    case EM_ESTIMATE_ADAMW: return em_adamw(m, 1e-3);
    default: return em_adam(m, 1e-3);
    }
}

double mem_classifier_step_flops(const char *model, int64_t batch) {
    /* multiply-adds per sample of the forward: the layers of model_cnn.h and mlp_new */
    double macs = !strcmp(model, "cnn") ? 28.0 * 28 * CNN_C1 * 25 + 10.0 * 10 * CNN_C2 * CNN_C1 * 25 +
                                              CNN_C2 * 25.0 * CNN_HIDDEN + CNN_HIDDEN * 10.0
                                        : 784.0 * 256 + 256.0 * 10;
    return 3 * 2 * macs * (double)batch;
}

double mem_measure_classifier(const mem_classifier *c, int64_t batch) {
    em_memory_empty_cache(EM_DEVICE_CPU);
    int64_t base = em_memory_allocated(EM_DEVICE_CPU);
    em_memory_reset_peak_stats(EM_DEVICE_CPU);
    em_manual_seed(0);
    em_module *m = model_new(c->model), *fwd = NULL;
    int segments = 0;
    bool ok = m && (c->lora_rank <= 0 || em_lora_wrap(m, c->lora_rank, 2.0 * c->lora_rank, EM_LORA_LINEAR) == EM_OK);
    if (ok && c->ckpt) ok = (fwd = train_ckpt_wrap("ember mem", m, &segments)) != NULL;
    em_optimizer *opt = ok ? make_optimizer(m, c->optimizer) : NULL;
    double peak = NAN;
    if (opt) {
        /* the steps' peak: building the model (its init's temporaries) is not part of it */
        em_memory_reset_peak_stats(EM_DEVICE_CPU);
        for (int step = 0; step < 2; step++) {
            em_scope s = em_scope_begin();
            em_tensor *x = em_rand(EM_SHAPE(batch, 784), EM_OPTS(0));
            em_tensor *y = em_randint(0, 10, EM_SHAPE(batch), EM_OPTS(.dtype = EM_I64));
            em_tensor *loss = em_cross_entropy(em_forward(fwd ? fwd : m, x), y, 0.0);
            em_zero_grad(opt);
            em_backward(loss);
            em_step(opt);
            em_scope_end(s);
        }
        if (!em_failed()) peak = (double)(em_memory_max_allocated(EM_DEVICE_CPU) - base);
    }
    em_optim_free(opt);
    em_module_free(fwd);
    em_module_free(m);
    em_memory_empty_cache(EM_DEVICE_CPU);
    em_clear_error();
    return peak;
}

bool classifier_estimate(const char *model, em_estimate_opts *o, bool ckpt, em_estimate *e) {
    (void)ckpt;
    em_module *m = model_new(model);
    if (!m) return false;
    em_estimate tmp;
    em_estimate_opts mo = *o;
    if (!e) mo.mode = EM_ESTIMATE_FULL, e = &tmp;
    if (mo.dtype != EM_F32 && em_module_to_dtype(m, mo.dtype) != EM_OK) {
        em_module_free(m);
        return false;
    }
    em_status st = em_estimate_module(m, &mo, e);
    o->params = (double)em_module_num_parameters(m);
    o->hidden = e->hidden;
    o->layers = e->layers;
    em_module_free(m);
    return st == EM_OK;
}

const char *mem_classifier_ckpt_why(const char *model) {
    if (!strcmp(model, "cnn"))
        return "3 segments (input, conv1, ReLU | pool, conv2, ReLU | pool, flatten, fc1, ReLU, fc2), the first two "
               "recomputed in backward, each keeping only what its graph saves: the peak moves to segment 2's backward and falls a little";
    return "2 segments (fc1 | ReLU, fc2): the first keeps only its input, the batch, and its output is not kept "
           "either way (ReLU keeps its own): nothing saved";
}
