/* The caching allocator on a fake backend: reuse, split and merge, statistics after every
 * step, empty_cache, fragmentation, PyTorch's policy as a reference, caching off, streams. */
#include "test.h"
#include "test_memory_fake.h"
#include "test_memory_policy.h"

#define KiB ((size_t)1024)
#define MiB ((size_t)1 << 20)

/* What a step should leave behind; -1 skips a field. */
typedef struct expect {
    int64_t allocated, reserved, requested, segments, allocations, inactive, largest, cached;
} expect;

static int expect_line;
#define EXPECT(d, ...) (expect_line = __LINE__, check_state((d), (expect){__VA_ARGS__}))

static void check_state(em_device d, expect e) {
    em_memory_stats s = fake_stats(d);
    int64_t got[8] = {s.allocated_bytes[0].current, s.reserved_bytes[0].current, s.requested_bytes[0].current,
                      s.segment[0].current, s.allocation[0].current, s.inactive_split_bytes[0].current,
                      s.largest_free_block, s.cached_segments};
    int64_t want[8] = {e.allocated, e.reserved, e.requested, e.segments, e.allocations, e.inactive, e.largest, e.cached};
    static const char *names[8] = {"allocated", "reserved", "requested", "segments", "allocations",
                                   "non-releasable", "largest free", "cached segments"};
    for (int i = 0; i < 8; i++) {
        if (want[i] >= 0 && got[i] != want[i]) {
            fprintf(stderr, "  step at line %d: %s = %lld, expected %lld\n", expect_line, names[i],
                    (long long)got[i], (long long)want[i]);
            test__checks_failed_in_case++;
        }
    }
    /* invariants that hold after every operation */
    CHECK(s.active_bytes[0].current == s.allocated_bytes[0].current);
    CHECK(s.allocated_bytes[0].current == s.allocated_bytes[1].current + s.allocated_bytes[2].current);
    CHECK(s.reserved_bytes[0].current == s.reserved_bytes[1].current + s.reserved_bytes[2].current);
    CHECK(s.reserved_bytes[0].current == (int64_t)fake[d.index].used);  /* what the device really gave */
    CHECK(s.segment[0].current == fake[d.index].live);
    CHECK(s.num_raw_allocs - s.num_raw_frees == s.segment[0].current);
    CHECK(em_memory_allocated(d) == s.allocated_bytes[0].current);
    CHECK(em_memory_reserved(d) == s.reserved_bytes[0].current);
}

static em_block must_alloc(em_device d, size_t bytes) {
    em_block b;
    CHECK_OK(em__mem_alloc(&fake_be, d, bytes, &b));
    return b;
}

