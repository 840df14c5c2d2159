/* ZeRO's sharded checkpoints (include/ember/zero.h): a folder with one em_checkpoint_save file
 * per rank (its float32 master shards "unitK" and their optimizer states, padding included)
 * and the layout in each file's metadata, so that a load on any number of ranks can take
 * from each old shard the elements its new shard covers. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <ember/autograd.h>
#include <ember/io.h>
#include <ember/ops.h>
#include "../core/internal_api.h"
#include "zero_internal.h"

#define ZERO_PATH_MAX 4096

static void shard_path(char *out, size_t size, const char *dir, int rank) {
    snprintf(out, size, "%s/rank-%d.safetensors", dir, rank);
}

/* Do all ranks agree that `ok`? The group's verdict (a collective); false also when the
 * vote itself fails. */
static bool all_ok(em_zero *z, bool ok) {
    em_scope s = em_scope_begin();
    em_tensor *flag = em_full(EM_SHAPE(1), ok ? 1.0 : 0.0, EM_OPTS(0));
    bool agreed = flag && em_dist_all_reduce(z->g, flag, EM_REDUCE_MIN) == EM_OK && em_item(flag) == 1.0;
    em_scope_end(s);
    return agreed;
}

/* "name:numel,name:numel,...": what a unit holds, compared on load. */
static char *unit_layout(const zero_unit *u) {
    size_t cap = 64;
    for (int i = 0; i < u->nparams; i++) cap += strlen(u->params[i].name) + 24;
    char *out = malloc(cap);
    if (!out) return NULL;
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < u->nparams; i++)
        len += (size_t)snprintf(out + len, cap - len, "%s%s:%" PRId64, i ? "," : "", u->params[i].name, u->params[i].numel);
    return out;
}

/* The metadata pairs: the caller's, then ZeRO's. */
typedef struct meta_list {
    char **keys, **values;
    int n, cap;
} meta_list;

static bool meta_put(meta_list *m, const char *key, const char *value) {
    if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 32;
        char **k = realloc(m->keys, (size_t)cap * sizeof *k);
        if (k) m->keys = k;
        char **v = realloc(m->values, (size_t)cap * sizeof *v);
        if (v) m->values = v;
        if (!k || !v) return false;
        m->cap = cap;
    }
    m->keys[m->n] = strdup(key);
    m->values[m->n] = strdup(value);
    if (!m->keys[m->n] || !m->values[m->n]) {
        free(m->keys[m->n]);
        free(m->values[m->n]);
        return false;
    }
    m->n++;
    return true;
}

static void meta_free(meta_list *m) {
    for (int i = 0; i < m->n; i++) {
        free(m->keys[i]);
        free(m->values[i]);
    }
    free(m->keys);
    free(m->values);
}

static bool meta_num(meta_list *m, const char *key, double v) {
    char buf[64];
    snprintf(buf, sizeof buf, "%.17g", v);
    return meta_put(m, key, buf);
}

/* This rank's file, or an error (recorded). */
static em_status save_mine(em_zero *z, const char *dir, const char *const *keys, const char *const *values, int nmeta) {
    meta_list m = {0};
    bool ok = true;
    for (int i = 0; i < nmeta && ok; i++) {
        if (!keys[i] || !values[i] || !strncmp(keys[i], "zero.", 5)) {
            meta_free(&m);
            return em_error(EM_ERR_ARGUMENT, "em_zero_save: metadata pair %d is %s", i,
                            !keys[i] || !values[i] ? "NULL" : "under \"zero.\", which ZeRO's layout uses");
        }
        ok = meta_put(&m, keys[i], values[i]);
    }
    const em_optimizer_ops *ops = em_optim_ops(z->opt);
    ok = ok && meta_num(&m, "zero.world_size", z->world) && meta_num(&m, "zero.rank", z->rank) &&
         meta_num(&m, "zero.stage", z->stage) && meta_num(&m, "zero.units", z->nunits) &&
         meta_num(&m, "zero.steps", (double)em_optim_steps(z->opt)) && meta_num(&m, "zero.lr", em_optim_lr(z->opt)) &&
         meta_put(&m, "zero.dtype", em_dtype_name(z->dtype));
    for (int k = 0; k < z->nunits && ok; k++) {
        zero_unit *u = &z->units[k];
        char key[256];
        snprintf(key, sizeof key, "zero.unit%d.numel", k);
        ok = meta_num(&m, key, (double)u->numel);
        snprintf(key, sizeof key, "zero.unit%d.shard", k);
        ok = ok && meta_num(&m, key, (double)u->shard);
        snprintf(key, sizeof key, "zero.unit%d.shard_start", k);
        ok = ok && meta_num(&m, key, (double)u->shard * z->rank);
        char *layout = ok ? unit_layout(u) : NULL;
        snprintf(key, sizeof key, "zero.unit%d.params", k);
        ok = layout && meta_put(&m, key, layout);
        free(layout);
        for (int c = -1; c < ops->nscalar && ok; c++) {
            const char *name = c < 0 ? "step" : ops->scalar_names[c];
            snprintf(key, sizeof key, "zero.unit%d.%s", k, name);
            ok = meta_num(&m, key, em_optim_scalar(z->opt, u->master, name));
        }
    }
    em_status st = ok ? EM_OK : em_error(EM_ERR_OUT_OF_MEMORY, "em_zero_save: out of host memory");
    char path[ZERO_PATH_MAX];
    shard_path(path, sizeof path, dir, z->rank);
    if (st == EM_OK)
        st = em_checkpoint_save(path, z->shards, z->opt, (const char *const *)m.keys, (const char *const *)m.values, m.n);
    meta_free(&m);
    return st;
}

