/* fill, fill_affine and copy/cast between all eight dtypes, plus the block converters the
 * other kernel families use to bring any dtype and layout into a contiguous compute buffer. */
#include "cpu_internal.h"
#include <stdlib.h>

em_status em__cpu_tmp_make(em_cpu_tmp *x, em_dtype dt, int nd, const int64_t *shape, const char *op) {
    memset(x, 0, sizeof *x);
    x->t.dtype = dt;
    x->t.ndim = nd;
    int64_t n = 1;
    for (int d = nd - 1; d >= 0; d--) {
        x->t.shape[d] = shape[d];
        x->t.strides[d] = n;
        n *= shape[d];
    }
    size_t bytes = (size_t)(n > 0 ? n : 1) * em_dtype_size(dt);
    x->s.block.handle = malloc(bytes);
    if (!x->s.block.handle)
        return em_error(EM_ERR_OUT_OF_MEMORY, "cpu: %s: failed to allocate %zu bytes of scratch", op, bytes);
    x->s.device = EM_DEVICE_CPU;
    x->s.nbytes = bytes;
    x->t.storage = &x->s;
    return EM_OK;
}

void em__cpu_tmp_free(em_cpu_tmp *x) {
    if (x) free(x->s.block.handle);
}

/* bfloat16 inline (the same rounding as core's em_f32_to_bf16: nearest even, NaN stays quiet). */
static inline float bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static inline uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* ---- per-dtype element access: LD gives the natural C type, ST takes it ---- */
#define LD_f32(p) (*(const float *)(p))
#define LD_f64(p) (*(const double *)(p))
#define LD_f16(p) em_f16_to_f32(*(const uint16_t *)(p))
#define LD_bf16(p) bf16_to_f32(*(const uint16_t *)(p))
#define LD_i64(p) (*(const int64_t *)(p))
#define LD_i32(p) ((int64_t) * (const int32_t *)(p))
#define LD_u8(p) ((int64_t) * (const uint8_t *)(p))
#define LD_b8(p) ((int64_t)(*(const uint8_t *)(p) != 0))
#define ST_f32(p, v) (*(float *)(p) = (v))
#define ST_f64(p, v) (*(double *)(p) = (v))
#define ST_f16(p, v) (*(uint16_t *)(p) = em_f32_to_f16(v))
#define ST_bf16(p, v) (*(uint16_t *)(p) = f32_to_bf16(v))
#define ST_i64(p, v) (*(int64_t *)(p) = (v))
#define ST_i32(p, v) (*(int32_t *)(p) = (int32_t)(v))
#define ST_u8(p, v) (*(uint8_t *)(p) = (uint8_t)(v))
#define ST_b8(p, v) (*(uint8_t *)(p) = (uint8_t)(v))
/* natural types: F float, D double, I int64; B is bool's target (0/1) */
#define NAT_f32 F
#define NAT_f64 D
#define NAT_f16 F
#define NAT_bf16 F
#define NAT_i64 I
#define NAT_i32 I
#define NAT_u8 I
#define NAT_b8 I
#define TGT_f32 F
#define TGT_f64 D
#define TGT_f16 F
#define TGT_bf16 F
#define TGT_i64 I
#define TGT_i32 J
#define TGT_u8 I
#define TGT_b8 B
#define T_f32 float
#define T_f64 double
#define T_f16 uint16_t
#define T_bf16 uint16_t
#define T_i64 int64_t
#define T_i32 int32_t
#define T_u8 uint8_t
#define T_b8 uint8_t
#define CV_F_F(x) (x)
#define CV_F_D(x) ((double)(x))
#define CV_F_I(x) em__cpu_f2i64(x)
#define CV_F_J(x) em__cpu_f2i32(x)
#define CV_F_B(x) ((x) != 0)
#define CV_D_F(x) ((float)(x))
#define CV_D_D(x) (x)
#define CV_D_I(x) em__cpu_f2i64(x)
#define CV_D_J(x) em__cpu_f2i32(x)
#define CV_D_B(x) ((x) != 0)
#define CV_I_F(x) ((float)(x))
#define CV_I_D(x) ((double)(x))
#define CV_I_I(x) (x)
#define CV_I_J(x) (x)
#define CV_I_B(x) ((x) != 0)
#define CV__(a, b, x) CV_##a##_##b(x)
#define CV_(a, b, x) CV__(a, b, x)

