/* Fused optimizer steps: SGD, Adam/AdamW, Adadelta, Adagrad, RMSprop, Adamax, NAdam and
 * RAdam in one pass over the elements, split across the thread pool. Each element goes
 * through exactly the roundings of the op-by-op path (src/optim/sgd_adam.c, adaptive.c) (every product and sum rounded to the compute type, scalars rounded first), so the
 * two agree bit for bit in f32 and f64. f16/bf16 are computed in float through small
 * blocks and rounded once at the end (the op-by-op path rounds after every op). */
#include "cpu_internal.h"

#include <float.h>

/* Built with -fno-math-errno (CMakeLists.txt): sqrt's errno (never set here: its argument
 * is a sum of squares, or NaN) would keep Adam's loops scalar; results are the same. */

/* Optimizer state below the smallest normal number is stored as zero. Adam's moments (and
 * SGD's momentum) for weights whose gradient is zero decay geometrically into subnormal
 * floats, and x86 arithmetic on those takes a microcode assist per element, which slows
 * every epoch after the first while such weights stay idle. A flushed moment changes no
 * parameter (the update it stood for is below the parameter's rounding unless the parameter
 * itself is ~1e-30), and the caller's floating-point environment (MXCSR) is left alone. src/kernels/optim.k
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

enum { F_WD = 1, F_DECAY = 2, F_AMSGRAD = 4, F_MOMENTUM = 8, F_NESTEROV = 16, F_FIRST = 32, F_MAXIMIZE = 64 };

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
    if (a->maximize) f |= F_MAXIMIZE;
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
            if (f & F_MAXIMIZE) gi = -gi;                                                  \
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
            if (f & F_MAXIMIZE) d = -d;                                                    \
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

/* ---- the other optimizers' steps: the op list's ADADELTA_STEP ... RADAM_STEP ----
 * Each body mirrors its op-by-op path in src/optim/adaptive.c statement for statement (one
 * rounding per op, the scalars rounded to T first), so that f32/f64 agree bit for bit; the
 * decaying averages are flushed below the smallest normal number as Adam's are. Operands:
 * p, the states s1..s3 (NULL where unused), g; c[] the call's f[] rounded to T. */
#define MAXIMIZE_OF(f) ((f) & EMK_OPTF_MAXIMIZE)
#define L2_OF(f) (((f) & EMK_OPTF_WD) && !((f) & EMK_OPTF_DECOUPLED))
#define DECOUPLED_OF(f) (((f) & EMK_OPTF_WD) && ((f) & EMK_OPTF_DECOUPLED))
/* The gradient each step starts from: negated to maximize, plus wd * p for L2 weight decay
 * (the decoupled decay scales p itself, before this). */
#define OPT_GRAD_IN(T, pi, gi, wd, f)                                                            \
    do {                                                                                         \
        if (MAXIMIZE_OF(f)) gi = -gi;                                                            \
        if (L2_OF(f)) {                                                                          \
            T t_ = (pi) * (wd);                                                                  \
            gi = gi + t_;                                                                        \
        }                                                                                        \
    } while (0)
