/* The OpenCL backend itself: devices and properties, copies (blocking, non-blocking,
 * on one device), errors (bad device, oversized allocation), the on-disk program cache
 * (written, reused, a corrupt file rebuilt), users' kernels (compile errors with the
 * compiler's log, launches in 1-d and 2-d, local memory and barriers, atomics, argument
 * checks) and ops from two threads at once. Ops' numerics are in test_backend_ops*.c. */
#include <dirent.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "core/tensor_impl.h"
#include "test.h"

static em_device D0 = {EM_OPENCL, 0};
static char g_cache[256];

static int count_cache_files(void) {
    DIR *d = opendir(g_cache);
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strncmp(e->d_name, "opencl-", 7) == 0 && strstr(e->d_name, ".bin")) n++;
    closedir(d);
    return n;
}

static void test_devices(void) {
    int n = em_device_count(EM_OPENCL);
    CHECK(n >= 1);
    CHECK(em_device_available(EM_OPENCL));
    CHECK(em_device_unavailable_reason(EM_OPENCL) == NULL);
    bool seen_non_gpu = false;
    for (int i = 0; i < n; i++) {
        em_device_props p;
        CHECK_OK(em_device_get_props(EM_DEVICE(EM_OPENCL, i), &p));
        CHECK(p.name[0] != 0 && p.vendor[0] != 0 && p.driver[0] != 0);
        CHECK(p.total_memory > 0);
        CHECK(p.free_memory == -1 || (p.free_memory > 0 && p.free_memory <= p.total_memory));
        CHECK(p.compute_units >= 1);
        CHECK(p.compute_capability == 0);
        /* GPUs come first in the index order */
        CHECK(!(p.is_gpu && seen_non_gpu));
        if (!p.is_gpu) seen_non_gpu = true;
        if (strstr(p.name, "pthread")) CHECK(!p.is_gpu && p.free_memory == -1);
    }
    em_device_props p;
    CHECK(em_device_get_props(EM_DEVICE(EM_OPENCL, n), &p) == EM_ERR_DEVICE);
    CHECK_ERROR(EM_ERR_DEVICE, "opencl");
    CHECK(em_zeros(EM_SHAPE(2), EM_OPTS(.device = EM_DEVICE(EM_OPENCL, n + 3))) == NULL);
    CHECK_ERROR(EM_ERR_DEVICE, "opencl");
}

