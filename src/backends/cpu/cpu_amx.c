/* bf16 GEMM on AMX tiles, see cpu_amx.h.
 *
 * The unit: TDPBF16PS adds A B to a 16 x 16 float32 tile C, A being 16 rows x 32 bf16 (k
 * contiguous) and B 16 rows of k pairs x 16 columns x 2 bf16 ("VNNI" order). Eight tile
 * registers hold a 32 x 32 block of C in four (2 x 2: each A and B tile loaded once and used
 * twice, the most eight registers allow), two of A and two of B.
 *
 * Blocking, GotoBLAS's with tiles for registers: a panel of B (all of K x NC columns, NC chosen
 * so that it fills about 1 MB) is packed into VNNI tiles and stays in L2; for each 32-row strip
 * of A, a KC-long piece is packed into tile order (16 KB, in L1) and runs along the panel's
 * 32-column pairs, the 32 x 32 blocks waiting in a float32 buffer between pieces; after the
 * last piece they are rounded once to bf16 (bias and the old z added first). A row-major A's
 * next piece is packed in parts between this piece's micro-kernel calls, into a second
 * buffer. When a long K makes the panels many, A's rows are packed once instead of once per
 * panel. Zero padding means the micro-kernel never branches on a tail; only the write masks. */
#include "cpu_amx.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "../../util/errors.h"

/* EMBER_CPU_LOWP_GEMM: 0 another path, 1 unset (this kernel where it is the faster), 2 "amx" */
static int choice(void) {
    const char *e = getenv("EMBER_CPU_LOWP_GEMM");
    return !e || !*e ? 1 : strcmp(e, "amx") == 0 ? 2 : 0;
}

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "cpu_internal.h"
#include "cpu_threads.h"

#define TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

#define TILE 512                /* bf16 in one packed tile: 16 rows x 32 */
#define STRIP 32                /* rows of A (and columns of B) per micro-kernel call */
/* Below this many multiply-adds a GEMM runs on the calling thread only: split in two, a
 * 256 x 784 x 256 product (51M) took as long as on one thread (each thread packs the whole
 * weight, the second starts 10-20 us later), and the seed MLP's bf16 step at batch 256 on 2
 * threads went 0.83-0.89 -> 0.74-0.84 ms (five alternated runs) with this floor at 60M, not 4M */
#define SERIAL_MACS 60000000

/* Blocking, measured on Sapphire Rapids (2 MB L2, 48 KB L1; bench_lowp_shapes, 1024-4096 squares):
 * KC 128-1024 and panels of 256 KB-1.5 MB tried */
#define KC 256                  /* k per micro-kernel call: A's 32 x KC piece (16 KB) stays in L1 */
#define PANEL_BYTES (1 << 20)   /* packed B per column panel (all of K), kept in L2 */
#define STREAM_MIN_BYTES ((int64_t)8 << 20) /* a float32 z at least this big is streamed */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static bool g_have;

static void detect(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1)) return; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0xE6) != 0xE6) return; /* the OS saves the AVX-512 state */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    bool avx512 = (b >> 16 & 1) && (b >> 17 & 1) && (b >> 30 & 1) && (b >> 31 & 1); /* F, DQ, BW, VL */
    if (!avx512 || !(d >> 24 & 1) || !(d >> 22 & 1) || a < 1) return;              /* AMX-TILE, AMX-BF16 */
    __get_cpuid_count(7, 1, &a, &b, &c, &d);
    if (!(a >> 5 & 1)) return; /* AVX512-BF16: the final rounding */
    /* Linux (5.16+) grants the 8 KB tile state only on request; refused: no AMX here */
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return;
    g_have = true;
}

bool em__cpu_amx_runs(em_dtype dt) {
    if (dt != EM_BF16 || !choice()) return false;
    pthread_once(&g_once, detect);
    return g_have;
}

const char *em__cpu_amx_name(void) {
    return em__cpu_amx_runs(EM_BF16) ? "Ember's AMX kernel (amx_bf16 tiles, 32x32 blocks), float32 accumulation" : NULL;
}

typedef struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

TARGET static void tiles_configure(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
}

static __mmask32 mask32(int64_t n) {
    return n >= 32 ? (__mmask32)0xFFFFFFFFu : n <= 0 ? 0 : (__mmask32)((1u << n) - 1);
}

