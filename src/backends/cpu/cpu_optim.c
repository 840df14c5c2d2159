/* Fused optimizer steps: SGD and Adam/AdamW in one pass over the elements, split across the
 * thread pool. Each element goes through exactly the roundings of optimizer.c's op-by-op
 * path (every product and sum rounded to the compute type, scalars rounded first), so the
 * two agree bit for bit in f32 and f64. f16/bf16 are computed in float through small
 * blocks and rounded once at the end (the op-by-op path rounds after every op). */
#include "cpu_internal.h"

#include <float.h>

/* Built with -fno-math-errno (CMakeLists.txt): sqrt's errno (never set here: its argument
 * is a sum of squares, or NaN) would keep Adam's loops scalar; results are the same. */

/* Optimizer state below the smallest normal number is stored as zero. Adam's moments (and
 * SGD's momentum) for weights whose gradient is zero decay geometrically into subnormal
 * floats, and x86 arithmetic on those takes a microcode assist per element: with Adam, every
 * epoch after the first ran ~40% slower. A flushed moment changes no parameter (the update
 * it stood for is below the parameter's rounding unless the parameter itself is ~1e-30),
 * and the caller's floating-point environment (MXCSR) is left alone. src/kernels/optim.k
 * flushes the same values the same way, so devices agree bit for bit. NaN stays NaN (both
 * comparisons are false). */
#define OPT_FLUSH(x, TINY) ((x) < (TINY) && (x) > -(TINY) ? 0 : (x))

/* Work per element is about 5 streams of memory: split from fewer elements than plain
 * elementwise ops. */
#define OPTIM_GRAIN (EM_CPU_PARALLEL_ELEMS / 4)
#define OPTIM_BLOCK 512
#define LOWP_BLOCK 2048 /* float32 elements stepped, then cast to lowp_out, per block */
/* The library is built for x86-64-v2 (SSE4.2) to run anywhere; these loops are bound by
 * sqrt and division, whose AVX2 forms do twice the elements per instruction, so GCC also
 * compiles an AVX2 clone and the loader picks it on CPUs that have it (same IEEE results:
 * no FMA contraction, see the kernel bodies). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__) \
    && !defined(__SANITIZE_THREAD__) /* sanitized resolvers run before the sanitizer is up */
#define EM_CPU_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define EM_CPU_MULTIVERSION
#endif

enum { F_WD = 1, F_DECAY = 2, F_AMSGRAD = 4, F_MOMENTUM = 8, F_NESTEROV = 16, F_FIRST = 32 };

static int flags_of(const em_optim_args *a, bool adam) {
    int f = 0;
    if (adam) {
        if (a->weight_decay != 0) f |= a->decoupled ? F_DECAY : F_WD;
        if (a->amsgrad) f |= F_AMSGRAD;
    } else {
        if (a->weight_decay != 0) f |= F_WD;
        if (a->momentum != 0) f |= F_MOMENTUM;
        if (a->nesterov) f |= F_NESTEROV;
        if (a->first_step) f |= F_FIRST;
    }
    return f;
}

/* The kernels over n contiguous elements of the compute type T; c holds the constants
 * already rounded to T. The statements mirror optimizer.c line by line. Each body is
 * inlined once per combination of flags (constants), so that every variant is a
 * branch-free loop the compiler vectorizes. */
/* EM_CPU_VLOOP for a body with commas */
#define OPT_VLOOP(n, ...)                                                                  \
    {                                                                                      \
        int64_t k_ = 0;                                                                    \
        for (; k_ + 8 <= (n); k_ += 8)                                                     \
            for (int j_ = 0; j_ < 8; j_++) {                                               \
                int64_t i = k_ + j_;                                                       \
                __VA_ARGS__                                                                \
            }                                                                              \
        for (int64_t i = k_; i < (n); i++) {                                               \
            __VA_ARGS__                                                                    \
        }                                                                                  \
    }
