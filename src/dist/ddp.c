/* DistributedDataParallel: parameters broadcast from rank 0 at construction (after a
 * name and shape check), then every backward all-reduces the gradients in buckets.
 *
 * Buckets hold parameters in reverse registration order (the order backward produces their
 * gradients), the first up to 1 MiB so that communication starts early, the rest up to
 * 25 MiB. Each bucket is one flat tensor on the parameters' device; a parameter's gradient is
 * copied into its slice by the autograd hook that reports it ready, and when the bucket's
 * last gradient is in, its averaging all-reduce starts asynchronously. Buckets start in
 * index order on every rank (a later bucket that fills first waits for the earlier ones),
 * so every rank issues the same collectives in the same order. Each hook call also lets
 * MPI progress the buckets in flight, which is what overlaps them with the rest of
 * backward (Open MPI progresses non-blocking collectives inside MPI calls). When the
 * backward ends (the hook's NULL call) the remaining buckets are waited for and the averaged
 * slices copied back into the .grad tensors. A parameter whose gradient grows again after its
 * bucket has started (one used twice in the graph: a tied embedding) is all-reduced on its own
 * then (mark_again). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dist_internal.h"
#include "../core/internal_api.h"
#include "../util/strbuf.h"
#include <ember/autograd.h>
#include <ember/ops.h>

typedef struct ddp_param {
    char *name;
    em_tensor *p;          /* borrowed from the module */
    em_tensor *slice;      /* a view of its bucket's flat tensor shaped like p (own reference) */
    int bucket;
    bool ready;
    bool late;             /* its gradient grew after its bucket's all-reduce had started */
} ddp_param;

typedef struct ddp_bucket {
    em_tensor *flat;       /* own reference */
    int nparams, pending;
    int64_t bytes;
    em_dist_work *work;
    double t_launch, t_done;
} ddp_bucket;

struct em_dist_ddp {
    em_module *model;
    em_dist_group *g;
    em_ddp_opts o;
    int np, nb;
    ddp_param *params;
    ddp_bucket *buckets;
    int *by_ptr;            /* param indices sorted by tensor address, for the hook's lookup */
    int hook_id;
    bool no_sync, active;
    pthread_t thread;       /* the thread whose backward is being reduced */
    int next_launch, nready;
    em_ddp_stats stats;
};

