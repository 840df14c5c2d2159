/* CPU backend: index_select, index_add, gather, scatter_add over dtypes, dims, layouts,
 * repeated indices and bad indices. */
#include "test_cpu_util.h"
#include "backend_calls.h"

/* A 1-d int64 index of n values in [0, size), stored with stride `step`. */
static ttensor *make_index(int64_t n, int64_t size, int64_t step) {
    int64_t shape[1] = {n}, st[1] = {step};
    ttensor *x = tt_make_strided(EM_I64, 1, shape, st, 1);
    for (int64_t i = 0; i < n; i++) {
        int64_t v = (int64_t)(tt_rand01() * (double)size);
        memcpy(tt_ptr(x, i), &v, 8);
    }
    return x;
}

/* Flat index of `idx` in a row-major shape. */
static int64_t flat(int nd, const int64_t *shape, const int64_t *idx) {
    int64_t f = 0;
    for (int d = 0; d < nd; d++) f = f * shape[d] + idx[d];
    return f;
}
static void unflat(int nd, const int64_t *shape, int64_t f, int64_t *idx) {
    for (int d = nd - 1; d >= 0; d--) { idx[d] = f % shape[d]; f /= shape[d]; }
}

static void test_index_select_and_add(void) {
    int bad = 0;
    const int64_t ishape[3] = {3, 4, 5};
    for (int di = 0; di < 8; di++)
        for (int dim = 0; dim < 3; dim++)
            for (int li = 0; li < L_LAYOUT_COUNT; li++)
                for (int lo = 0; lo < 3; lo++)
                    for (int ni = 0; ni < 3; ni++) {
                        em_dtype dt = all_dtypes[di];
                        int64_t n = ni == 0 ? 0 : ni == 1 ? 1 : 7, oshape[3] = {3, 4, 5};
                        oshape[dim] = n;
                        ttensor *in = tt_make(dt, 3, ishape, (tlayout)li), *out = tt_make(dt, 3, oshape, (tlayout)lo);
                        ttensor *index = make_index(n, ishape[dim], 2);
                        tt_fill_random(in, 0, 100);
                        CHECK_OK(be_index_select(&em__cpu_backend, &out->t, &in->t, dim, &index->t));
                        int64_t no = tt_numel(&out->t), idx[3];
                        for (int64_t o = 0; o < no; o++) {
                            unflat(3, oshape, o, idx);
                            idx[dim] = tt_get_i64(index, idx[dim]);
                            if (tt_get(out, o) != tt_get(in, flat(3, ishape, idx)) && bad++ < 10)
                                fprintf(stderr, "  index_select %s dim %d [%lld]\n", dtype_names[di], dim, (long long)o);
                        }
                        if (!tt_guard_ok(out)) bad++;
                        /* index_add: acc (in's shape) += src (out's shape) at index, repeats accumulate */
                        if (dt != EM_BOOL && lo < 2) {
                            ttensor *acc = tt_make(dt, 3, ishape, (tlayout)(li == L_BCAST0 ? L_SLICED : li));
                            ttensor *src = tt_make(dt, 3, oshape, (tlayout)lo);
                            tt_fill_random(acc, 0, 50);
                            tt_fill_random(src, 0, 20);
                            int64_t na = tt_numel(&acc->t);
                            double *want = malloc(sizeof(double) * (size_t)na);
                            for (int64_t i = 0; i < na; i++) want[i] = tt_get(acc, i);
                            for (int64_t o = 0; o < no; o++) {
                                unflat(3, oshape, o, idx);
                                idx[dim] = tt_get_i64(index, idx[dim]);
                                want[flat(3, ishape, idx)] += tt_get(src, o);
                            }
                            CHECK_OK(be_index_add(&em__cpu_backend, &acc->t, dim, &index->t, &src->t));
                            for (int64_t i = 0; i < na; i++) {
                                double w = dt == EM_U8 ? (double)((int64_t)want[i] & 255) : want[i];
                                if (!tt_close(tt_get(acc, i), w, tt_tol(dt, w)) && bad++ < 10)
                                    fprintf(stderr, "  index_add %s dim %d [%lld]: got %g want %g\n", dtype_names[di],
                                            dim, (long long)i, tt_get(acc, i), w);
                            }
                            if (!tt_guard_ok(acc)) bad++;
                            free(want);
                            tt_free(acc);
                            tt_free(src);
                        }
                        tt_free(in);
                        tt_free(out);
                        tt_free(index);
                    }
    CHECK(bad == 0);
}

