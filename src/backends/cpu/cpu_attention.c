/* Fused scaled-dot-product attention on the CPU: the forward in f32, bf16 and f16 (float32
 * accumulation), the backward in the same three (float32 products, 16-bit operands converted
 * per task), with grouped-query heads, a causal offset and a key
 * padding mask (op_list.h's SDPA and SDPA_BACKWARD).
 *
 * The composed attention (matmul, mask, softmax, matmul: src/nn/attention.c and core's
 * em_attention elsewhere) writes the [L, S] scores, the masked scores and the softmax to memory
 * for every head and reads them back in backward; here a block of query rows' scores lives in
 * a per-task buffer while it is used, a causal block stops at its last row's key, and the
 * operands are read with their own strides. Backward recomputes the probabilities from q, k
 * and each row's log-sum-exp (as FlashAttention does) instead of keeping [L, S] per head.
 *   forward   P = softmax(scale q k^T over the visible keys), out = P v,
 *             lse_i = log sum_j e^(s_ij)
 *   backward  dv = P^T g, dP = g v^T, dS = P (dP - rowsum(g out)), dq = scale dS k,
 *             dk = scale dS^T q
 * Grouped-query attention: query head h reads key/value head h / G (G = Hq / Hkv). The
 * forward runs one task per (batch, key/value head, part) over all G * L query rows of the
 * group, so a key block is converted (and, for many rows, transposed) once for the G heads that
 * share it: a decoding step (L = 1) then multiplies the group's G query rows at once. Where those tasks
 * are fewer than the threads and the rows few (decoding), the keys are split into parts
 * whose partial softmax sums are merged afterwards (flash-decoding); long row sets
 * (prefill) split over rows instead. Backward runs one task per (batch, key/value head):
 * dk and dv sum over the group's heads without two threads writing one row. */
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

#define SDPA_ROWS 16     /* query rows per block: the scores block is SDPA_ROWS x S floats */
#define SPLIT_MIN_KEYS 256 /* a key part of a split decoding task holds at least this many */

/* C (m x n, ldc) = alpha A B + beta C, A (m x k) stored row-major with lda or, when ta,
 * its transpose; B (k x n) likewise. beta is 0 or 1. tmp: m x n floats where beta is 1, for
 * the build without BLAS, whose GEMM has neither alpha nor beta. */
static void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                 const float *b, int64_t ldb, float beta, float *c, int64_t ldc, float *tmp) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) { /* an empty sum: C = beta C */
        for (int64_t r = 0; r < m && beta == 0.0f; r++) memset(c + r * ldc, 0, sizeof(float) * (size_t)n);
        return;
    }
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
    char *p;
    int64_t sb, sh, sr; /* elements */
    em_dtype dt;
} operand;

static operand operand_of(const em_tensor *t) {
    return (operand){(char *)em__host_ptr(t), t->strides[0], t->strides[1], t->strides[2], t->dtype};
}
static inline char *at(const operand *o, int64_t b, int64_t h, int64_t r) {
    return o->p + (b * o->sb + h * o->sh + r * o->sr) * (int64_t)em__cpu_esize(o->dt);
}
static inline float *atf(const operand *o, int64_t b, int64_t h, int64_t r) { return (float *)at(o, b, h, r); }

/* n rows of cols elements from (b, h, r0) as float32 into buf (row stride cols) */
static void load_rows(float *buf, const operand *o, int64_t b, int64_t h, int64_t r0, int64_t n, int64_t cols) {
    if (o->sr == cols) { /* one run: one cast (a cache's rows are) */
        if (o->dt == EM_F32) memcpy(buf, at(o, b, h, r0), sizeof(float) * (size_t)(n * cols));
        else em__cpu_load_block(buf, at(o, b, h, r0), (int64_t)em__cpu_esize(o->dt), n * cols, o->dt);
        return;
    }
    for (int64_t r = 0; r < n; r++) em__cpu_load_block(buf + r * cols, at(o, b, h, r0 + r), (int64_t)em__cpu_esize(o->dt), cols, o->dt);
}