/* 16 x 16 32-bit transpose in registers */
TARGET static void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    /* r[4i + j], 128-bit lane L: rows 4i..4i+3, column 4L + j */
    for (int j = 0; j < 4; j++) {
        __m512i a = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x88), b = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xDD);
        __m512i c = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x88), d = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xDD);
        t[j] = _mm512_shuffle_i32x4(a, c, 0x88);
        t[8 + j] = _mm512_shuffle_i32x4(a, c, 0xDD);
        t[4 + j] = _mm512_shuffle_i32x4(b, d, 0x88);
        t[12 + j] = _mm512_shuffle_i32x4(b, d, 0xDD);
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* interleave two rows of 32 bf16: (a0 b0 a1 b1 ... a15 b15), (a16 b16 ... a31 b31) */
TARGET static __m512i pairs_lo(__m512i a, __m512i b) {
    const __m512i idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                         37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    return _mm512_permutex2var_epi16(a, idx, b);
}
TARGET static __m512i pairs_hi(__m512i a, __m512i b) {
    const __m512i idx = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24, 55, 23, 54,
                                         22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
    return _mm512_permutex2var_epi16(a, idx, b);
}

/* Rows [r, r + mr) of X (mr <= 32), k-tiles [t0, t0 + kt), into tile order: per k-tile two
 * tiles (rows 0-15, 16-31) of 16 rows x 32 k; zero beyond mr and K. Packed just before use,
 * or during the previous piece's micro-kernel calls, so the piece (16 KB at KC 256) is in L1
 * for the whole B panel. pack_a_part packs units [u0, u1) of it only (pack_a_units: rows for
 * a row-major X, k-tile halves for a transposed one). */
static int64_t pack_a_units(const em_lowp_gemm *g, int64_t kt) { return g->xt ? 2 * kt : STRIP; }

TARGET static void pack_a_part(uint16_t *dst, const em_lowp_gemm *g, int64_t r, int64_t mr, int64_t t0, int64_t kt,
                               int64_t u0, int64_t u1) {
    const uint16_t *x = g->x;
    int64_t K = g->K, ldx = g->ldx;
    if (!g->xt) { /* X[r][k] at x[r * ldx + k]: along each row */
        for (int64_t i = u0; i < u1; i++) {
            uint16_t *out = dst + (i / 16) * TILE + (i % 16) * 32;
            const uint16_t *row = i < mr ? x + (r + i) * ldx : NULL; /* rows past mr: zeros */
            for (int64_t t = 0; t < kt; t++) {
                int64_t k = (t0 + t) * 32;
                _mm512_storeu_si512(out + t * 2 * TILE, row ? _mm512_maskz_loadu_epi16(mask32(K - k), row + k)
                                                            : _mm512_setzero_si512());
            }
        }
        return;
    }
    /* X[r][k] at x[k * ldx + r]: rows k, k+1 paired (16 rows' (X[i][k], X[i][k+1]) words), then
     * 16 x 16 words transposed */
    for (int64_t u = u0; u < u1; u++) {
        int64_t t = u / 2, h = u % 2;
        __mmask32 rm = mask32(mr - h * 16);
        __m512i v[16];
        for (int p = 0; p < 16; p++) {
            int64_t k = (t0 + t) * 32 + 2 * p;
            __m512i a = k < K ? _mm512_maskz_loadu_epi16(rm, x + k * ldx + r + h * 16) : _mm512_setzero_si512();
            __m512i b = k + 1 < K ? _mm512_maskz_loadu_epi16(rm, x + (k + 1) * ldx + r + h * 16) : _mm512_setzero_si512();
            v[p] = pairs_lo(a, b);
        }
        transpose16(v);
        uint16_t *out = dst + t * 2 * TILE + h * TILE;
        for (int i = 0; i < 16; i++) _mm512_storeu_si512(out + i * 32, v[i]);
    }
}

TARGET static void pack_a(uint16_t *dst, const em_lowp_gemm *g, int64_t r, int64_t mr, int64_t t0, int64_t kt) {
    pack_a_part(dst, g, r, mr, t0, kt, 0, pack_a_units(g, kt));
}

/* All of Y's k, columns [q0, q0 + nc) into VNNI tiles: per 32-column pair, kt
 * k-tiles of two tiles (columns 0-15, 16-31), each 16 k pairs x 16 columns x 2. */
