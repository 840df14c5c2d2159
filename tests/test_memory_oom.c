/* Out of memory on a fake backend: fault injection, caps, the message, recovery, the
 * environment, threads, and the pinned host cache. */
#include "test.h"
#include "test_memory_fake.h"

#define MiB ((size_t)1 << 20)

static em_block must_alloc(em_device d, size_t bytes) {
    em_block b;
    CHECK_OK(em__mem_alloc(&fake_be, d, bytes, &b));
    return b;
}

/* Memory the allocator holds is exactly what the device handed out. */
static void check_no_leak(em_device d) {
    em_memory_stats s = fake_stats(d);
    CHECK(s.reserved_bytes[0].current == (int64_t)fake[d.index].used);
    CHECK(s.segment[0].current == fake[d.index].live);
}

static void test_fake_backend_fails_nth_call(void) {
    em_device d = fake_device(0);
    em_block a = must_alloc(d, 1000);                  /* call 1: a 2 MiB segment */
    fake[d.index].fail_call = 2;                       /* the 20 MiB segment for 3 MiB fails... */
    em_block b = must_alloc(d, 3 * MiB);               /* ...so a segment of just 3 MiB is taken */
    CHECK(!em_failed());
    CHECK(fake[d.index].calls == 3);
    em_memory_stats s = fake_stats(d);
    CHECK(s.num_alloc_retries == 0 && s.num_ooms == 0 && s.num_raw_allocs == 2);
    CHECK(s.reserved_bytes[0].current == (int64_t)(2 * MiB + 3 * MiB) && b.size == 3 * MiB);
    check_no_leak(d);
    em__mem_free(&fake_be, d, &a);
    em__mem_free(&fake_be, d, &b);
    CHECK_OK(em_memory_empty_cache(d));
    CHECK(fake[d.index].live == 0);
}

static void test_injected_oom_is_clean(void) {
    em_device d = fake_device(0);
    em_block keep = must_alloc(d, 5 * MiB);            /* a live block that must survive */
    memset((char *)keep.handle + keep.offset, 0x5a, keep.size);
    em_block cached = must_alloc(d, 30 * MiB);
    em__mem_free(&fake_be, d, &cached);                /* a whole cached 30 MiB segment */
    em_memory_stats before = fake_stats(d);
    em__mem_debug_fail_raw(1, 100);                    /* every raw allocation fails */
    em_block b;
    CHECK(em__mem_alloc(&fake_be, d, 40 * MiB, &b) == EM_ERR_OUT_OF_MEMORY);
    CHECK(b.handle == NULL && b.alloc_ctx == NULL);
    CHECK(strstr(em_last_error(), "OpenCL out of memory. Tried to allocate 40.00 MiB.") != NULL);
    CHECK(strstr(em_last_error(), "Device opencl:") != NULL);
    CHECK(strstr(em_last_error(), "has 1.00 GiB total") != NULL);
    CHECK(strstr(em_last_error(), "Ember holds 5.00 MiB allocated and 15.00 MiB reserved but unallocated, "
                                  "of which the largest free block is 15.00 MiB (fragmentation 0%)") != NULL);
    CHECK(strstr(em_last_error(), "Cap: none.") != NULL);
    CHECK_ERROR(EM_ERR_OUT_OF_MEMORY, "out of memory");
    em__mem_debug_fail_raw(0, 0);
    em_memory_stats s = fake_stats(d);
    CHECK(s.num_ooms == before.num_ooms + 1);
    CHECK(s.num_alloc_retries == before.num_alloc_retries + 1);
    CHECK(s.cached_segments == 0);                     /* the retry gave the cached segment back */
    CHECK(s.allocated_bytes[0].current == before.allocated_bytes[0].current);
    CHECK(s.allocation[0].current == 1);
    bool intact = true;
    for (size_t i = 0; i < keep.size; i++) intact &= ((unsigned char *)keep.handle)[keep.offset + i] == 0x5a;
    CHECK(intact);
    check_no_leak(d);
    /* a small request nests in the free rest of keep's segment: no raw allocation to fail */
    em__mem_debug_fail_raw(1, 100);
    CHECK(em__mem_alloc(&fake_be, d, 100, &b) == EM_OK);
    CHECK(!em_failed());
    CHECK(fake_stats(d).num_raw_allocs == before.num_raw_allocs);
    CHECK(b.handle == keep.handle && b.offset == keep.offset + keep.size);
    em__mem_debug_fail_raw(0, 0);
    em__mem_free(&fake_be, d, &b);
    em__mem_free(&fake_be, d, &keep);
    CHECK_OK(em_memory_empty_cache(d));
    CHECK(fake[d.index].live == 0 && fake[d.index].used == 0);
    /* with nothing to nest in, the small pool fails as the large one does */
    before = fake_stats(d);
    em__mem_debug_fail_after(1);
    CHECK(em__mem_alloc(&fake_be, d, 100, &b) == EM_OK);   /* one failure: a 512 B segment instead */
    CHECK(!em_failed());
    CHECK(fake_stats(d).num_alloc_retries == before.num_alloc_retries);   /* 2 MiB failed, then 512 B */
    CHECK(fake_stats(d).reserved_bytes[0].current == 512 && fake_stats(d).num_ooms == before.num_ooms);
    em__mem_free(&fake_be, d, &b);
    CHECK_OK(em_memory_empty_cache(d));
    CHECK(fake[d.index].live == 0 && fake[d.index].used == 0);
}