em_status em_zero_save(em_zero *z, const char *dir, const char *const *keys, const char *const *values, int nmeta) {
    if (!z || !dir || nmeta < 0 || (nmeta > 0 && (!keys || !values)))
        return em__error_unless_pending(EM_ERR_ARGUMENT, "em_zero_save: %s", !z ? "z is NULL" : !dir ? "dir is NULL"
                                        : "expected nmeta >= 0 keys and values");
    if (!z->opt)
        return em_error(EM_ERR_ARGUMENT, "em_zero_save: the optimizer was freed by em_zero_unshard: save before it");
    em_status st = EM_OK;
    if (z->rank == 0 && mkdir(dir, 0777) != 0 && errno != EEXIST)
        st = em_error(EM_ERR_IO, "em_zero_save: cannot make the folder %s: %s", dir, strerror(errno));
    if (!all_ok(z, st == EM_OK))   /* the folder exists for every rank, or none writes */
        return st != EM_OK ? st : em__error_unless_pending(EM_ERR_IO, "em_zero_save: rank 0 could not make the folder %s", dir);
    st = save_mine(z, dir, keys, values, nmeta);
    if (!all_ok(z, st == EM_OK))
        return st != EM_OK ? st : em__error_unless_pending(EM_ERR_IO, "em_zero_save: another rank failed to write its shard into %s", dir);
    return EM_OK;
}

/* ---- load ---- */

static bool meta_i64(const em_safetensors *f, const char *key, int64_t *out) {
    const char *v = em_safetensors_metadata(f, key);
    if (!v) return false;
    char *end = NULL;
    double d = strtod(v, &end);
    if (end == v || *end || d != (double)(int64_t)d) return false;
    *out = (int64_t)d;
    return true;
}

static bool meta_f64(const em_safetensors *f, const char *key, double *out) {
    const char *v = em_safetensors_metadata(f, key);
    if (!v) return false;
    char *end = NULL;
    *out = strtod(v, &end);
    return end != v && !*end;
}

static bool has_tensor(const em_safetensors *f, const char *name) {
    for (int i = 0; i < em_safetensors_count(f); i++)
        if (!strcmp(em_safetensors_name(f, i), name)) return true;
    return false;
}

