/* A model folder's weights: model.safetensors, or the shards model.safetensors.index.json
 * names, matched one to one against the parameters the config gives the model.
 *
 * Each file's header is read with pread and parsed by src/data's safetensors parser (which
 * checks it against the file's length: a truncated shard is an error here, at load); then
 * the file is mapped read-only. On the CPU a weight whose dtype is the model's is a read-only
 * tensor over the mapping, imported through DLPack: its deleter drops a reference to the
 * mapping, so the mapping lives exactly as long as the last weight that views it, and the
 * model's pages are read from the file when they are first touched. Any other weight is
 * copied (converted to the model's dtype, moved to its device) in pieces of at most
 * CHUNK_BYTES of the file, and the pages already copied are given back to the kernel
 * (madvise), so host memory never holds a second copy of the model. The mapping is advised
 * into huge pages: the page cache then reads the file in 2 MiB folios where it can.
 *
 * With em_model_opts.read_weights, a file is read into anonymous memory instead of mapped
 * (and that memory advised into 2 MiB pages): the weights are then the process's own copy,
 * which a decoder streams faster than the page cache's 4 KiB pages (fewer TLB misses, the
 * prefetchers kept ahead); the views over it are made exactly as over a mapping. */
#define _DEFAULT_SOURCE /* madvise */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ember/dlpack.h>
#include "models_internal.h"
#include "../data/json.h"
#include "../data/parsers.h"

#define CHUNK_BYTES ((size_t)64 << 20)

/* One mapped file, shared by the tensors that view it. */
typedef struct file_map {
    atomic_int refs;
    void *addr;
    size_t len;
    bool anonymous;   /* the file read into anonymous memory: its pages cannot be dropped and re-read */
} file_map;

static void map_release(file_map *m) {
    if (m && atomic_fetch_sub(&m->refs, 1) == 1) {
        if (m->len) munmap(m->addr, m->len);
        free(m);
    }
}

/* A DLPack managed tensor over part of a mapping. */
typedef struct map_view {
    DLManagedTensorVersioned dl;
    int64_t shape[EM_MAX_DIMS];
    file_map *map;
} map_view;

static void map_view_delete(DLManagedTensorVersioned *self) {
    map_view *v = self->manager_ctx;
    map_release(v->map);
    free(v);
}

/* A read-only CPU tensor (scoped) over bytes of the mapping, holding a reference to it. */
static em_tensor *view_of(file_map *map, const uint8_t *bytes, em_dtype dt, int ndim, const int64_t *shape) {
    map_view *v = calloc(1, sizeof *v);
    if (!v) {
        em_error(EM_ERR_OUT_OF_MEMORY, "em_model_load: out of host memory");
        return NULL;
    }
    for (int i = 0; i < ndim; i++) v->shape[i] = shape[i];
    DLDataType dl_dt = dt == EM_BF16 ? (DLDataType){kDLBfloat, 16, 1}
                                     : (DLDataType){kDLFloat, (uint8_t)(8 * em_dtype_size(dt)), 1};
    v->dl = (DLManagedTensorVersioned){
        .version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION},
        .manager_ctx = v,
        .deleter = map_view_delete,
        .flags = DLPACK_FLAG_BITMASK_READ_ONLY,
        .dl_tensor = {.data = (void *)bytes, .device = {kDLCPU, 0}, .ndim = ndim, .dtype = dl_dt, .shape = v->shape},
    };
    atomic_fetch_add(&map->refs, 1);
    v->map = map;
    em_tensor *t = em_from_dlpack(&v->dl);
    if (!t) map_view_delete(&v->dl);   /* not taken: still ours */
    return t;
}

/* A copy of a weight on device in dt (scoped, as em_empty made it), made in pieces of rows
 * (dim 0). */