#define DEF_STEP_KERNELS(T, SFX, SQRT, TINY)                                                     \
    static inline __attribute__((always_inline)) void adadelta_body_##SFX(                       \
        T *restrict p, T *restrict sq, T *restrict acc, const T *restrict g, int64_t n, const T *c, const int f) { \
        T rho = c[0], omr = c[1], eps = c[2], wd = c[3], nlr = c[4];                             \
        OPT_VLOOP(n, {                                                                           \
            T pi = p[i], gi = g[i];                                                              \
            OPT_GRAD_IN(T, pi, gi, wd, f);                                                       \
            T gg = gi * gi, s = sq[i] * rho, t1 = gg * omr;                                      \
            s = s + t1;                                                                          \
            s = OPT_FLUSH(s, (T)TINY);                                                           \
            T a1 = s + eps, a2 = acc[i] + eps;                                                   \
            T std = SQRT(a1), dl = SQRT(a2);                                                     \
            dl = dl / std;                                                                       \
            dl = dl * gi;                                                                        \
            T dd = dl * dl, a = acc[i] * rho, t2 = dd * omr;                                     \
            a = a + t2;                                                                          \
            a = OPT_FLUSH(a, (T)TINY);                                                           \
            T u = dl * nlr;                                                                      \
            p[i] = pi + u;                                                                       \
            sq[i] = s;                                                                           \
            acc[i] = a;                                                                          \
        })                                                                                       \
    }                                                                                            \
    static inline __attribute__((always_inline)) void adagrad_body_##SFX(                        \
        T *restrict p, T *restrict sum, const T *restrict g, int64_t n, const T *c, const int f) { \
        T eps = c[0], wd = c[1], nclr = c[2];                                                    \
        OPT_VLOOP(n, {                                                                           \
            T pi = p[i], gi = g[i];                                                              \
            OPT_GRAD_IN(T, pi, gi, wd, f);                                                       \
            T gg = gi * gi, s = sum[i] + gg;                                                     \
            T std = SQRT(s);                                                                     \
            std = std + eps;                                                                     \
            T q = gi / std, u = q * nclr;                                                        \
            p[i] = pi + u;                                                                       \
            sum[i] = s;                                                                          \
        })                                                                                       \
    }                                                                                            \
    static inline __attribute__((always_inline)) void rmsprop_body_##SFX(                        \
        T *restrict p, T *restrict sq, T *restrict buf, T *restrict ga, const T *restrict g, int64_t n, \
        const T *c, const int f) {                                                               \
        T alpha = c[0], oma = c[1], lc = c[2], eps = c[3], wd = c[4], mom = c[5], nlr = c[6];    \
        OPT_VLOOP(n, {                                                                           \
            T pi = p[i], gi = g[i];                                                              \
            OPT_GRAD_IN(T, pi, gi, wd, f);                                                       \
            T gg = gi * gi, s = sq[i] * alpha, t1 = gg * oma;                                    \
            s = s + t1;                                                                          \
            s = OPT_FLUSH(s, (T)TINY);                                                           \
            sq[i] = s;                                                                           \
            T avg;                                                                               \
            if (f & EMK_OPTF_CENTERED) {                                                         \
                T x = ga[i], d = gi - x, dc = d * lc;                                            \
                x = (f & EMK_OPTF_LERP_BIG) ? gi - dc : x + dc;                                  \
                x = OPT_FLUSH(x, (T)TINY);                                                       \
                ga[i] = x;                                                                       \
                T xx = x * x, var = s - xx;                                              \
                avg = SQRT(var);                                                                 \
            } else {                                                                             \
                avg = SQRT(s);                                                                   \
            }                                                                                    \
            avg = avg + eps;                                                                     \
            T q = gi / avg;                                                                      \
            if (f & EMK_OPTF_MOMENTUM) {                                                         \
                T b = buf[i] * mom;                                                              \
                b = b + q;                                                                       \
                b = OPT_FLUSH(b, (T)TINY);                                                       \
                buf[i] = b;                                                                      \
                q = b;                                                                           \
            }                                                                                    \
            T u = q * nlr;                                                                       \
            p[i] = pi + u;                                                                       \
        })                                                                                       \
    }                                                                                            \
    static inline __attribute__((always_inline)) void adamax_body_##SFX(                         \
        T *restrict p, T *restrict m, T *restrict inf, const T *restrict g, int64_t n, const T *c, const int f) { \
        T lc = c[0], b2 = c[1], eps = c[2], wd = c[3], nclr = c[4];                              \
        OPT_VLOOP(n, {                                                                           \
            T pi = p[i], gi = g[i];                                                              \
            OPT_GRAD_IN(T, pi, gi, wd, f);                                                       \
            T x = m[i], d = gi - x, dc = d * lc;                                                 \
            x = (f & EMK_OPTF_LERP_BIG) ? gi - dc : x + dc;                                      \
            x = OPT_FLUSH(x, (T)TINY);                                                           \
            T a = inf[i] * b2, ag = gi < 0 ? -gi : gi, b = ag + eps;                             \
            T mx = (a > b || a != a) ? a : b; /* em_maximum: NaN wins */                         \
            T q = x / mx, u = q * nclr;                                                          \
            p[i] = pi + u;                                                                       \
            m[i] = x;                                                                            \
            inf[i] = mx;                                                                         \
        })                                                                                       \
    }                                                                                            \
    static inline __attribute__((always_inline)) void nadam_body_##SFX(                          \
        T *restrict p, T *restrict m, T *restrict v, const T *restrict g, int64_t n, const T *c, const int f) { \
        T lc = c[0], b2 = c[1], omb2 = c[2], bc2 = c[3], eps = c[4], wdx = c[5], cg = c[6], ca = c[7]; \
        OPT_VLOOP(n, {                                                                           \
            T pi = p[i], gi = g[i];                                                              \
            if (DECOUPLED_OF(f)) pi = pi * wdx;                                                  \
            OPT_GRAD_IN(T, pi, gi, wdx, f);                                                      \
            T x = m[i], d = gi - x, dc = d * lc;                                                 \
            x = (f & EMK_OPTF_LERP_BIG) ? gi - dc : x + dc;                                      \
            x = OPT_FLUSH(x, (T)TINY);                                                           \
            T gg = gi * gi, s = v[i] * b2, t1 = gg * omb2;                                       \
            s = s + t1;                                                                          \
            s = OPT_FLUSH(s, (T)TINY);                                                           \
            T den = s / bc2;                                                                     \
            den = SQRT(den);                                                                     \
            den = den + eps;                                                                     \
            T q1 = gi / den, u1 = q1 * cg;                                                       \
            pi = pi + u1;                                                                        \
            T q2 = x / den, u2 = q2 * ca;                                                        \
            p[i] = pi + u2;                                                                      \
            m[i] = x;                                                                            \
            v[i] = s;                                                                            \
        })                                                                                       \
    }                                                                                            \
    static inline __attribute__((always_inline)) void radam_body_##SFX(                          \
        T *restrict p, T *restrict m, T *restrict v, const T *restrict g, int64_t n, const T *c, const int f) { \
        T lc = c[0], b2 = c[1], omb2 = c[2], eps = c[3], wdx = c[4], scale = c[5];               \
        OPT_VLOOP(n, {                                                                           \
            T pi = p[i], gi = g[i];                                                              \
            if (DECOUPLED_OF(f)) pi = pi * wdx;                                                  \
            OPT_GRAD_IN(T, pi, gi, wdx, f);                                                      \
            T x = m[i], d = gi - x, dc = d * lc;                                                 \
            x = (f & EMK_OPTF_LERP_BIG) ? gi - dc : x + dc;                                      \
            x = OPT_FLUSH(x, (T)TINY);                                                           \
            T gg = gi * gi, s = v[i] * b2, t1 = gg * omb2;                                       \
            s = s + t1;                                                                          \
            s = OPT_FLUSH(s, (T)TINY);                                                           \
            T q = x;                                                                             \
            if (f & EMK_OPTF_RECTIFIED) {                                                        \
                T den = SQRT(s);                                                                 \
                den = den + eps;                                                                 \
                q = x / den;                                                                     \
            }                                                                                    \
            T u = q * scale;                                                                     \
            p[i] = pi + u;                                                                       \
            m[i] = x;                                                                            \
            v[i] = s;                                                                            \
        })                                                                                       \
    }                                                                                            \
    /* one loop per common flag set (the body's branches fold away), the rest generic */         \
    EM_CPU_MULTIVERSION static void adadelta_##SFX(T *const *a, int64_t n, const T *c, int f) {   \
        switch (f) {                                                                             \
        case 0: adadelta_body_##SFX(a[0], a[1], a[2], a[4], n, c, 0); break;                     \
        case EMK_OPTF_WD: adadelta_body_##SFX(a[0], a[1], a[2], a[4], n, c, EMK_OPTF_WD); break; \
        default: adadelta_body_##SFX(a[0], a[1], a[2], a[4], n, c, f); break;                    \
        }                                                                                        \
    }                                                                                            \
    EM_CPU_MULTIVERSION static void adagrad_##SFX(T *const *a, int64_t n, const T *c, int f) {    \
        switch (f) {                                                                             \
        case 0: adagrad_body_##SFX(a[0], a[1], a[4], n, c, 0); break;                            \
        case EMK_OPTF_WD: adagrad_body_##SFX(a[0], a[1], a[4], n, c, EMK_OPTF_WD); break;        \
        default: adagrad_body_##SFX(a[0], a[1], a[4], n, c, f); break;                           \
        }                                                                                        \
    }                                                                                            \
    EM_CPU_MULTIVERSION static void rmsprop_##SFX(T *const *a, int64_t n, const T *c, int f) {    \
        switch (f) {                                                                             \
        case 0: rmsprop_body_##SFX(a[0], a[1], a[2], a[3], a[4], n, c, 0); break;                \
        case EMK_OPTF_MOMENTUM:                                                                  \
            rmsprop_body_##SFX(a[0], a[1], a[2], a[3], a[4], n, c, EMK_OPTF_MOMENTUM); break;    \
        case EMK_OPTF_CENTERED:                                                                  \
            rmsprop_body_##SFX(a[0], a[1], a[2], a[3], a[4], n, c, EMK_OPTF_CENTERED); break;    \
        case EMK_OPTF_CENTERED | EMK_OPTF_MOMENTUM:                                              \
            rmsprop_body_##SFX(a[0], a[1], a[2], a[3], a[4], n, c, EMK_OPTF_CENTERED | EMK_OPTF_MOMENTUM); \
            break;                                                                               \
        default: rmsprop_body_##SFX(a[0], a[1], a[2], a[3], a[4], n, c, f); break;               \
        }                                                                                        \
    }                                                                                            \
    EM_CPU_MULTIVERSION static void adamax_##SFX(T *const *a, int64_t n, const T *c, int f) {     \
        switch (f) {                                                                             \
        case 0: adamax_body_##SFX(a[0], a[1], a[2], a[4], n, c, 0); break;                       \
        default: adamax_body_##SFX(a[0], a[1], a[2], a[4], n, c, f); break;                      \
        }                                                                                        \
    }                                                                                            \
    EM_CPU_MULTIVERSION static void nadam_##SFX(T *const *a, int64_t n, const T *c, int f) {      \
        switch (f) {                                                                             \
        case 0: nadam_body_##SFX(a[0], a[1], a[2], a[4], n, c, 0); break;                        \
        default: nadam_body_##SFX(a[0], a[1], a[2], a[4], n, c, f); break;                      \
        }                                                                                        \
    }                                                                                            \
    EM_CPU_MULTIVERSION static void radam_##SFX(T *const *a, int64_t n, const T *c, int f) {      \
        switch (f) {                                                                             \
        case 0: radam_body_##SFX(a[0], a[1], a[2], a[4], n, c, 0); break;                        \
        case EMK_OPTF_RECTIFIED: radam_body_##SFX(a[0], a[1], a[2], a[4], n, c, EMK_OPTF_RECTIFIED); break; \
        default: radam_body_##SFX(a[0], a[1], a[2], a[4], n, c, f); break;                       \
        }                                                                                        \
    }