typedef void (*cast_fn)(char *o, int64_t so, const char *i, int64_t si, int64_t n);

#define CAST_FN(S, D)                                                                   \
    static void cast_##S##_to_##D(char *o, int64_t so, const char *i, int64_t si, int64_t n) { \
        if (so == (int64_t)sizeof(T_##D) && si == (int64_t)sizeof(T_##S)) {             \
            for (int64_t k = 0; k < n; k++)                                             \
                ST_##D(o + k * (int64_t)sizeof(T_##D),                                  \
                       CV_(NAT_##S, TGT_##D, LD_##S(i + k * (int64_t)sizeof(T_##S))));  \
        } else {                                                                        \
            for (int64_t k = 0; k < n; k++, o += so, i += si)                            \
                ST_##D(o, CV_(NAT_##S, TGT_##D, LD_##S(i)));                            \
        }                                                                               \
    }
#define CAST_FROM(S) \
    CAST_FN(S, f32) CAST_FN(S, f64) CAST_FN(S, f16) CAST_FN(S, bf16) \
    CAST_FN(S, i64) CAST_FN(S, i32) CAST_FN(S, u8) CAST_FN(S, b8)
CAST_FROM(f32)
CAST_FROM(f64)
CAST_FROM(f16)
CAST_FROM(bf16)
CAST_FROM(i64)
CAST_FROM(i32)
CAST_FROM(u8)
CAST_FROM(b8)

#define CAST_ROW(S) {cast_##S##_to_f32, cast_##S##_to_f64, cast_##S##_to_f16, cast_##S##_to_bf16, \
                      cast_##S##_to_i64, cast_##S##_to_i32, cast_##S##_to_u8, cast_##S##_to_b8}
/* g_cast[src][dst], indexed in em_dtype order */
static const cast_fn g_cast[EM_DTYPE_COUNT][EM_DTYPE_COUNT] = {
    CAST_ROW(f32), CAST_ROW(f64), CAST_ROW(f16), CAST_ROW(bf16),
    CAST_ROW(i64), CAST_ROW(i32), CAST_ROW(u8), CAST_ROW(b8),
};

/* f32 <-> f16 with the F16C instructions where the CPU has them (same rounding and NaN rules
 * as em_f32_to_f16: nearest even, quiet NaN keeping the top payload bits). */
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
__attribute__((target("avx,f16c"))) static void f32_to_f16_f16c(uint16_t *o, const float *i, int64_t n) {
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        _mm_storeu_si128((__m128i *)(o + k), _mm256_cvtps_ph(_mm256_loadu_ps(i + k), 0));
    for (; k < n; k++) o[k] = em_f32_to_f16(i[k]);
}
__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(float *o, const uint16_t *i, int64_t n) {
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        _mm256_storeu_ps(o + k, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(i + k))));
    for (; k < n; k++) o[k] = em_f16_to_f32(i[k]);
}
/* f32 <-> bf16, 16 at a time with AVX-512 integer ops: the scalar rounding exactly (nearest
 * even, NaN made quiet, subnormals kept; VCVTNEPS2BF16 would flush them). bf16 matmul's casts
 * of float32 master weights each step are memory-bound passes this makes several times faster. */
/* bf16 -> f32 outputs of at least NT_BYTES go past the caches with streaming stores: a whole
 * weight's gradient (tens of MB) is then written once instead of read for ownership first.
 * f32 -> bf16 measured slower with them (its input read dominates), so it keeps plain
 * stores. */
#define NT_BYTES (1 << 20)
__attribute__((target("avx512f,avx512bw"))) static inline __m256i f32_to_bf16_16(__m512 f) {
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff), quiet = _mm512_set1_epi32(0x400000);
    __m512i u = _mm512_castps_si512(f);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
    r = _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), u, quiet);
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}
__attribute__((target("avx512f,avx512bw"))) static void f32_to_bf16_avx512(uint16_t *o, const float *i, int64_t n) {
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) _mm256_storeu_si256((__m256i *)(o + k), f32_to_bf16_16(_mm512_loadu_ps(i + k)));
    for (; k < n; k++) o[k] = f32_to_bf16(i[k]);
}
__attribute__((target("avx512f,avx512bw"))) static void bf16_to_f32_avx512(float *o, const uint16_t *i, int64_t n) {
    int64_t k = 0;
    if (n * 4 >= NT_BYTES) {
        for (; k < n && ((uintptr_t)(o + k) & 63); k++) o[k] = bf16_to_f32(i[k]);
        for (; k + 16 <= n; k += 16)
            _mm512_stream_si512((void *)(o + k),
                                _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(i + k))), 16));
        _mm_sfence();
    }
    for (; k + 16 <= n; k += 16)
        _mm512_storeu_si512((void *)(o + k),
                            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(i + k))), 16));
    for (; k < n; k++) o[k] = bf16_to_f32(i[k]);
}
/* The same two conversions, 8 at a time with AVX2 (CPUs without AVX-512: there bf16 products
 * are float32 GEMMs over converted panels, cpu_matmul.c, and these passes feed them). */