static em_tensor *copy_of(file_map *map, const uint8_t *bytes, em_dtype src_dt, int ndim, const int64_t *shape,
                          em_device device, em_dtype dt) {
    em_shape s = {ndim, {0}};
    for (int i = 0; i < ndim; i++) s.d[i] = shape[i];
    em_tensor *dst = em_empty(s, EM_OPTS(.dtype = dt, .device = device));
    if (!dst) return NULL;
    int64_t rows = shape[0], row_elems = 1;
    for (int i = 1; i < ndim; i++) row_elems *= shape[i];
    size_t esize = em_dtype_size(src_dt), row_bytes = (size_t)row_elems * esize;
    int64_t per_chunk = row_bytes ? (int64_t)(CHUNK_BYTES / row_bytes) : rows;
    if (per_chunk < 1) per_chunk = 1;
    bool aligned = (uintptr_t)bytes % esize == 0;
    long page = sysconf(_SC_PAGESIZE);
    for (int64_t r0 = 0; r0 < rows; r0 += per_chunk) {
        int64_t n = rows - r0 < per_chunk ? rows - r0 : per_chunk;
        const uint8_t *from = bytes + (size_t)r0 * row_bytes;
        size_t len = (size_t)n * row_bytes;
        em_shape piece_shape = s;
        piece_shape.d[0] = n;
        em_scope scope = em_scope_begin();
        em_tensor *piece;
        if (aligned) {
            piece = view_of(map, from, src_dt, ndim, piece_shape.d);
        } else {   /* an offset the format allows but a typed read does not: through an aligned copy */
            void *bounce = malloc(len ? len : 1);
            if (!bounce) {
                em_scope_end(scope);
                em_error(EM_ERR_OUT_OF_MEMORY, "em_model_load: out of host memory for a %zu-byte piece", len);
                return NULL;
            }
            memcpy(bounce, from, len);
            piece = em_from_data(bounce, src_dt, piece_shape, EM_OPTS(.dtype = src_dt));
            free(bounce);
        }
        em_status st = piece ? em_copy_(em_narrow(dst, 0, r0, n), piece) : em_last_status();
        em_scope_end(scope);
        if (st != EM_OK) return NULL;   /* (dst is the caller's scope's to release) */
        /* these pages are copied: give them back (the mapping reads them again if touched) */
        uintptr_t lo = (uintptr_t)from & ~(uintptr_t)(page - 1);
        if (!map->anonymous) madvise((void *)lo, (size_t)((uintptr_t)from + len - lo), MADV_DONTNEED);
    }
    return dst;
}

/* ---- the files ---- */

typedef struct shard {
    char path[4096];
    const char *file;     /* the name in the folder (into path) */
    em__st_file st;
    file_map *map;
} shard;

static void shard_close(shard *s) {
    em__st_file_free(&s->st);
    map_release(s->map);
    s->map = NULL;
}

#define HUGE_PAGE ((size_t)2 << 20)

/* The file's len bytes read into anonymous memory starting at a 2 MiB boundary and advised
 * into huge pages, then made read-only; into m. */