DEF_STEP_KERNELS(float, f32, sqrtf, FLT_MIN)
DEF_STEP_KERNELS(double, f64, sqrt, DBL_MIN)

/* The operands in the kernels' order: p, the states (NULL where unused), g. */
#define STEP_OPERANDS 5
typedef struct step_job {
    em_op op;
    int flags;
    em_dtype dt;
    char *ptr[STEP_OPERANDS];
    float cf[EM_OP_MAX_PARAMS];
    double cd[EM_OP_MAX_PARAMS];
} step_job;

static void step_block(const step_job *j, char *const *ptr, int64_t n) {
    if (j->dt == EM_F64) {
        double *const *a = (double *const *)ptr;
        switch (j->op) {
        case EM_OP_ADADELTA_STEP: adadelta_f64(a, n, j->cd, j->flags); break;
        case EM_OP_ADAGRAD_STEP: adagrad_f64(a, n, j->cd, j->flags); break;
        case EM_OP_RMSPROP_STEP: rmsprop_f64(a, n, j->cd, j->flags); break;
        case EM_OP_ADAMAX_STEP: adamax_f64(a, n, j->cd, j->flags); break;
        case EM_OP_NADAM_STEP: nadam_f64(a, n, j->cd, j->flags); break;
        default: radam_f64(a, n, j->cd, j->flags); break;
        }
        return;
    }
    float *const *a = (float *const *)ptr;
    switch (j->op) {
    case EM_OP_ADADELTA_STEP: adadelta_f32(a, n, j->cf, j->flags); break;
    case EM_OP_ADAGRAD_STEP: adagrad_f32(a, n, j->cf, j->flags); break;
    case EM_OP_RMSPROP_STEP: rmsprop_f32(a, n, j->cf, j->flags); break;
    case EM_OP_ADAMAX_STEP: adamax_f32(a, n, j->cf, j->flags); break;
    case EM_OP_NADAM_STEP: nadam_f32(a, n, j->cf, j->flags); break;
    default: radam_f32(a, n, j->cf, j->flags); break;
    }
}