typedef struct sdpa_job {
    operand q, k, v, out, g, dq, dk, dv;
    float *lse;              /* contiguous [B, Hq, L], or NULL (not wanted) */
    const uint8_t *mask;     /* contiguous bool [B, S], or NULL */
    int64_t B, Hq, Hkv, G, L, S, E, Ev, past;
    float scale;
    bool causal;
    /* forward partition: each (b, kvh) has `parts` tasks, over rows (rows_per_part rows
     * each) or, when split_keys, over keys (keys_per_part each); partials of split keys:
     * [task][row] {m, l} and [task][row][Ev] */
    int64_t parts, rows_per_part, keys_per_part;
    bool split_keys;
    float *part_ml, *part_acc;
    atomic_bool oom;
} sdpa_job;

/* Keys [0, n) of a row at query i are visible (causal: j <= past + i), clipped to [0, S). */
static inline int64_t visible_end(const sdpa_job *j, int64_t i) {
    if (!j->causal) return j->S;
    int64_t e = j->past + i + 1;
    return e < j->S ? e : j->S;
}

/* x (n rows of e floats, row stride sr) transposed into xt (e rows of n, row stride n): BLAS
 * multiplies by a transposed right operand at under half the speed at these sizes (measured:
 * 67 against 155 GFLOP/s for 16 x 64 x 32 with OpenBLAS), so k and v are transposed once per
 * task instead. */
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