__attribute__((target("avx2"))) static void f32_to_bf16_avx2(uint16_t *o, const float *i, int64_t n) {
    const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7fff), quiet = _mm256_set1_epi32(0x400000);
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 f = _mm256_loadu_ps(i + k);
        __m256i u = _mm256_castps_si256(f);
        __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(half, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
        __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
        r = _mm256_blendv_epi8(r, _mm256_or_si256(u, quiet), nan);
        r = _mm256_srli_epi32(r, 16);   /* 0..0xffff: packus keeps it; then undo its lane order */
        __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
        _mm_storeu_si128((__m128i *)(o + k), _mm256_castsi256_si128(packed));
    }
    for (; k < n; k++) o[k] = f32_to_bf16(i[k]);
}
__attribute__((target("avx2"))) static void bf16_to_f32_avx2(float *o, const uint16_t *i, int64_t n) {
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        _mm256_storeu_si256((__m256i *)(o + k),
                            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(i + k))), 16));
    for (; k < n; k++) o[k] = bf16_to_f32(i[k]);
}
static bool have_avx2(void) {
    static atomic_int have = -1;
    int h = atomic_load_explicit(&have, memory_order_relaxed);
    if (h < 0) {
        h = __builtin_cpu_supports("avx2");
        atomic_store_explicit(&have, h, memory_order_relaxed);
    }
    return h;
}
/* The fused Adam step's bf16 weight copy (cpu_optim.c): streaming stores, as that copy is
 * read only by the next step's GEMMs; returns false (nothing written) where it cannot. */
__attribute__((target("avx512f,avx512bw"))) static bool f32_to_bf16_stream_avx512(uint16_t *o, const float *i,
                                                                                  int64_t n) {
    if ((uintptr_t)o & 31) return false;
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) _mm256_stream_si256((__m256i *)(o + k), f32_to_bf16_16(_mm512_loadu_ps(i + k)));
    _mm_sfence();
    for (; k < n; k++) o[k] = f32_to_bf16(i[k]);
    return true;
}
static bool have_avx512bw(void) {
    static atomic_int have = -1;
    int h = atomic_load_explicit(&have, memory_order_relaxed);
    if (h < 0) {
        h = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
        atomic_store_explicit(&have, h, memory_order_relaxed);
    }
    return h;
}
static bool have_f16c(void) {
    static atomic_int have = -1; /* threads racing on first use all compute the same */
    int h = atomic_load_explicit(&have, memory_order_relaxed);
    if (h < 0) {
        unsigned a, b, c, d; /* "avx" also checks that the OS saves the YMM registers */
        h = __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)); /* F16C */
        atomic_store_explicit(&have, h, memory_order_relaxed);
    }
    return h;
}
#else
static bool have_f16c(void) { return false; }
static bool have_avx512bw(void) { return false; }
static bool have_avx2(void) { return false; }
static void f32_to_bf16_avx2(uint16_t *o, const float *i, int64_t n) { (void)o, (void)i, (void)n; }
static void bf16_to_f32_avx2(float *o, const uint16_t *i, int64_t n) { (void)o, (void)i, (void)n; }
static void f32_to_bf16_avx512(uint16_t *o, const float *i, int64_t n) { (void)o, (void)i, (void)n; }
static void bf16_to_f32_avx512(float *o, const uint16_t *i, int64_t n) { (void)o, (void)i, (void)n; }
static bool f32_to_bf16_stream_avx512(uint16_t *o, const float *i, int64_t n) { return (void)o, (void)i, (void)n, false; }
static void f32_to_f16_f16c(uint16_t *o, const float *i, int64_t n) { (void)o, (void)i, (void)n; }
static void f16_to_f32_f16c(float *o, const uint16_t *i, int64_t n) { (void)o, (void)i, (void)n; }
#endif

