/* Fused scaled-dot-product attention, f32, forward and backward, one (batch, head) per task.
 * The composed attention (matmul, mask add, softmax, matmul: src/nn/attention.c) writes the
 * [L, S] scores, the masked scores and the softmax to memory for every head and reads them
 * back in backward, and copies q, k, v and the output between [N, L, E] and [N, H, L, E/H];
 * here a block of query rows' scores lives in a per-task buffer while it is used, a causal
 * block stops at its last row's key (about half the work), and the operands are read and the
 * results written with their own strides. What backward needs is the output and each row's
 * log-sum-exp: it recomputes the probabilities from q, k and lse (as FlashAttention does)
 * instead of keeping [L, S] per head.
 *   forward   P = softmax(scale q k^T, j <= i when causal), out = P v, lse_i = log sum_j e^(s_ij)
 *   backward  dv = P^T g, dP = g v^T, dS = P (dP - rowsum(g out)), dq = scale dS k,
 *             dk = scale dS^T q */
#include <math.h>
#include <stdlib.h>
#ifdef __SSE2__
#include <xmmintrin.h>
#endif
#include "cpu_gemm.h"
#include "cpu_internal.h"
#include "cpu_vmath.h"
#ifdef EMBER_HAVE_BLAS
#include <cblas.h>
#endif

#define SDPA_ROWS 16 /* query rows per block: the scores block is SDPA_ROWS x S floats */

/* C (m x n, ldc) = alpha A B + beta C, A (m x k) stored row-major with lda or, when ta,
 * its transpose; B (k x n) likewise. beta is 0 or 1. tmp: m x n floats where beta is 1, for
 * the build without BLAS, whose GEMM has neither alpha nor beta. */
static void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                 const float *b, int64_t ldb, float beta, float *c, int64_t ldc, float *tmp) {
    if (m <= 0 || n <= 0) return;
#ifdef EMBER_HAVE_BLAS
    (void)tmp;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k,
                alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
#else
    float *z = beta == 0.0f ? c : tmp;
    int64_t ldz = beta == 0.0f ? ldc : n;
    em__cpu_gemm_f32(m, n, k, a, ta ? 1 : lda, ta ? lda : 1, b, tb ? 1 : ldb, tb ? ldb : 1, z, ldz);
    for (int64_t r = 0; r < m && (alpha != 1.0f || z != c); r++) {
        float *ci = c + r * ldc, *zi = z + r * ldz;
        if (z == c) EM_CPU_VLOOP(n, ci[i] *= alpha;)
        else EM_CPU_VLOOP(n, ci[i] += alpha * zi[i];)
    }
#endif
}

/* Element (b, h, row, 0) of a [B, H, rows, cols] operand with the last stride 1. */
typedef struct operand {
    float *p;
    int64_t sb, sh, sr;
} operand;

static operand operand_of(const em_tensor *t) {
    return (operand){(float *)em__host_ptr(t), t->strides[0], t->strides[1], t->strides[2]};
}
static inline float *at(const operand *o, int64_t b, int64_t h, int64_t r) {
    return o->p + b * o->sb + h * o->sh + r * o->sr;
}

typedef struct sdpa_job {
    operand q, k, v, out, g, dq, dk, dv;
    float *lse; /* contiguous [B, H, L] */
    int64_t H, L, S, E, Ev;
    float scale;
    bool causal;
    atomic_bool oom;
} sdpa_job;

/* Keys row i may see in a block of keys [0, sc): all, or j <= i when causal. */
static inline int64_t visible(const sdpa_job *j, int64_t i, int64_t sc) {
    return j->causal ? (i + 1 < sc ? i + 1 : sc) : sc;
}
/* Keys a block of rows [i0, i1) needs. */
static inline int64_t block_keys(const sdpa_job *j, int64_t i1) { return j->causal && i1 < j->S ? i1 : j->S; }

/* x (n rows of e floats, row stride sr) transposed into xt (e rows of n, row stride n): BLAS
 * multiplies by a transposed right operand at under half the speed at these sizes (measured:
 * 67 against 155 GFLOP/s for 16 x 64 x 32 with OpenBLAS), so k and v are transposed once per
 * head instead. */