static float row_max(const float *s, int64_t n) {
    float lane[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int64_t c = 0;
    for (; c + 8 <= n; c += 8)
        for (int l = 0; l < 8; l++) lane[l] = s[c + l] > lane[l] ? s[c + l] : lane[l];
    for (; c < n; c++) lane[0] = s[c] > lane[0] ? s[c] : lane[0];
    float m = lane[0];
    for (int l = 1; l < 8; l++) m = lane[l] > m ? lane[l] : m;
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

/* A row of sc scores for keys [s0, s0 + sc): those a query at i cannot see (past its causal
 * end, or masked) become -inf, the others minus their maximum, which is returned (-inf when
 * none is visible). A NaN score makes the row's sum, so its output, NaN. */
static float mask_and_shift(const sdpa_job *j, float *s, int64_t b, int64_t i, int64_t s0, int64_t sc) {
    int64_t n = visible_end(j, i) - s0;
    if (n < 0) n = 0;
    if (n > sc) n = sc;
    for (int64_t c = n; c < sc; c++) s[c] = -INFINITY;
    if (j->mask) {
        const uint8_t *mk = j->mask + b * j->S + s0;
        for (int64_t c = 0; c < n; c++)
            if (!mk[c]) s[c] = -INFINITY;
    }
    float m = row_max(s, n);
    float sub = m == -INFINITY ? 0.0f : m; /* nothing visible: e^(-inf) = 0 everywhere */
    EM_CPU_VLOOP(n, s[i] -= sub;)
    return m;
}

/* out row (b, h, i) and lse from an unnormalized accumulator: acc / l, lse = m + log l; a
 * row that saw no key gives zeros and lse -inf */
static void finish_row(const sdpa_job *j, int64_t b, int64_t h, int64_t i, float *acc, float m, float l) {
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    EM_CPU_VLOOP(j->Ev, acc[i] *= inv;)
    char *o = at(&j->out, b, h, i);
    if (j->out.dt == EM_F32) memcpy(o, acc, sizeof(float) * (size_t)j->Ev);
    else em__cpu_store_block(o, (int64_t)em__cpu_esize(j->out.dt), j->Ev, j->out.dt, acc);
    if (j->lse) j->lse[(b * j->Hq + h) * j->L + i] = l > 0.0f ? m + logf(l) : -INFINITY;
}

#define FEW_ROWS (2 * SDPA_ROWS) /* at most this many rows per task: keys by blocks, untransposed */
#define KEY_BLOCK 256           /* keys per block of the few-rows path (16-bit ones converted) */

/* The task's rows of (b, kvh) against keys [s0, kend) for a few rows (decoding): all rows'
 * scores at once (rows x keys), each key block of k converted once where 16-bit and
 * multiplied untransposed, then P v block by block into the accumulators. No pass over k or
 * v but the one that reads them. */
static void fwd_few(sdpa_job *j, int64_t t, int64_t b, int64_t kvh, int64_t r0, int64_t r1, int64_t s0, int64_t kend,
                    float *sb, float *kf, float *vf, float *qb, float *ob, float *tmp) {
    int64_t E = j->E, Ev = j->Ev, R = j->G * j->L, rows = r1 - r0, nk = kend > s0 ? kend - s0 : 0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t row = r0 + r;
        load_rows(qb + r * E, &j->q, b, kvh * j->G + row / j->L, row % j->L, 1, E);
    }
    for (int64_t k0 = 0; k0 < nk; k0 += KEY_BLOCK) {
        int64_t nb = nk - k0 < KEY_BLOCK ? nk - k0 : KEY_BLOCK;
        const float *kr = kf;
        int64_t ksr = E;
        if (j->k.dt == EM_F32) {
            kr = atf(&j->k, b, kvh, s0 + k0);
            ksr = j->k.sr;
        } else {
            load_rows(kf, &j->k, b, kvh, s0 + k0, nb, E);
        }
        gemm(false, true, rows, nb, E, j->scale, qb, E, kr, ksr, 0.0f, sb + k0, nk, tmp);
    }
    float m[FEW_ROWS], l[FEW_ROWS];
    for (int64_t r = 0; r < rows; r++) {
        float *pr = sb + r * nk;
        m[r] = mask_and_shift(j, pr, b, (r0 + r) % j->L, s0, nk);
        em__cpu_vexp_f32(pr, pr, nk);
        l[r] = row_sum(pr, nk);
    }
    for (int64_t k0 = 0; k0 < nk || k0 == 0; k0 += KEY_BLOCK) {
        int64_t nb = nk - k0 < KEY_BLOCK ? nk - k0 : KEY_BLOCK;
        const float *vr = vf;
        int64_t vsr = Ev;
        if (nb > 0 && j->v.dt == EM_F32) {
            vr = atf(&j->v, b, kvh, s0 + k0);
            vsr = j->v.sr;
        } else if (nb > 0) {
            load_rows(vf, &j->v, b, kvh, s0 + k0, nb, Ev);
        }
        gemm(false, false, rows, Ev, nb, 1.0f, sb + k0, nk, vr, vsr, k0 == 0 ? 0.0f : 1.0f, ob, Ev, tmp);
        if (nk == 0) break;
    }
    for (int64_t r = 0; r < rows; r++) {
        int64_t row = r0 + r;
        float *acc = ob + r * Ev;
        if (!j->split_keys) {
            finish_row(j, b, kvh * j->G + row / j->L, row % j->L, acc, m[r], l[r]);
        } else {
            float *ml = j->part_ml + (t * R + row) * 2;
            ml[0] = m[r];
            ml[1] = l[r];
            memcpy(j->part_acc + (t * R + row) * Ev, acc, sizeof(float) * (size_t)Ev);
        }
    }
}

static void sdpa_fwd_tasks(void *arg, int64_t t0, int64_t t1) {
    sdpa_job *j = arg;
    int64_t S = j->S, E = j->E, Ev = j->Ev, R = j->G * j->L;
    int64_t maxk = j->split_keys ? j->keys_per_part : S;
    bool few = (j->split_keys ? R : j->rows_per_part) <= FEW_ROWS;
    /* many rows: k^T, v (16-bit: as float32), the scores block, the block's q rows and output
     * rows (beta is 0 throughout, so the no-BLAS GEMM needs no product buffer); a few: all
     * rows' scores, a key block of k and of v, the rows' q and accumulators, a GEMM product */
    size_t kt_n = (size_t)E * (size_t)maxk, v_n = j->v.dt == EM_F32 ? 0 : (size_t)maxk * (size_t)Ev;
    size_t k_n = j->k.dt == EM_F32 ? 0 : (size_t)maxk * (size_t)E;
    size_t total = kt_n + v_n + k_n + (size_t)SDPA_ROWS * ((size_t)maxk + (size_t)E + (size_t)Ev);
    if (few) total = (size_t)FEW_ROWS * ((size_t)maxk + (size_t)E + 2 * (size_t)Ev) + (size_t)KEY_BLOCK * (size_t)(E + Ev);
    float *buf = malloc(sizeof(float) * total);
    if (!buf) {
        atomic_store(&j->oom, true);
        return;
    }
    float *kt = buf, *vf = kt + kt_n, *kf = vf + v_n, *sb = kf + k_n, *qb = sb + (size_t)SDPA_ROWS * maxk,
          *ob = qb + (size_t)SDPA_ROWS * E;
    for (int64_t t = t0; t < t1; t++) {
        int64_t bk = t / j->parts, part = t % j->parts, b = bk / j->Hkv, kvh = bk % j->Hkv;
        int64_t r0 = 0, r1 = R, s0 = 0, s1 = S;
        if (j->split_keys) {
            s0 = part * j->keys_per_part;
            s1 = s0 + j->keys_per_part < S ? s0 + j->keys_per_part : S;
        } else {
            r0 = part * j->rows_per_part;
            r1 = r0 + j->rows_per_part < R ? r0 + j->rows_per_part : R;
        }
        if (r0 >= r1) continue;
        /* the keys any row of the task sees: up to the last query's causal end */
        int64_t last_i = r1 - r0 >= j->L ? j->L - 1 : 0;
        for (int64_t r = r0; r < r1 && last_i < j->L - 1; r++) last_i = r % j->L > last_i ? r % j->L : last_i;
        int64_t kend = visible_end(j, last_i) < s1 ? visible_end(j, last_i) : s1, nk = kend > s0 ? kend - s0 : 0;
        if (few) {
            float *sbf = buf, *qbf = sbf + (size_t)FEW_ROWS * maxk, *obf = qbf + (size_t)FEW_ROWS * E,
                  *tmp = obf + (size_t)FEW_ROWS * Ev, *kbf = tmp + (size_t)FEW_ROWS * Ev, *vbf = kbf + (size_t)KEY_BLOCK * E;
            fwd_few(j, t, b, kvh, r0, r1, s0, kend, sbf, kbf, vbf, qbf, obf, tmp);
            continue;
        }
        /* many rows: k transposed once (BLAS multiplies by a transposed right operand slowly) */
        bool many = r1 - r0 > 2 * SDPA_ROWS;
        const float *krows = NULL;
        int64_t ksr = E;
        if (nk > 0) {
            if (j->k.dt == EM_F32) {
                krows = atf(&j->k, b, kvh, s0);
                ksr = j->k.sr;
            } else {
                load_rows(kf, &j->k, b, kvh, s0, nk, E);
                krows = kf;
            }
            if (many) transpose(krows, nk, E, ksr, kt);
        }
        const float *vrows = NULL;
        int64_t vsr = Ev;
        if (nk > 0 && j->v.dt == EM_F32) {
            vrows = atf(&j->v, b, kvh, s0);
            vsr = j->v.sr;
        } else if (nk > 0) {
            load_rows(vf, &j->v, b, kvh, s0, nk, Ev);
            vrows = vf;
        }
        for (int64_t rb = r0; rb < r1; rb += SDPA_ROWS) {
            int64_t rows = r1 - rb < SDPA_ROWS ? r1 - rb : SDPA_ROWS, bi = -1;
            for (int64_t r = 0; r < rows; r++) {
                int64_t row = rb + r, h = kvh * j->G + row / j->L, i = row % j->L;
                load_rows(qb + r * E, &j->q, b, h, i, 1, E);
                bi = i > bi ? i : bi;
            }
            /* the block's keys: up to its last query's causal end */
            int64_t bend = visible_end(j, bi) < kend ? visible_end(j, bi) : kend, sc = bend > s0 ? bend - s0 : 0;
            float m[SDPA_ROWS], l[SDPA_ROWS];
            if (sc > 0 && many) gemm(false, false, rows, sc, E, j->scale, qb, E, kt, nk, 0.0f, sb, sc, NULL);
            else if (sc > 0) gemm(false, true, rows, sc, E, j->scale, qb, E, krows, ksr, 0.0f, sb, sc, NULL);
            for (int64_t r = 0; r < rows; r++) {
                int64_t row = rb + r, i = row % j->L;
                float *pr = sb + r * sc;
                m[r] = mask_and_shift(j, pr, b, i, s0, sc);
            }
            em__cpu_vexp_f32(sb, sb, rows * sc); /* the whole block at once; hidden keys give 0 */
            for (int64_t r = 0; r < rows; r++) l[r] = row_sum(sb + r * sc, sc);
            gemm(false, false, rows, Ev, sc, 1.0f, sb, sc, vrows, vsr, 0.0f, ob, Ev, NULL);
            for (int64_t r = 0; r < rows; r++) {
                int64_t row = rb + r, h = kvh * j->G + row / j->L, i = row % j->L;
                float *acc = ob + r * Ev;
                if (!j->split_keys) {
                    finish_row(j, b, h, i, acc, m[r], l[r]);
                } else {
                    float *ml = j->part_ml + (t * R + row) * 2;
                    ml[0] = m[r];
                    ml[1] = l[r];
                    memcpy(j->part_acc + (t * R + row) * Ev, acc, sizeof(float) * (size_t)Ev);
                }
            }
        }
    }
    free(buf);
}

/* Split keys: each row's parts merged, e^(m_p - M) weighting part p's sums (M their max). */
static void sdpa_merge(void *arg, int64_t t0, int64_t t1) {
    sdpa_job *j = arg;
    int64_t R = j->G * j->L, Ev = j->Ev;
    float *acc = malloc(sizeof(float) * (size_t)Ev);
    if (!acc) {
        atomic_store(&j->oom, true);
        return;
    }
    for (int64_t bk = t0; bk < t1; bk++) {
        int64_t b = bk / j->Hkv, kvh = bk % j->Hkv;
        for (int64_t row = 0; row < R; row++) {
            float M = -INFINITY, l = 0.0f;
            for (int64_t p = 0; p < j->parts; p++) {
                float mp = j->part_ml[((bk * j->parts + p) * R + row) * 2];
                M = mp > M ? mp : M;
            }
            memset(acc, 0, sizeof(float) * (size_t)Ev);
            for (int64_t p = 0; p < j->parts && M != -INFINITY; p++) {
                int64_t t = bk * j->parts + p;
                const float *ml = j->part_ml + (t * R + row) * 2, *pa = j->part_acc + (t * R + row) * Ev;
                if (ml[0] == -INFINITY) continue; /* a part this row saw nothing of */
                float wgt = expf(ml[0] - M);
                l += wgt * ml[1];
                EM_CPU_VLOOP(Ev, acc[i] += wgt * pa[i];)
            }
            finish_row(j, b, kvh * j->G + row / j->L, row % j->L, acc, M, l);
        }
    }
    free(acc);
}

/* A [B, H, rows, cols] operand's rows as the backward reads them: float32 ones in place,
 * 16-bit ones converted into a task's buffer first (row stride cols) */
typedef struct rows_f32 {
    const float *p;
    int64_t sr;
} rows_f32;

static rows_f32 rows_as_f32(const operand *o, int64_t b, int64_t h, int64_t n, int64_t cols, float *buf) {
    if (o->dt == EM_F32) return (rows_f32){atf(o, b, h, 0), o->sr};
    load_rows(buf, o, b, h, 0, n, cols);
    return (rows_f32){buf, cols};
}

/* n rows of cols float32 (row stride cols) into (b, h, 0..n) of a 16-bit operand */
static void store_rows(const operand *o, int64_t b, int64_t h, int64_t r0, int64_t n, int64_t cols, const float *buf) {
    for (int64_t r = 0; r < n; r++)
        em__cpu_store_block(at(o, b, h, r0 + r), (int64_t)em__cpu_esize(o->dt), cols, o->dt, buf + r * cols);
}

/* One task per (batch, key/value head). 16-bit operands are converted to float32 once per
 * task (k, v) or per head (q, g), the products are the float32 ones, dq is rounded block by
 * block and dk, dv, summed over the group's heads in float32, are rounded once at the end:
 * PyTorch's flash backward on the CPU accumulates the same way. */
static void sdpa_bwd_heads(void *arg, int64_t t0, int64_t t1) {
    sdpa_job *j = arg;
    int64_t S = j->S, L = j->L, E = j->E, Ev = j->Ev, wide = E > Ev ? E : Ev;
    bool low = j->q.dt != EM_F32;
    size_t blk = (size_t)SDPA_ROWS * (size_t)S;
    /* P and dS blocks, k^T, v^T, the rows' rowsum(g out), and the no-BLAS GEMM's product;
     * 16-bit: k, v, one head's q and g, a block's dq, dk and dv sums and an out row as float32 */
    size_t n = 2 * blk + (size_t)S * (size_t)(E + Ev) + (size_t)L + (size_t)S * (size_t)wide;
    size_t n_low = low ? (size_t)S * (size_t)(E + Ev) * 2 + (size_t)L * (size_t)(E + Ev) + (size_t)SDPA_ROWS * (size_t)E +
                             (size_t)Ev
                       : 0;
    float *buf = malloc(sizeof(float) * (n + n_low));
    if (!buf) {
        atomic_store(&j->oom, true);
        return;
    }
    float *p = buf, *ds = p + blk, *kt = ds + blk, *vt = kt + S * E, *dsum = vt + S * Ev, *tmp = dsum + L;
    float *kf = buf + n, *vf = kf + S * E, *qf = vf + S * Ev, *gf = qf + L * E, *dqf = gf + L * Ev,
          *dkf = dqf + SDPA_ROWS * E, *dvf = dkf + S * E, *of = dvf + S * Ev;
    int64_t nblk = (L + SDPA_ROWS - 1) / SDPA_ROWS, seen = visible_end(j, L - 1);
    for (int64_t t = t0; t < t1; t++) {
        int64_t b = t / j->Hkv, kvh = t % j->Hkv;
        rows_f32 kr = rows_as_f32(&j->k, b, kvh, S, E, kf), vr = rows_as_f32(&j->v, b, kvh, S, Ev, vf);
        transpose(kr.p, S, E, kr.sr, kt);
        transpose(vr.p, S, Ev, vr.sr, vt);
        /* dk and dv: the operand's rows, or (16-bit) the float32 sums stored at the end */
        float *dkp = low ? dkf : atf(&j->dk, b, kvh, 0), *dvp = low ? dvf : atf(&j->dv, b, kvh, 0);
        int64_t dksr = low ? E : j->dk.sr, dvsr = low ? Ev : j->dv.sr;
        /* keys no query sees (causal, past + L < S) get zeros */
        for (int64_t s = seen; s < S; s++) {
            memset(dkp + s * dksr, 0, sizeof(float) * (size_t)E);
            memset(dvp + s * dvsr, 0, sizeof(float) * (size_t)Ev);
        }
        for (int64_t gi = 0; gi < j->G; gi++) {
            int64_t h = kvh * j->G + gi;
            const float *lse = j->lse + (b * j->Hq + h) * L;
            rows_f32 qr = rows_as_f32(&j->q, b, h, L, E, qf), gr = rows_as_f32(&j->g, b, h, L, Ev, gf);
            for (int64_t i = 0; i < L; i++) {
                const float *grow = gr.p + i * gr.sr, *orow = of;
                if (low) load_rows(of, &j->out, b, h, i, 1, Ev);
                else orow = atf(&j->out, b, h, i);
                float lane[8] = {0};
                int64_t e = 0;
                for (; e + 8 <= Ev; e += 8)
                    for (int l = 0; l < 8; l++) lane[l] += grow[e + l] * orow[e + l];
                for (; e < Ev; e++) lane[0] += grow[e] * orow[e];
                dsum[i] = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
            }
            /* dk and dv sum over the row blocks and the group's heads: the first head's last
             * block sees every key any block sees, so its products write them (beta 0) and
             * the others add */
            for (int64_t bi = nblk - 1; bi >= 0; bi--) {
                int64_t i0 = bi * SDPA_ROWS, rows = L - i0 < SDPA_ROWS ? L - i0 : SDPA_ROWS;
                int64_t sc = visible_end(j, i0 + rows - 1);
                float beta = gi == 0 && bi == nblk - 1 ? 0.0f : 1.0f;
                if (sc <= 0) continue;
                const float *qb = qr.p + i0 * qr.sr, *gb = gr.p + i0 * gr.sr;
                gemm(false, false, rows, sc, E, j->scale, qb, qr.sr, kt, S, 0.0f, p, sc, tmp);
                for (int64_t r = 0; r < rows; r++) {
                    float *pr = p + r * sc;
                    int64_t nv = visible_end(j, i0 + r);
                    float by = lse[i0 + r];
                    for (int64_t c = nv; c < sc; c++) pr[c] = -INFINITY;
                    if (by == -INFINITY) { /* a row that saw nothing: P = 0 */
                        for (int64_t c = 0; c < nv; c++) pr[c] = -INFINITY;
                        continue;
                    }
                    EM_CPU_VLOOP(nv, pr[i] -= by;)
                }
                em__cpu_vexp_f32(p, p, rows * sc); /* P = e^(s - lse) where visible, else 0 */
                gemm(true, false, sc, Ev, rows, 1.0f, p, sc, gb, gr.sr, beta, dvp, dvsr, tmp);
                gemm(false, false, rows, sc, Ev, 1.0f, gb, gr.sr, vt, S, 0.0f, ds, sc, tmp);
                for (int64_t r = 0; r < rows; r++) { /* dS = P (dP - rowsum(g out)), times the scale */
                    float *restrict dr = ds + r * sc;
                    const float *restrict pr = p + r * sc;
                    float dd = dsum[i0 + r], sl = j->scale;
                    EM_CPU_VLOOP(sc, dr[i] = pr[i] * (dr[i] - dd) * sl;)
                }
                if (low) {
                    gemm(false, false, rows, E, sc, 1.0f, ds, sc, kr.p, kr.sr, 0.0f, dqf, E, tmp);
                    store_rows(&j->dq, b, h, i0, rows, E, dqf);
                } else {
                    gemm(false, false, rows, E, sc, 1.0f, ds, sc, kr.p, kr.sr, 0.0f, atf(&j->dq, b, h, i0), j->dq.sr, tmp);
                }
                gemm(true, false, sc, E, rows, 1.0f, ds, sc, qb, qr.sr, beta, dkp, dksr, tmp);
            }
        }
        if (low) {
            store_rows(&j->dk, b, kvh, 0, S, E, dkf);
            store_rows(&j->dv, b, kvh, 0, S, Ev, dvf);
        }
    }
    free(buf);
}

static em_status sdpa_check(const char *op, const em_tensor *const *ts, int n, em_dtype dt) {
    for (int i = 0; i < n; i++)
        if (ts[i]->dtype != dt || ts[i]->ndim != 4 || (ts[i]->shape[3] > 1 && ts[i]->strides[3] != 1))
            return em_error(EM_ERR_INTERNAL, "cpu: %s expects %s [B, H, rows, cols] operands with unit last stride",
                            op, em_dtype_name(dt));
    const em_tensor *q = ts[n - 3], *k = ts[n - 2];
    if (k->shape[1] <= 0 || q->shape[1] % k->shape[1])
        return em_error(EM_ERR_INTERNAL, "cpu: %s expects query heads a multiple of key heads", op);
    return EM_OK;
}

static void job_shape(sdpa_job *j, const em_op_call *c, const em_tensor *q, const em_tensor *k, const em_tensor *v) {
    memset(j, 0, sizeof *j);
    j->q = operand_of(q);
    j->k = operand_of(k);
    j->v = operand_of(v);
    j->B = q->shape[0];
    j->Hq = q->shape[1];
    j->Hkv = k->shape[1];
    j->G = j->Hq / j->Hkv;
    j->L = q->shape[2];
    j->S = k->shape[2];
    j->E = q->shape[3];
    j->Ev = v->shape[3];
    j->scale = (float)c->f[0];
    j->causal = c->i[0] != 0;
    j->past = c->i[1];
    atomic_init(&j->oom, false);
}

em_status em__cpu_sdpa(const em_op_call *c) {
    em_tensor *out = c->dst[0], *lse = c->dst[1];
    const em_tensor *q = c->src[0], *k = c->src[1], *v = c->src[2], *mask = c->src[3];
    const em_tensor *ts[4] = {out, q, k, v};
    if (sdpa_check("sdpa", ts, 4, c->dtype)) return em_last_status();
    if (mask && (mask->dtype != EM_BOOL || !em__cpu_is_contiguous(mask) || em__cpu_numel(mask) != q->shape[0] * k->shape[2]))
        return em_error(EM_ERR_INTERNAL, "cpu: sdpa expects a contiguous bool key mask [B, S]");
    em__cpu_blas_init();
    sdpa_job j;
    job_shape(&j, c, q, k, v);
    j.out = operand_of(out);
    j.lse = lse ? em__host_ptr(lse) : NULL;
    j.mask = mask ? em__host_ptr(mask) : NULL;
    int64_t groups = j.B * j.Hkv, R = j.G * j.L, threads = em__cpu_num_threads();
    /* fewer groups than threads: decoding's few rows split their keys, longer row sets their
     * rows (whole blocks) */
    j.parts = 1;
    j.rows_per_part = R;
    if (groups < threads && R <= 4 * SDPA_ROWS) {
        int64_t parts = (threads + groups - 1) / groups, most = j.S / SPLIT_MIN_KEYS;
        if (parts > most) parts = most;
        if (parts > 1) {
            j.split_keys = true;
            j.parts = parts;
            j.keys_per_part = (j.S + parts - 1) / parts;
        }
    } else if (groups < 4 * threads && R > 4 * SDPA_ROWS) {
        int64_t parts = (4 * threads + groups - 1) / groups, blocks = (R + SDPA_ROWS - 1) / SDPA_ROWS;
        if (parts > blocks) parts = blocks;
        j.parts = parts;
        j.rows_per_part = (blocks + parts - 1) / parts * SDPA_ROWS;
    }
    if (j.split_keys) {
        size_t n = (size_t)(groups * j.parts * R);
        j.part_ml = malloc(sizeof(float) * n * 2);
        j.part_acc = j.part_ml ? malloc(sizeof(float) * n * (size_t)j.Ev) : NULL;
        if (!j.part_acc) {
            free(j.part_ml);
            return em_error(EM_ERR_OUT_OF_MEMORY, "scaled_dot_product_attention: out of host memory for partial sums");
        }
    }
    /* a task's work is its rows x keys x (E + Ev) multiply-adds */
    int64_t macs = (j.split_keys ? j.keys_per_part : j.S) * (j.split_keys ? R : j.rows_per_part) * (j.E + j.Ev);
    em__cpu_parallel_for(groups * j.parts, macs >= 262144 ? 1 : 262144 / (macs > 0 ? macs : 1) + 1, sdpa_fwd_tasks, &j);
    if (j.split_keys && !atomic_load(&j.oom)) em__cpu_parallel_for(groups, 64, sdpa_merge, &j);
    free(j.part_ml);
    free(j.part_acc);
    if (atomic_load(&j.oom))
        return em_error(EM_ERR_OUT_OF_MEMORY, "scaled_dot_product_attention: out of host memory for a block of scores");
    return EM_OK;
}

em_status em__cpu_sdpa_backward(const em_op_call *c) {
    em_tensor *dq = c->dst[0], *dk = c->dst[1], *dv = c->dst[2];
    const em_tensor *g = c->src[0], *q = c->src[1], *k = c->src[2], *v = c->src[3], *out = c->src[4];
    const em_tensor *ts[8] = {dq, dk, dv, g, out, q, k, v};
    if (sdpa_check("sdpa_backward", ts, 8, c->dtype)) return em_last_status();
    em__cpu_blas_init();
    sdpa_job j;
    job_shape(&j, c, q, k, v);
    j.lse = em__host_ptr(c->src[5]);
    j.out = operand_of(out);
    j.g = operand_of(g);
    j.dq = operand_of(dq);
    j.dk = operand_of(dk);
    j.dv = operand_of(dv);
    int64_t macs = j.G * j.L * j.S * (j.E + j.Ev);
    em__cpu_parallel_for(j.B * j.Hkv, macs >= 262144 ? 1 : 262144 / (macs > 0 ? macs : 1) + 1, sdpa_bwd_heads, &j);
    if (atomic_load(&j.oom))
        return em_error(EM_ERR_OUT_OF_MEMORY, "scaled_dot_product_attention backward: out of host memory for a block "
                        "of scores");
    return EM_OK;
}