static void test_scripted_sequence(void) {
    em_device d = fake_device(0);
    const int64_t S = 2 * MiB, L = 20 * MiB;
    EXPECT(d, 0, 0, 0, 0, 0, 0, 0, 0);
    em_block a = must_alloc(d, 1000);            /* 1024 B from a new 2 MiB small segment */
    CHECK(a.size == 1024 && a.offset == 0 && a.handle);
    EXPECT(d, 1024, S, 1000, 1, 1, S - 1024, S - 1024, 0);
    em_block b = must_alloc(d, 1);               /* 512 B, split from the rest */
    CHECK(b.handle == a.handle && b.offset == 1024 && b.size == 512);
    EXPECT(d, 1536, S, 1001, 1, 2, S - 1536, S - 1536, 0);
    em_block c = must_alloc(d, 3 * MiB);         /* large pool: a 20 MiB segment, 17 MiB kept free */
    CHECK(c.handle != a.handle && c.offset == 0 && c.size == 3 * MiB);
    EXPECT(d, 1536 + 3 * MiB, S + L, 1001 + 3 * MiB, 2, 3, S - 1536 + 17 * MiB, 17 * MiB, 0);
    em_memory_stats s = fake_stats(d);
    CHECK(s.allocated_bytes[EM_MEMORY_SMALL_POOL].current == 1536);
    CHECK(s.allocated_bytes[EM_MEMORY_LARGE_POOL].current == (int64_t)(3 * MiB));
    CHECK(s.reserved_bytes[EM_MEMORY_LARGE_POOL].current == L);
    CHECK(s.inactive_split[0].current == 2);
    em__mem_free(&fake_be, d, &a);               /* a hole at offset 0: b is live next to it */
    CHECK(a.alloc_ctx == NULL && a.handle == NULL);
    EXPECT(d, 512 + 3 * MiB, S + L, 1 + 3 * MiB, 2, 2, S - 512 + 17 * MiB, 17 * MiB, 0);
    CHECK(fake_stats(d).inactive_split[0].current == 3);
    em_block dd = must_alloc(d, 700);            /* best fit: exactly the 1024 B hole */
    CHECK(dd.handle == b.handle && dd.offset == 0 && dd.size == 1024);
    EXPECT(d, 1536 + 3 * MiB, S + L, 701 + 3 * MiB, 2, 3, S - 1536 + 17 * MiB, 17 * MiB, 0);
    em__mem_free(&fake_be, d, &b);               /* merges with the free rest */
    EXPECT(d, 1024 + 3 * MiB, S + L, 700 + 3 * MiB, 2, 2, S - 1024 + 17 * MiB, 17 * MiB, 0);
    em__mem_free(&fake_be, d, &dd);              /* the small segment is whole again: releasable */
    EXPECT(d, 3 * MiB, S + L, 3 * MiB, 2, 1, 17 * MiB, 17 * MiB, 1);
    em_block e = must_alloc(d, 19 * MiB + 1);    /* >= 10 MiB: a 20 MiB segment; rest < 1 MiB stays attached */
    CHECK(e.size == (size_t)L && e.offset == 0);
    EXPECT(d, 3 * MiB + L, S + 2 * L, 22 * MiB + 1, 3, 2, 17 * MiB, 17 * MiB, 1);
    em_block f = must_alloc(d, 17 * MiB);        /* exactly the 17 MiB left in c's segment */
    CHECK(f.handle == c.handle && f.offset == 3 * MiB && f.size == 17 * MiB);
    EXPECT(d, 20 * MiB + L, S + 2 * L, 39 * MiB + 1, 3, 3, 0, S, 1);
    em__mem_free(&fake_be, d, &c);
    EXPECT(d, 17 * MiB + L, S + 2 * L, 36 * MiB + 1, 3, 2, 3 * MiB, 3 * MiB, 1);
    CHECK_OK(em_memory_empty_cache(d));          /* only the whole small segment can go */
    EXPECT(d, 17 * MiB + L, 2 * L, 36 * MiB + 1, 2, 2, 3 * MiB, 3 * MiB, 0);
    em__mem_free(&fake_be, d, &e);
    EXPECT(d, 17 * MiB, 2 * L, 17 * MiB, 2, 1, 3 * MiB, L, 1);
    em__mem_free(&fake_be, d, &f);               /* merges with c's hole: whole */
    EXPECT(d, 0, 2 * L, 0, 2, 0, 0, L, 2);
    s = fake_stats(d);
    CHECK(s.allocated_bytes[0].peak == (int64_t)(20 * MiB) + L);
    CHECK(s.reserved_bytes[0].peak == S + 2 * L);
    CHECK(s.allocation[0].allocated == 6 && s.allocation[0].freed == 6);
    CHECK(s.num_raw_allocs == 3 && s.num_raw_frees == 1);
    CHECK(em_memory_max_allocated(d) == (int64_t)(20 * MiB) + L);
    CHECK_OK(em_memory_empty_cache(d));
    EXPECT(d, 0, 0, 0, 0, 0, 0, 0, 0);
    CHECK(fake[d.index].live == 0 && fake[d.index].used == 0);
    CHECK(em_memory_max_reserved(d) == S + 2 * L);
    em_memory_reset_peak_stats(d);
    CHECK(em_memory_max_reserved(d) == 0 && em_memory_max_allocated(d) == 0);
    em_memory_reset_accumulated_stats(d);
    s = fake_stats(d);
    CHECK(s.allocation[0].allocated == 0 && s.num_raw_allocs == 0 && s.reserved_bytes[0].freed == 0);
}

