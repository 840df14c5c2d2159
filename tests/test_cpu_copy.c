/* CPU backend: fill, fill_affine and copy/cast over every dtype pair and layout. */
#include "test_cpu_util.h"
#include "backend_calls.h"

typedef struct tshape { int ndim; int64_t d[4]; } tshape;
static const tshape shapes[] = {
    {1, {0}}, {1, {1}}, {1, {7}}, {1, {1023}}, {1, {100003}}, {2, {3, 5}}, {3, {4, 1, 7}},
    {4, {2, 3, 4, 5}}, {2, {33, 31}}, {2, {0, 3}}, {0, {0}},
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

/* What converting v to dt must give (v is exactly representable in double). */
static double expect_cast(double v, em_dtype dt) {
    switch (dt) {
    case EM_F32: return (float)v;
    case EM_F64: return v;
    case EM_F16: return em_f16_to_f32(em_f32_to_f16((float)v));
    case EM_BF16: return em_bf16_to_f32(em_f32_to_bf16((float)v));
    case EM_I64: case EM_I32: return trunc(v);
    case EM_U8: return (double)((int64_t)trunc(v) & 255);
    default: return v != 0;
    }
}

static void test_copy_all_pairs(void) {
    int bad = 0;
    for (int si = 0; si < 8; si++)
        for (int di = 0; di < 8; di++)
            for (int s = 0; s < NSHAPES; s++)
                for (int li = 0; li < L_LAYOUT_COUNT; li++)
                    for (int lo = 0; lo < 3; lo++) {
                        const tshape *sh = &shapes[s];
                        if (sh->d[0] > 2000 && (li != L_CONTIG || lo != L_CONTIG) && !(si == 0 && di == 0)) continue;
                        ttensor *in = tt_make(all_dtypes[si], sh->ndim, sh->d, (tlayout)li);
                        ttensor *out = tt_make(all_dtypes[di], sh->ndim, sh->d, (tlayout)lo);
                        tt_fill_random(in, -100, 100);
                        CHECK_OK(be_copy(&em__cpu_backend, &out->t, &in->t));
                        int64_t n = tt_numel(&out->t);
                        for (int64_t i = 0; i < n && bad < 10; i++) {
                            double e = expect_cast(tt_get(in, i), all_dtypes[di]), g = tt_get(out, i);
                            if (g != e) {
                                fprintf(stderr, "  copy %s->%s shape#%d %s->%s [%lld]: got %g want %g\n",
                                        dtype_names[si], dtype_names[di], s, tlayout_name[li], tlayout_name[lo],
                                        (long long)i, g, e);
                                bad++;
                            }
                        }
                        if (!tt_guard_ok(out) || !tt_guard_ok(in)) {
                            fprintf(stderr, "  copy %s->%s shape#%d: guard bytes changed\n", dtype_names[si],
                                    dtype_names[di], s);
                            bad++;
                        }
                        tt_free(in);
                        tt_free(out);
                    }
    CHECK(bad == 0);
}

/* NaN, infinities and out-of-range floats give defined integers (x86's, as PyTorch there). */
static void test_cast_special_values(void) {
    int64_t shape[1] = {6};
    const double vals[6] = {NAN, INFINITY, -INFINITY, 3e9, -3e9, 300.7};
    ttensor *in = tt_make(EM_F64, 1, shape, L_CONTIG);
    for (int i = 0; i < 6; i++) tt_set(in, i, vals[i]);
    ttensor *i32 = tt_make(EM_I32, 1, shape, L_CONTIG), *i64 = tt_make(EM_I64, 1, shape, L_CONTIG);
    ttensor *u8 = tt_make(EM_U8, 1, shape, L_CONTIG), *b = tt_make(EM_BOOL, 1, shape, L_CONTIG);
    CHECK_OK(be_copy(&em__cpu_backend, &i32->t, &in->t));
    CHECK_OK(be_copy(&em__cpu_backend, &i64->t, &in->t));
    CHECK_OK(be_copy(&em__cpu_backend, &u8->t, &in->t));
    CHECK_OK(be_copy(&em__cpu_backend, &b->t, &in->t));
    for (int i = 0; i < 5; i++) CHECK(tt_get_i64(i32, i) == INT32_MIN || i == 4);
    CHECK(tt_get_i64(i32, 4) == INT32_MIN);
    CHECK(tt_get_i64(i32, 5) == 300);
    CHECK(tt_get_i64(i64, 0) == INT64_MIN);
    CHECK(tt_get_i64(i64, 1) == INT64_MIN);
    CHECK(tt_get_i64(i64, 3) == 3000000000);
    CHECK(tt_get_i64(i64, 4) == -3000000000);
    CHECK(tt_get_i64(u8, 5) == 44);   /* 300 wraps, as in PyTorch */
    CHECK(tt_get_i64(u8, 4) == 0);    /* -3e9 = 0 mod 256 */
    for (int i = 0; i < 6; i++) CHECK(tt_get_i64(b, i) == 1);
    /* bool bytes other than 0/1 read as true */
    ttensor *braw = tt_make(EM_BOOL, 1, shape, L_CONTIG), *f = tt_make(EM_F32, 1, shape, L_CONTIG);
    for (int i = 0; i < 6; i++) *tt_ptr(braw, i) = (unsigned char)(i * 50);
    CHECK_OK(be_copy(&em__cpu_backend, &f->t, &braw->t));
    CHECK(tt_get(f, 0) == 0);
    for (int i = 1; i < 6; i++) CHECK(tt_get(f, i) == 1);
    tt_free(in); tt_free(i32); tt_free(i64); tt_free(u8); tt_free(b); tt_free(braw); tt_free(f);
}

/* f32 <-> f16 / bf16 conversions (vectorized where the CPU allows) give exactly core's bits,
 * for special values too: NaN payloads, infinities, overflow, subnormals, signed zeros. */
static void test_half_conversions_bit_exact(void) {
    const uint32_t bits[] = {0x7fc00000u, 0xffc12345u, 0x7f800001u, 0x7f800000u, 0xff800000u, 0x477ff000u,
                             0x477fefffu, 0x47800000u, 0x33000000u, 0x33000001u, 0x387fc000u, 0x00000001u,
                             0x80000000u, 0x3f800000u, 0xc0490fdbu, 0x38800000u, 0x3eaaaaabu, 0x42f6e979u};
    int64_t n = 18 * 7, shape[1] = {18 * 7};
    ttensor *f = tt_make(EM_F32, 1, shape, L_CONTIG), *h = tt_make(EM_F16, 1, shape, L_CONTIG);
    ttensor *b = tt_make(EM_BF16, 1, shape, L_CONTIG), *back = tt_make(EM_F32, 1, shape, L_CONTIG);
    for (int64_t i = 0; i < n; i++) memcpy(tt_ptr(f, i), &bits[i % 18], 4);
    CHECK_OK(be_copy(&em__cpu_backend, &h->t, &f->t));
    CHECK_OK(be_copy(&em__cpu_backend, &b->t, &f->t));
    for (int64_t i = 0; i < n; i++) {
        float v;
        uint16_t hv, bv;
        memcpy(&v, tt_ptr(f, i), 4);
        memcpy(&hv, tt_ptr(h, i), 2);
        memcpy(&bv, tt_ptr(b, i), 2);
        CHECK(hv == em_f32_to_f16(v));
        CHECK(bv == em_f32_to_bf16(v));
    }
    CHECK_OK(be_copy(&em__cpu_backend, &back->t, &h->t));
    for (int64_t i = 0; i < n; i++) {
        uint16_t hv;
        float want = 0, got;
        memcpy(&hv, tt_ptr(h, i), 2);
        want = em_f16_to_f32(hv);
        memcpy(&got, tt_ptr(back, i), 4);
        CHECK(memcmp(&got, &want, 4) == 0);
    }
    tt_free(f); tt_free(h); tt_free(b); tt_free(back);
}

/* In-place copy of a view onto itself leaves it unchanged. */
static void test_copy_onto_itself(void) {
    int64_t shape[2] = {5, 9};
    ttensor *x = tt_make(EM_F32, 2, shape, L_CONTIG);
    tt_fill_random(x, -3, 3);
    double before[45];
    for (int i = 0; i < 45; i++) before[i] = tt_get(x, i);
    CHECK_OK(be_copy(&em__cpu_backend, &x->t, &x->t));
    for (int i = 0; i < 45; i++) CHECK(tt_get(x, i) == before[i]);
    tt_free(x);
}

static void test_fill(void) {
    const double values[] = {3.0, -1.5, 0.0, 1e10};
    int bad = 0;
    for (int di = 0; di < 8; di++)
        for (int s = 0; s < NSHAPES; s++)
            for (int lo = 0; lo < 3; lo++)
                for (int vi = 0; vi < 4; vi++) {
                    const tshape *sh = &shapes[s];
                    em_dtype dt = all_dtypes[di];
                    ttensor *out = tt_make(dt, sh->ndim, sh->d, (tlayout)lo);
                    CHECK_OK(be_fill(&em__cpu_backend, &out->t, values[vi]));
                    double e;
                    if (dt == EM_I32 && values[vi] == 1e10) e = INT32_MIN;
                    else if (dt == EM_U8 && values[vi] == 1e10) e = (double)(10000000000ll & 255);
                    else e = expect_cast(values[vi], dt);
                    int64_t n = tt_numel(&out->t);
                    for (int64_t i = 0; i < n; i++)
                        if (tt_get(out, i) != e && bad++ < 10)
                            fprintf(stderr, "  fill %s %g [%lld] = %g, want %g\n", dtype_names[di], values[vi],
                                    (long long)i, tt_get(out, i), e);
                    if (!tt_guard_ok(out)) bad++;
                    tt_free(out);
                }
    CHECK(bad == 0);
}

static void test_fill_affine(void) {
    int bad = 0;
    for (int di = 0; di < 7; di++) /* bool has no arange */
        for (int s = 0; s < NSHAPES; s++)
            for (int lo = 0; lo < 3; lo++) {
                const tshape *sh = &shapes[s];
                em_dtype dt = all_dtypes[di];
                ttensor *out = tt_make(dt, sh->ndim, sh->d, (tlayout)lo);
                double start = dt == EM_U8 ? 2 : -7, step = em_dtype_is_floating_test(dt) ? 0.25 : 3;
                CHECK_OK(be_fill_affine(&em__cpu_backend, &out->t, start, step));
                int64_t n = tt_numel(&out->t);
                for (int64_t i = 0; i < n; i++) {
                    double e = expect_cast(start + (double)i * step, dt), g = tt_get(out, i);
                    if (g != e && bad++ < 10)
                        fprintf(stderr, "  fill_affine %s shape#%d %s [%lld] = %g, want %g\n", dtype_names[di], s,
                                tlayout_name[lo], (long long)i, g, e);
                }
                if (!tt_guard_ok(out)) bad++;
                tt_free(out);
            }
    CHECK(bad == 0);
    /* int64 beyond 2^53 stays exact */
    int64_t shape[1] = {4};
    ttensor *x = tt_make(EM_I64, 1, shape, L_CONTIG);
    CHECK_OK(be_fill_affine(&em__cpu_backend, &x->t, 9007199254740992.0, 1));
    for (int i = 0; i < 4; i++) CHECK(tt_get_i64(x, i) == 9007199254740992ll + i);
    tt_free(x);
}

int main(void) {
    RUN(test_copy_all_pairs);
    RUN(test_cast_special_values);
    RUN(test_half_conversions_bit_exact);
    RUN(test_copy_onto_itself);
    RUN(test_fill);
    RUN(test_fill_affine);
    return test_summary();
}
