/* The strided N-d iterator and the dtype block converters used by every kernel family. */
#include "cpu_internal.h"

void em__cpu_iter_init(cpu_iter *it, int nops, const em_tensor *const *ts, bool keep_order) {
    const em_tensor *out = ts[0];
    int perm[EM_MAX_DIMS], nd = 0;
    it->nops = nops;
    it->numel = em__cpu_numel(out);
    for (int k = 0; k < nops; k++)
        it->base[k] = (char *)em__host_ptr(ts[k]);
    for (int d = 0; d < out->ndim; d++)
        if (out->shape[d] != 1) perm[nd++] = d;
    if (!keep_order) {
        /* Insertion sort, outermost (largest |out stride|) first; stable for equal strides. */
        for (int i = 1; i < nd; i++) {
            int d = perm[i], j = i;
            int64_t s = out->strides[d] < 0 ? -out->strides[d] : out->strides[d];
            while (j > 0) {
                int64_t t = out->strides[perm[j - 1]];
                if (t < 0) t = -t;
                if (t >= s) break;
                perm[j] = perm[j - 1];
                j--;
            }
            perm[j] = d;
        }
    }
    int m = 0;
    for (int i = 0; i < nd; i++) {
        int d = perm[i];
        if (m > 0) {
            bool merge = true;
            for (int k = 0; k < nops && merge; k++)
                merge = it->strides[k][m - 1] == out->shape[d] * ts[k]->strides[d] * (int64_t)em__cpu_esize(ts[k]->dtype);
            if (merge) {
                it->shape[m - 1] *= out->shape[d];
                for (int k = 0; k < nops; k++)
                    it->strides[k][m - 1] = ts[k]->strides[d] * (int64_t)em__cpu_esize(ts[k]->dtype);
                continue;
            }
        }
        it->shape[m] = out->shape[d];
        for (int k = 0; k < nops; k++)
            it->strides[k][m] = ts[k]->strides[d] * (int64_t)em__cpu_esize(ts[k]->dtype);
        m++;
    }
    if (m == 0) { /* a single element */
        it->shape[0] = 1;
        for (int k = 0; k < nops; k++) it->strides[k][0] = (int64_t)em__cpu_esize(ts[k]->dtype);
        m = 1;
    }
    it->ndim = m;
}

typedef struct iter_job {
    const cpu_iter *it;
    cpu_loop_fn loop;
    void *ctx;
} iter_job;

/* Run elements [begin, end) of the flattened iteration space. */
static void iter_range(void *arg, int64_t begin, int64_t end) {
    const iter_job *job = arg;
    const cpu_iter *it = job->it;
    int nd = it->ndim, nops = it->nops;
    int64_t idx[EM_MAX_DIMS], inner = it->shape[nd - 1];
    char *row[EM_CPU_MAX_OPS], *run[EM_CPU_MAX_OPS];
    int64_t inner_strides[EM_CPU_MAX_OPS];
    int64_t rem = begin;
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = rem % it->shape[d];
        rem /= it->shape[d];
    }
    for (int k = 0; k < nops; k++) {
        row[k] = it->base[k];
        for (int d = 0; d < nd - 1; d++) row[k] += idx[d] * it->strides[k][d];
        inner_strides[k] = it->strides[k][nd - 1];
    }
    int64_t pos = begin, j = idx[nd - 1];
    while (pos < end) {
        int64_t n = inner - j;
        if (n > end - pos) n = end - pos;
        for (int k = 0; k < nops; k++) run[k] = row[k] + j * inner_strides[k];
        job->loop(job->ctx, run, inner_strides, n, pos);
        pos += n;
        j = 0;
        if (pos >= end) break;
        for (int d = nd - 2; d >= 0; d--) { /* carry into the outer dims */
            idx[d]++;
            for (int k = 0; k < nops; k++) row[k] += it->strides[k][d];
            if (idx[d] < it->shape[d]) break;
            for (int k = 0; k < nops; k++) row[k] -= it->shape[d] * it->strides[k][d];
            idx[d] = 0;
        }
    }
}

void em__cpu_iter_run(const cpu_iter *it, cpu_loop_fn loop, void *ctx, int64_t grain) {
    if (it->numel <= 0) return;
    iter_job job = {it, loop, ctx};
    if (grain > 0 && it->numel >= grain)
        em__cpu_parallel_for(it->numel, grain / 2 > 1 ? grain / 2 : 1, iter_range, &job);
    else
        iter_range(&job, 0, it->numel);
}