static void test_copies(void) {
    em_scope s = em_scope_begin();
    /* odd sizes through host -> device -> host */
    const int sizes[] = {1, 3, 1000, 123457};
    for (int k = 0; k < 4; k++) {
        int n = sizes[k];
        uint8_t *src = malloc((size_t)n), *back = malloc((size_t)n);
        for (int i = 0; i < n; i++) src[i] = (uint8_t)(i * 7 + 3);
        em_tensor *t = em_from_data(src, EM_U8, EM_SHAPE(n), EM_OPTS(.dtype = EM_U8, .device = D0));
        memset(back, 0, (size_t)n);
        CHECK_OK(em_copy_to_host(t, back, (size_t)n));
        CHECK(memcmp(src, back, (size_t)n) == 0);
        /* a copy on the device, then a copy of a strided view */
        em_tensor *c = em_clone(t);
        memset(back, 0, (size_t)n);
        CHECK_OK(em_copy_to_host(c, back, (size_t)n));
        CHECK(memcmp(src, back, (size_t)n) == 0);
        free(src);
        free(back);
    }
    /* non-blocking from pinned memory: the data arrives by the next synchronization */
    em_tensor *pinned = em_empty(EM_SHAPE(4096), EM_OPTS(.pin_memory = true));
    float *hp = em_data_ptr(pinned);
    CHECK(hp != NULL);
    if (hp) {
        for (int i = 0; i < 4096; i++) hp[i] = (float)i * 0.5f;
        em_tensor *g = em_to_device_dtype(pinned, D0, EM_F32, true);
        CHECK_OK(em_device_synchronize(D0));
        float *back = malloc(4096 * sizeof(float));
        CHECK_OK(em_copy_to_host(g, back, 4096 * sizeof(float)));
        bool same = true;
        for (int i = 0; i < 4096; i++) same = same && back[i] == (float)i * 0.5f;
        CHECK(same);
        free(back);
    }
    /* device -> device on one device, into a view */
    em_tensor *a = em_arange(0, 12, 1, EM_OPTS(.device = D0));
    em_tensor *big = em_zeros(EM_SHAPE(3, 8), EM_OPTS(.device = D0));
    CHECK_OK(em_copy_(em_narrow(big, 1, 2, 4), em_view(a, EM_SHAPE(3, 4))));
    float got[24];
    CHECK_OK(em_copy_to_host(big, got, sizeof got));
    bool ok = true;
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 8; c++) ok = ok && got[r * 8 + c] == ((c >= 2 && c < 6) ? (float)(r * 4 + c - 2) : 0.f);
    CHECK(ok);
    /* dense on one device, at an offset: the driver's buffer copy (em__gpu_copy) */
    em_tensor *rows = em_zeros(EM_SHAPE(4, 4), EM_OPTS(.device = D0));
    CHECK_OK(em_copy_(em_narrow(rows, 0, 1, 3), em_view(a, EM_SHAPE(3, 4))));
    float rg[16];
    CHECK_OK(em_copy_to_host(rows, rg, sizeof rg));
    ok = true;
    for (int i = 0; i < 16; i++) ok = ok && rg[i] == (i < 4 ? 0.f : (float)(i - 4));
    CHECK(ok);
    /* em_copy_ between host and device straight into the destination (no staging tensor),
     * into and out of views at an offset, pinned and pageable; then a strided destination,
     * which goes through the staging path */
    for (int pin = 0; pin < 2; pin++) {
        em_tensor *host = em_full(EM_SHAPE(5, 4), -1.0, EM_OPTS(.pin_memory = pin));
        CHECK_OK(em_copy_(em_narrow(host, 0, 1, 3), em_view(a, EM_SHAPE(3, 4)))); /* device -> host */
        const float *hp2 = em_data_ptr(host);
        ok = hp2 != NULL;
        for (int i = 0; ok && i < 20; i++) ok = hp2[i] == (i < 4 || i >= 16 ? -1.f : (float)(i - 4));
        CHECK(ok);
        em_tensor *dev = em_zeros(EM_SHAPE(2, 4, 4), EM_OPTS(.device = D0));
        CHECK_OK(em_copy_(em_select(dev, 0, 1), em_narrow(host, 0, 1, 4))); /* host -> device */
        float dg[32];
        CHECK_OK(em_copy_to_host(dev, dg, sizeof dg));
        ok = true;
        for (int i = 0; i < 32; i++) ok = ok && dg[i] == (i < 16 ? 0.f : i < 28 ? (float)(i - 16) : -1.f);
        CHECK(ok);
        em_tensor *ht = em_zeros(EM_SHAPE(4, 3), EM_OPTS(.pin_memory = pin));
        CHECK_OK(em_copy_(em_transpose(ht, 0, 1), em_view(a, EM_SHAPE(3, 4)))); /* strided: staged */
        const float *tp = em_data_ptr(ht);
        ok = tp != NULL;
        for (int i = 0; ok && i < 12; i++) ok = tp[i] == (float)((i % 3) * 4 + i / 3);
        CHECK(ok);
        /* a dtype change is not a plain copy either: staged, then cast */
        em_tensor *hd = em_zeros(EM_SHAPE(12), EM_OPTS(.dtype = EM_F64, .pin_memory = pin));
        CHECK_OK(em_copy_(hd, a));
        const double *dp = em_data_ptr(hd);
        CHECK(dp && dp[0] == 0 && dp[11] == 11);
    }
    CHECK_OK(em_device_synchronize(D0));
    em_scope_end(s);
}

static void test_oversized_allocation(void) {
    em_device_props p;
    CHECK_OK(em_device_get_props(D0, &p));
    /* more than the device has: refused with an out-of-memory error, nothing aborts */
    int64_t n = p.total_memory / 4 * 2 + 1024;
    em_tensor *t = em_empty(EM_SHAPE(n), EM_OPTS(.device = D0));
    CHECK(t == NULL);
    CHECK(em_last_status() == EM_ERR_OUT_OF_MEMORY);
    em_clear_error();
    /* and the device still works */
    em_scope s = em_scope_begin();
    em_tensor *ok = em_full(EM_SHAPE(3), 2.0, EM_OPTS(.device = D0));
    CHECK_NEAR(em_item(em_sum(ok, EM_ALL_DIMS, false)), 6.0, 0);
    em_scope_end(s);
}

/* ---- users' kernels ---- */