static void test_rounding_and_pools(void) {
    em_device d = fake_device(0);
    /* request -> block size (the rounded request, or the whole segment when the rest is too
     * small to keep: < 512 B in the small pool, <= 1 MiB in the large), pool, segment size */
    struct { size_t bytes, size; int pool; int64_t segment; } cases[] = {
        {0, 512, EM_MEMORY_SMALL_POOL, 2 * MiB},
        {511, 512, EM_MEMORY_SMALL_POOL, 2 * MiB},
        {513, 1024, EM_MEMORY_SMALL_POOL, 2 * MiB},
        {MiB, MiB, EM_MEMORY_SMALL_POOL, 2 * MiB},
        {2 * MiB - 256, 2 * MiB, EM_MEMORY_LARGE_POOL, 20 * MiB},
        {MiB + 1, MiB + 512, EM_MEMORY_LARGE_POOL, 20 * MiB},
        {19 * MiB, 20 * MiB, EM_MEMORY_LARGE_POOL, 20 * MiB},
        {9 * MiB, 9 * MiB, EM_MEMORY_LARGE_POOL, 20 * MiB},
        {10 * MiB - 512, 10 * MiB - 512, EM_MEMORY_LARGE_POOL, 20 * MiB},
        {10 * MiB, 10 * MiB, EM_MEMORY_LARGE_POOL, 10 * MiB},
        {11 * MiB + 3, 12 * MiB, EM_MEMORY_LARGE_POOL, 12 * MiB},
        {11 * MiB - 509, 12 * MiB, EM_MEMORY_LARGE_POOL, 12 * MiB},   /* rest exactly 1 MiB: kept */
        {11 * MiB - 1024, 11 * MiB - 1024, EM_MEMORY_LARGE_POOL, 12 * MiB},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        em_block b = must_alloc(d, cases[i].bytes);
        em_memory_stats s = fake_stats(d);
        if (b.size != cases[i].size) fprintf(stderr, "  case %zu: block %zu\n", i, b.size);
        CHECK(b.size == cases[i].size);
        CHECK(s.allocated_bytes[cases[i].pool].current == (int64_t)b.size);
        CHECK(s.reserved_bytes[0].current == cases[i].segment);
        CHECK(s.requested_bytes[0].current == (int64_t)cases[i].bytes);
        CHECK(b.handle != NULL);
        em__mem_free(&fake_be, d, &b);
        CHECK_OK(em_memory_empty_cache(d));
        CHECK(fake[d.index].live == 0);
    }
    em_block b = must_alloc(d, 100);
    em__mem_free(&fake_be, d, &b);
    em__mem_free(&fake_be, d, &b);   /* the first free cleared the block: a second is a no-op */
    EXPECT(d, 0, 2 * MiB, 0, 1, 0, 0, 2 * MiB, 1);
    CHECK_OK(em_memory_empty_cache(d));
}

/* Every live block gets a pattern at both ends; overlapping blocks would overwrite it. */
static void stamp(em_block *b, uint32_t v) {
    memcpy((char *)b->handle + b->offset, &v, 4);
    memcpy((char *)b->handle + b->offset + b->size - 4, &v, 4);
}
static bool stamp_ok(const em_block *b, uint32_t v) {
    uint32_t x, y;
    memcpy(&x, (char *)b->handle + b->offset, 4);
    memcpy(&y, (char *)b->handle + b->offset + b->size - 4, 4);
    return x == v && y == v;
}

static size_t random_size(uint64_t *rng) {
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t r = *rng >> 33;
    int kind = (int)(r % 10);
    size_t base = kind < 6 ? 4 * KiB : kind < 9 ? 2 * MiB : 16 * MiB;  /* mostly small, some large */
    return (size_t)((r >> 4) % (base * 3 / 2)) + 1;
}

/* Ember and the reference policy must place every block identically: PyTorch's policy under
 * EMBER_MEMORY_POLICY=pytorch, PyTorch's plus release-on-grow and nested small segments by
 * default. */
static void compare_with_reference(bool pytorch) {
    if (pytorch) setenv("EMBER_MEMORY_POLICY", "pytorch", 1);
    em_device d = fake_device((size_t)1 << 40);
    CHECK(fake_stats(d).caching);                      /* creates the device's state: reads the policy */
    unsetenv("EMBER_MEMORY_POLICY");
    ptp ref = {0};
    ref.release_on_grow = ref.nested = !pytorch;
    enum { LIVE = 48, OPS = 4000 };
    em_block live[LIVE];
    int ref_seg[LIVE];
    size_t ref_off[LIVE];
    int n = 0, mismatches = 0;
    uint64_t rng = 42;
    for (int op = 0; op < OPS; op++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int r = (int)((rng >> 33) % 100);
        if (r == 0) {
            CHECK_OK(em_memory_empty_cache(d));
            ptp_empty_cache(&ref);
        } else if (n < LIVE && (n == 0 || r < 55)) {
            size_t bytes = random_size(&rng);
            if (em__mem_alloc(&fake_be, d, bytes, &live[n]) != EM_OK) {
                CHECK(!"allocation failed");
                break;
            }
            ptp_alloc(&ref, bytes, &ref_seg[n], &ref_off[n]);
            mem_block *mb = live[n].alloc_ctx;
            /* the block's offset in its segment, and in the memory the handle names: a nested
             * segment's blocks lie inside its large segment, from the carved block's offset */
            size_t at = ref_off[n] + (ref.seg[ref_seg[n]].parent >= 0 ? ref.seg[ref_seg[n]].parent_off : 0);
            if ((int)mb->seg->id != ref_seg[n] || mb->offset != ref_off[n] || live[n].offset != at) {
                if (!mismatches) fprintf(stderr, "  first placement apart: op %d, %zu bytes: Ember segment %d offset %zu (%zu in its memory), "
                            "reference segment %d offset %zu (%zu)\n", op, bytes, (int)mb->seg->id, mb->offset,
                            live[n].offset, ref_seg[n], ref_off[n], at);
                mismatches++;
            }
            n++;
        } else {
            int i = (int)((rng >> 20) % (uint64_t)n);
            em__mem_free(&fake_be, d, &live[i]);
            ptp_free(&ref, ref_seg[i], ref_off[i]);
            live[i] = live[n - 1];
            ref_seg[i] = ref_seg[n - 1];
            ref_off[i] = ref_off[n - 1];
            n--;
        }
        em_memory_stats s = fake_stats(d);
        int64_t inactive, largest;
        ptp_free_info(&ref, &inactive, &largest);
        if (s.reserved_bytes[0].current != ref.reserved || s.allocated_bytes[0].current != ref.allocated ||
            s.inactive_split_bytes[0].current != inactive || s.largest_free_block != largest ||
            s.reserved_bytes[0].current != (int64_t)fake[d.index].used || s.num_raw_allocs != ref.raw_allocs) {
            if (!mismatches) fprintf(stderr, "  first statistics apart (Ember/reference): op %d: reserved %ld/%ld allocated %ld/%ld "
                        "inactive split %ld/%ld largest free %ld/%ld raw allocations %ld/%ld\n", op, (long)s.reserved_bytes[0].current, (long)ref.reserved, (long)s.allocated_bytes[0].current, (long)ref.allocated, (long)s.inactive_split_bytes[0].current, (long)inactive, (long)s.largest_free_block, (long)largest, (long)s.num_raw_allocs, (long)ref.raw_allocs);
            mismatches++;
        }
    }
    CHECK(mismatches == 0);
    CHECK(pytorch ? ref.carves == 0 : ref.carves > 10);   /* the sequence nests small segments */
    em_memory_stats s = fake_stats(d);
    CHECK(s.reserved_bytes[0].peak == ref.peak_reserved && s.allocated_bytes[0].peak == ref.peak_allocated);
    for (int i = 0; i < n; i++) em__mem_free(&fake_be, d, &live[i]);
    CHECK_OK(em_memory_empty_cache(d));
    CHECK(fake[d.index].live == 0 && em_memory_allocated(d) == 0 && em_memory_reserved(d) == 0);
    ptp_destroy(&ref);
}