static void test_retry_recovers_without_error(void) {
    em_device d = fake_device(0);
    em_block a = must_alloc(d, 12 * MiB);
    em__mem_free(&fake_be, d, &a);                     /* cached: 12 MiB */
    em__mem_debug_fail_raw(1, 1);                      /* the 16 MiB segment fails; the retry succeeds */
    em_block b;
    CHECK(em__mem_alloc(&fake_be, d, 16 * MiB, &b) == EM_OK);
    CHECK(!em_failed());
    em_memory_stats s = fake_stats(d);
    CHECK(s.num_alloc_retries == 1 && s.num_ooms == 0);
    CHECK(s.reserved_bytes[0].current == (int64_t)(16 * MiB));   /* the cached 12 MiB went back */
    em__mem_free(&fake_be, d, &b);
    /* an error pending before the call stays the pending one */
    em_error(EM_ERR_SHAPE, "an earlier mistake");
    em__mem_debug_fail_raw(1, 1);
    CHECK(em__mem_alloc(&fake_be, d, 30 * MiB, &b) == EM_OK);
    CHECK_ERROR(EM_ERR_SHAPE, "an earlier mistake");
    em__mem_debug_fail_raw(0, 0);
    em__mem_free(&fake_be, d, &b);
    CHECK_OK(em_memory_empty_cache(d));
    CHECK(fake[d.index].live == 0);
}

static void test_cap_oom_and_recovery(void) {
    em_device d = fake_device(0);
    CHECK_OK(em_memory_set_cap(d, 64 * MiB));
    CHECK(em_memory_get_cap(d) == (int64_t)(64 * MiB));
    em_block b[8];
    int n = 0;
    while (n < 8 && em__mem_alloc(&fake_be, d, 10 * MiB, &b[n]) == EM_OK) n++;
    CHECK(n == 6);                                     /* 6 x 10 MiB segments fit under 64 MiB */
    CHECK(strstr(em_last_error(), "Cap: 64.00 MiB (em_memory_set_cap); this request would take reserved "
                                  "memory past it.") != NULL);
    CHECK_ERROR(EM_ERR_OUT_OF_MEMORY, "Tried to allocate 10.00 MiB");
    CHECK(fake_stats(d).num_ooms == 1);
    CHECK(em_memory_reserved(d) == (int64_t)(60 * MiB));
    for (int i = 0; i < 3; i++) em__mem_free(&fake_be, d, &b[i]);
    em_block big;
    /* 30 MiB cached in 10 MiB pieces, too small for a 30 MiB block: given back before growing */
    CHECK(em__mem_alloc(&fake_be, d, 30 * MiB, &big) == EM_OK);
    CHECK(!em_failed());
    em_memory_stats s = fake_stats(d);
    CHECK(s.num_alloc_retries == 1 && s.reserved_bytes[0].current == (int64_t)(60 * MiB));
    em__mem_free(&fake_be, d, &big);
    for (int i = 3; i < 6; i++) em__mem_free(&fake_be, d, &b[i]);
    CHECK_OK(em_memory_empty_cache(d));
    CHECK(em_memory_reserved(d) == 0);
    CHECK(em__mem_alloc(&fake_be, d, 64 * MiB, &big) == EM_OK);   /* exactly the cap */
    em__mem_free(&fake_be, d, &big);
    CHECK_OK(em_memory_set_cap(d, -1));
    CHECK(em_memory_get_cap(d) == -1);
    CHECK(em__mem_alloc(&fake_be, d, 200 * MiB, &big) == EM_OK);
    em__mem_free(&fake_be, d, &big);
    CHECK_OK(em_memory_empty_cache(d));
    check_no_leak(d);
}