static void test_gather_and_scatter_add(void) {
    int bad = 0;
    const int64_t big[3] = {4, 6, 5};
    for (int di = 0; di < 8; di++)
        for (int dim = 0; dim < 3; dim++)
            for (int li = 0; li < 3; li++)
                for (int lx = 0; lx < 3; lx++)
                    for (int small = 0; small < 2; small++) {
                        em_dtype dt = all_dtypes[di];
                        int64_t ishape[3] = {4, 3, 5};
                        if (small) { ishape[0] = 2; ishape[1] = 7; ishape[2] = 4; }
                        if (small && dim != 1) ishape[1] = 3;
                        if (!small) ishape[dim] = 3;
                        ttensor *in = tt_make(dt, 3, big, (tlayout)li), *index = tt_make(EM_I64, 3, ishape, (tlayout)lx);
                        ttensor *out = tt_make(dt, 3, ishape, (tlayout)(2 - lx));
                        int64_t n = tt_numel(&index->t), idx[3];
                        for (int64_t i = 0; i < n; i++) {
                            int64_t v = (int64_t)(tt_rand01() * (double)big[dim]);
                            memcpy(tt_ptr(index, i), &v, 8);
                        }
                        tt_fill_random(in, 0, 100);
                        CHECK_OK(be_gather(&em__cpu_backend, &out->t, &in->t, dim, &index->t));
                        for (int64_t i = 0; i < n; i++) {
                            unflat(3, ishape, i, idx);
                            idx[dim] = tt_get_i64(index, i);
                            if (tt_get(out, i) != tt_get(in, flat(3, big, idx)) && bad++ < 10)
                                fprintf(stderr, "  gather %s dim %d [%lld]\n", dtype_names[di], dim, (long long)i);
                        }
                        if (!tt_guard_ok(out)) bad++;
                        /* scatter_add of out (as src) back into in */
                        if (dt != EM_BOOL) {
                            int64_t nb = tt_numel(&in->t);
                            double *want = malloc(sizeof(double) * (size_t)nb);
                            for (int64_t i = 0; i < nb; i++) want[i] = tt_get(in, i);
                            for (int64_t i = 0; i < n; i++) {
                                unflat(3, ishape, i, idx);
                                idx[dim] = tt_get_i64(index, i);
                                want[flat(3, big, idx)] += tt_get(out, i);
                            }
                            CHECK_OK(be_scatter_add(&em__cpu_backend, &in->t, dim, &index->t, &out->t));
                            for (int64_t i = 0; i < nb; i++) {
                                double w = dt == EM_U8 ? (double)((int64_t)want[i] & 255) : want[i];
                                if (!tt_close(tt_get(in, i), w, tt_tol(dt, w)) && bad++ < 10)
                                    fprintf(stderr, "  scatter_add %s dim %d [%lld]: got %g want %g\n", dtype_names[di],
                                            dim, (long long)i, tt_get(in, i), w);
                            }
                            if (!tt_guard_ok(in)) bad++;
                            free(want);
                        }
                        tt_free(in);
                        tt_free(out);
                        tt_free(index);
                    }
    CHECK(bad == 0);
}

/* A bad index is an error naming it; nothing is written. */
static void test_bad_indices(void) {
    int64_t shape[2] = {3, 4}, oshape[2] = {2, 4};
    ttensor *in = tt_make(EM_F32, 2, shape, L_CONTIG), *out = tt_make(EM_F32, 2, oshape, L_CONTIG);
    ttensor *index = make_index(2, 3, 1);
    int64_t v = 3;
    memcpy(tt_ptr(index, 1), &v, 8);
    CHECK(be_index_select(&em__cpu_backend, &out->t, &in->t, 0, &index->t) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "index 3 is out of bounds for dimension 0 with size 3");
    CHECK(tt_guard_ok(out) && *tt_ptr(out, 0) == GUARD_BYTE);
    v = -1;
    memcpy(tt_ptr(index, 1), &v, 8);
    CHECK(be_index_add(&em__cpu_backend, &in->t, 0, &index->t, &out->t) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "index -1");
    ttensor *gi = tt_make(EM_I64, 2, oshape, L_CONTIG);
    for (int i = 0; i < 8; i++) { int64_t z = i == 5 ? INT64_MAX : 0; memcpy(tt_ptr(gi, i), &z, 8); }
    CHECK(be_gather(&em__cpu_backend, &out->t, &in->t, 1, &gi->t) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "out of bounds for dimension 1 with size 4");
    CHECK(be_scatter_add(&em__cpu_backend, &in->t, 0, &gi->t, &out->t) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "scatter_add");
    tt_free(in); tt_free(out); tt_free(index); tt_free(gi);
}

int main(void) {
    RUN(test_index_select_and_add);
    RUN(test_gather_and_scatter_add);
    RUN(test_bad_indices);
    return test_summary();
}