static void test_matches_pytorch_policy(void) {
    compare_with_reference(true);
}

static void test_matches_release_on_grow_policy(void) {
    compare_with_reference(false);
}

/* Varying shapes: PyTorch keeps every too-small cached segment; Ember gives them back when it
 * must grow anyway. */
static void test_release_on_grow(void) {
    for (int pytorch = 0; pytorch < 2; pytorch++) {
        if (pytorch) setenv("EMBER_MEMORY_POLICY", "pytorch", 1);
        em_device d = fake_device(0);
        em_block a = must_alloc(d, 30 * MiB);
        unsetenv("EMBER_MEMORY_POLICY");
        void *ha = a.handle;
        em__mem_free(&fake_be, d, &a);
        em_block b = must_alloc(d, 40 * MiB);          /* the cached 30 MiB cannot hold it */
        void *hb = b.handle;
        EXPECT(d, 40 * MiB, pytorch ? 70 * MiB : 40 * MiB, 40 * MiB, pytorch ? 2 : 1, 1, 0,
               pytorch ? 30 * MiB : 0, pytorch ? 1 : 0);
        em__mem_free(&fake_be, d, &b);
        em_block c = must_alloc(d, 30 * MiB);          /* fits in a cached block: nothing released */
        CHECK(c.handle == (pytorch ? ha : hb));
        em_memory_stats s = fake_stats(d);
        CHECK(s.num_raw_allocs == 2 && s.num_raw_frees == (pytorch ? 0 : 1));
        em__mem_free(&fake_be, d, &c);
        CHECK_OK(em_memory_empty_cache(d));
        CHECK(fake[d.index].live == 0);
    }
    setenv("EMBER_MEMORY_POLICY", "tensorflow", 1);
    em_device d = fake_device(0);
    em_block x;
    CHECK(em__mem_alloc(&fake_be, d, 10, &x) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "EMBER_MEMORY_POLICY: unknown policy 'tensorflow'");
    unsetenv("EMBER_MEMORY_POLICY");
}

/* A fake device whose state reads EMBER_MEMORY_POLICY=policy. */
static em_device device_with_policy(const char *policy) {
    setenv("EMBER_MEMORY_POLICY", policy, 1);
    em_device d = fake_device((size_t)1 << 40);
    CHECK(fake_stats(d).caching);   /* creates the device's state: reads the policy */
    unsetenv("EMBER_MEMORY_POLICY");
    return d;
}

/* Training steps' shape of use: activations of one size in the forward, freed, then
 * gradients of another in the backward, freed, four times. The peak policy holds no more
 * than the allocated peak; Ember's, splitting 20 MiB segments, holds more. */