/* Does the folder's layout (rank 0's file) match z's units? */
static em_status check_layout(em_zero *z, const em_safetensors *f0, const char *path, int64_t *old_world) {
    int64_t units = 0;
    if (!meta_i64(f0, "zero.world_size", old_world) || *old_world < 1 || !meta_i64(f0, "zero.units", &units))
        return em_error(EM_ERR_FORMAT, "em_zero_load: %s: not a ZeRO shard (no zero.world_size / zero.units metadata)", path);
    if (units != z->nunits)
        return em_error(EM_ERR_ARGUMENT, "em_zero_load: %s holds %" PRId64 " units, this model has %d", path, units, z->nunits);
    for (int k = 0; k < z->nunits; k++) {
        char key[64];
        snprintf(key, sizeof key, "zero.unit%d.params", k);
        const char *saved = em_safetensors_metadata(f0, key);
        char *mine = unit_layout(&z->units[k]);
        if (!mine) return em_error(EM_ERR_OUT_OF_MEMORY, "em_zero_load: out of host memory");
        bool same = saved && !strcmp(saved, mine);
        em_status st = same ? EM_OK
                            : em_error(EM_ERR_ARGUMENT, "em_zero_load: %s: unit %d holds other parameters than this "
                                       "model's (saved \"%.200s\", here \"%.200s\")", path, k, saved ? saved : "none", mine);
        free(mine);
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

/* This rank's new masters and states, made from the old shards that overlap them, then
 * handed to the optimizer. Every file read is rank r's own business; nothing collective. */
static em_status load_mine(em_zero *z, const char *dir, em_safetensors *f0, int64_t old_world) {
    const em_optimizer_ops *ops = em_optim_ops(z->opt);
    em_safetensors **files = calloc((size_t)old_world, sizeof *files);
    if (!files) return em_error(EM_ERR_OUT_OF_MEMORY, "em_zero_load: out of host memory");
    files[0] = f0;
    em_status st = EM_OK;
    em_scope s = em_scope_begin();
    em_grad_mode mode = em_no_grad_begin();
    for (int k = 0; k < z->nunits && st == EM_OK; k++) {
        zero_unit *u = &z->units[k];
        int64_t old_shard = (u->numel + old_world - 1) / old_world;
        int64_t lo = (int64_t)z->rank * u->shard, hi = lo + u->shard < u->numel ? lo + u->shard : u->numel;
        em_tensor *master = em_zeros(EM_SHAPE(u->shard), EM_OPTS(0));
        em_tensor *states[8] = {0};
        bool present[8] = {0};
        char name[128];
        for (int c = 0; c < ops->nstate; c++) {
            snprintf(name, sizeof name, "optimizer.unit%d.%s", k, ops->state_names[c]);
            present[c] = has_tensor(f0, name);
            if (present[c] && !(states[c] = em_zeros(EM_SHAPE(u->shard), EM_OPTS(0)))) st = em_last_status();
        }
        if (!master) st = em_last_status();
        for (int64_t j = lo / (old_shard ? old_shard : 1); st == EM_OK && lo < hi && j < old_world; j++) {
            int64_t olo = j * old_shard, ohi = olo + old_shard < u->numel ? olo + old_shard : u->numel;
            int64_t a = olo > lo ? olo : lo, b = ohi < hi ? ohi : hi;
            if (a >= b) {
                if (olo >= hi) break;
                continue;
            }
            if (!files[j]) {
                char path[ZERO_PATH_MAX];
                shard_path(path, sizeof path, dir, (int)j);
                files[j] = em_safetensors_load(path, (em_device){EM_CPU, 0});
                if (!files[j]) {
                    st = em_last_status();
                    break;
                }
            }
            for (int c = -1; c < ops->nstate && st == EM_OK; c++) {
                if (c >= 0 && !present[c]) continue;
                if (c < 0) snprintf(name, sizeof name, "unit%d", k);
                else snprintf(name, sizeof name, "optimizer.unit%d.%s", k, ops->state_names[c]);
                em_tensor *t = em_safetensors_get(files[j], name);
                if (!t) {
                    st = em_last_status();
                    break;
                }
                if (em_numel(t) != old_shard) {
                    st = em_error(EM_ERR_FORMAT, "em_zero_load: %s: %s has %" PRId64 " elements, the layout says %" PRId64,
                                  em_safetensors_path(files[j]), name, em_numel(t), old_shard);
                    break;
                }
                st = em_copy_(em_narrow(c < 0 ? master : states[c], 0, a - lo, b - a), em_narrow(t, 0, a - olo, b - a));
            }
        }
        if (st == EM_OK) st = em_copy_(u->master, em_to(master, z->device));
        for (int c = 0; c < ops->nstate && st == EM_OK; c++)
            if (present[c]) st = em_optim_set_state(z->opt, u->master, ops->state_names[c], states[c]);
        for (int c = -1; c < ops->nscalar && st == EM_OK; c++) {
            const char *sname = c < 0 ? "step" : ops->scalar_names[c];
            double v = 0;
            snprintf(name, sizeof name, "zero.unit%d.%s", k, sname);
            st = meta_f64(f0, name, &v) ? em_optim_set_scalar(z->opt, u->master, sname, v)
                                        : em_error(EM_ERR_FORMAT, "em_zero_load: %s: no %s metadata", em_safetensors_path(f0), name);
        }
    }
    int64_t steps = 0;
    double lr = 0;
    if (st == EM_OK && (!meta_i64(f0, "zero.steps", &steps) || !meta_f64(f0, "zero.lr", &lr)))
        st = em_error(EM_ERR_FORMAT, "em_zero_load: %s: no zero.steps / zero.lr metadata", em_safetensors_path(f0));
    if (st == EM_OK) st = em_optim_set_steps(z->opt, steps);
    if (st == EM_OK) st = em_optim_set_lr(z->opt, lr);
    em_no_grad_end(mode);
    em_scope_end(s);
    for (int64_t j = 1; j < old_world; j++) em_safetensors_free(files[j]);
    free(files);
    return st;
}

em_status em_zero_load(em_zero *z, const char *dir, em_safetensors **meta) {
    if (meta) *meta = NULL;
    if (!z || !dir) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_zero_load: %s is NULL", !z ? "z" : "dir");
    if (!z->opt) return em_error(EM_ERR_ARGUMENT, "em_zero_load: the model was unsharded (em_zero_unshard): z cannot train");
    char path[ZERO_PATH_MAX];
    shard_path(path, sizeof path, dir, 0);
    em_safetensors *f0 = em_safetensors_load(path, (em_device){EM_CPU, 0});
    int64_t old_world = 0;
    em_status st = f0 ? check_layout(z, f0, path, &old_world) : em_last_status();
    if (st == EM_OK) st = load_mine(z, dir, f0, old_world);
    /* every rank has its shard, or none goes on: the compute copies are gathered together */
    if (!all_ok(z, st == EM_OK)) {
        em_safetensors_free(f0);
        return st != EM_OK ? st : em__error_unless_pending(EM_ERR_IO, "em_zero_load: another rank failed to load its shard from %s", dir);
    }
    st = em__zero_refresh_all(z);
    if (st == EM_OK && meta) *meta = f0;
    else em_safetensors_free(f0);
    return st;
}