static void transpose(const float *x, int64_t n, int64_t e, int64_t sr, float *xt) {
    int64_t r = 0;
#ifdef __SSE2__ /* every x86-64: 4 x 4 tiles through registers */
    for (; r + 4 <= n; r += 4) {
        const float *x0 = x + r * sr;
        int64_t c = 0;
        for (; c + 4 <= e; c += 4) {
            __m128 a0 = _mm_loadu_ps(x0 + c), a1 = _mm_loadu_ps(x0 + sr + c), a2 = _mm_loadu_ps(x0 + 2 * sr + c),
                   a3 = _mm_loadu_ps(x0 + 3 * sr + c);
            _MM_TRANSPOSE4_PS(a0, a1, a2, a3);
            _mm_storeu_ps(xt + c * n + r, a0);
            _mm_storeu_ps(xt + (c + 1) * n + r, a1);
            _mm_storeu_ps(xt + (c + 2) * n + r, a2);
            _mm_storeu_ps(xt + (c + 3) * n + r, a3);
        }
        for (; c < e; c++)
            for (int64_t k = r; k < r + 4; k++) xt[c * n + k] = x[k * sr + c];
    }
#endif
    for (; r < n; r++)
        for (int64_t c = 0; c < e; c++) xt[c * n + r] = x[r * sr + c];
}

/* The block's scaled scores scale q k^T into buf (rows x sc, row stride sc), kt = k^T (E x S). */
static void scores(const sdpa_job *j, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t sc, const float *kt,
                   float *buf, float *tmp) {
    gemm(false, false, rows, sc, j->E, j->scale, at(&j->q, b, h, i0), j->q.sr, kt, j->S, 0.0f, buf, sc, tmp);
}

/* A row of sc scores of which the first n are visible: the rest become -inf (weight 0 after
 * the exponential), the visible ones minus *by or, without it, minus their maximum, which is
 * returned. In lanes of 8 that GCC vectorizes; a NaN score makes the row's sum, so its
 * probabilities, NaN. */