static em_status read_into_memory(const char *path, int fd, size_t len, file_map *m) {
    size_t span = (len + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    uint8_t *raw = mmap(NULL, span + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return em_error(EM_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes to read it into: %s", path, len,
                        strerror(errno));
    /* keep the aligned span only: munmap of the whole mapping later needs its exact bounds */
    uint8_t *at = (uint8_t *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (at > raw) munmap(raw, (size_t)(at - raw));
    if (at + span < raw + span + HUGE_PAGE) munmap(at + span, (size_t)(raw + span + HUGE_PAGE - (at + span)));
    madvise(at, span, MADV_HUGEPAGE);   /* advice: without huge pages the copy still works */
    size_t have = 0;
    while (have < len) {
        size_t want = len - have < ((size_t)1 << 30) ? len - have : ((size_t)1 << 30);
        ssize_t r = pread(fd, at + have, want, (off_t)have);
        if (r <= 0) {
            munmap(at, span);
            return em_error(EM_ERR_IO, "%s: cannot read its %zu bytes: %s", path, len,
                            r < 0 ? strerror(errno) : "the file ended");
        }
        have += (size_t)r;
    }
    mprotect(at, span, PROT_READ);   /* read-only, as a mapping of the file is */
    m->addr = at;
    m->len = span;
    m->anonymous = true;
    return EM_OK;
}

/* Reads path's header and maps the file (read_in: reads it into memory). */
static em_status shard_open(shard *s, bool read_in) {
    int fd = open(s->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return em_error(EM_ERR_IO, "%s: cannot open: %s", s->path, strerror(errno));
    struct stat sb;
    em_status st = EM_OK;
    uint8_t *head = NULL;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = em_error(EM_ERR_IO, "%s: not a regular file (model weights are mapped)", s->path);
        goto done;
    }
    uint64_t file_len = (uint64_t)sb.st_size, hl = 0;
    uint8_t len8[8] = {0};
    ssize_t got = pread(fd, len8, 8, 0);
    if (em__safetensors_header_length(s->path, len8, got > 0 ? (size_t)got : 0, file_len, &hl) != EM_OK) {
        st = em_last_status();
        goto done;
    }
    head = malloc((size_t)(8 + hl));
    if (!head) {
        st = em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory for its %llu-byte header", s->path, (unsigned long long)hl);
        goto done;
    }
    size_t have = 0;
    while (have < 8 + hl) {
        ssize_t r = pread(fd, head + have, (size_t)(8 + hl) - have, (off_t)have);
        if (r <= 0) {
            st = em_error(EM_ERR_IO, "%s: cannot read its header: %s", s->path, r < 0 ? strerror(errno) : "the file ended");
            goto done;
        }
        have += (size_t)r;
    }
    if (em__safetensors_parse_header(s->path, head, have, file_len, &s->st) != EM_OK) {
        st = em_last_status();
        goto done;
    }
    s->map = calloc(1, sizeof *s->map);
    if (!s->map) {
        st = em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", s->path);
        goto done;
    }
    atomic_init(&s->map->refs, 1);
    if (file_len > 0 && read_in) {
        st = read_into_memory(s->path, fd, (size_t)file_len, s->map);
    } else if (file_len > 0) {
        void *a = mmap(NULL, (size_t)file_len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (a == MAP_FAILED) {
            st = em_error(EM_ERR_IO, "%s: cannot map its %llu bytes: %s", s->path, (unsigned long long)file_len,
                          strerror(errno));
            goto done;
        }
        /* Advice, free at load: pages this mapping reads from the file come into the page
         * cache as 2 MiB folios mapped whole (where the kernel and the file system can), so
         * a decoder streaming the weights takes a TLB miss per 2 MiB, not per 4 KiB (on the
         * 1B's decode within the noise, the GEMV's page-ahead prefetch hiding most of that
         * cost: docs/BENCHMARKS.md). Pages already cached in small folios (the file read by
         * something else first) stay so. EMBER_CPU_HUGE_PAGES=0 leaves the mapping alone. */
        const char *huge = getenv("EMBER_CPU_HUGE_PAGES");
        if (!huge || strcmp(huge, "0") != 0) (void)madvise(a, (size_t)file_len, MADV_HUGEPAGE);
        s->map->addr = a;
        s->map->len = (size_t)file_len;
    }
done:
    free(head);
    close(fd);
    if (st != EM_OK) shard_close(s);
    return st;
}

/* model.safetensors.index.json: weight_map's names and files. */
typedef struct weight_index {
    em__json root;
    const em__json *map;   /* the weight_map object */
    bool *seen;            /* per entry: found in its file */
} weight_index;

static em_status read_index(const char *path, weight_index *ix) {
    em__file_map fm;
    if (em__file_map_open(path, &fm) != EM_OK) return em_last_status();
    em_status s = em__json_parse_file(path, (const char *)fm.data, fm.len, &ix->root);
    em__file_map_close(&fm);
    if (s != EM_OK) return s;
    ix->map = em__json_get(&ix->root, "weight_map");
    if (ix->root.type != EM__JSON_OBJECT || !ix->map || ix->map->type != EM__JSON_OBJECT)
        return em_error(EM_ERR_FORMAT, "%s: expected an object with a 'weight_map' object", path);
    for (int i = 0; i < ix->map->count; i++) {
        const em__json *v = &ix->map->items[i];
        if (v->type != EM__JSON_STRING || !v->len || strchr(v->str, '/') || !strcmp(v->str, ".") || !strcmp(v->str, ".."))
            return em_error(EM_ERR_FORMAT, "%s: weight_map['%.200s'] must name a file of the folder", path,
                            ix->map->keys[i]);
    }
    ix->seen = calloc((size_t)ix->map->count + 1, 1);
    if (!ix->seen) return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", path);
    return EM_OK;
}

static int index_find(const weight_index *ix, const char *name) {
    for (int i = 0; i < ix->map->count; i++)
        if (!strcmp(ix->map->keys[i], name)) return i;
    return -1;
}

/* The name a file's tensor has in transformers' model, or NULL for a tensor to skip: the
 * buffers older checkpoints saved, and a tied model's lm_head.weight (transformers ties it to
 * the embedding whatever the file holds). GPT-2's original files name the tensors of
 * GPT2Model, without the "transformer." of GPT2LMHeadModel. */
static const char *canonical_name(const char *name, const em_model_config *cfg, char *buf, size_t size) {
    size_t n = strlen(name);
    const char *tail;
    if (cfg->tie_word_embeddings && !strcmp(name, "lm_head.weight")) return NULL;
    if (cfg->family == EM_MODEL_LLAMA) {
        tail = ".rotary_emb.inv_freq";
        if (n > strlen(tail) && !strcmp(name + n - strlen(tail), tail)) return NULL;
        return name;
    }
    const char *skip[] = {".attn.bias", ".attn.masked_bias"};
    for (int i = 0; i < 2; i++)
        if (n > strlen(skip[i]) && !strcmp(name + n - strlen(skip[i]), skip[i])) return NULL;
    if (!strncmp(name, "transformer.", 12) || !strcmp(name, "lm_head.weight")) return name;
    if (snprintf(buf, size, "transformer.%s", name) >= (int)size) return name;
    return buf;
}

static void shape_text(char *buf, size_t size, int ndim, const int64_t *shape) {
    size_t at = 0;
    at += (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && at < size; i++)
        at += (size_t)snprintf(buf + at, size - at, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (at < size) snprintf(buf + at, size - at, "]");
}

typedef struct loader {
    const char *dir;
    const em_model_config *cfg;
    model_param *params;
    int nparams;
    em_device device;
    em_dtype dtype;
    bool read_in;        /* files read into memory, not mapped (the CPU only) */
    size_t mapped;
    weight_index ix;
    bool indexed;
    const char **from;   /* per parameter: the file it came from */
} loader;

static model_param *find_param(loader *L, const char *name, int *at) {
    for (int i = 0; i < L->nparams; i++)
        if (!strcmp(L->params[i].name, name)) {
            *at = i;
            return &L->params[i];
        }
    return NULL;
}

/* Every tensor of one shard into its parameter. */
static em_status load_shard(loader *L, shard *s) {
    const em_model_config *cfg = L->cfg;
    for (int i = 0; i < s->st.count; i++) {
        const em__st_tensor *t = &s->st.tensors[i];
        char buf[160];
        const char *name = canonical_name(t->name, cfg, buf, sizeof buf);
        if (L->indexed) {
            int k = index_find(&L->ix, t->name);
            if (k < 0)
                return em_error(EM_ERR_FORMAT, "%s: tensor '%.200s' is not in model.safetensors.index.json's "
                                "weight_map", s->path, t->name);
            if (strcmp(L->ix.map->items[k].str, s->file))
                return em_error(EM_ERR_FORMAT, "%s: tensor '%.200s' is here, but model.safetensors.index.json puts it "
                                "in %.200s", s->path, t->name, L->ix.map->items[k].str);
            L->ix.seen[k] = true;
        }
        if (!name) continue;
        int at;
        model_param *p = find_param(L, name, &at);
        if (!p)
            return em_error(EM_ERR_FORMAT, "%s: tensor '%.200s' is not a parameter of %s with this config.json (%lld "
                            "layers, hidden_size %lld)", s->path, t->name, cfg->architecture,
                            (long long)cfg->num_hidden_layers, (long long)cfg->hidden_size);
        if (p->t)
            return em_error(EM_ERR_FORMAT, "%s: tensor '%.200s' is also in %s", s->path, t->name, L->from[at]);
        if (t->dtype != EM_F32 && t->dtype != EM_BF16 && t->dtype != EM_F16)
            return em_error(EM_ERR_DTYPE, "%s: tensor '%.200s' is %s: model weights are float32, bfloat16 or "
                            "float16", s->path, t->name, em_dtype_name(t->dtype));
        bool same = t->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
        if (!same) {
            char got[120], want[120];
            shape_text(got, sizeof got, t->ndim, t->shape);
            shape_text(want, sizeof want, p->ndim, p->shape);
            return em_error(EM_ERR_SHAPE, "%s: tensor '%.200s' has shape %s, but config.json's %s (hidden_size %lld, "
                            "intermediate_size %lld, %lld heads of %lld, %lld key-value heads, vocab_size %lld) gives "
                            "it %s", s->path, t->name, got, cfg->architecture, (long long)cfg->hidden_size,
                            (long long)cfg->intermediate_size, (long long)cfg->num_attention_heads,
                            (long long)cfg->head_dim, (long long)cfg->num_key_value_heads,
                            (long long)cfg->vocab_size, want);
        }
        const uint8_t *bytes = (const uint8_t *)s->map->addr + s->st.data_start + t->begin;
        em_scope scope = em_scope_begin();
        bool view = L->device.type == EM_CPU && t->dtype == L->dtype && (uintptr_t)bytes % em_dtype_size(t->dtype) == 0;
        em_tensor *w = view ? view_of(s->map, bytes, t->dtype, t->ndim, t->shape)
                            : copy_of(s->map, bytes, t->dtype, t->ndim, t->shape, L->device, L->dtype);
        if (w) p->t = em_keep(w);
        p->read_only = view;
        em_scope_end(scope);
        if (!p->t) return em__model_error_prefix("%s: tensor '%.200s'", s->path, t->name);
        L->from[at] = s->file;
        if (view && !s->map->anonymous) L->mapped += (size_t)(t->end - t->begin);
    }
    return EM_OK;
}

static em_status check_complete(loader *L, const char *source) {
    if (L->indexed)
        for (int k = 0; k < L->ix.map->count; k++)
            if (!L->ix.seen[k])
                return em_error(EM_ERR_FORMAT, "%s/model.safetensors.index.json: tensor '%.200s' is in none of the "
                                "files: the index puts it in %.200s, which does not hold it", L->dir,
                                L->ix.map->keys[k], L->ix.map->items[k].str);
    for (int i = 0; i < L->nparams; i++)
        if (!L->params[i].t)
            return em_error(EM_ERR_FORMAT, "%s: parameter '%s' of %s is missing from %s", L->dir, L->params[i].name,
                            L->cfg->architecture, source);
    return EM_OK;
}

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

em_status em__model_load_weights(const char *dir, const em_model_config *cfg, model_param *params, int nparams,
                                 em_device device, em_dtype dtype, bool read_weights, size_t *mapped) {
    loader L = {.dir = dir, .cfg = cfg, .params = params, .nparams = nparams, .device = device, .dtype = dtype,
                .read_in = read_weights && device.type == EM_CPU};
    shard *shards = NULL;
    int nshards = 0;
    char path[4096];
    em_status st = EM_OK;
    L.from = calloc((size_t)nparams + 1, sizeof *L.from);
    if (!L.from) return em_error(EM_ERR_OUT_OF_MEMORY, "em_model_load: out of host memory");
    /* transformers' order: a single file first, then an index of shards */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const char *source = "model.safetensors";
    if (!exists(path)) {
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        if (!exists(path)) {
            st = em_error(EM_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json (Ember reads the "
                          "weights from safetensors files)", dir);
            goto done;
        }
        L.indexed = true;
        source = "every shard of model.safetensors.index.json";
        if (read_index(path, &L.ix) != EM_OK) {
            st = em_last_status();
            goto done;
        }
    }
    /* the files: the single one, or each distinct file of the index, in the index's order */
    int most = L.indexed ? L.ix.map->count : 1;
    shards = calloc((size_t)most + 1, sizeof *shards);
    if (!shards) {
        st = em_error(EM_ERR_OUT_OF_MEMORY, "em_model_load: out of host memory");
        goto done;
    }
    for (int k = 0; k < most; k++) {
        const char *file = L.indexed ? L.ix.map->items[k].str : "model.safetensors";
        bool known = false;
        for (int j = 0; j < nshards && !known; j++) known = !strcmp(shards[j].file, file);
        if (known) continue;
        shard *s = &shards[nshards];
        int len = snprintf(s->path, sizeof s->path, "%s/%s", dir, file);
        if (len < 0 || (size_t)len >= sizeof s->path) {
            st = em_error(EM_ERR_ARGUMENT, "em_model_load: the path of %s is too long", file);
            goto done;
        }
        s->file = s->path + strlen(dir) + 1;
        if (shard_open(s, L.read_in) != EM_OK) {
            st = L.indexed ? em__model_error_prefix("%s/model.safetensors.index.json names %s", dir, file)
                           : em_last_status();
            goto done;
        }
        nshards++;
        if (load_shard(&L, s) != EM_OK) {
            st = em_last_status();
            goto done;
        }
    }
    st = check_complete(&L, source);
done:
    for (int j = 0; j < nshards; j++) shard_close(&shards[j]);   /* the weights keep their mappings */
    free(shards);
    if (L.indexed) {
        em__json_free(&L.ix.root);
        free(L.ix.seen);
    }
    free(L.from);
    if (st != EM_OK) {
        for (int i = 0; i < nparams; i++) {
            em_release(params[i].t);
            params[i].t = NULL;
        }
        return st;
    }
    *mapped = L.mapped;
    return EM_OK;
}