TARGET static void pack_b(uint16_t *dst, const em_lowp_gemm *g, int64_t q0, int64_t nc, int64_t kt) {
    const uint16_t *y = g->y;
    int64_t K = g->K, ldy = g->ldy, ncp = (nc + 31) / 32;
    if (!g->yt) { /* Y[k][q] at y[k * ldy + q]: rows k, k+1 interleaved, along the rows */
        for (int64_t t = 0; t < kt; t++)
            for (int p = 0; p < 16; p++) {
                int64_t k = t * 32 + 2 * p;
                /* rows past K: zeros */
                const uint16_t *ra = k < K ? y + k * ldy + q0 : NULL, *rb = k + 1 < K ? y + (k + 1) * ldy + q0 : NULL;
                for (int64_t cp = 0; cp < ncp; cp++) {
                    __mmask32 cm = mask32(nc - cp * 32);
                    __m512i a = ra ? _mm512_maskz_loadu_epi16(cm, ra + cp * 32) : _mm512_setzero_si512();
                    __m512i b = rb ? _mm512_maskz_loadu_epi16(cm, rb + cp * 32) : _mm512_setzero_si512();
                    uint16_t *out = dst + (cp * kt + t) * 2 * TILE + p * 32;
                    _mm512_storeu_si512(out, pairs_lo(a, b));
                    _mm512_storeu_si512(out + TILE, pairs_hi(a, b));
                }
            }
        return;
    }
    /* Y[k][q] at y[q * ldy + k]: a column's k pairs are 32-bit words; 16 columns transposed */
    for (int64_t cp = 0; cp < ncp; cp++)
        for (int h = 0; h < 2; h++)
            for (int64_t t = 0; t < kt; t++) {
                __mmask32 km = mask32(K - t * 32);
                __m512i v[16];
                for (int j = 0; j < 16; j++) {
                    int64_t q = cp * 32 + h * 16 + j;
                    v[j] = q < nc ? _mm512_maskz_loadu_epi16(km, y + (q0 + q) * ldy + t * 32) : _mm512_setzero_si512();
                }
                transpose16(v);
                uint16_t *out = dst + (cp * kt + t) * 2 * TILE + h * TILE;
                for (int p = 0; p < 16; p++) _mm512_storeu_si512(out + p * 32, v[p]);
            }
}

/* c (32 x 32 float32, rows of 32) = [c +] A strip x B column pair over kt k-tiles */
TARGET static void micro(const uint16_t *a, const uint16_t *b, int64_t kt, float *c, bool load) {
    if (load) {
        _tile_loadd(0, c, 128);
        _tile_loadd(1, c + 16, 128);
        _tile_loadd(2, c + 512, 128);
        _tile_loadd(3, c + 528, 128);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t t = 0; t < kt; t++) {
        const uint16_t *at = a + t * 2 * TILE, *bt = b + t * 2 * TILE;
        _tile_loadd(4, at, 64);
        _tile_loadd(6, bt, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, bt + TILE, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, at + TILE, 64);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, 128);
    _tile_stored(1, c + 16, 128);
    _tile_stored(2, c + 512, 128);
    _tile_stored(3, c + 528, 128);
}

/* z rows [r, r + mr), columns [q, q + nq) = round(c + bias [+ z]); float32 z (z_f32):
 * c + bias [+ z], not rounded, full rows with streaming stores when `stream` */
TARGET static void write_block(const float *c, const em_lowp_gemm *g, const float *bias, int64_t r, int64_t mr,
                               int64_t q, int64_t nq, bool stream) {
    __mmask32 m = mask32(nq); /* a row's 32 columns in one store */
    __mmask16 lo = (__mmask16)(m & 0xFFFFu), hi = (__mmask16)(m >> 16);
    __m512 b0 = bias ? _mm512_maskz_loadu_ps(lo, bias + q) : _mm512_setzero_ps();
    __m512 b1 = bias ? _mm512_maskz_loadu_ps(hi, bias + q + 16) : _mm512_setzero_ps();
    for (int64_t i = 0; i < mr; i++) {
        __m512 v0 = _mm512_add_ps(_mm512_loadu_ps(c + i * 32), b0);
        __m512 v1 = _mm512_add_ps(_mm512_loadu_ps(c + i * 32 + 16), b1);
        if (g->z_f32) {
            float *zf = (float *)g->z + (r + i) * g->ldz + q;
            if (stream && nq == 32) {
                _mm512_stream_ps(zf, v0);
                _mm512_stream_ps(zf + 16, v1);
                continue;
            }
            if (g->acc) {
                v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(lo, zf));
                v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(hi, zf + 16));
            }
            _mm512_mask_storeu_ps(zf, lo, v0);
            _mm512_mask_storeu_ps(zf + 16, hi, v1);
            continue;
        }
        uint16_t *zp = (uint16_t *)g->z + (r + i) * g->ldz + q;
        if (g->acc) {
            __m512i old = _mm512_maskz_loadu_epi16(m, zp);
            __m512i o0 = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(old));
            __m512i o1 = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(old, 1));
            v0 = _mm512_add_ps(v0, _mm512_castsi512_ps(_mm512_slli_epi32(o0, 16)));
            v1 = _mm512_add_ps(v1, _mm512_castsi512_ps(_mm512_slli_epi32(o1, 16)));
        }
        __m512bh o = _mm512_cvtne2ps_pbh(v1, v0); /* v0 in the low half */
        _mm512_mask_storeu_epi16(zp, m, (__m512i)o);
    }
}