/* Under a cap, a 1..10 MiB request takes a segment of its own size when 20 MiB will not fit. */
static void test_cap_takes_tight_segment(void) {
    em_device d = fake_device(0);
    CHECK_OK(em_memory_set_cap(d, 16 * MiB));
    em_block a = must_alloc(d, 3 * MiB);
    CHECK(em_memory_reserved(d) == (int64_t)(3 * MiB));
    em__mem_free(&fake_be, d, &a);
    CHECK_OK(em_memory_empty_cache(d));
}

static void test_fragmentation_is_reported(void) {
    em_device d = fake_device(0);
    CHECK_OK(em_memory_set_cap(d, 20 * MiB));
    em_block b[4];
    for (int i = 0; i < 4; i++) b[i] = must_alloc(d, 4 * MiB);   /* one 20 MiB segment: 4 MiB free at the end */
    em__mem_free(&fake_be, d, &b[0]);
    em__mem_free(&fake_be, d, &b[2]);                            /* 12 MiB free in three 4 MiB pieces */
    em_block x;
    CHECK(em__mem_alloc(&fake_be, d, 6 * MiB, &x) == EM_ERR_OUT_OF_MEMORY);
    CHECK(strstr(em_last_error(), "8.00 MiB allocated and 12.00 MiB reserved but unallocated, of which the "
                                  "largest free block is 4.00 MiB (fragmentation 67%: enough is free in "
                                  "total, but not in one piece)") != NULL);
    CHECK_ERROR(EM_ERR_OUT_OF_MEMORY, "Cap: 20.00 MiB");
    em__mem_free(&fake_be, d, &b[1]);                            /* 12 MiB in one piece now */
    CHECK(em__mem_alloc(&fake_be, d, 6 * MiB, &x) == EM_OK);
    CHECK(x.handle == b[3].handle && x.offset == 0);
    em__mem_free(&fake_be, d, &x);
    em__mem_free(&fake_be, d, &b[3]);
    CHECK_OK(em_memory_empty_cache(d));
    check_no_leak(d);
}

static void test_device_full(void) {
    em_device d = fake_device(50 * MiB);               /* the device itself runs out */
    em_block a = must_alloc(d, 30 * MiB), b;
    CHECK(em__mem_alloc(&fake_be, d, 30 * MiB, &b) == EM_ERR_OUT_OF_MEMORY);
    CHECK(strstr(em_last_error(), "has 50.00 MiB total, 20.00 MiB free") != NULL);
    CHECK_ERROR(EM_ERR_OUT_OF_MEMORY, "Tried to allocate 30.00 MiB");
    em__mem_free(&fake_be, d, &a);
    CHECK(em__mem_alloc(&fake_be, d, 40 * MiB, &b) == EM_OK);   /* after the retry frees the cache */
    em__mem_free(&fake_be, d, &b);
    CHECK(em__mem_alloc(&fake_be, d, (size_t)1 << 62, &b) == EM_ERR_OUT_OF_MEMORY);
    CHECK_ERROR(EM_ERR_OUT_OF_MEMORY, "more than any device can hold");
    CHECK_OK(em_memory_empty_cache(d));
    check_no_leak(d);
}

static void test_cap_from_environment(void) {
    em_device d1 = fake_device(0), d2 = fake_device(0), d3 = fake_device(0);
    char spec[128];
    snprintf(spec, sizeof spec, "cpu=1GB, opencl=100MiB, opencl:%d=0.25", d1.index);
    setenv("EMBER_MEMORY_CAP", spec, 1);
    em_block a = must_alloc(d1, 100), b = must_alloc(d2, 100);
    CHECK(em_memory_get_cap(d1) == (int64_t)1 << 28);  /* a quarter of the fake's 1 GiB */
    CHECK(em_memory_get_cap(d2) == (int64_t)(100 * MiB));
    CHECK(fake_stats(d2).cap == (int64_t)(100 * MiB));
    setenv("EMBER_MEMORY_CAP", "opencl=12QB", 1);
    em__mem_free(&fake_be, d1, &a);
    em__mem_free(&fake_be, d2, &b);
    em_block c;
    CHECK(em__mem_alloc(&fake_be, d3, 100, &c) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "EMBER_MEMORY_CAP: cannot read 'opencl=12QB'");
    CHECK_OK(em_memory_set_cap(d3, 10 * MiB));         /* the API replaces a bad environment entry */
    CHECK(em__mem_alloc(&fake_be, d3, 100, &c) == EM_OK);
    em__mem_free(&fake_be, d3, &c);
    em_device d4 = fake_device(0);
    setenv("EMBER_MEMORY_CAP", "3GiB", 1);             /* a bare value: every device */
    CHECK(em_memory_get_cap(d4) == (int64_t)3 << 30);
    unsetenv("EMBER_MEMORY_CAP");
    CHECK_OK(em_memory_empty_cache(d1));
    CHECK_OK(em_memory_empty_cache(d2));
    CHECK_OK(em_memory_empty_cache(d3));
}