static float shift_row(float *s, int64_t n, int64_t sc, const float *by) {
    for (int64_t c = n; c < sc; c++) s[c] = -INFINITY;
    float m;
    if (by) {
        m = *by;
    } else {
        float lane[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
        int64_t c = 0;
        for (; c + 8 <= n; c += 8)
            for (int l = 0; l < 8; l++) lane[l] = s[c + l] > lane[l] ? s[c + l] : lane[l];
        for (; c < n; c++) lane[0] = s[c] > lane[0] ? s[c] : lane[0];
        m = lane[0];
        for (int l = 1; l < 8; l++) m = lane[l] > m ? lane[l] : m;
        if (m == -INFINITY) m = 0.0f; /* every score -inf: e^(-inf) = 0, a 0 / 0 row like the composition's */
    }
    EM_CPU_VLOOP(n, s[i] -= m;)
    return m;
}

static float row_sum(const float *p, int64_t n) {
    float lane[8] = {0};
    int64_t c = 0;
    for (; c + 8 <= n; c += 8)
        for (int l = 0; l < 8; l++) lane[l] += p[c + l];
    for (; c < n; c++) lane[0] += p[c];
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

static void sdpa_fwd_heads(void *arg, int64_t t0, int64_t t1) {
    sdpa_job *j = arg;
    int64_t S = j->S;
    /* the scores block, k^T; beta is 0 here, so the no-BLAS GEMM needs no product buffer */
    float *buf = malloc(sizeof(float) * (size_t)S * (size_t)(SDPA_ROWS + j->E)), *kt = buf + SDPA_ROWS * S, *tmp = NULL;
    if (!buf) {
        atomic_store(&j->oom, true);
        return;
    }
    for (int64_t t = t0; t < t1; t++) {
        int64_t b = t / j->H, h = t % j->H;
        float *lse = j->lse + t * j->L;
        transpose(at(&j->k, b, h, 0), S, j->E, j->k.sr, kt);
        for (int64_t i0 = 0; i0 < j->L; i0 += SDPA_ROWS) {
            int64_t rows = j->L - i0 < SDPA_ROWS ? j->L - i0 : SDPA_ROWS, sc = block_keys(j, i0 + rows);
            scores(j, b, h, i0, rows, sc, kt, buf, tmp);
            float m[SDPA_ROWS];
            for (int64_t r = 0; r < rows; r++) m[r] = shift_row(buf + r * sc, visible(j, i0 + r, sc), sc, NULL);
            em__cpu_vexp_f32(buf, buf, rows * sc); /* the whole block at once; the future gives 0 */
            for (int64_t r = 0; r < rows; r++) {
                float *pr = buf + r * sc, sum = row_sum(pr, sc), inv = 1.0f / sum;
                EM_CPU_VLOOP(sc, pr[i] *= inv;)
                lse[i0 + r] = m[r] + logf(sum);
            }
            gemm(false, false, rows, j->Ev, sc, 1.0f, buf, sc, at(&j->v, b, h, 0), j->v.sr, 0.0f,
                 at(&j->out, b, h, i0), j->out.sr, tmp);
        }
    }
    free(buf);
}

static void sdpa_bwd_heads(void *arg, int64_t t0, int64_t t1) {
    sdpa_job *j = arg;
    int64_t S = j->S, L = j->L, E = j->E, Ev = j->Ev, wide = E > Ev ? E : Ev;
    size_t blk = (size_t)SDPA_ROWS * (size_t)S;
    /* P and dS blocks, k^T, v^T, the rows' rowsum(g out), and the no-BLAS GEMM's product */
    float *buf = malloc(sizeof(float) * (2 * blk + (size_t)S * (size_t)(E + Ev) + (size_t)L + (size_t)S * (size_t)wide));
    if (!buf) {
        atomic_store(&j->oom, true);
        return;
    }
    float *p = buf, *ds = p + blk, *kt = ds + blk, *vt = kt + S * E, *dsum = vt + S * Ev, *tmp = dsum + L;
    for (int64_t t = t0; t < t1; t++) {
        int64_t b = t / j->H, h = t % j->H;
        const float *lse = j->lse + t * L;
        transpose(at(&j->k, b, h, 0), S, E, j->k.sr, kt);
        transpose(at(&j->v, b, h, 0), S, Ev, j->v.sr, vt);
        for (int64_t i = 0; i < L; i++) {
            const float *gi = at(&j->g, b, h, i), *oi = at(&j->out, b, h, i);
            float lane[8] = {0};
            int64_t e = 0;
            for (; e + 8 <= Ev; e += 8)
                for (int l = 0; l < 8; l++) lane[l] += gi[e + l] * oi[e + l];
            for (; e < Ev; e++) lane[0] += gi[e] * oi[e];
            dsum[i] = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
        }
        /* dk and dv sum over the row blocks, the last first: it sees every key any block
         * sees, so its products write them (beta 0) and the others add; keys no query sees
         * (causal, L < S) get zeros */
        for (int64_t s = block_keys(j, L); s < S; s++) {
            memset(at(&j->dk, b, h, s), 0, sizeof(float) * (size_t)E);
            memset(at(&j->dv, b, h, s), 0, sizeof(float) * (size_t)Ev);
        }
        int64_t nblk = (L + SDPA_ROWS - 1) / SDPA_ROWS;
        for (int64_t bi = nblk - 1; bi >= 0; bi--) {
            int64_t i0 = bi * SDPA_ROWS, rows = L - i0 < SDPA_ROWS ? L - i0 : SDPA_ROWS, sc = block_keys(j, i0 + rows);
            float beta = bi == nblk - 1 ? 0.0f : 1.0f;
            scores(j, b, h, i0, rows, sc, kt, p, tmp);
            for (int64_t r = 0; r < rows; r++) shift_row(p + r * sc, visible(j, i0 + r, sc), sc, &lse[i0 + r]);
            em__cpu_vexp_f32(p, p, rows * sc); /* P = e^(s - lse) where visible, else 0 */
            const float *gb = at(&j->g, b, h, i0);
            gemm(true, false, sc, Ev, rows, 1.0f, p, sc, gb, j->g.sr, beta, at(&j->dv, b, h, 0), j->dv.sr, tmp);
            gemm(false, false, rows, sc, Ev, 1.0f, gb, j->g.sr, vt, S, 0.0f, ds, sc, tmp);
            for (int64_t r = 0; r < rows; r++) { /* dS = P (dP - rowsum(g out)), times the scale */
                float *restrict dr = ds + r * sc;
                const float *restrict pr = p + r * sc;
                float dd = dsum[i0 + r], sl = j->scale;
                EM_CPU_VLOOP(sc, dr[i] = pr[i] * (dr[i] - dd) * sl;)
            }
            gemm(false, false, rows, E, sc, 1.0f, ds, sc, at(&j->k, b, h, 0), j->k.sr, 0.0f, at(&j->dq, b, h, i0),
                 j->dq.sr, tmp);
            gemm(true, false, sc, E, rows, 1.0f, ds, sc, at(&j->q, b, h, i0), j->q.sr, beta, at(&j->dk, b, h, 0),
                 j->dk.sr, tmp);
        }
    }
    free(buf);
}

static em_status sdpa_check(const char *op, const em_tensor *const *ts, int n) {
    for (int i = 0; i < n; i++)
        if (ts[i]->dtype != EM_F32 || ts[i]->ndim != 4 || (ts[i]->shape[3] > 1 && ts[i]->strides[3] != 1))
            return em_error(EM_ERR_INTERNAL, "cpu: %s expects f32 [B, H, rows, cols] operands with unit last stride", op);
    return EM_OK;
}

static void job_shape(sdpa_job *j, const em_tensor *q, const em_tensor *k, const em_tensor *v, em_tensor *lse,
                      double scale, bool causal) {
    j->q = operand_of(q);
    j->k = operand_of(k);
    j->v = operand_of(v);
    j->lse = em__host_ptr(lse);
    j->H = q->shape[1];
    j->L = q->shape[2];
    j->S = k->shape[2];
    j->E = q->shape[3];
    j->Ev = v->shape[3];
    j->scale = (float)scale;
    j->causal = causal;
    atomic_init(&j->oom, false);
}

/* Heads per task: a head's work is L x S x (E + Ev) multiply-adds (twice that backward). */
static int64_t heads_grain(const sdpa_job *j) {
    int64_t macs = j->L * j->S * (j->E + j->Ev);
    return macs >= 262144 ? 1 : 262144 / (macs > 0 ? macs : 1) + 1;
}

em_status em__cpu_sdpa(em_tensor *out, em_tensor *lse, const em_tensor *q, const em_tensor *k, const em_tensor *v,
                       double scale, bool causal) {
    const em_tensor *ts[4] = {out, q, k, v};
    if (sdpa_check("sdpa", ts, 4)) return em_last_status();
    em__cpu_blas_init();
    sdpa_job j;
    job_shape(&j, q, k, v, lse, scale, causal);
    j.out = operand_of(out);
    em__cpu_parallel_for(q->shape[0] * j.H, heads_grain(&j), sdpa_fwd_heads, &j);
    if (atomic_load(&j.oom))
        return em_error(EM_ERR_OUT_OF_MEMORY, "scaled_dot_product_attention: out of host memory for a block of scores");
    return EM_OK;
}

em_status em__cpu_sdpa_backward(em_tensor *dq, em_tensor *dk, em_tensor *dv, const em_tensor *g, const em_tensor *q,
                                const em_tensor *k, const em_tensor *v, const em_tensor *out, const em_tensor *lse,
                                double scale, bool causal) {
    const em_tensor *ts[8] = {dq, dk, dv, g, q, k, v, out};
    if (sdpa_check("sdpa_backward", ts, 8)) return em_last_status();
    em__cpu_blas_init();
    sdpa_job j;
    job_shape(&j, q, k, v, (em_tensor *)lse, scale, causal);
    j.out = operand_of(out);
    j.g = operand_of(g);
    j.dq = operand_of(dq);
    j.dk = operand_of(dk);
    j.dv = operand_of(dv);
    em__cpu_parallel_for(q->shape[0] * j.H, heads_grain(&j), sdpa_bwd_heads, &j);
    if (atomic_load(&j.oom))
        return em_error(EM_ERR_OUT_OF_MEMORY, "scaled_dot_product_attention backward: out of host memory for a block "
                        "of scores");
    return EM_OK;
}
