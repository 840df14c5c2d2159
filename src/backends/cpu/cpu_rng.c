/* Random tensors from Philox 4x32-10 following src/kernels/philox.h's contract exactly: element i
 * (row-major) of out uses counter offset + i, whatever out's strides or the thread count.
 * Every kind, normal included, equals the OpenCL and CUDA kernels' bits (src/kernels/rng.k). */
#include "cpu_internal.h"
#include "../../kernels/philox.h"

#define BLOCK 256

typedef struct rng_ctx {
    em_rng_kind kind;
    em_dtype dt;
    uint64_t seed, offset;
    double p0, p1;
} rng_ctx;

/* The block's values in a compute buffer; returns the buffer's dtype. */
static em_dtype rng_block(const rng_ctx *c, int64_t first, int64_t m, void *buf) {
    uint32_t w[4];
    bool dbl = c->dt == EM_F64;
    switch (c->kind) {
    case EM_RNG_UNIFORM:
        if (dbl) {
            double *o = buf, lo = c->p0, hi = c->p1;
            for (int64_t k = 0; k < m; k++) {
                em__philox_element(c->seed, c->offset + (uint64_t)(first + k), w);
                double v = lo + (double)em__philox_unit(w[0]) * (hi - lo);
                o[k] = v < hi ? v : lo;
            }
            return EM_F64;
        } else {
            float *o = buf, lo = (float)c->p0, hi = (float)c->p1;
            for (int64_t k = 0; k < m; k++) {
                em__philox_element(c->seed, c->offset + (uint64_t)(first + k), w);
                float v = lo + em__philox_unit(w[0]) * (hi - lo);
                o[k] = v < hi ? v : lo;
            }
            return EM_F32;
        }
    case EM_RNG_NORMAL: /* philox.h's transform, never fused: the same bits as every device */
        if (dbl) {
            double *o = buf, mean = c->p0, sd = c->p1;
            for (int64_t k = 0; k < m; k++) {
                em__philox_element(c->seed, c->offset + (uint64_t)(first + k), w);
                o[k] = em__addd(em__muld(em__normal_f64(w[0], w[1]), sd), mean);
            }
            return EM_F64;
        } else {
            float *o = buf, mean = (float)c->p0, sd = (float)c->p1;
            for (int64_t k = 0; k < m; k++) {
                em__philox_element(c->seed, c->offset + (uint64_t)(first + k), w);
                o[k] = em__addf(em__mulf(em__normal_f32(w[0], w[1]), sd), mean);
            }
            return EM_F32;
        }
    case EM_RNG_RANDINT: {
        int64_t *o = buf, lo = em__cpu_param_i64(c->p0);
        uint64_t range = (uint64_t)em__cpu_param_i64(c->p1) - (uint64_t)lo;
        for (int64_t k = 0; k < m; k++) {
            em__philox_element(c->seed, c->offset + (uint64_t)(first + k), w);
            uint64_t r = (uint64_t)w[1] << 32 | w[0];
            o[k] = (int64_t)((uint64_t)lo + (range ? r % range : 0));
        }
        return EM_I64;
    }
    default: { /* bernoulli */
        uint8_t *o = buf;
        for (int64_t k = 0; k < m; k++) {
            em__philox_element(c->seed, c->offset + (uint64_t)(first + k), w);
            o[k] = (double)em__philox_unit(w[0]) < c->p0;
        }
        return EM_BOOL;
    }
    }
}

static void rng_loop(void *arg, char **d, const int64_t *st, int64_t n, int64_t index) {
    const rng_ctx *c = arg;
    _Alignas(64) unsigned char buf[BLOCK * 8];
    for (int64_t off = 0; off < n; off += BLOCK) {
        int64_t m = n - off < BLOCK ? n - off : BLOCK;
        em_dtype bt = rng_block(c, index + off, m, buf);
        em__cpu_cast_block(d[0] + off * st[0], st[0], c->dt, (const char *)buf, (int64_t)em_dtype_size(bt), bt, m);
    }
}

em_status em__cpu_rng(em_tensor *out, em_rng_kind kind, uint64_t seed, uint64_t offset, double p0, double p1) {
    if (kind < EM_RNG_UNIFORM || kind > EM_RNG_BERNOULLI)
        return em_error(EM_ERR_INTERNAL, "cpu: unknown random distribution %d", (int)kind);
    rng_ctx c = {kind, out->dtype, seed, offset, p0, p1};
    const em_tensor *ts[1] = {out};
    cpu_iter it;
    em__cpu_iter_init(&it, 1, ts, true);
    em__cpu_iter_run(&it, rng_loop, &c, 4 * EM_CPU_MIN_GRAIN); /* ~20 ns per element: split earlier */
    return EM_OK;
}