static const char *VECADD =
    "KERNEL vecadd(GLOBAL const float *a, GLOBAL const float *b, GLOBAL float *c, int n) {\n"
    "    i64 i = GLOBAL_ID(0);\n"
    "    if (i < n) c[i] = a[i] + b[i];\n"
    "}\n";

static void test_kernel_launch(void) {
    em_scope s = em_scope_begin();
    int files_before = count_cache_files();
    em_kernel *k = em_kernel_compile(VECADD, "vecadd", D0);
    CHECK(k != NULL);
    CHECK(em_device_equal(em_kernel_device(k), D0));
    /* the compiled binary is now in the disk cache */
    CHECK(count_cache_files() == files_before + 1);
    const int n = 1000;
    em_tensor *a = em_arange(0, n, 1, EM_OPTS(.device = D0));
    em_tensor *b = em_full(EM_SHAPE(n), 0.5, EM_OPTS(.device = D0));
    em_tensor *c = em_zeros(EM_SHAPE(n), EM_OPTS(.device = D0));
    CHECK_OK(em_kernel_launch(k, EM_DIM3((n + 127) / 128), EM_DIM3(128),
                              EM_KARGS(em_arg_tensor(a), em_arg_tensor(b), em_arg_tensor(c), em_arg_i32(n))));
    float got[1000];
    CHECK_OK(em_copy_to_host(c, got, sizeof got));
    bool ok = true;
    for (int i = 0; i < n; i++) ok = ok && got[i] == (float)i + 0.5f;
    CHECK(ok);

    /* a view starting at an aligned offset (a sub-buffer), and one at an odd offset */
    em_tensor *tail = em_narrow(c, 0, 128, 256);
    em_tensor *ta = em_narrow(a, 0, 128, 256), *tb = em_narrow(b, 0, 128, 256);
    CHECK_OK(em_kernel_launch(k, EM_DIM3(2), EM_DIM3(128),
                              EM_KARGS(em_arg_tensor(ta), em_arg_tensor(ta), em_arg_tensor(tail), em_arg_i32(256))));
    CHECK_OK(em_copy_to_host(c, got, sizeof got));
    CHECK(got[127] == 127.5f && got[128] == 256.f && got[383] == 766.f && got[384] == 384.5f);
    em_tensor *odd = em_narrow(c, 0, 1, 10);
    CHECK(em_kernel_launch(k, EM_DIM3(1), EM_DIM3(16),
                           EM_KARGS(em_arg_tensor(odd), em_arg_tensor(odd), em_arg_tensor(odd), em_arg_i32(10))) ==
          EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "em_clone");
    (void)tb;

    /* argument checks */
    em_tensor *cpu = em_zeros(EM_SHAPE(n), EM_OPTS());
    CHECK(em_kernel_launch(k, EM_DIM3(1), EM_DIM3(1),
                           EM_KARGS(em_arg_tensor(a), em_arg_tensor(cpu), em_arg_tensor(c), em_arg_i32(n))) ==
          EM_ERR_DEVICE);
    CHECK_ERROR(EM_ERR_DEVICE, "argument 1");
    em_tensor *m = em_view(a, EM_SHAPE(10, 100));
    CHECK(em_kernel_launch(k, EM_DIM3(1), EM_DIM3(1),
                           EM_KARGS(em_arg_tensor(em_transpose(m, 0, 1)), em_arg_tensor(b), em_arg_tensor(c),
                                    em_arg_i32(n))) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "not contiguous");
    CHECK(em_kernel_launch(k, EM_DIM3(1), EM_DIM3(1), EM_KARGS(em_arg_tensor(a), em_arg_tensor(b))) ==
          EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "4 parameters");
    CHECK(em_kernel_launch(k, EM_DIM3(1), EM_DIM3(1),
                           EM_KARGS(em_arg_tensor(a), em_arg_tensor(b), em_arg_tensor(c), em_arg_f64(1))) ==
          EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "argument 3");
    CHECK(em_kernel_launch(k, EM_DIM3(1), EM_DIM3(100000),
                           EM_KARGS(em_arg_tensor(a), em_arg_tensor(b), em_arg_tensor(c), em_arg_i32(n))) ==
          EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "threads per block");
    em_kernel_free(k);
    em_scope_end(s);
}

