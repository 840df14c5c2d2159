/* The on-disk cache of compiled kernels (PTX), keyed by a hash of what produced them. */
#include "cuda_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void em__cuda_cache_dir(char *buf, size_t size) {
    const char *d = getenv("EMBER_CACHE_DIR");
    if (d && *d) { snprintf(buf, size, "%s", d); return; }
    d = getenv("XDG_CACHE_HOME");
    if (d && *d) { snprintf(buf, size, "%s/ember", d); return; }
    d = getenv("HOME");
    if (d && *d) { snprintf(buf, size, "%s/.cache/ember", d); return; }
    buf[0] = '\0';
}

/* Two 64-bit lanes: FNV-1a and a multiply-rotate hash, each finished with splitmix64's
 * mixer. Not cryptographic; the file header also records the label, checked on load. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void hash_bytes(uint64_t h[2], const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h[0] = (h[0] ^ p[i]) * 0x100000001b3ULL;
        h[1] = ((h[1] << 5) | (h[1] >> 59)) ^ p[i];
        h[1] *= 0x9e3779b97f4a7c15ULL;
    }
}

em_cuda_cache_key em__cuda_cache_key(const char *const *parts, size_t nparts) {
    uint64_t h[2] = {0xcbf29ce484222325ULL, 0x243f6a8885a308d3ULL};
    for (size_t i = 0; i < nparts; i++) {
        const char *p = parts[i] ? parts[i] : "";
        uint64_t len = strlen(p);
        /* the length first, so that ("ab", "c") and ("a", "bc") differ */
        hash_bytes(h, (const unsigned char *)&len, sizeof len);
        hash_bytes(h, (const unsigned char *)p, (size_t)len);
    }
    em_cuda_cache_key k;
    snprintf(k.hex, sizeof k.hex, "%016llx%016llx", (unsigned long long)mix64(h[0]),
             (unsigned long long)mix64(h[1] ^ h[0]));
    return k;
}

static void entry_path(char *buf, size_t size, const char *dir, em_cuda_cache_key key,
                       const char *ext) {
    snprintf(buf, size, "%s/cuda-%s.%s", dir, key.hex, ext);
}

#define HEADER_FMT "ember-cuda-cache v1 %s\n"

char *em__cuda_cache_load(const char *dir, em_cuda_cache_key key, const char *ext,
                          const char *label, size_t *size) {
    if (!dir || !*dir) return NULL;
    char path[1024];
    entry_path(path, sizeof path, dir, key, ext);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *data = NULL;
    char header[512];
    snprintf(header, sizeof header, HEADER_FMT, label);
    size_t hlen = strlen(header);
    char got[512];
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || (size_t)st.st_size < hlen ||
        fread(got, 1, hlen, f) != hlen || memcmp(got, header, hlen) != 0)
        goto done; /* foreign, truncated or stale: recompile */
    size_t n = (size_t)st.st_size - hlen;
    data = malloc(n + 1);
    if (!data) goto done;
    if (fread(data, 1, n, f) != n) { free(data); data = NULL; goto done; }
    data[n] = '\0';
    if (size) *size = n;
done:
    fclose(f);
    return data;
}

/* mkdir -p; true when dir exists afterwards. */
static bool make_dirs(const char *dir) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return false;
        *p = '/';
    }
    return mkdir(tmp, 0755) == 0 || errno == EEXIST;
}

bool em__cuda_cache_store(const char *dir, em_cuda_cache_key key, const char *ext,
                          const char *label, const char *data, size_t size) {
    if (!dir || !*dir || !make_dirs(dir)) return false;
    char path[1024], tmp[1100];
    entry_path(path, sizeof path, dir, key, ext);
    snprintf(tmp, sizeof tmp, "%s.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) return false;
    FILE *f = fdopen(fd, "wb");
    if (!f) { close(fd); unlink(tmp); return false; }
    bool ok = fprintf(f, HEADER_FMT, label) > 0 && fwrite(data, 1, size, f) == size;
    ok = (fclose(f) == 0) && ok;
    /* rename is atomic: a concurrent reader sees the old entry or the whole new one */
    if (!ok || rename(tmp, path) != 0) { unlink(tmp); return false; }
    return true;
}