static void step_range(void *ctx, int64_t begin, int64_t end) {
    const step_job *j = ctx;
    size_t es = em__cpu_esize(j->dt);
    char *ptr[STEP_OPERANDS];
    if (j->dt == EM_F32 || j->dt == EM_F64) {
        for (int k = 0; k < STEP_OPERANDS; k++) ptr[k] = j->ptr[k] ? j->ptr[k] + (size_t)begin * es : NULL;
        step_block(j, ptr, end - begin);
        return;
    }
    /* f16 / bf16: through float blocks, rounded once when stored */
    float buf[STEP_OPERANDS][OPTIM_BLOCK];
    for (int64_t b = begin; b < end; b += OPTIM_BLOCK) {
        int64_t n = end - b < OPTIM_BLOCK ? end - b : OPTIM_BLOCK;
        for (int k = 0; k < STEP_OPERANDS; k++) {
            ptr[k] = j->ptr[k] ? (char *)buf[k] : NULL;
            if (j->ptr[k]) em__cpu_load_block(buf[k], j->ptr[k] + (size_t)b * es, (int64_t)es, n, j->dt);
        }
        step_job fj = *j;
        fj.dt = EM_F32;
        step_block(&fj, ptr, n);
        for (int k = 0; k < STEP_OPERANDS - 1; k++)   /* every operand but g */
            if (j->ptr[k]) em__cpu_store_block(j->ptr[k] + (size_t)b * es, (int64_t)es, n, j->dt, buf[k]);
    }
}