/* 2-d indices, local memory with barriers, and atomics: the dialect's other parts */
static const char *DIALECT =
    "KERNEL add2d(GLOBAL float *out, GLOBAL const float *x, int rows, int cols) {\n"
    "    i64 c = GLOBAL_ID(0), r = GLOBAL_ID(1);\n"
    "    if (r < rows && c < cols) out[r * cols + c] = x[r * cols + c] + (float)(r * 1000 + c);\n"
    "}\n"
    "KERNEL block_sum(GLOBAL float *out, GLOBAL const float *x, int n) {\n"
    "    LOCAL_MEM float part[64];\n"
    "    int t = LOCAL_ID(0);\n"
    "    i64 i = GLOBAL_ID(0);\n"
    "    part[t] = i < n ? x[i] : 0.0f;\n"
    "    BARRIER();\n"
    "    for (int s = LOCAL_SIZE(0) / 2; s > 0; s >>= 1) {\n"
    "        if (t < s) part[t] += part[t + s];\n"
    "        BARRIER();\n"
    "    }\n"
    "    if (t == 0) out[GROUP_ID(0)] = part[0];\n"
    "}\n"
    "KERNEL histogram(GLOBAL i32 *bins, GLOBAL const i32 *x, int n) {\n"
    "    for (i64 i = GLOBAL_ID(0); i < n; i += GLOBAL_SIZE(0)) ATOMIC_ADD_I32(&bins[x[i]], 1);\n"
    "}\n";

static void test_kernel_dialect(void) {
    em_scope s = em_scope_begin();
    em_kernel *k2 = em_kernel_compile(DIALECT, "add2d", D0);
    em_kernel *ks = em_kernel_compile(DIALECT, "block_sum", D0);
    em_kernel *kh = em_kernel_compile(DIALECT, "histogram", D0);
    CHECK(k2 && ks && kh);
    if (!k2 || !ks || !kh) {
        em_clear_error();
        em_scope_end(s);
        return;
    }
    /* 2-d: 5 x 37 with 8 x 8 blocks */
    em_tensor *x = em_ones(EM_SHAPE(5, 37), EM_OPTS(.device = D0)), *y = em_empty_like(x);
    CHECK_OK(em_kernel_launch(k2, EM_DIM3(5, 1), EM_DIM3(8, 8),
                              EM_KARGS(em_arg_tensor(y), em_arg_tensor(x), em_arg_i32(5), em_arg_i32(37))));
    float got[185];
    CHECK_OK(em_copy_to_host(y, got, sizeof got));
    bool ok = true;
    for (int r = 0; r < 5; r++)
        for (int c = 0; c < 37; c++) ok = ok && got[r * 37 + c] == 1.f + (float)(r * 1000 + c);
    CHECK(ok);
    /* block sums of 0..299 in blocks of 64 */
    em_tensor *v = em_arange(0, 300, 1, EM_OPTS(.device = D0)), *sums = em_zeros(EM_SHAPE(5), EM_OPTS(.device = D0));
    CHECK_OK(em_kernel_launch(ks, EM_DIM3(5), EM_DIM3(64),
                              EM_KARGS(em_arg_tensor(sums), em_arg_tensor(v), em_arg_i32(300))));
    float bs[5];
    CHECK_OK(em_copy_to_host(sums, bs, sizeof bs));
    for (int b = 0; b < 5; b++) {
        double want = 0;
        for (int i = b * 64; i < (b + 1) * 64 && i < 300; i++) want += i;
        CHECK_NEAR(bs[b], want, 0);
    }
    /* atomics: a histogram of i % 7 over 10000 values from many threads */
    int32_t xs[10000];
    for (int i = 0; i < 10000; i++) xs[i] = i % 7;
    em_tensor *xt = em_from_data(xs, EM_I32, EM_SHAPE(10000), EM_OPTS(.dtype = EM_I32, .device = D0));
    em_tensor *bins = em_zeros(EM_SHAPE(7), EM_OPTS(.dtype = EM_I32, .device = D0));
    CHECK_OK(em_kernel_launch(kh, EM_DIM3(4), EM_DIM3(64),
                              EM_KARGS(em_arg_tensor(bins), em_arg_tensor(xt), em_arg_i32(10000))));
    int32_t hb[7];
    CHECK_OK(em_copy_to_host(bins, hb, sizeof hb));
    for (int b = 0; b < 7; b++) CHECK(hb[b] == 10000 / 7 + (b < 10000 % 7));
    em_kernel_free(k2);
    em_kernel_free(ks);
    em_kernel_free(kh);
    em_scope_end(s);
}

