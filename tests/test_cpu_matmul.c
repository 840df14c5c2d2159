/* CPU backend: batched matmul for every dtype, layout (row-major, transposed, strided,
 * broadcast batch) and odd size, against a naive reference. */
#include "test_cpu_util.h"
#include "backend_calls.h"

typedef struct mm_case { int64_t M, K, N; } mm_case;
static const mm_case cases[] = {
    {1, 1, 1}, {7, 5, 3}, {16, 16, 16}, {33, 17, 65}, {1, 9, 1}, {5, 0, 4}, {0, 3, 4}, {4, 3, 1}, {1, 3, 5},
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

/* A [batch..., R, C] tensor in one of: row-major, last two dims transposed in memory,
 * strided (every stride doubled), batch dim 0 broadcast. */
static ttensor *make_mat(em_dtype dt, int nb, const int64_t *bshape, int64_t R, int64_t C, int layout) {
    int64_t shape[EM_MAX_DIMS];
    int nd = nb + 2;
    for (int d = 0; d < nb; d++) shape[d] = bshape[d];
    shape[nb] = R;
    shape[nb + 1] = C;
    if (layout == 1) { /* build [.., C, R] row-major, then swap the last two dims */
        int64_t tshape[EM_MAX_DIMS];
        memcpy(tshape, shape, sizeof shape);
        tshape[nb] = C;
        tshape[nb + 1] = R;
        int64_t st[EM_MAX_DIMS], s = 1;
        for (int d = nd - 1; d >= 0; d--) { st[d] = s; s *= tshape[d] > 0 ? tshape[d] : 1; }
        int64_t t = st[nb];
        st[nb] = st[nb + 1];
        st[nb + 1] = t;
        return tt_make_strided(dt, nd, shape, st, 0);
    }
    if (layout >= 4 && nb == 2) { /* attention heads: [b0, b1, R, C] a view of [b0, R, b1, C] (5: of [b0, C, b1, R]) */
        int64_t st[EM_MAX_DIMS];
        st[1] = layout == 4 ? C : R;
        st[0] = shape[0] > 0 ? R * C * shape[1] : 1;
        st[2] = layout == 4 ? shape[1] * C : 1;
        st[3] = layout == 4 ? 1 : shape[1] * R;
        return tt_make_strided(dt, nd, shape, st, 0);
    }
    if (layout >= 4) layout = 0;
    if (layout == 3 && nb == 0) layout = 0;
    return tt_make(dt, nd, shape, layout == 0 ? L_CONTIG : layout == 2 ? L_SLICED : L_BCAST0);
}

static int64_t elem(const em_tensor *t, int nb, int64_t batch, const int64_t *bshape, int64_t r, int64_t c) {
    int64_t off = 0, i = batch;
    for (int d = nb - 1; d >= 0; d--) { off += (i % bshape[d]) * t->strides[d]; i /= bshape[d]; }
    return off + r * t->strides[nb] + c * t->strides[nb + 1];
}

/* Element at eoff elements from the tensor's own offset. */
static const unsigned char *at(ttensor *x, int64_t eoff) {
    return (const unsigned char *)x->st.block.handle + (x->t.offset + eoff) * (int64_t)tt_esize(x->t.dtype);
}
static double get_at(ttensor *x, int64_t eoff) { return tt_get_raw(x, at(x, eoff)); }
static int64_t get_at_i(ttensor *x, int64_t eoff) { return tt_get_i64_raw(x, at(x, eoff)); }

static void check_mm(em_dtype dt, const mm_case *c, int nb, const int64_t *bshape, int la, int lb, int lo, int *bad) {
    ttensor *a = make_mat(dt, nb, bshape, c->M, c->K, la), *b = make_mat(dt, nb, bshape, c->K, c->N, lb);
    ttensor *o = make_mat(dt, nb, bshape, c->M, c->N, lo == 3 ? 0 : lo);
    if (dt == EM_U8) { tt_fill_random(a, 0, 20); tt_fill_random(b, 0, 20); }
    else if (dt == EM_BOOL) { tt_fill_random(a, 0, 1); tt_fill_random(b, 0, 1); }
    else { tt_fill_random(a, -4, 4); tt_fill_random(b, -4, 4); }
    CHECK_OK(be_matmul(&em__cpu_backend, &o->t, &a->t, &b->t));
    int64_t nbatch = 1;
    for (int d = 0; d < nb; d++) nbatch *= bshape[d];
    bool fl = em_dtype_is_floating_test(dt);
    int64_t M = c->M, K = c->K, N = c->N;
    double *ad = malloc(sizeof(double) * (size_t)(M * K + 1)), *bd = malloc(sizeof(double) * (size_t)(K * N + 1));
    int64_t *ai = malloc(sizeof(int64_t) * (size_t)(M * K + 1)), *bi_ = malloc(sizeof(int64_t) * (size_t)(K * N + 1));
    for (int64_t bi = 0; bi < nbatch; bi++) {
        for (int64_t i = 0; i < M; i++)
            for (int64_t k = 0; k < K; k++) {
                int64_t e = elem(&a->t, nb, bi, bshape, i, k);
                ad[i * K + k] = get_at(a, e);
                ai[i * K + k] = get_at_i(a, e);
            }
        for (int64_t k = 0; k < K; k++)
            for (int64_t j = 0; j < N; j++) {
                int64_t e = elem(&b->t, nb, bi, bshape, k, j);
                bd[k * N + j] = get_at(b, e);
                bi_[k * N + j] = get_at_i(b, e);
            }
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double want = 0, mag = 0;
                uint64_t iw = 0;
                for (int64_t k = 0; k < K; k++) {
                    want += ad[i * K + k] * bd[k * N + j];
                    mag += fabs(ad[i * K + k] * bd[k * N + j]);
                    iw += (uint64_t)ai[i * K + k] * (uint64_t)bi_[k * N + j];
                }
                int64_t oo = elem(&o->t, nb, bi, bshape, i, j);
                bool ok;
                if (fl) {
                    double tol = (dt == EM_F32 ? 1e-6 : dt == EM_F64 ? 1e-14 : dt == EM_F16 ? 1e-3 : 8e-3) * (mag + 1);
                    ok = fabs(get_at(o, oo) - want) <= tol;
                } else {
                    int64_t w = (int64_t)iw;
                    w = dt == EM_I32 ? (int32_t)(uint32_t)iw : dt == EM_U8 ? (uint8_t)iw : dt == EM_BOOL ? iw != 0 : w;
                    ok = get_at_i(o, oo) == w;
                }
                if (!ok && (*bad)++ < 10)
                    fprintf(stderr, "  matmul %s %lldx%lldx%lld nb=%d layouts %d,%d->%d [%lld,%lld,%lld]: got %g want %g\n",
                            dtype_names[dt], (long long)M, (long long)K, (long long)N, nb, la, lb, lo,
                            (long long)bi, (long long)i, (long long)j, get_at(o, oo), want);
            }
    }
    free(ad); free(bd); free(ai); free(bi_);
    if ((!tt_guard_ok(o) || !tt_guard_ok(a) || !tt_guard_ok(b)) && (*bad)++ < 10)
        fprintf(stderr, "  matmul: guard bytes changed\n");
    tt_free(a); tt_free(b); tt_free(o);
}