static int find_param(const em_dist_ddp *d, const em_tensor *t) {
    int lo = 0, hi = d->np - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const em_tensor *m = d->params[d->by_ptr[mid]].p;
        if (m == t) return d->by_ptr[mid];
        if ((uintptr_t)m < (uintptr_t)t) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

static void reset_iteration(em_dist_ddp *d) {
    for (int i = 0; i < d->np; i++) d->params[i].ready = d->params[i].late = false;
    for (int b = 0; b < d->nb; b++) {
        d->buckets[b].pending = d->buckets[b].nparams;
        em_dist_work_free(d->buckets[b].work);
        d->buckets[b].work = NULL;
    }
    d->next_launch = 0;
    d->nready = 0;
    d->active = false;
}

/* Start every bucket that is full, in index order. */
static em_status launch_ready(em_dist_ddp *d) {
    while (d->next_launch < d->nb && d->buckets[d->next_launch].pending == 0) {
        ddp_bucket *b = &d->buckets[d->next_launch];
        b->t_launch = em__dist_now();
        b->t_done = 0;
        b->work = em_dist_all_reduce_async(d->g, b->flat, EM_REDUCE_AVG);
        if (!b->work) return em_last_status();
        d->next_launch++;
    }
    return EM_OK;
}

/* A backward that ends with an error before its end (the engine then stops calling the
 * hook): the buckets already started are waited for (every rank started the same ones: the
 * error depends on the graph), and the next backward starts afresh. The error stays. */
static void abandon_backward(em_dist_ddp *d) {
    em_error_state saved;
    em__error_save(&saved);
    for (int b = 0; b < d->next_launch; b++)
        if (d->buckets[b].work) (void)em_dist_wait(d->buckets[b].work);
    em__error_restore(&saved);
    reset_iteration(d);
}

/* With gradient_as_bucket_view, once bucket b's all-reduce is complete: each of its
 * parameters' .grad becomes its slice, which holds the average, and the local gradient it
 * replaces is released, so the gradients are held once. Not earlier: the engine reads a .grad
 * when a later use adds to it, and a bucket in flight must not be read (such a late use is
 * refused with bucket views: mark_again). */
static em_status grads_to_slices(em_dist_ddp *d, int b) {
    if (!d->o.gradient_as_bucket_view) return EM_OK;
    em_status st = EM_OK;
    for (int i = 0; i < d->np && st == EM_OK; i++) {
        ddp_param *p = &d->params[i];
        if (p->bucket == b && !p->late && em__grad_borrowed(p->p) != p->slice) st = em_set_grad(p->p, p->slice);
    }
    return st;
}

/* Let MPI move the buckets in flight along. */
static em_status progress(em_dist_ddp *d) {
    for (int i = 0; i < d->next_launch; i++) {
        ddp_bucket *b = &d->buckets[i];
        if (!b->work || b->t_done) continue;
        bool done;
        if (em_dist_test(b->work, &done) != EM_OK) return em_last_status();
        if (done) {
            b->t_done = em__dist_now();
            if (grads_to_slices(d, i) != EM_OK) return em_last_status();
        }
    }
    return EM_OK;
}

static em_status mark_ready(em_dist_ddp *d, int i) {
    ddp_param *p = &d->params[i];
    em_tensor *grad = em__grad_borrowed(p->p);
    em_status st;
    if (grad == p->slice) {
        st = EM_OK;   /* a bucket view left from the last backward, unchanged by this one */
    } else if (grad) {
        st = em_copy_(p->slice, grad);
    } else {
        st = em_zero_(p->slice);
    }
    if (st != EM_OK) return st;
    p->ready = true;
    d->nready++;
    d->buckets[p->bucket].pending--;
    return launch_ready(d);
}

/* A parameter used more than once in the graph (a tied embedding and output projection)
 * receives a gradient per use: the engine adds each into .grad and calls the hook each time.
 * While its bucket waits, the slice takes the new sum; once the bucket's all-reduce has
 * started, the parameter is reduced on its own when the backward ends. Which parameters
 * arrive late depends only on the graph and the buckets, the same on every rank, so every
 * rank issues the same extra all-reduces. */
static em_status mark_again(em_dist_ddp *d, int i) {
    ddp_param *p = &d->params[i];
    if (p->bucket < d->next_launch) {
        /* with bucket views, the engine may have summed this gradient with a .grad that had
         * become the bucket's average, or with a bucket still in flight, depending on timing:
         * refused, whatever the timing (lateness depends only on the graph) */
        if (d->o.gradient_as_bucket_view) {
            em_status e = em_error(EM_ERR_NOT_SUPPORTED,
                                   "em_ddp: parameter '%s' received another gradient after its bucket's all-reduce "
                                   "had started (a parameter used twice, as tied weights); gradient_as_bucket_view "
                                   "needs each parameter's gradient whole before its bucket starts: turn it off for "
                                   "this model, or put the parameter in the last bucket (larger buckets)", p->name);
            abandon_backward(d);
            return e;
        }
        p->late = true;
        return EM_OK;
    }
    em_tensor *grad = em__grad_borrowed(p->p);
    return grad && grad != p->slice ? em_copy_(p->slice, grad) : EM_OK;
}

/* The end of a backward through the model: wait, copy back, check every parameter took part. */
static em_status finish_backward(em_dist_ddp *d) {
    em_status st = EM_OK;
    if (d->nready < d->np) {
        if (d->o.find_unused_parameters) {
            for (int i = 0; i < d->np && st == EM_OK; i++)
                if (!d->params[i].ready) st = mark_ready(d, i);
        } else {
            em_strbuf names = em__sb_growing();
            int n = 0;
            for (int i = 0; i < d->np; i++)
                if (!d->params[i].ready) {
                    if (n < 8) em__sb_printf(&names, "%s%s", n ? ", " : "", d->params[i].name);
                    n++;
                }
            if (n > 8) em__sb_printf(&names, " and %d more", n - 8);
            st = em_error(EM_ERR_AUTOGRAD,
                          "em_ddp: on rank %d, %d parameter%s received no gradient in this backward: %s. Every "
                          "parameter must take part in the loss on every rank, or set find_unused_parameters in "
                          "em_ddp_opts (their gradients then count as zeros)",
                          d->g->rank, n, n > 1 ? "s" : "", names.s ? names.s : "?");
            em__sb_free(&names);
        }
    }
    double t0 = em__dist_now();
    /* every bucket that started is waited for, even after an error, so no collective is
     * left half done */
    for (int b = 0; b < d->next_launch; b++) {
        ddp_bucket *k = &d->buckets[b];
        if (!k->work) continue;
        em_status ws = em_dist_wait(k->work);
        if (!k->t_done) k->t_done = em__dist_now();
        if (st == EM_OK) st = ws;
    }
    double t1 = em__dist_now();
    if (st == EM_OK) {
        d->stats.comm_wait_s = t1 - t0;
        d->stats.comm_total_s = 0;
        d->stats.reduced_bytes = 0;
        for (int b = 0; b < d->nb; b++) {
            d->stats.comm_total_s += d->buckets[b].t_done - d->buckets[b].t_launch;
            d->stats.reduced_bytes += d->buckets[b].bytes;
        }
        for (int i = 0; i < d->np && st == EM_OK; i++) {
            ddp_param *p = &d->params[i];
            em_tensor *grad = em__grad_borrowed(p->p);
            if (p->late && grad) {   /* its whole local sum, averaged now, in parameter order */
                st = em_dist_all_reduce(d->g, grad, EM_REDUCE_AVG);
                d->stats.reduced_bytes += (int64_t)em_nbytes(grad);
            } else if (grad == p->slice) {
                /* a bucket view: averaged in place */
            } else if (d->o.gradient_as_bucket_view) {
                st = em_set_grad(p->p, p->slice);
            } else if (grad) {
                st = em_copy_(grad, p->slice);
            } else {
                em_tensor *c = em_clone(p->slice);
                st = c ? em_set_grad(p->p, c) : em_last_status();
            }
        }
    }
    reset_iteration(d);
    return st;
}

static em_status hook(void *ctx, em_tensor *leaf) {
    em_dist_ddp *d = ctx;
    if (d->no_sync) return EM_OK;
    if (!leaf) {
        if (!d->active || !pthread_equal(d->thread, pthread_self())) return EM_OK;
        em_scope s = em_scope_begin();
        em_status st = finish_backward(d);
        em_scope_end(s);
        return st;
    }
    int i = find_param(d, leaf);
    if (i < 0) return d->active && pthread_equal(d->thread, pthread_self()) ? progress(d) : EM_OK;
    if (!d->active) {
        d->active = true;
        d->thread = pthread_self();
    }
    em_scope s = em_scope_begin();
    em_status st = d->params[i].ready ? mark_again(d, i) : mark_ready(d, i);
    if (st == EM_OK) st = progress(d);
    em_scope_end(s);
    return st;
}

/* ---- construction ---- */

static void describe_tensor(em_strbuf *b, const char *kind, const char *name, em_tensor *t) {
    em__sb_printf(b, "%s '%s' %s [", kind, name, em_dtype_name(em_dtype_of(t)));
    for (int k = 0; k < em_ndim(t); k++) em__sb_printf(b, "%s%lld", k ? ", " : "", (long long)em_size(t, k));
    em__sb_printf(b, "]\n");
}

/* Every rank must describe the same parameters and buffers as rank 0. */
static em_status check_same_model(em_dist_ddp *d, const char *text, int64_t len) {
    em_dist_group *g = d->g;
    em_status st;
    em_scope s = em_scope_begin();
    em_tensor *n = em_full(EM_SHAPE(1), (double)len, EM_OPTS(.dtype = EM_I64));
    if ((st = em_dist_broadcast(g, n, 0)) != EM_OK) goto out;
    int64_t len0 = *(int64_t *)em_data_ptr(n);
    em_tensor *t0 = em_zeros(EM_SHAPE(len0 + 1), EM_OPTS(.dtype = EM_U8));
    if (!t0) { st = em_last_status(); goto out; }
    char *b0 = em_data_ptr(t0);
    if (g->rank == 0) memcpy(b0, text, (size_t)len);
    if ((st = em_dist_broadcast(g, t0, 0)) != EM_OK) goto out;
    b0[len0] = 0;
    /* the first line that differs */
    char mine[256] = "", theirs[256] = "";
    int line = 0;
    bool differs = false;
    for (const char *a = text, *b = b0;; line++) {
        const char *ae = strchr(a, '\n'), *be = strchr(b, '\n');
        if (!ae && !be) break;
        size_t al = ae ? (size_t)(ae - a) : 0, bl = be ? (size_t)(be - b) : 0;
        if (!ae || !be || al != bl || memcmp(a, b, al)) {
            snprintf(mine, sizeof mine, "%.*s", ae ? (int)al : 0, ae ? a : "");
            snprintf(theirs, sizeof theirs, "%.*s", be ? (int)bl : 0, be ? b : "");
            differs = true;
            break;
        }
        a = ae + 1;
        b = be + 1;
    }
    em_tensor *flags = em_zeros(EM_SHAPE(g->size), EM_OPTS(.dtype = EM_I32));
    em_tensor *flag = em_full(EM_SHAPE(1), differs ? 1 : 0, EM_OPTS(.dtype = EM_I32));
    if (!flags || !flag) { st = em_last_status(); goto out; }
    if ((st = em_dist_all_gather(g, flags, flag)) != EM_OK) goto out;
    const int32_t *f = em_data_ptr(flags);
    if (differs) {
        st = em_error(EM_ERR_ARGUMENT,
                      "em_ddp: rank %d's model differs from rank 0's at entry %d: rank 0 has %s, rank %d has %s "
                      "(every rank must build the same model)",
                      g->rank, line, theirs[0] ? theirs : "nothing more", g->rank, mine[0] ? mine : "nothing more");
        goto out;
    }
    for (int r = 0; r < g->size; r++)
        if (f[r]) {
            st = em_error(EM_ERR_ARGUMENT, "em_ddp: rank %d's model differs from rank 0's (its error names the first "
                          "difference); every rank must build the same model", r);
            goto out;
        }
out:
    em_scope_end(s);
    return st;
}

/* Insertion sort of the lookup table by address (a model has at most thousands of parameters). */
static void sort_by_ptr(em_dist_ddp *d) {
    for (int i = 1; i < d->np; i++) {
        int x = d->by_ptr[i], j = i;
        for (; j > 0 && (uintptr_t)d->params[d->by_ptr[j - 1]].p > (uintptr_t)d->params[x].p; j--)
            d->by_ptr[j] = d->by_ptr[j - 1];
        d->by_ptr[j] = x;
    }
}

static em_status make_buckets(em_dist_ddp *d) {
    double first = d->o.first_bucket_mb > 0 ? d->o.first_bucket_mb : 1.0;
    double rest = d->o.bucket_mb > 0 ? d->o.bucket_mb : 25.0;
    d->buckets = calloc((size_t)d->np + 1, sizeof *d->buckets);
    if (!d->buckets) return em_error(EM_ERR_OUT_OF_MEMORY, "em_ddp: out of host memory");
    /* assign, last parameter first */
    int nb = 0;
    int64_t cap = 0, used = 0;
    em_dtype dt = EM_F32;
    em_device dev = {0};
    for (int i = d->np - 1; i >= 0; i--) {
        em_tensor *p = d->params[i].p;
        int64_t bytes = (int64_t)em_nbytes(p);
        bool fits = nb > 0 && used + bytes <= cap && em_dtype_of(p) == dt && em_device_equal(em_device_of(p), dev);
        if (!fits) {
            cap = (int64_t)((nb == 0 ? first : rest) * 1024 * 1024);
            used = 0;
            dt = em_dtype_of(p);
            dev = em_device_of(p);
            nb++;
        }
        d->params[i].bucket = nb - 1;
        d->buckets[nb - 1].nparams++;
        used += bytes;
        d->buckets[nb - 1].bytes = used;
    }
    d->nb = nb;
    /* flat tensors and each parameter's slice */
    for (int b = 0; b < nb; b++) {
        int first_p = -1;
        for (int i = d->np - 1; i >= 0 && first_p < 0; i--)
            if (d->params[i].bucket == b) first_p = i;
        em_tensor *p0 = d->params[first_p].p;
        int64_t numel = d->buckets[b].bytes / (int64_t)em_dtype_size(em_dtype_of(p0));
        em_tensor *flat = em_zeros(EM_SHAPE(numel), (em_opts){.dtype = em_dtype_of(p0), .device = em_device_of(p0)});
        if (!flat) return em_last_status();
        d->buckets[b].flat = em_retain(flat);
        d->buckets[b].pending = d->buckets[b].nparams;
    }
    int64_t *off = calloc((size_t)nb, sizeof *off);
    if (!off) return em_error(EM_ERR_OUT_OF_MEMORY, "em_ddp: out of host memory");
    for (int i = d->np - 1; i >= 0; i--) {
        ddp_param *p = &d->params[i];
        int64_t n = em_numel(p->p);
        em_tensor *v = em_view(em_narrow(d->buckets[p->bucket].flat, 0, off[p->bucket], n), em_shape_of(p->p));
        off[p->bucket] += n;
        if (!v) {
            free(off);
            return em_last_status();
        }
        p->slice = em_retain(v);
    }
    free(off);
    return EM_OK;
}

em_dist_ddp *em_ddp(em_module *model, em_dist_group *gin, const em_ddp_opts *opts) {
    if (!model) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "em_ddp: argument 'model' is NULL");
        return NULL;
    }
    em_dist_group *g = em__dist_resolve(gin, "em_ddp");
    if (!g) return NULL;
    em_ddp_opts o = opts ? *opts : (em_ddp_opts){0};
    if (o.first_bucket_mb < 0 || o.bucket_mb < 0) {
        em_error(EM_ERR_ARGUMENT, "em_ddp: bucket sizes must be >= 0 MiB (0: the default), got %g and %g", o.first_bucket_mb,
                 o.bucket_mb);
        return NULL;
    }
    em_dist_ddp *d = calloc(1, sizeof *d);
    if (!d) {
        em_error(EM_ERR_OUT_OF_MEMORY, "em_ddp: out of host memory");
        return NULL;
    }
    d->model = model;
    d->g = g;
    d->o = o;
    d->hook_id = -1;
    em_status st = EM_OK;
    em_scope s = em_scope_begin();
    em_grad_mode gm = em_no_grad_begin();
    int np = em_module_parameters(model, NULL, 0), nbuf = em_module_buffers(model, NULL, 0);
    em_named_tensor *pt = calloc((size_t)np + 1, sizeof *pt), *bt = calloc((size_t)nbuf + 1, sizeof *bt);
    d->params = calloc((size_t)np + 1, sizeof *d->params);
    d->by_ptr = calloc((size_t)np + 1, sizeof *d->by_ptr);
    em_strbuf text = em__sb_growing();
    if (!pt || !bt || !d->params || !d->by_ptr) {
        st = em_error(EM_ERR_OUT_OF_MEMORY, "em_ddp: out of host memory");
        goto out;
    }
    em_module_parameters(model, pt, np);
    em_module_buffers(model, bt, nbuf);
    for (int i = 0; i < np; i++) describe_tensor(&text, "parameter", pt[i].name, pt[i].tensor);
    for (int i = 0; i < nbuf; i++) describe_tensor(&text, "buffer", bt[i].name, bt[i].tensor);
    if (text.oom) {
        st = em_error(EM_ERR_OUT_OF_MEMORY, "em_ddp: out of host memory");
        goto out;
    }
    if ((st = check_same_model(d, text.s ? text.s : "", (int64_t)text.len)) != EM_OK) goto out;
    for (int i = 0; i < np && st == EM_OK; i++) st = em_dist_broadcast(g, pt[i].tensor, 0);
    for (int i = 0; i < nbuf && st == EM_OK; i++) st = em_dist_broadcast(g, bt[i].tensor, 0);
    if (st != EM_OK) goto out;
    for (int i = 0; i < np; i++) {
        if (!em_requires_grad(pt[i].tensor)) continue;
        ddp_param *p = &d->params[d->np];
        p->p = pt[i].tensor;
        p->name = strdup(pt[i].name);
        if (!p->name) {
            st = em_error(EM_ERR_OUT_OF_MEMORY, "em_ddp: out of host memory");
            goto out;
        }
        d->by_ptr[d->np] = d->np;
        d->np++;
    }
    sort_by_ptr(d);
    if (d->np && (st = make_buckets(d)) != EM_OK) goto out;
    d->hook_id = em_autograd_add_grad_hook(hook, d);
    if (d->hook_id < 0) st = em_last_status();