/* Packing buffers are kept between calls: fresh ones cost page faults on every call (two
 * threads' megabytes made glibc trim and refault its heap: 0.2-0.3 ms per 256-row product
 * instead of 0.1). At most POOL buffers are kept, none over POOL_MAX bytes. */
#define POOL 16
#define POOL_MAX ((size_t)64 << 20)
#define HUGE_BUF ((size_t)2 << 20)
#define HUGE_BUF_MIN ((size_t)512 << 10) /* smaller ones keep 4 KiB pages */
static pthread_mutex_t g_pool_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { void *p; size_t n; } g_pool[POOL];
static int g_npool;

static void *buf_take(size_t n) {
    void *p = NULL;
    pthread_mutex_lock(&g_pool_lock);
    int best = -1; /* the smallest that fits: a big one given to a small need makes a fault-prone new one */
    for (int i = 0; i < g_npool; i++)
        if (g_pool[i].n >= n && (best < 0 || g_pool[i].n < g_pool[best].n)) best = i;
    if (best >= 0) {
        p = g_pool[best].p;
        g_pool[best] = g_pool[--g_npool];
    } else if (g_npool == POOL) { /* none fits and the pool is full: make room */
        free(g_pool[--g_npool].p);
    }
    pthread_mutex_unlock(&g_pool_lock);
    if (!p && n >= HUGE_BUF_MIN && em__cpu_huge_pages()) {
        /* a packed B panel and its neighbours (about 1.1 MB a thread) in one 2 MiB page
         * instead of ~280 of 4 KiB: the 1024 square on 1 thread was faster in 12 of 14
         * alternated pairs (about 1400 against 1300 GFLOP/s). Fewer TLB misses for the tiles'
         * loads is the likely reason; this VM exposes no TLB counters to confirm it. */
        size_t r = (n + HUGE_BUF - 1) & ~(HUGE_BUF - 1);
        if (posix_memalign(&p, HUGE_BUF, r)) p = NULL;
        else (void)madvise(p, r, MADV_HUGEPAGE);
    } else if (!p && posix_memalign(&p, 64, n)) {
        p = NULL;
    }
    return p;
}

static void buf_give(void *p, size_t n) {
    if (!p) return;
    pthread_mutex_lock(&g_pool_lock);
    if (g_npool < POOL && n <= POOL_MAX) {
        g_pool[g_npool].p = p;
        g_pool[g_npool++].n = n;
        p = NULL;
    }
    pthread_mutex_unlock(&g_pool_lock);
    free(p);
}

typedef struct job {
    const em_lowp_gemm *g;
    const float *bias;       /* g->bias in float32, or NULL */
    bool split_rows, prepack;  /* prepack: A's rows packed once per chunk (run_region) */
    bool stream;             /* a big float32 z: written with streaming stores (write_block) */
    int64_t per, nchunks;    /* rows (or columns) per chunk, a multiple of 32 */
    int64_t KT, kt, nc;      /* k-tiles of K and per micro-kernel call; the B panel's columns */
    size_t a_len, b_len;     /* bf16 per chunk: packed A rows, one B panel (all of K) */
    uint16_t *bufs[256];     /* per chunk: packed A, B panel, then the float32 blocks */
} job;