static void test_matmul_all(void) {
    int bad = 0, ran = 0;
    const int64_t b1[1] = {3}, b2[2] = {2, 3};
    for (int di = 0; di < 8; di++)
        for (int ci = 0; ci < NCASES; ci++)
            for (int nb = 0; nb <= 2; nb++)
                for (int la = 0; la < 4; la++)
                    for (int lb = 0; lb < 4; lb++)
                        for (int lo = 0; lo < 3; lo++) {
                            if (nb == 0 && (la == 3 || lb == 3)) continue;
                            if (nb == 2 && (la != lb || lo != 0)) continue;
                            check_mm(all_dtypes[di], &cases[ci], nb, nb == 1 ? b1 : b2, la, lb, lo, &bad);
                            ran++;
                        }
    CHECK(bad == 0);
    CHECK(ran > 2000);
}

/* Large enough to be split across threads; the folded-batch path; 1 and 2 threads agree. */
static void test_matmul_large_and_threads(void) {
    int bad = 0;
    const mm_case big = {300, 200, 130}, tall = {1, 64, 3000};
    const int64_t b1[1] = {40};
    em_set_num_threads(2);
    check_mm(EM_F32, &big, 0, NULL, 0, 1, 0, &bad);
    check_mm(EM_F64, &big, 0, NULL, 1, 0, 1, &bad);
    check_mm(EM_F32, &tall, 0, NULL, 0, 0, 0, &bad);
    const mm_case lin = {50, 64, 33};
    check_mm(EM_F32, &lin, 1, b1, 0, 3, 0, &bad); /* [40,50,64] x broadcast [64,33]: one folded GEMM */
    em_set_num_threads(1);
    check_mm(EM_F32, &big, 0, NULL, 0, 1, 0, &bad);
    em_set_num_threads(2);
    CHECK(bad == 0);
}

/* f32 batches through oneDNN's batched primitive (the default in a build with oneDNN) and
 * through per-matrix BLAS calls (EMBER_CPU_BATCHED_GEMM=blas) and the per-shape choice: odd sizes, an outer batch dim
 * of 1, an outer batch split over 2 threads unevenly, broadcast, strided, transposed and
 * attention-head views, output transposed. */
static void test_matmul_batched_paths(void) {
    int bad = 0, ran = 0;
    const mm_case shapes[] = {{17, 9, 13}, {64, 32, 64}, {1, 5, 7}, {3, 1, 2}};
    const int64_t bs[][2] = {{5, 3}, {1, 4}, {7, 1}, {32, 4}};
    const char *paths[] = {"dnnl", "blas", "auto"};
    for (int p = 0; p < 3; p++) {
        setenv("EMBER_CPU_BATCHED_GEMM", paths[p], 1);
        for (int th = 1; th <= 2; th++) {
            em_set_num_threads(th);
            for (int si = 0; si < 4; si++)
                for (int bi = 0; bi < 4; bi++) {
                    if (bi == 3 && si != 1) continue; /* the GPT's shape only at its own size */
                    const int lay[][3] = {{0, 0, 0}, {4, 5, 0}, {4, 4, 0}, {1, 1, 1}, {2, 3, 0}, {3, 2, 1}, {5, 4, 0}};
                    for (int li = 0; li < 7; li++) {
                        check_mm(EM_F32, &shapes[si], 2, bs[bi], lay[li][0], lay[li][1], lay[li][2], &bad);
                        ran++;
                    }
                }
        }
    }
    unsetenv("EMBER_CPU_BATCHED_GEMM");
    em_set_num_threads(2);
    CHECK(bad == 0);
    CHECK(ran == 3 * 2 * 13 * 7);
}

int main(void) {
    RUN(test_matmul_all);
    RUN(test_matmul_large_and_threads);
    RUN(test_matmul_batched_paths);
    return test_summary();
}