#define DEF_KERNELS(T, SFX, SQRT, TINY)                                                          \
    static inline __attribute__((always_inline)) void adam_body_##SFX(                     \
        T *restrict p, const T *restrict g, T *restrict m, T *restrict v, T *restrict vm,  \
        int64_t n, const T *c, const int f) {                                              \
        T wd = c[EM_OPT_WD], decay = c[EM_OPT_DECAY], b1 = c[EM_OPT_B1], omb1 = c[EM_OPT_OMB1]; \
        T b2 = c[EM_OPT_B2], omb2 = c[EM_OPT_OMB2], sbc2 = c[EM_OPT_SQRT_BC2];            \
        T eps = c[EM_OPT_EPS], step = c[EM_OPT_STEP];                                      \
        OPT_VLOOP(n, {                                                                  \
            T pi = p[i], gi = g[i];                                                        \
            if (f & F_DECAY) pi = pi * decay;                                              \
            if (f & F_WD) {                                                                \
                T t = pi * wd;                                                             \
                gi = gi + t;                                                               \
            }                                                                              \
            T mi = m[i] * b1, t1 = gi * omb1;                                              \
            mi = mi + t1;                                                                  \
            mi = OPT_FLUSH(mi, (T)TINY);                                                   \
            T gg = gi * gi, vi = v[i] * b2, t2 = gg * omb2;                                \
            vi = vi + t2;                                                                  \
            vi = OPT_FLUSH(vi, (T)TINY);                                                   \
            T second = vi;                                                                 \
            if (f & F_AMSGRAD) {                                                           \
                T mx = vm[i];                                                              \
                second = (mx > vi || mx != mx) ? mx : vi;                                  \
                vm[i] = second;                                                            \
            }                                                                              \
            T denom = SQRT(second) / sbc2;                                                 \
            denom = denom + eps;                                                           \
            T upd = mi / denom, s = upd * step;                                            \
            p[i] = pi + s;                                                                 \
            m[i] = mi;                                                                     \
            v[i] = vi;                                                                     \
        })                                                                                 \
    }                                                                                      \
    static inline __attribute__((always_inline)) void sgd_body_##SFX(                      \
        T *restrict p, const T *restrict g, T *restrict buf, int64_t n, const T *c, const int f) { \
        T wd = c[EM_OPT_WD], mom = c[EM_OPT_MOMENTUM], omd = c[EM_OPT_OMD];                \
        T step = c[EM_OPT_STEP];                                                           \
        OPT_VLOOP(n, {                                                                  \
            T pi = p[i], d = g[i];                                                         \
            if (f & F_WD) {                                                                \
                T t = pi * wd;                                                             \
                d = d + t;                                                                 \
            }                                                                              \
            if (f & F_MOMENTUM) {                                                          \
                T b;                                                                       \
                if (f & F_FIRST) {                                                         \
                    b = d;                                                                 \
                } else {                                                                   \
                    T t = d * omd;                                                         \
                    b = buf[i] * mom;                                                      \
                    b = b + t;                                                             \
                }                                                                          \
                b = OPT_FLUSH(b, (T)TINY);                                                 \
                buf[i] = b;                                                                \
                if (f & F_NESTEROV) {                                                      \
                    T t = b * mom;                                                         \
                    d = d + t;                                                             \
                } else {                                                                   \
                    d = b;                                                                 \
                }                                                                          \
            }                                                                              \
            T s = d * step;                                                                \
            p[i] = pi + s;                                                                 \
        })                                                                                 \
    }                                                                                      \
    EM_CPU_MULTIVERSION static void adam_##SFX(T *p, const T *g, T *m, T *v, T *vm, int64_t n, const T *c, int f) { \
        switch (f) {                                                                       \
        ADAM_CASES(SFX)                                                                    \
        default: adam_body_##SFX(p, g, m, v, vm, n, c, f); break;                          \
        }                                                                                  \
    }                                                                                      \
    EM_CPU_MULTIVERSION static void sgd_##SFX(T *p, const T *g, T *buf, int64_t n, const T *c, int f) { \
        switch (f) {                                                                       \
        SGD_CASES(SFX)                                                                     \
        default: sgd_body_##SFX(p, g, buf, n, c, f); break;                                \
        }                                                                                  \
    }
#define ADAM_CASE(SFX, F) case F: adam_body_##SFX(p, g, m, v, vm, n, c, F); break;
#define ADAM_CASES(SFX)                                                                    \
    ADAM_CASE(SFX, 0) ADAM_CASE(SFX, F_WD) ADAM_CASE(SFX, F_DECAY) ADAM_CASE(SFX, F_AMSGRAD) \
    ADAM_CASE(SFX, F_WD | F_AMSGRAD) ADAM_CASE(SFX, F_DECAY | F_AMSGRAD)
#define SGD_CASE(SFX, F) case F: sgd_body_##SFX(p, g, buf, n, c, F); break;
#define SGD_MOM_CASES(SFX, W)                                                              \
    SGD_CASE(SFX, W | F_MOMENTUM) SGD_CASE(SFX, W | F_MOMENTUM | F_FIRST)                  \
    SGD_CASE(SFX, W | F_MOMENTUM | F_NESTEROV) SGD_CASE(SFX, W | F_MOMENTUM | F_NESTEROV | F_FIRST)
#define SGD_CASES(SFX)                                                                     \
    SGD_CASE(SFX, 0) SGD_CASE(SFX, F_WD) SGD_MOM_CASES(SFX, 0) SGD_MOM_CASES(SFX, F_WD)
DEF_KERNELS(float, f32, sqrtf, FLT_MIN)
DEF_KERNELS(double, f64, sqrt, DBL_MIN)

typedef struct optim_job {
    bool adam;
    int flags;
    em_dtype dt;
    char *ptr[5];        /* p, g, then states (NULL when unused) */
    char *low;           /* Adam, float32 p: p's new value cast to low_dt here too, or NULL */
    em_dtype low_dt;
    float cf[EM_OPT_NCONST];
    double cd[EM_OPT_NCONST];
} optim_job;