static em_status run_step(const em_op_call *call) {
    em_tensor *p = call->dst[0];
    em_dtype dt = p->dtype;
    if (!em_dtype_is_floating(dt))
        return em_error(EM_ERR_NOT_SUPPORTED, "fused optimizer step: %s parameters are not floating point",
                        em_dtype_name(dt));
    step_job j = {.op = call->op, .flags = (int)call->i[0], .dt = dt};
    for (int k = 0; k < EM_OP_MAX_PARAMS; k++) {
        j.cd[k] = call->f[k];
        j.cf[k] = (float)call->f[k];
    }
    j.ptr[0] = em__host_ptr(p);
    for (int k = 1; k < STEP_OPERANDS - 1; k++) j.ptr[k] = call->dst[k] ? (char *)em__host_ptr(call->dst[k]) : NULL;
    j.ptr[STEP_OPERANDS - 1] = (char *)em__host_ptr(call->src[0]);
    int64_t n = em__cpu_numel(p);
    if (n > 0) em__cpu_parallel_for(n, OPTIM_GRAIN, step_range, &j);
    return EM_OK;
}

em_status em__cpu_adadelta_step(const em_op_call *call) { return run_step(call); }
em_status em__cpu_adagrad_step(const em_op_call *call) { return run_step(call); }
em_status em__cpu_rmsprop_step(const em_op_call *call) { return run_step(call); }
em_status em__cpu_adamax_step(const em_op_call *call) { return run_step(call); }
em_status em__cpu_nadam_step(const em_op_call *call) { return run_step(call); }
em_status em__cpu_radam_step(const em_op_call *call) { return run_step(call); }
