/* Loss scaling on the CPU (backend.h's amp_unscale / amp_update): unscale a gradient in
 * place while looking for inf/NaN, and PyTorch's scale update. The CPU runs ops when they
 * are called, so these read and write the scaler's state directly. */
#include "cpu_internal.h"

typedef struct unscale_job {
    char *g;
    em_dtype dt;
    double inv;          /* 1 / scale, as PyTorch's reciprocal in double */
    atomic_int found;
} unscale_job;

#define AMP_BLOCK 512

static void unscale_range(void *ctx, int64_t begin, int64_t end) {
    unscale_job *j = ctx;
    size_t es = em__cpu_esize(j->dt);
    bool bad = false;
    if (j->dt == EM_F64) {
        double *g = (double *)j->g, inv = j->inv;
        for (int64_t i = begin; i < end; i++) {
            bad |= !isfinite(g[i]);
            g[i] = g[i] * inv;
        }
    } else { /* f32 directly; f16 / bf16 through float blocks */
        float buf[AMP_BLOCK], inv = (float)j->inv;
        for (int64_t b = begin; b < end; b += AMP_BLOCK) {
            int64_t n = end - b < AMP_BLOCK ? end - b : AMP_BLOCK;
            char *p = j->g + (size_t)b * es;
            float *x = j->dt == EM_F32 ? (float *)p : buf;
            if (j->dt != EM_F32) em__cpu_load_block(buf, p, (int64_t)es, n, j->dt);
            for (int64_t i = 0; i < n; i++) {
                bad |= !isfinite(x[i]);
                x[i] = x[i] * inv;
            }
            if (j->dt != EM_F32) em__cpu_store_block(p, (int64_t)es, n, j->dt, buf);
        }
    }
    if (bad) atomic_store(&j->found, 1);
}

em_status em__cpu_amp_unscale(em_tensor *g, em_tensor *state) {
    float *st = em__host_ptr(state);
    unscale_job j = {.g = em__host_ptr(g), .dt = g->dtype, .inv = 1.0 / (double)st[EM_AMP_SCALE]};
    atomic_init(&j.found, 0);
    int64_t n = em__cpu_numel(g);
    if (n > 0) em__cpu_parallel_for(n, EM_CPU_PARALLEL_ELEMS, unscale_range, &j);
    if (atomic_load(&j.found)) st[EM_AMP_FOUND_INF] = 1.0f;
    return EM_OK;
}

em_status em__cpu_amp_update(em_tensor *state, double growth, double backoff, int64_t interval) {
    float *st = em__host_ptr(state);
    if (st[EM_AMP_FOUND_INF] != 0.0f) {
        st[EM_AMP_SCALE] = st[EM_AMP_SCALE] * (float)backoff;
        st[EM_AMP_TRACKER] = 0.0f;
        st[EM_AMP_SKIPPED] = st[EM_AMP_SKIPPED] + 1.0f;
    } else {
        float successful = st[EM_AMP_TRACKER] + 1.0f;
        if (successful >= (float)interval) {
            float grown = st[EM_AMP_SCALE] * (float)growth;
            if (isfinite(grown)) st[EM_AMP_SCALE] = grown; /* PyTorch keeps the scale finite */
            st[EM_AMP_TRACKER] = 0.0f;
        } else {
            st[EM_AMP_TRACKER] = successful;
        }
    }
    st[EM_AMP_FOUND_INF] = 0.0f;
    return EM_OK;
}