TARGET static void run_region(const job *j, uint16_t *buf, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    const em_lowp_gemm *g = j->g;
    uint16_t *ap = buf, *bp = buf + j->a_len;
    float *cacc = (float *)(bp + j->b_len);
    tiles_configure();
    /* A's rows are packed once when the B panels are many (a long K makes them narrow);
     * else each 32 x KC piece: a row-major A's into one of two buffers while the tiles work
     * on the other (ahead), a transposed A's just before use */
    uint16_t *abuf[2] = {ap, ap + j->kt * 2 * TILE};
    int sel = 0;
    bool ahead = !j->prepack && !g->xt;
    if (j->prepack)
        for (int64_t ic = r0; ic < r1; ic += STRIP)
            pack_a(ap + (ic - r0) / STRIP * j->KT * 2 * TILE, g, ic, r1 - ic < STRIP ? r1 - ic : STRIP, 0, j->KT);
    else if (ahead)
        pack_a(abuf[0], g, r0, r1 - r0 < STRIP ? r1 - r0 : STRIP, 0, j->KT < j->kt ? j->KT : j->kt);
    for (int64_t jc = c0; jc < c1; jc += j->nc) {
        int64_t nc = c1 - jc < j->nc ? c1 - jc : j->nc, ncp = (nc + 31) / 32;
        pack_b(bp, g, jc, nc, j->KT);
        for (int64_t ic = r0; ic < r1; ic += STRIP) {
            int64_t mr = r1 - ic < STRIP ? r1 - ic : STRIP;
            for (int64_t pc = 0; pc < j->KT; pc += j->kt) {
                int64_t kt = j->KT - pc < j->kt ? j->KT - pc : j->kt;
                bool last = pc + kt >= j->KT;
                const uint16_t *as = j->prepack ? ap + ((ic - r0) / STRIP * j->KT + pc) * 2 * TILE : abuf[sel];
                if (!j->prepack && !ahead) pack_a(abuf[0], g, ic, mr, pc, kt);
                /* the next piece: along k, then the next strip, then the next panel's first */
                int64_t nic = !last ? ic : ic + STRIP < r1 ? ic + STRIP : jc + j->nc < c1 ? r0 : -1;
                int64_t npc = !last ? pc + kt : 0, nkt = j->KT - npc < j->kt ? j->KT - npc : j->kt;
                int64_t nmr = r1 - nic < STRIP ? r1 - nic : STRIP;
                int64_t units = !ahead || nic < 0 ? 0 : pack_a_units(g, nkt), per = (units + ncp - 1) / ncp;
                for (int64_t cp = 0; cp < ncp; cp++) {
                    float *cb = cacc + cp * (1024 + 16) + 16; /* off 4 KB strides */
                    micro(as, bp + (cp * j->KT + pc) * 2 * TILE, kt, cb, pc > 0);
                    /* a part of the next piece is packed while the tiles work on this one (the
                     * packing is loads and stores the core runs beside them), and the source rows
                     * of the part after it are fetched, which measured faster than packing the
                     * whole piece just before its use; a transposed A's pieces packed so
                     * measured slower, so they are not (docs/benchmarks-history.md) */
                    int64_t u0 = cp * per, u1 = u0 + per < units ? u0 + per : units;
                    if (ahead)
                        for (int64_t i = u1; i < u1 + per && i < units && nic + i < r1; i++) {
                            const uint16_t *row = (const uint16_t *)g->x + (nic + i) * g->ldx + npc * 32;
                            for (int64_t t = 0; t < nkt; t++) _mm_prefetch((const char *)(row + t * 32), _MM_HINT_T0);
                        }
                    if (u0 < u1) pack_a_part(abuf[!sel], g, nic, nmr, npc, nkt, u0, u1);
                    if (last)
                        write_block(cb, g, j->bias, ic, mr, jc + cp * 32, nc - cp * 32 < 32 ? nc - cp * 32 : 32, j->stream);
                }
                if (ahead) sel = !sel;
            }
        }
    }
    if (j->stream) _mm_sfence(); /* the streamed rows are visible before the job ends */
    _tile_release();
}

static void chunk(void *arg, int64_t begin, int64_t end) {
    const job *j = arg;
    const em_lowp_gemm *g = j->g;
    for (int64_t i = begin; i < end; i++) {
        int64_t lo = i * j->per, hi = lo + j->per;
        if (j->split_rows) run_region(j, j->bufs[i], lo, hi < g->P ? hi : g->P, 0, g->Q);
        else run_region(j, j->bufs[i], 0, g->P, lo, hi < g->Q ? hi : g->Q);
    }
}