static void test_peak_policy_holds_the_allocated_peak(void) {
    const char *policies[] = {"peak", "ember"};
    for (int k = 0; k < 2; k++) {
        em_device d = device_with_policy(policies[k]);
        em_block act[6], grad[3];
        for (int step = 0; step < 4; step++) {
            for (int i = 0; i < 6; i++) act[i] = must_alloc(d, 8 * MiB);
            for (int i = 0; i < 6; i++) em__mem_free(&fake_be, d, &act[i]);
            for (int i = 0; i < 3; i++) grad[i] = must_alloc(d, 16 * MiB);
            for (int i = 0; i < 3; i++) em__mem_free(&fake_be, d, &grad[i]);
        }
        em_memory_stats s = fake_stats(d);
        CHECK(s.allocated_bytes[0].peak == (int64_t)(48 * MiB));
        if (k == 0) CHECK(s.reserved_bytes[0].peak == (int64_t)(48 * MiB));
        else CHECK(s.reserved_bytes[0].peak == (int64_t)(60 * MiB));   /* three 20 MiB segments */
        CHECK(s.reserved_bytes[0].current == (int64_t)fake[d.index].used);
        CHECK_OK(em_memory_empty_cache(d));
        CHECK(fake[d.index].live == 0);
    }
}

/* Under the peak policy: a segment is the request rounded up to 2 MiB, its block the request
 * rounded to 512 B; a free block serves a request of its own rounded size, not a smaller one;
 * before growing, only as many free segments go back as keep reserved memory within the
 * allocated peak, the largest first. */
static void test_peak_policy_rules(void) {
    em_device d = device_with_policy("peak");
    em_block a = must_alloc(d, 3 * MiB);
    CHECK(a.size == 3 * MiB);
    EXPECT(d, 3 * MiB, 4 * MiB, 3 * MiB, 1, 1, MiB, MiB, 0);   /* the rounding: a free 1 MiB rest */
    void *ha = a.handle;
    em__mem_free(&fake_be, d, &a);
    em_block b = must_alloc(d, 4 * MiB - 100);   /* the same rounded size: the cached segment */
    CHECK(b.handle == ha && fake_stats(d).num_raw_allocs == 1);
    em__mem_free(&fake_be, d, &b);
    CHECK_OK(em_memory_empty_cache(d));

    em_block x = must_alloc(d, 16 * MiB), y = must_alloc(d, 16 * MiB);   /* peak: 32 MiB */
    void *hx = x.handle;
    em__mem_free(&fake_be, d, &y);
    em__mem_free(&fake_be, d, &x);
    em_memory_stats s0 = fake_stats(d);
    em_block z = must_alloc(d, 8 * MiB);   /* no 16 MiB block is split for it: one goes back */
    em_memory_stats s = fake_stats(d);
    CHECK(s.num_raw_frees - s0.num_raw_frees == 1 && s.num_raw_allocs - s0.num_raw_allocs == 1);
    CHECK(s.reserved_bytes[0].current == (int64_t)(24 * MiB));
    em_block w = must_alloc(d, 16 * MiB);  /* the one kept (the older) serves this */
    s = fake_stats(d);
    CHECK(w.handle == hx && s.num_raw_allocs - s0.num_raw_allocs == 1);
    CHECK(s.reserved_bytes[0].current == (int64_t)(24 * MiB));
    em_block v = must_alloc(d, 20 * MiB);  /* above the peak now: nothing cached to give back */
    s = fake_stats(d);
    CHECK(s.reserved_bytes[0].current == (int64_t)(44 * MiB) && s.reserved_bytes[0].peak == (int64_t)(44 * MiB));
    em__mem_free(&fake_be, d, &z);
    em__mem_free(&fake_be, d, &w);
    em__mem_free(&fake_be, d, &v);
    CHECK_OK(em_memory_empty_cache(d));
    CHECK(fake[d.index].live == 0);
}

/* Blocks never overlap, whatever the order of allocations and frees. */
static void test_no_overlap(void) {
    em_device d = fake_device((size_t)1 << 40);
    enum { LIVE = 64 };
    em_block live[LIVE];
    uint32_t tag[LIVE];
    int n = 0, bad = 0;
    uint64_t rng = 7;
    for (uint32_t op = 1; op <= 3000; op++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        if (n < LIVE && (n == 0 || (rng >> 40) % 3)) {
            if (em__mem_alloc(&fake_be, d, random_size(&rng), &live[n]) != EM_OK) break;
            stamp(&live[n], op);
            tag[n++] = op;
        } else {
            int i = (int)((rng >> 20) % (uint64_t)n);
            bad += !stamp_ok(&live[i], tag[i]);
            em__mem_free(&fake_be, d, &live[i]);
            live[i] = live[--n];
            tag[i] = tag[n];
        }
    }
    for (int i = 0; i < n; i++) {
        bad += !stamp_ok(&live[i], tag[i]);
        em__mem_free(&fake_be, d, &live[i]);
    }
    CHECK(bad == 0);
    CHECK(em_memory_allocated(d) == 0);
    em_memory_stats s = fake_stats(d);
    CHECK(s.inactive_split_bytes[0].current == 0 && s.cached_segments == s.segment[0].current);
    CHECK_OK(em_memory_empty_cache(d));
    CHECK(fake[d.index].live == 0);
}