static void run_block(const optim_job *j, char *const *ptr, int64_t n) {
    if (j->dt == EM_F64) {
        if (j->adam)
            adam_f64((double *)ptr[0], (const double *)ptr[1], (double *)ptr[2], (double *)ptr[3],
                     (double *)ptr[4], n, j->cd, j->flags);
        else
            sgd_f64((double *)ptr[0], (const double *)ptr[1], (double *)ptr[2], n, j->cd, j->flags);
    } else {
        if (j->adam)
            adam_f32((float *)ptr[0], (const float *)ptr[1], (float *)ptr[2], (float *)ptr[3],
                     (float *)ptr[4], n, j->cf, j->flags);
        else
            sgd_f32((float *)ptr[0], (const float *)ptr[1], (float *)ptr[2], n, j->cf, j->flags);
    }
}

static void optim_range(void *ctx, int64_t begin, int64_t end) {
    const optim_job *j = ctx;
    size_t es = em__cpu_esize(j->dt);
    if (j->low) { /* float32 Adam with the low-precision copy: each block cast while in L1 */
        for (int64_t b = begin; b < end; b += LOWP_BLOCK) {
            int64_t n = end - b < LOWP_BLOCK ? end - b : LOWP_BLOCK;
            char *ptr[5];
            for (int k = 0; k < 5; k++) ptr[k] = j->ptr[k] ? j->ptr[k] + (size_t)b * es : NULL;
            run_block(j, ptr, n);
            em__cpu_cast_f32_stream(j->low + (size_t)b * 2, j->low_dt, (const float *)ptr[0], n);
        }
        return;
    }
    if (j->dt == EM_F32 || j->dt == EM_F64) {
        char *ptr[5];
        for (int k = 0; k < 5; k++) ptr[k] = j->ptr[k] ? j->ptr[k] + (size_t)begin * es : NULL;
        run_block(j, ptr, end - begin);
        return;
    }
    /* f16 / bf16: through float blocks */
    float buf[5][OPTIM_BLOCK];
    for (int64_t b = begin; b < end; b += OPTIM_BLOCK) {
        int64_t n = end - b < OPTIM_BLOCK ? end - b : OPTIM_BLOCK;
        char *ptr[5];
        for (int k = 0; k < 5; k++) {
            ptr[k] = j->ptr[k] ? (char *)buf[k] : NULL;
            bool read = j->ptr[k] && !(k == 2 && !j->adam && (j->flags & F_FIRST));
            if (read) em__cpu_load_block(buf[k], j->ptr[k] + (size_t)b * es, (int64_t)es, n, j->dt);
        }
        run_block(j, ptr, n);
        for (int k = 0; k < 5; k++)
            if (j->ptr[k] && k != 1) em__cpu_store_block(j->ptr[k] + (size_t)b * es, (int64_t)es, n, j->dt, buf[k]);
    }
}

static em_status run(bool adam, const em_optim_args *args, em_tensor *const ts[5]) {
    em_dtype dt = ts[0]->dtype;
    if (!em_dtype_is_floating(dt))
        return em_error(EM_ERR_NOT_SUPPORTED, "fused optimizer step: %s parameters are not floating point",
                        em_dtype_name(dt));
    em_optim_args scaled;
    const em_optim_args *a = args;
    if (args->amp) { /* loss scaling: the scaler's flag and skipped count are in host memory here */
        const float *st = em__host_ptr(args->amp);
        if (st[EM_AMP_FOUND_INF] != 0.0f) return EM_OK;
        scaled = *args;
        double t = (double)args->step - (double)st[EM_AMP_SKIPPED];
        scaled.bias_correction1 = 1.0 - pow(args->beta1, t);
        scaled.bias_correction2 = 1.0 - pow(args->beta2, t);
        a = &scaled;
    }
    optim_job j = {.adam = adam, .flags = flags_of(a, adam), .dt = dt};
    double c[EM_OPT_NCONST];
    em__optim_consts(a, adam, c);
    for (int k = 0; k < EM_OPT_NCONST; k++) {
        j.cd[k] = c[k];
        j.cf[k] = (float)c[k];
    }
    for (int k = 0; k < 5; k++) j.ptr[k] = ts[k] ? (char *)em__host_ptr(ts[k]) : NULL;
    const em_tensor *low = adam ? args->lowp_out : NULL;
    if (low && dt == EM_F32 && (low->dtype == EM_BF16 || low->dtype == EM_F16)) {
        j.low = em__host_ptr(low);
        j.low_dt = low->dtype;
    }
    int64_t n = em__cpu_numel(ts[0]);
    if (n > 0) em__cpu_parallel_for(n, OPTIM_GRAIN, optim_range, &j);
    return EM_OK;
}

em_status em__cpu_fused_sgd(const em_optim_args *a, em_tensor *p, const em_tensor *g, em_tensor *buf) {
    em_tensor *ts[5] = {p, (em_tensor *)g, a->momentum != 0 ? buf : NULL, NULL, NULL};
    return run(false, a, ts);
}

em_status em__cpu_fused_adam(const em_optim_args *a, em_tensor *p, const em_tensor *g, em_tensor *m,
                             em_tensor *v, em_tensor *vmax) {
    em_tensor *ts[5] = {p, (em_tensor *)g, m, v, a->amsgrad ? vmax : NULL};
    return run(true, a, ts);
}