void em__cpu_cast_block(char *o, int64_t so, em_dtype dto, const char *i, int64_t si, em_dtype dti, int64_t n) {
    if (dti == EM_F32 && dto == EM_F16 && so == 2 && si == 4 && have_f16c()) {
        f32_to_f16_f16c((uint16_t *)o, (const float *)i, n);
        return;
    }
    if (dti == EM_F16 && dto == EM_F32 && so == 4 && si == 2 && have_f16c()) {
        f16_to_f32_f16c((float *)o, (const uint16_t *)i, n);
        return;
    }
    if (dti == EM_F32 && dto == EM_BF16 && so == 2 && si == 4 && (have_avx512bw() || have_avx2())) {
        (have_avx512bw() ? f32_to_bf16_avx512 : f32_to_bf16_avx2)((uint16_t *)o, (const float *)i, n);
        return;
    }
    if (dti == EM_BF16 && dto == EM_F32 && so == 4 && si == 2 && (have_avx512bw() || have_avx2())) {
        (have_avx512bw() ? bf16_to_f32_avx512 : bf16_to_f32_avx2)((float *)o, (const uint16_t *)i, n);
        return;
    }
    g_cast[dti][dto](o, so, i, si, n);
}

void em__cpu_cast_f32_stream(char *o, em_dtype dto, const float *i, int64_t n) {
    if (dto == EM_BF16 && have_avx512bw() && f32_to_bf16_stream_avx512((uint16_t *)o, i, n)) return;
    em__cpu_cast_block(o, (int64_t)em_dtype_size(dto), dto, (const char *)i, 4, EM_F32, n);
}

void em__cpu_load_block(void *buf, const char *p, int64_t stride, int64_t n, em_dtype dt) {
    em_dtype ct = em__cpu_compute_type(dt);
    em__cpu_cast_block((char *)buf, (int64_t)em__cpu_esize(ct), ct, p, stride, dt, n);
}

void em__cpu_store_block(char *p, int64_t stride, int64_t n, em_dtype dt, const void *buf) {
    em_dtype ct = em__cpu_compute_type(dt);
    em__cpu_cast_block(p, stride, dt, (const char *)buf, (int64_t)em__cpu_esize(ct), ct, n);
}

double em__cpu_load_f64(const void *p, em_dtype dt) {
    double v;
    g_cast[dt][EM_F64]((char *)&v, 8, p, 0, 1);
    return v;
}
void em__cpu_store_f64(void *p, em_dtype dt, double v) { g_cast[EM_F64][dt](p, 0, (const char *)&v, 8, 1); }
int64_t em__cpu_load_i64(const void *p, em_dtype dt) {
    int64_t v;
    g_cast[dt][EM_I64]((char *)&v, 8, p, 0, 1);
    return v;
}
void em__cpu_store_i64(void *p, em_dtype dt, int64_t v) { g_cast[EM_I64][dt](p, 0, (const char *)&v, 8, 1); }

/* ---- copy ---- */
typedef struct copy_ctx { em_dtype dst, src; } copy_ctx;

static void copy_loop(void *arg, char **data, const int64_t *st, int64_t n, int64_t index) {
    const copy_ctx *c = arg;
    size_t es = em__cpu_esize(c->dst);
    if (c->dst == c->src && st[0] == (int64_t)es && st[1] == (int64_t)es) {
        memmove(data[0], data[1], (size_t)n * es); /* in-place copy onto itself is allowed */
        return;
    }
    if (c->dst == c->src && c->dst != EM_BOOL) { /* same type, strided: move bytes */
        char *o = data[0];
        const char *i = data[1];
        switch (es) {
        case 1: for (int64_t k = 0; k < n; k++, o += st[0], i += st[1]) *(uint8_t *)o = *(const uint8_t *)i; break;
        case 2: for (int64_t k = 0; k < n; k++, o += st[0], i += st[1]) *(uint16_t *)o = *(const uint16_t *)i; break;
        case 4: for (int64_t k = 0; k < n; k++, o += st[0], i += st[1]) *(uint32_t *)o = *(const uint32_t *)i; break;
        default: for (int64_t k = 0; k < n; k++, o += st[0], i += st[1]) *(uint64_t *)o = *(const uint64_t *)i; break;
        }
        return;
    }
    em__cpu_cast_block(data[0], st[0], c->dst, data[1], st[1], c->src, n);
}

