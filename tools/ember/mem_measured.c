/* `ember mem`: measured peaks next to the estimates (see mem_measured.h). */
#include <math.h>
#include <stdio.h>
#include "mem_measured.h"

void mem_print_measured(double estimate, double peak, const char *what) {
    if (isnan(peak)) {
        printf("  measured peak     not measured: the steps failed (%s)\n", em_failed() ? em_last_error() : "?");
        em_clear_error();
        return;
    }
    printf("  measured peak     %9.2f MB  the CPU allocator's peak over %s (em_memory_max_allocated, reset "
           "first): the estimate is %+.1f%% of it\n", peak / 1e6, what, 100.0 * (estimate - peak) / peak);
}

double mem_measure_classifier(bool (*make)(void *ctx, mem_classifier *out), void *ctx, int64_t batch) {
    em_memory_empty_cache(EM_DEVICE_CPU);
    int64_t base = em_memory_allocated(EM_DEVICE_CPU);
    em_memory_reset_peak_stats(EM_DEVICE_CPU);
    em_manual_seed(0);
    mem_classifier c = {0};
    double peak = NAN;
    if (make(ctx, &c)) {
        em_module *fwd = c.fwd ? c.fwd : c.model;
        for (int step = 0; step < 2; step++) {
            em_scope s = em_scope_begin();
            em_tensor *x = em_rand(EM_SHAPE(batch, 784), EM_OPTS(0));
            em_tensor *y = em_randint(0, 10, EM_SHAPE(batch), EM_OPTS(.dtype = EM_I64));
            em_tensor *loss = em_cross_entropy(em_forward(fwd, x), y, 0.0);
            em_zero_grad(c.opt);
            em_backward(loss);
            em_step(c.opt);
            em_scope_end(s);
        }
        if (!em_failed()) peak = (double)(em_memory_max_allocated(EM_DEVICE_CPU) - base);
    }
    em_optim_free(c.opt);
    if (c.fwd) em_module_free(c.fwd);
    em_module_free(c.model);
    em_memory_empty_cache(EM_DEVICE_CPU);
    return peak;
}