/* Holes left between live blocks cannot serve a bigger request: that is fragmentation, and
 * the statistics must show it (non-releasable bytes, largest free block). */
static void test_fragmentation(void) {
    em_device d = fake_device(0);
    em_block b[8];
    for (int i = 0; i < 8; i++) b[i] = must_alloc(d, 2 * MiB);   /* 1 segment of 20 MiB: 8 x 2 MiB + 4 MiB */
    for (int i = 0; i < 8; i++) CHECK(b[i].handle == b[0].handle && b[i].offset == (size_t)i * 2 * MiB);
    for (int i = 0; i < 8; i += 2) em__mem_free(&fake_be, d, &b[i]);
    EXPECT(d, 8 * MiB, 20 * MiB, 8 * MiB, 1, 4, 12 * MiB, 4 * MiB, 0);
    CHECK(fake_stats(d).inactive_split[0].current == 5);
    em_block big = must_alloc(d, 5 * MiB);                     /* 12 MiB free, none 5 MiB long */
    CHECK(big.handle != b[1].handle);
    EXPECT(d, 13 * MiB, 40 * MiB, 13 * MiB, 2, 5, 12 * MiB + 15 * MiB, 15 * MiB, 0);
    CHECK_OK(em_memory_empty_cache(d));                        /* nothing whole: nothing released */
    CHECK(em_memory_reserved(d) == (int64_t)(40 * MiB));
    em_block fit = must_alloc(d, 3 * MiB);                     /* best fit: the 4 MiB tail, not the 15 MiB */
    CHECK(fit.handle == b[1].handle && fit.offset == 16 * MiB && fit.size == 3 * MiB + MiB);
    em__mem_free(&fake_be, d, &fit);
    for (int i = 1; i < 8; i += 2) em__mem_free(&fake_be, d, &b[i]);
    em__mem_free(&fake_be, d, &big);
    EXPECT(d, 0, 40 * MiB, 0, 2, 0, 0, 20 * MiB, 2);
    CHECK_OK(em_memory_empty_cache(d));
    EXPECT(d, 0, 0, 0, 0, 0, 0, 0, 0);
}

/* A training-like loop (varying batch sizes) settles: after warm-up, no new segments. */
static void test_steady_state_reuse(void) {
    em_device d = fake_device(0);
    int64_t raw_after_warmup = 0;
    for (int iter = 0; iter < 20; iter++) {
        size_t batch = 32 + (size_t)(iter % 4) * 16;
        em_block act[6];
        for (int l = 0; l < 6; l++) act[l] = must_alloc(d, batch * 3000 * (size_t)(l % 3 + 1));
        for (int l = 5; l >= 0; l--) em__mem_free(&fake_be, d, &act[l]);
        if (iter == 3) raw_after_warmup = fake_stats(d).num_raw_allocs;
    }
    CHECK(fake_stats(d).num_raw_allocs == raw_after_warmup);
    CHECK(em_memory_allocated(d) == 0);
    CHECK_OK(em_memory_empty_cache(d));
}

static void test_caching_off(void) {
    setenv("EMBER_NO_CACHE", "1", 1);
    em_device d = fake_device(0);
    em_block a = must_alloc(d, 1000);
    em_block b = must_alloc(d, 3 * MiB);
    unsetenv("EMBER_NO_CACHE");
    em_memory_stats s = fake_stats(d);
    CHECK(!s.caching);
    CHECK(a.size == 1024 && b.size == 3 * MiB);
    EXPECT(d, 1024 + 3 * MiB, 1024 + 3 * MiB, 1000 + 3 * MiB, 2, 2, 0, 0, 0);
    em__mem_free(&fake_be, d, &a);                 /* straight back to the device */
    EXPECT(d, 3 * MiB, 3 * MiB, 3 * MiB, 1, 1, 0, 0, 0);
    em_block c = must_alloc(d, 1000);
    em__mem_free(&fake_be, d, &c);
    em__mem_free(&fake_be, d, &b);
    EXPECT(d, 0, 0, 0, 0, 0, 0, 0, 0);
    s = fake_stats(d);
    CHECK(s.num_raw_allocs == 3 && s.num_raw_frees == 3);
    CHECK(fake[d.index].calls == 3 && fake[d.index].live == 0);
}

/* Ember's policy: a small request that no small block fits takes its segment out of the
 * smallest free large block of at least 2 MiB, and that memory goes back to the large pool
 * when the small segment's last block is freed; PyTorch's policy never does. */