out:
    em_no_grad_end(gm);
    em_scope_end(s);
    free(pt);
    free(bt);
    em__sb_free(&text);
    if (st != EM_OK) {
        em_ddp_free(d);
        return NULL;
    }
    return d;
}

em_module *em_ddp_module(em_dist_ddp *d) { return d ? d->model : NULL; }

em_tensor *em_ddp_forward(em_dist_ddp *d, em_tensor *x) {
    if (!d) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "em_ddp_forward: argument 'd' is NULL");
        return NULL;
    }
    if (d->active) reset_iteration(d); /* a backward that failed half way */
    return em_forward(d->model, x);
}

void em_ddp_set_no_sync(em_dist_ddp *d, bool on) {
    if (d) d->no_sync = on;
}

int em_ddp_num_buckets(const em_dist_ddp *d) { return d ? d->nb : 0; }

em_status em_ddp_bucket_info(const em_dist_ddp *d, int i, int *nparams, int64_t *bytes) {
    if (!d || i < 0 || i >= d->nb)
        return em_error(EM_ERR_ARGUMENT, "em_ddp_bucket_info: expected a bucket index in [0, %d), got %d", d ? d->nb : 0, i);
    if (nparams) *nparams = d->buckets[i].nparams;
    if (bytes) *bytes = d->buckets[i].bytes;
    return EM_OK;
}

em_ddp_stats em_ddp_last_stats(const em_dist_ddp *d) { return d ? d->stats : (em_ddp_stats){0}; }

void em_ddp_free(em_dist_ddp *d) {
    if (!d) return;
    if (d->hook_id >= 0) em_autograd_remove_grad_hook(d->hook_id);
    if (d->buckets) {
        for (int b = 0; b < d->nb; b++) {
            em_dist_work_free(d->buckets[b].work);
            em_release(d->buckets[b].flat);
        }
    }
    for (int i = 0; i < d->np; i++) {
        free(d->params[i].name);
        em_release(d->params[i].slice);
    }
    free(d->params);
    free(d->by_ptr);
    free(d->buckets);
    free(d);
}