static void test_cap_fraction_api(void) {
    em_device d = fake_device(256 * MiB);
    em_block a = must_alloc(d, 100);                   /* the device's backend is known from here */
    CHECK_OK(em_memory_set_cap_fraction(d, 0.5));
    CHECK(em_memory_get_cap(d) == (int64_t)(128 * MiB));
    CHECK(em_memory_set_cap_fraction(d, 1.5) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "fraction must be in (0, 1]");
    CHECK(em_memory_set_cap_fraction(d, 0) == EM_ERR_ARGUMENT);
    em_clear_error();
    CHECK_OK(em_memory_set_cap_fraction(d, 0.25));     /* backend known: resolved now */
    CHECK(em_memory_get_cap(d) == (int64_t)(64 * MiB));
    em__mem_free(&fake_be, d, &a);
    CHECK_OK(em_memory_empty_cache(d));
}

static void test_parse_and_format_sizes(void) {
    struct { const char *s; int64_t v; } good[] = {
        {"512MiB", 512 * (int64_t)MiB}, {"1.5GB", 1500000000}, {"4096", 4096}, {"2 GiB", (int64_t)2 << 30},
        {"8k", 8192}, {"3kb", 3000}, {"1TiB", (int64_t)1 << 40}, {"0", 0}, {" 7 B ", 7},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        int64_t v = -1;
        CHECK_OK(em_memory_parse_size(good[i].s, &v));
        CHECK(v == good[i].v);
    }
    const char *bad[] = {"-1", "12QB", "", "MiB", "1e400", "5 MiB extra"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t v;
        CHECK(em_memory_parse_size(bad[i], &v) == EM_ERR_ARGUMENT);
        CHECK_ERROR(EM_ERR_ARGUMENT, "expected a non-negative number");
    }
    char buf[32];
    em_memory_format_size(512, buf, sizeof buf);
    CHECK(!strcmp(buf, "512 bytes"));
    em_memory_format_size(1536, buf, sizeof buf);
    CHECK(!strcmp(buf, "1.50 KiB"));
    em_memory_format_size((int64_t)2 << 30, buf, sizeof buf);
    CHECK(!strcmp(buf, "2.00 GiB"));
}

/* ---- threads ---- */

typedef struct worker { em_device d; int id, ops, bad; int64_t allocs; } worker;

static void *work(void *arg) {
    worker *w = arg;
    em_block live[32];
    int n = 0;
    uint64_t rng = 0x1234567ull * (uint64_t)(w->id + 1);
    for (int op = 0; op < w->ops; op++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t r = rng >> 33;
        if (n < 32 && (n == 0 || r % 2)) {
            size_t bytes = r % 16 == 0 ? (size_t)(r % (12 * MiB)) + 1 : (size_t)(r % 65536) + 1;
            if (em__mem_alloc(&fake_be, w->d, bytes, &live[n]) != EM_OK) { w->bad++; break; }
            memset((char *)live[n].handle + live[n].offset, w->id + 1, 64 < live[n].size ? 64 : live[n].size);
            n++;
            w->allocs++;
        } else {
            int i = (int)(r % (uint64_t)n);
            for (int k = 0; k < 64 && k < (int)live[i].size; k++)
                w->bad += ((unsigned char *)live[i].handle)[live[i].offset + (size_t)k] != w->id + 1;
            em__mem_free(&fake_be, w->d, &live[i]);
            live[i] = live[--n];
        }
    }
    while (n) em__mem_free(&fake_be, w->d, &live[--n]);
    return NULL;
}