em_status em__cpu_copy(em_tensor *out, const em_tensor *in) {
    const em_tensor *ts[2] = {out, in};
    cpu_iter it;
    em__cpu_iter_init(&it, 2, ts, false);
    copy_ctx c = {out->dtype, in->dtype};
    em__cpu_iter_run(&it, copy_loop, &c, EM_CPU_PARALLEL_ELEMS);
    return EM_OK;
}

/* ---- fill ---- */
typedef struct fill_ctx { em_dtype dt; bool same_bytes; _Alignas(8) unsigned char value[8]; } fill_ctx;

#define FILL_CASE(T, ES)                                                                 \
    case ES: {                                                                           \
        T v;                                                                             \
        memcpy(&v, c->value, ES);                                                        \
        if (st[0] == ES) {                                                               \
            T *restrict p = (T *)o;                                                      \
            EM_CPU_VLOOP(n, p[i] = v;)                                                   \
        } else {                                                                         \
            for (int64_t k = 0; k < n; k++, o += st[0]) *(T *)o = v;                     \
        }                                                                                \
        break;                                                                           \
    }

static void fill_loop(void *arg, char **data, const int64_t *st, int64_t n, int64_t index) {
    const fill_ctx *c = arg;
    char *o = data[0];
    size_t es = em__cpu_esize(c->dt);
    if ((int64_t)es == st[0] && c->same_bytes) { /* zeros, ones of u8, ...: memset speed */
        memset(o, c->value[0], (size_t)n * es);
        return;
    }
    switch (es) {
        FILL_CASE(uint8_t, 1)
        FILL_CASE(uint16_t, 2)
        FILL_CASE(uint32_t, 4)
        FILL_CASE(uint64_t, 8)
    }
}

em_status em__cpu_fill(em_tensor *out, double value) {
    fill_ctx c = {out->dtype, true, {0}};
    em__cpu_store_f64(c.value, out->dtype, value);
    for (size_t k = 1; k < em__cpu_esize(out->dtype); k++) c.same_bytes &= c.value[k] == c.value[0];
    const em_tensor *ts[1] = {out};
    cpu_iter it;
    em__cpu_iter_init(&it, 1, ts, false);
    em__cpu_iter_run(&it, fill_loop, &c, EM_CPU_PARALLEL_ELEMS);
    return EM_OK;
}

/* ---- fill_affine: out[i] = start + i * step in row-major order ---- */
typedef struct affine_ctx {
    em_dtype dt;
    bool integral;          /* integer dtype with integral start and step: exact int64 math */
    double start, step;
    int64_t istart, istep;
} affine_ctx;

static void affine_loop(void *arg, char **data, const int64_t *st, int64_t n, int64_t index) {
    const affine_ctx *c = arg;
    char *o = data[0];
    if (c->dt == EM_F32 && st[0] == 4) {
        float *f = (float *)o;
        for (int64_t k = 0; k < n; k++) f[k] = (float)(c->start + (double)(index + k) * c->step);
        return;
    }
    for (int64_t k = 0; k < n; k++, o += st[0]) {
        if (c->integral) /* unsigned math: wraps instead of overflowing */
            em__cpu_store_i64(o, c->dt, (int64_t)((uint64_t)c->istart + (uint64_t)(index + k) * (uint64_t)c->istep));
        else
            em__cpu_store_f64(o, c->dt, c->start + (double)(index + k) * c->step);
    }
}

em_status em__cpu_fill_affine(em_tensor *out, double start, double step) {
    affine_ctx c = {out->dtype, false, start, step, 0, 0};
    if (!em_dtype_is_floating(out->dtype) && out->dtype != EM_BOOL && start == floor(start) &&
        step == floor(step) && fabs(start) < 9.2e18 && fabs(step) < 9.2e18) {
        c.integral = true;
        c.istart = (int64_t)start;
        c.istep = (int64_t)step;
    }
    const em_tensor *ts[1] = {out};
    cpu_iter it;
    em__cpu_iter_init(&it, 1, ts, true);
    em__cpu_iter_run(&it, affine_loop, &c, EM_CPU_PARALLEL_ELEMS);
    return EM_OK;
}