static void test_nested_small_segments(void) {
    em_device d = fake_device(0);
    const int64_t L = 20 * MiB;
    em_block big = must_alloc(d, 3 * MiB);           /* a 20 MiB segment: 17 MiB free after it */
    EXPECT(d, 3 * MiB, L, 3 * MiB, 1, 1, 17 * MiB, 17 * MiB, 0);
    em_block a = must_alloc(d, 1000);                 /* nested: the first 2 MiB of those 17 */
    CHECK(a.handle == big.handle && a.offset == 3 * MiB && a.size == 1024);
    EXPECT(d, 3 * MiB + 1024, L, 3 * MiB + 1000, 1, 2, 17 * MiB - 1024, 15 * MiB, 0);
    em_memory_stats s = fake_stats(d);
    CHECK(s.reserved_bytes[EM_MEMORY_SMALL_POOL].current == (int64_t)(2 * MiB));
    CHECK(s.reserved_bytes[EM_MEMORY_LARGE_POOL].current == (int64_t)(18 * MiB));
    CHECK(s.segment[EM_MEMORY_SMALL_POOL].current == 0 && s.num_raw_allocs == 1);
    em_block b = must_alloc(d, MiB);                  /* most of the nested segment's rest */
    CHECK(b.handle == a.handle && b.offset == 3 * MiB + 1024);
    em_block c = must_alloc(d, MiB);                  /* too big for what is left: a second one */
    CHECK(c.handle == big.handle && c.offset == 5 * MiB);
    stamp(&big, 1);
    stamp(&a, 2);
    stamp(&b, 3);
    stamp(&c, 4);
    CHECK(stamp_ok(&big, 1) && stamp_ok(&a, 2) && stamp_ok(&b, 3) && stamp_ok(&c, 4));
    em__mem_free(&fake_be, d, &a);
    em__mem_free(&fake_be, d, &b);                    /* the first one is whole: back to the large pool */
    EXPECT(d, 4 * MiB, L, 4 * MiB, 1, 2, 2 * MiB + 13 * MiB + MiB, 13 * MiB, 0);
    s = fake_stats(d);
    CHECK(s.reserved_bytes[EM_MEMORY_SMALL_POOL].current == (int64_t)(2 * MiB));
    em_block e = must_alloc(d, 2 * MiB - 256);        /* a large request takes that memory back */
    CHECK(e.handle == big.handle && e.offset == 3 * MiB && e.size == 2 * MiB);
    CHECK(stamp_ok(&big, 1) && stamp_ok(&c, 4));
    em__mem_free(&fake_be, d, &e);
    em__mem_free(&fake_be, d, &c);                    /* the second one goes back too */
    EXPECT(d, 3 * MiB, L, 3 * MiB, 1, 1, 17 * MiB, 17 * MiB, 0);
    /* work queued on a nested segment's block is queued on the large block it returns to */
    em_block q;
    CHECK_OK(em__mem_alloc_stream(&fake_be, d, 4096, 0, &q));
    CHECK(q.offset == 3 * MiB);                       /* nested in the hole again */
    em__mem_record_stream(&q, 1);
    em__mem_free(&fake_be, d, &q);
    int syncs = fake[d.index].syncs;
    CHECK_OK(em__mem_alloc_stream(&fake_be, d, 2 * MiB, 0, &e));
    CHECK(e.offset == 3 * MiB && fake[d.index].syncs == syncs + 1);
    em__mem_free(&fake_be, d, &e);
    em__mem_free(&fake_be, d, &big);                  /* the segment is whole again */
    EXPECT(d, 0, L, 0, 1, 0, 0, L, 1);
    s = fake_stats(d);
    CHECK(s.reserved_bytes[EM_MEMORY_SMALL_POOL].current == 0 && s.reserved_bytes[EM_MEMORY_LARGE_POOL].current == L);
    CHECK(s.reserved_bytes[EM_MEMORY_SMALL_POOL].peak == (int64_t)(4 * MiB));
    CHECK_OK(em_memory_empty_cache(d));
    EXPECT(d, 0, 0, 0, 0, 0, 0, 0, 0);

    setenv("EMBER_MEMORY_POLICY", "pytorch", 1);
    em_device p = fake_device(0);
    CHECK(fake_stats(p).caching);                     /* creates the device's state: reads the policy */
    unsetenv("EMBER_MEMORY_POLICY");
    big = must_alloc(p, 3 * MiB);
    a = must_alloc(p, 1000);                          /* a segment of its own */
    CHECK(a.handle != big.handle && a.offset == 0);
    EXPECT(p, 3 * MiB + 1024, L + 2 * MiB, 3 * MiB + 1000, 2, 2, 17 * MiB + 2 * MiB - 1024, 17 * MiB, 0);
    em__mem_free(&fake_be, p, &a);
    em__mem_free(&fake_be, p, &big);
    CHECK_OK(em_memory_empty_cache(p));
    CHECK(fake[p.index].live == 0);
}