static void test_kernel_compile_errors(void) {
    /* a compile error carries the compiler's log */
    const char *bad = "KERNEL broken(GLOBAL float *x) { x[0] = undefined_thing + 1; }\n";
    CHECK(em_kernel_compile(bad, "broken", D0) == NULL);
    CHECK(em_last_status() == EM_ERR_BACKEND);
    CHECK(strstr(em_last_error(), "undefined_thing") != NULL);
    CHECK(strstr(em_last_error(), "broken") != NULL);
    em_clear_error();
    /* a name the source does not define: the names it does */
    CHECK(em_kernel_compile(VECADD, "vec_add", D0) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "kernels found: vecadd");
    /* not a GPU-type device; bad arguments */
    CHECK(em_kernel_compile(VECADD, "vecadd", EM_DEVICE_CPU) == NULL);
    CHECK_ERROR(EM_ERR_NOT_SUPPORTED, "GPU-type");
    CHECK(em_kernel_compile(NULL, "vecadd", D0) == NULL);
    CHECK_ERROR(EM_ERR_ARGUMENT, "source");
    CHECK(em_kernel_launch(NULL, EM_DIM3(1), EM_DIM3(1), 0, NULL) != EM_OK);
    CHECK_ERROR(EM_ERR_ARGUMENT, "NULL");
    em_kernel_free(NULL);
}

/* The cache survives a corrupt file: a child process finds garbage under the same name,
 * builds from source and rewrites it. */
static void test_disk_cache_recovers(void) {
    int before = count_cache_files();
    CHECK(before >= 1); /* vecadd from test_kernel_launch */
    DIR *d = opendir(g_cache);
    char path[512] = "";
    for (struct dirent *e; d && (e = readdir(d));)
        if (strncmp(e->d_name, "opencl-", 7) == 0) snprintf(path, sizeof path, "%s/%s", g_cache, e->d_name);
    if (d) closedir(d);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    fputs("not a program binary", f);
    fclose(f);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        for (int i = 0; i < 4; i++) {
            em_kernel *k = em_kernel_compile(i % 2 ? DIALECT : VECADD, i % 2 ? "add2d" : "vecadd", D0);
            if (!k) _exit(1);
            em_kernel_free(k);
        }
        _exit(0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_size > 100); /* rewritten with a real binary */
}

/* ---- two threads queue ops on one device at once ---- */
typedef struct { float scale; double result; } thread_job;
static void *thread_main(void *arg) {
    thread_job *j = arg;
    em_scope s = em_scope_begin();
    double total = 0;
    for (int it = 0; it < 20; it++) {
        em_tensor *a = em_full(EM_SHAPE(64, 33), j->scale, EM_OPTS(.device = D0));
        em_tensor *b = em_mul_scalar(em_add(a, a), 0.5);
        total += em_item(em_sum(b, EM_ALL_DIMS, false));
    }
    j->result = em_failed() ? -1 : total;
    em_clear_error();
    em_scope_end(s);
    return NULL;
}