em_status em__cpu_amx_gemm(const em_lowp_gemm *g) {
    if (!em__cpu_amx_runs(g->dtype) || g->P > INT_MAX || g->Q > INT_MAX || g->K > INT_MAX) return EM_ERR_NOT_SUPPORTED;
    if (g->P == 0 || g->Q == 0) return EM_OK;
    if (g->K == 0) return EM_ERR_NOT_SUPPORTED; /* nothing to multiply: the callers fill z */
    /* fewer than 32 rows or columns (a 10-class head): the 32 x 32 blocks would be mostly
     * padding; oneDNN measured faster there (bench_lowp_shapes), so it takes them
     * unless this kernel is asked for by name */
    if ((g->P < 32 || g->Q < 32) && choice() == 1 && em__cpu_dnnl_runs(EM_BF16)) return EM_ERR_NOT_SUPPORTED;
    job j = {.g = g, .split_rows = g->P >= g->Q};
    /* a float32 result far bigger than the caches (a weight's gradient, read next by the
     * optimizer): streaming stores skip reading each line before writing it, which made the
     * product write-bound (bf16 step of the 4096-wide MLP, batch 256) */
    j.stream = g->z_f32 && !g->acc && g->P * g->Q * 4 >= STREAM_MIN_BYTES && ((uintptr_t)g->z & 63) == 0 && g->ldz % 16 == 0;
    int64_t len = j.split_rows ? g->P : g->Q;
    int64_t chunks = g->P * g->Q * g->K >= SERIAL_MACS ? em__cpu_num_threads() : 1;
    if (chunks > 256) chunks = 256;
    j.per = ((len + chunks - 1) / chunks + 31) / 32 * 32;
    j.nchunks = (len + j.per - 1) / j.per;
    j.KT = (g->K + 31) / 32;
    int64_t pieces = (j.KT + KC / 32 - 1) / (KC / 32); /* k split evenly: no 1-tile remainder piece */
    j.kt = (j.KT + pieces - 1) / pieces;
    int64_t rows = j.split_rows ? j.per : g->P, cols = j.split_rows ? g->Q : j.per;
    int64_t nc = PANEL_BYTES / (j.KT * 64) / 32 * 32; /* columns whose K x nc panel fits the budget */
    if (nc < 32) nc = 32;
    j.nc = cols < nc ? (cols + 31) / 32 * 32 : nc;
    int64_t strips = (rows + STRIP - 1) / STRIP;
    int64_t panels = (cols + j.nc - 1) / j.nc;
    j.prepack = panels > 2 || (g->xt && panels > 1); /* transposing pieces again costs more */
    j.a_len = (size_t)((j.prepack ? strips * j.KT : 2 * j.kt) * 2 * TILE); /* two pieces in turn */
    j.b_len = (size_t)(j.nc / 32 * j.KT * 2 * TILE);
    size_t c_len = (size_t)(j.nc / 32 * (1024 + 16) + 16);
    size_t each = (j.a_len + j.b_len) * 2 + c_len * 4;
    float *bias = NULL;
    bool oom = false;
    size_t bias_len = sizeof(float) * (size_t)g->Q;
    if (g->bias) {
        if (!(bias = buf_take(bias_len))) oom = true;
        else
            for (int64_t q = 0; q < g->Q; q++) {
                uint32_t w = (uint32_t)((const uint16_t *)g->bias)[q] << 16;
                memcpy(&bias[q], &w, 4);
            }
    }
    j.bias = bias;
    for (int64_t i = 0; i < j.nchunks && !oom; i++)
        if (!(j.bufs[i] = buf_take(each))) oom = true;
    if (!oom) {
        if (j.nchunks == 1) chunk(&j, 0, 1);
        else em__cpu_parallel_for(j.nchunks, 1, chunk, &j);
    }
    for (int64_t i = 0; i < j.nchunks; i++) buf_give(j.bufs[i], each);
    if (bias) buf_give(bias, bias_len);
    if (oom)
        return em_error(EM_ERR_OUT_OF_MEMORY, "cpu: bf16 matmul (%lldx%lld @ %lldx%lld): out of memory for the AMX "
                        "kernel's packed operands (%zu bytes per thread)", (long long)g->P, (long long)g->K,
                        (long long)g->K, (long long)g->Q, each);
    return EM_OK;
}

#else /* not x86-64 Linux with GCC or clang: never */

bool em__cpu_amx_runs(em_dtype dt) {
    (void)dt;
    (void)choice;
    return false;
}

const char *em__cpu_amx_name(void) {
    return NULL;
}

em_status em__cpu_amx_gemm(const em_lowp_gemm *g) {
    (void)g;
    return EM_ERR_NOT_SUPPORTED;
}

#endif