/* A block used by another queue is reused only after waiting for the device. */
static void test_streams(void) {
    em_device d = fake_device(0);
    em_block a;
    CHECK_OK(em__mem_alloc_stream(&fake_be, d, 4096, 0, &a));
    em__mem_free(&fake_be, d, &a);
    CHECK_OK(em__mem_alloc_stream(&fake_be, d, 4096, 0, &a));   /* same queue: no wait */
    CHECK(fake[d.index].syncs == 0);
    em__mem_record_stream(&a, 1);
    em__mem_free(&fake_be, d, &a);
    CHECK_OK(em__mem_alloc_stream(&fake_be, d, 4096, 0, &a));   /* queue 1 may still use it */
    CHECK(fake[d.index].syncs == 1 && fake_stats(d).num_stream_waits == 1);
    em__mem_free(&fake_be, d, &a);
    CHECK_OK(em__mem_alloc_stream(&fake_be, d, 4096, 2, &a));   /* queue 0 used it, now queue 2 */
    CHECK(fake[d.index].syncs == 2);
    em__mem_free(&fake_be, d, &a);
    CHECK(em__mem_alloc_stream(&fake_be, d, 16, 64, &a) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "stream 64");
    CHECK_OK(em_memory_empty_cache(d));
    CHECK(fake[d.index].live == 0);
}

static void test_memory_summary_table(void) {
    em_device d = fake_device(0);
    em_block a = must_alloc(d, 1000), b = must_alloc(d, 3 * MiB);
    char buf[8192];
    size_t n = em_memory_summary(d, buf, sizeof buf);
    CHECK(n == strlen(buf) && n > 1000);
    CHECK(strstr(buf, "Ember memory summary, device opencl:") != NULL);
    const char *rows[] = {"Allocated memory", "Active memory", "Requested memory", "GPU reserved memory",
                          "Non-releasable memory", "Allocations", "Active allocs", "GPU reserved segments",
                          "from large pool", "from small pool", "Cur Usage", "Peak Usage", "Tot Alloc",
                          "Tot Freed"};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) CHECK(strstr(buf, rows[i]) != NULL);
    CHECK(strstr(buf, "| Allocated memory      |    3073 KB |    3073 KB |    3073 KB |       0 B  |") != NULL);
    CHECK(strstr(buf, "|       from small pool |       1 KB |       1 KB |       1 KB |       0 B  |") != NULL);
    CHECK(strstr(buf, "| GPU reserved segments |       2    |       2    |       2    |       0    |") != NULL);
    for (const char *p = buf; *p;) {   /* a box: every line 77 characters */
        const char *nl = strchr(p, '\n');
        CHECK(nl && nl - p == 77);
        if (!nl) break;
        p = nl + 1;
    }
    char small[100];
    CHECK(em_memory_summary(d, small, sizeof small) == n && strlen(small) == sizeof small - 1);
    CHECK(em_memory_summary(d, NULL, 0) == n);
    em__mem_free(&fake_be, d, &a);
    em__mem_free(&fake_be, d, &b);
    CHECK_OK(em_memory_empty_cache(d));
    CHECK(em_memory_summary(EM_DEVICE(EM_DEVICE_TYPE_COUNT, 0), buf, sizeof buf) == 0 && buf[0] == '\0');
    CHECK_ERROR(EM_ERR_DEVICE, "no allocator for device");
}

static void test_untouched_device_reports_zero(void) {
    em_device d = fake_device(0);
    CHECK(em_memory_allocated(d) == 0 && em_memory_reserved(d) == 0 && em_memory_max_reserved(d) == 0);
    CHECK_OK(em_memory_empty_cache(d));
    em_memory_stats s = fake_stats(d);
    CHECK(s.segment[0].current == 0 && s.cap == -1 && s.caching);
    CHECK(em_memory_get_stats(d, NULL) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "'out' is NULL");
}

int main(void) {
    unsetenv("EMBER_NO_CACHE");
    unsetenv("EMBER_MEMORY_CAP");
    unsetenv("EMBER_MEMORY_POLICY");
    RUN(test_scripted_sequence);
    RUN(test_rounding_and_pools);
    RUN(test_matches_pytorch_policy);
    RUN(test_matches_release_on_grow_policy);
    RUN(test_release_on_grow);
    RUN(test_peak_policy_holds_the_allocated_peak);
    RUN(test_peak_policy_rules);
    RUN(test_no_overlap);
    RUN(test_fragmentation);
    RUN(test_steady_state_reuse);
    RUN(test_caching_off);
    RUN(test_nested_small_segments);
    RUN(test_streams);
    RUN(test_memory_summary_table);
    RUN(test_untouched_device_reports_zero);
    return test_summary();
}
