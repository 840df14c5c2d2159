/* fill, fill_affine and copy/cast between all eight dtypes, plus the block converters the
 * other kernel families use to bring any dtype and layout into a contiguous compute buffer. */
#include "cpu_internal.h"

/* ---- per-dtype element access: LD gives the natural C type, ST takes it ---- */
#define LD_f32(p) (*(const float *)(p))
#define LD_f64(p) (*(const double *)(p))
#define LD_f16(p) em_f16_to_f32(*(const uint16_t *)(p))
#define LD_bf16(p) em_bf16_to_f32(*(const uint16_t *)(p))
#define LD_i64(p) (*(const int64_t *)(p))
#define LD_i32(p) ((int64_t) * (const int32_t *)(p))
#define LD_u8(p) ((int64_t) * (const uint8_t *)(p))
#define LD_b8(p) ((int64_t)(*(const uint8_t *)(p) != 0))
#define ST_f32(p, v) (*(float *)(p) = (v))
#define ST_f64(p, v) (*(double *)(p) = (v))
#define ST_f16(p, v) (*(uint16_t *)(p) = em_f32_to_f16(v))
#define ST_bf16(p, v) (*(uint16_t *)(p) = em_f32_to_bf16(v))
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

void em__cpu_cast_block(char *o, int64_t so, em_dtype dto, const char *i, int64_t si, em_dtype dti, int64_t n) {
    g_cast[dti][dto](o, so, i, si, n);
}

void em__cpu_load_block(void *buf, const char *p, int64_t stride, int64_t n, em_dtype dt) {
    em_dtype ct = em__cpu_compute_type(dt);
    g_cast[dt][ct]((char *)buf, (int64_t)em__cpu_esize(ct), p, stride, n);
}

void em__cpu_store_block(char *p, int64_t stride, int64_t n, em_dtype dt, const void *buf) {
    em_dtype ct = em__cpu_compute_type(dt);
    g_cast[ct][dt](p, stride, (const char *)buf, (int64_t)em__cpu_esize(ct), n);
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
    g_cast[c->src][c->dst](data[0], st[0], data[1], st[1], n);
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
typedef struct fill_ctx { em_dtype dt; _Alignas(8) unsigned char value[8]; } fill_ctx;

static void fill_loop(void *arg, char **data, const int64_t *st, int64_t n, int64_t index) {
    const fill_ctx *c = arg;
    char *o = data[0];
    switch (em__cpu_esize(c->dt)) {
    case 1: {
        uint8_t v;
        memcpy(&v, c->value, 1);
        if (st[0] == 1) memset(o, v, (size_t)n);
        else for (int64_t k = 0; k < n; k++, o += st[0]) *(uint8_t *)o = v;
        break;
    }
    case 2: {
        uint16_t v;
        memcpy(&v, c->value, 2);
        if (st[0] == 2) for (int64_t k = 0; k < n; k++) ((uint16_t *)o)[k] = v;
        else for (int64_t k = 0; k < n; k++, o += st[0]) *(uint16_t *)o = v;
        break;
    }
    case 4: {
        uint32_t v;
        memcpy(&v, c->value, 4);
        if (st[0] == 4) for (int64_t k = 0; k < n; k++) ((uint32_t *)o)[k] = v;
        else for (int64_t k = 0; k < n; k++, o += st[0]) *(uint32_t *)o = v;
        break;
    }
    default: {
        uint64_t v;
        memcpy(&v, c->value, 8);
        if (st[0] == 8) for (int64_t k = 0; k < n; k++) ((uint64_t *)o)[k] = v;
        else for (int64_t k = 0; k < n; k++, o += st[0]) *(uint64_t *)o = v;
        break;
    }
    }
}

em_status em__cpu_fill(em_tensor *out, double value) {
    fill_ctx c = {out->dtype, {0}};
    em__cpu_store_f64(c.value, out->dtype, value);
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