static void test_threads(void) {
    em_device d = fake_device((size_t)1 << 40);
    enum { THREADS = 4 };
    pthread_t t[THREADS];
    worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){.d = d, .id = i, .ops = 20000};
        CHECK(pthread_create(&t[i], NULL, work, &w[i]) == 0);
    }
    int64_t allocs = 0;
    int bad = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        allocs += w[i].allocs;
        bad += w[i].bad;
    }
    CHECK(bad == 0);
    em_memory_stats s = fake_stats(d);
    CHECK(s.allocation[0].allocated == allocs && s.allocation[0].freed == allocs);
    CHECK(s.allocated_bytes[0].current == 0 && s.requested_bytes[0].current == 0);
    CHECK(s.allocated_bytes[0].allocated == s.allocated_bytes[0].freed);
    CHECK(s.inactive_split_bytes[0].current == 0 && s.cached_segments == s.segment[0].current);
    check_no_leak(d);
    CHECK_OK(em_memory_empty_cache(d));
    CHECK(fake[d.index].live == 0 && em_memory_reserved(d) == 0);
}

/* ---- pinned host memory ---- */

static void test_pinned_cache(void) {
    em_memory_empty_pinned_cache();
    em_memory_stats s0;
    CHECK_OK(em_memory_get_pinned_stats(&s0));
    em_block a, b;
    CHECK_OK(em__mem_alloc_pinned(1000, &a));
    CHECK(a.size == 1024 && a.handle && a.offset == 0);
    memset(a.handle, 1, a.size);
    void *first = a.handle;
    em__mem_free_pinned(&a);
    CHECK(a.handle == NULL);
    CHECK_OK(em__mem_alloc_pinned(700, &a));               /* same power-of-two bin: reused */
    CHECK(a.handle == first);
    CHECK_OK(em__mem_alloc_pinned(3000, &b));
    CHECK(b.size == 4096);
    em_memory_stats s;
    CHECK_OK(em_memory_get_pinned_stats(&s));
    CHECK(s.num_raw_allocs - s0.num_raw_allocs == 2);
    CHECK(s.allocated_bytes[0].current - s0.allocated_bytes[0].current == 1024 + 4096);
    CHECK(s.requested_bytes[0].current - s0.requested_bytes[0].current == 700 + 3000);
    CHECK(s.reserved_bytes[0].current - s0.reserved_bytes[0].current == 1024 + 4096);
    /* a queued copy used b on fake device k: reuse waits for it */
    em_device d = fake_device(0);
    em__mem_pinned_record_use(&b, &fake_be, d.index);
    em__mem_free_pinned(&b);
    CHECK(fake[d.index].syncs == 0);
    CHECK_OK(em__mem_alloc_pinned(4000, &b));
    CHECK(fake[d.index].syncs == 1);
    em__mem_free_pinned(&b);
    em__mem_free_pinned(&a);
    CHECK_OK(em_memory_get_pinned_stats(&s));
    CHECK(s.cached_segments >= 2 && s.largest_free_block >= 4096);
    em_memory_empty_pinned_cache();
    CHECK_OK(em_memory_get_pinned_stats(&s));
    CHECK(s.reserved_bytes[0].current == s.allocated_bytes[0].current && s.cached_segments == 0);
    em__mem_debug_fail_raw(1, 2);
    CHECK(em__mem_alloc_pinned(100, &a) == EM_ERR_OUT_OF_MEMORY);
    CHECK_ERROR(EM_ERR_OUT_OF_MEMORY, "Pinned host memory: out of memory. Tried to allocate 100 bytes");
    em__mem_debug_fail_raw(1, 1);
    CHECK_OK(em__mem_alloc_pinned(100, &a));               /* the retry recovers */
    CHECK(!em_failed());
    em__mem_free_pinned(&a);
    CHECK_OK(em_memory_get_pinned_stats(&s));
    CHECK(s.num_ooms - s0.num_ooms == 1 && s.num_alloc_retries - s0.num_alloc_retries == 2);
    em_memory_empty_pinned_cache();
}

int main(void) {
    unsetenv("EMBER_NO_CACHE");
    unsetenv("EMBER_MEMORY_CAP");
    unsetenv("EMBER_MEMORY_POLICY");
    RUN(test_fake_backend_fails_nth_call);
    RUN(test_injected_oom_is_clean);
    RUN(test_retry_recovers_without_error);
    RUN(test_cap_oom_and_recovery);
    RUN(test_cap_takes_tight_segment);
    RUN(test_fragmentation_is_reported);
    RUN(test_device_full);
    RUN(test_cap_from_environment);
    RUN(test_cap_fraction_api);
    RUN(test_parse_and_format_sizes);
    RUN(test_threads);
    RUN(test_pinned_cache);
    return test_summary();
}