static void test_threads(void) {
    pthread_t t[2];
    thread_job jobs[2] = {{1.0f, 0}, {2.0f, 0}};
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, thread_main, &jobs[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    CHECK_NEAR(jobs[0].result, 20.0 * 64 * 33 * 1.0, 0);
    CHECK_NEAR(jobs[1].result, 20.0 * 64 * 33 * 2.0, 0);
}

/* A tall-skinny integer matmul runs Ember's tiled kernel with more tiles of M than the
 * grid's y dimension gets (65535, CUDA's limit): the kernel loops over the rest. */
static void test_tall_integer_matmul(void) {
    em_scope s = em_scope_begin();
    int64_t M = 2100000; /* 65625 tiles of 32 rows */
    em_manual_seed(3);
    em_tensor *a = em_randint(-4, 5, EM_SHAPE(M, 2), EM_OPTS(.dtype = EM_I32));
    em_tensor *b = em_randint(-4, 5, EM_SHAPE(2, 3), EM_OPTS(.dtype = EM_I32));
    em_tensor *want = em_matmul(a, b);
    em_tensor *got = em_cpu(em_matmul(em_to(a, D0), em_to(b, D0)));
    em_tensor *diff = em_sum(em_ne(got, want), EM_ALL_DIMS, false);
    if (em_failed()) fprintf(stderr, "  %s\n", em_last_error());
    CHECK(!em_failed() && diff && em_item(diff) == 0);
    /* the last rows, which only the looping blocks write */
    CHECK(got && em_item(em_select(em_select(got, 0, M - 1), 0, 2)) ==
                     em_item(em_select(em_select(want, 0, M - 1), 0, 2)));
    em_scope_end(s);
}

/* ---- matmul through CLBlast (EMBER_OPENCL_GEMM=clblast; off by default, see
 * opencl_gemm.c), in a fresh process ---- */
static int clblast_child(void) {
    int failures = 0;
    /* f32 only (CLBlast compiles its kernels per precision: ~35 s each on a cold PoCL cache) */
    const int shapes[][4] = {{1, 7, 5, 3}, {3, 8, 16, 4}, {1, 64, 784, 256}};
    for (int si = 0; si < 3; si++) for (int tb = 0; tb < 2; tb++) for (int dt = 0; dt < 1; dt++) {
        em_scope s = em_scope_begin();
        int B = shapes[si][0], M = shapes[si][1], K = shapes[si][2], N = shapes[si][3];
        em_dtype type = dt ? EM_F64 : EM_F32;
        em_manual_seed((uint64_t)(si * 4 + tb * 2 + dt));
        em_tensor *a = em_rand(EM_SHAPE(B, M, K), EM_OPTS(.dtype = type));
        em_tensor *b = tb ? em_transpose(em_rand(EM_SHAPE(B, N, K), EM_OPTS(.dtype = type)), 1, 2)
                          : em_rand(EM_SHAPE(B, K, N), EM_OPTS(.dtype = type));
        em_tensor *want = em_matmul(a, b);
        em_tensor *got = em_cpu(em_matmul(em_to(a, D0), em_to(b, D0)));
        em_tensor *err = em_max(em_abs(em_sub(got, want)), EM_ALL_DIMS, false);
        double e = em_item(err);
        if (em_failed() || !(e <= (dt ? 1e-12 : 1e-4) * K)) {
            fprintf(stderr, "  clblast matmul %dx%dx%dx%d %s%s: max error %g %s\n", B, M, K, N,
                    em_dtype_name(type), tb ? " (b transposed)" : "", e, em_last_error());
            em_clear_error();
            failures++;
        }
        em_scope_end(s);
    }
    return failures ? 1 : 0;
}

static void test_clblast_matmul(void) {
    if (!getenv("EMBER_TEST_CLBLAST") && access("/usr/lib/x86_64-linux-gnu/libclblast.so.1", F_OK) != 0) {
        SKIP("CLBlast is not installed (Debian: libclblast-dev)");
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("EMBER_OPENCL_GEMM", "clblast", 1);
        execl("/proc/self/exe", "clblast-child", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(int argc, char **argv) {
    if (argc >= 1 && strcmp(argv[0], "clblast-child") == 0) return clblast_child();
    /* a private cache directory, set before the first OpenCL use */
    snprintf(g_cache, sizeof g_cache, "/tmp/ember-test-cache-XXXXXX");
    if (!mkdtemp(g_cache)) return 1;
    setenv("EMBER_CACHE_DIR", g_cache, 1);
    if (em_device_count(EM_OPENCL) == 0) {
        /* not a pass: a skip, or a failure where OpenCL was expected (EMBER_REQUIRE_OPENCL) */
        if (getenv("EMBER_REQUIRE_OPENCL")) CHECK(em_device_count(EM_OPENCL) > 0);
        else test_skip_case("OpenCL backend tests", "no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
        em_clear_error();
        rmdir(g_cache);
        return test_summary();
    }
    RUN(test_devices);
    RUN(test_copies);
    RUN(test_oversized_allocation);
    RUN(test_kernel_launch);
    RUN(test_kernel_dialect);
    RUN(test_kernel_compile_errors);
    RUN(test_disk_cache_recovers);
    RUN(test_threads);
    RUN(test_tall_integer_matmul);
    RUN(test_clblast_matmul);
    /* PoCL: Ember's own program is not exported (see opencl_program.c); users' kernels are */
    em_device_props p;
    if (em_device_get_props(D0, &p) == EM_OK && strstr(p.name, "pthread")) {
        printf("cache files: %d (two user programs)\n", count_cache_files());
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_cache);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_cache);
    return test_summary();
}
