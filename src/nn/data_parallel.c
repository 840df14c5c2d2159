/* DataParallel (include/ember/parallel.h): resident replicas; replica 0 (the model) runs on
 * the caller's thread, every other replica on a worker thread of its own.
 *
 * The graph is cut between the replicas and the gather: the caller's em_dp_backward runs
 * backward from the loss down to detached copies of the replicas' outputs (the gather's
 * leaves), then every worker runs its replica's backward from its output with the leaf's
 * gradient, at the same time. Ember's error state, scopes, grad mode and autocast regions
 * are per thread: a worker copies the caller's grad mode and autocast state in (as
 * PyTorch's parallel_apply enters the caller's autocast in each worker), and its error out
 * as status and text. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ember/amp.h>
#include <ember/autograd.h>
#include <ember/ops.h>
#include <ember/parallel.h>
#include "../core/internal_api.h"
#include "module_impl.h"

typedef enum dp_job { JOB_NONE, JOB_FORWARD, JOB_BACKWARD, JOB_SYNC, JOB_QUIT } dp_job;

typedef struct dp_worker {
    struct em_dp *dp;
    int index;
    pthread_t thread;
    bool started;
    unsigned seen;          /* the last job number this worker finished */
    bool active;            /* has a part in the current job */
    /* the job's data */
    int64_t start, len;     /* JOB_FORWARD: the rows of the batch */
    em_tensor *y;           /* the replica's output, graph root (owned), kept for backward */
    em_tensor *gy;          /* JOB_BACKWARD: the gradient of y (owned) */
    em_tensor **grads;      /* JOB_BACKWARD: the replica's gradients moved to devices[0] (owned) */
    /* the job's outcome */
    em_status status;
    char msg[640];
} dp_worker;

struct em_dp {
    int n;
    em_device devs[EM_DP_MAX_DEVICES];
    em_module *model;
    em_module *replicas[EM_DP_MAX_DEVICES];   /* [0] is the model */
    int nparams, nbufs;
    em_named_tensor *params;                  /* [replica * nparams + k]: borrowed */
    em_named_tensor *bufs;                    /* [replica * nbufs + k] */
    dp_worker workers[EM_DP_MAX_DEVICES];
    /* the current job */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned seq;
    int pending;
    dp_job job;
    em_tensor *x;          /* JOB_FORWARD's input (borrowed) */
    bool grad_enabled;     /* the caller's grad mode */
    /* JOB_FORWARD: the caller's autocast state per device type, entered on each worker */
    bool ac_on[EM_DEVICE_TYPE_COUNT];
    em_dtype ac_dtype[EM_DEVICE_TYPE_COUNT];
    /* the last forward's gather leaves (owned), one per active replica */
    em_tensor *leaves[EM_DP_MAX_DEVICES];
    int nactive;
};

/* ---- replicas ---- */

/* Set (or clear, with src NULL) every ctx of the replica tree r from the model tree src:
 * the replicas share their module's ctx, so they are built and freed with ctx NULL (then
 * nothing frees the model's on any path). */
static void share_ctx(em_module *r, const em_module *src) {
    r->ctx = src ? src->ctx : NULL;
    for (int i = 0; i < r->nkids; i++) share_ctx(r->kids[i].m, src ? src->kids[i].m : NULL);
}

static void replica_free(em_module *r) {
    if (!r) return;
    share_ctx(r, NULL);
    em_module_free(r);
}

/* A copy of src's tree on d with ctx NULL everywhere; NULL and an error on failure. */
static em_module *replicate(const em_module *src, em_device d) {
    em_module *m = calloc(1, sizeof *m);
    if (!m) {
        em_error(EM_ERR_OUT_OF_MEMORY, "em_data_parallel: out of host memory");
        return NULL;
    }
    m->ops = src->ops;
    m->training = src->training;
    em_status st = EM_OK;
    em_grad_mode g = em_no_grad_begin();
    for (int k = 0; k < 2 && st == EM_OK; k++) {
        const nn_slot *slots = k ? src->bufs : src->params;
        int n = k ? src->nbufs : src->nparams;
        for (int i = 0; i < n && st == EM_OK; i++) {
            em_scope s = em_scope_begin();
            em_tensor *t = em_to(slots[i].t, d);
            if (t == slots[i].t) t = em_clone(t);   /* never share storage with the model */
            if (!t) st = em_last_status();
            else if (k) st = em_module_add_buffer(m, slots[i].name, t);
            else st = em_module_add_parameter(m, slots[i].name, t);
            em_scope_end(s);
        }
    }
    em_no_grad_end(g);
    for (int i = 0; i < src->nkids && st == EM_OK; i++) {
        em_module *kid = replicate(src->kids[i].m, d);
        st = kid ? em_module_add_child(m, src->kids[i].name, kid) : em_last_status();
    }
    if (st != EM_OK) {
        em_module_free(m);   /* ctx is NULL throughout */
        return NULL;
    }
    return m;
}

/* Every parameter and buffer of the model on devices[0]: PyTorch's check, and what keeps
 * the replicas' copies right. prefix: m's dotted name ("" or "0."). */
static em_status check_tree_device(const em_module *m, em_device d, const char *fn, const char *prefix) {
    for (int k = 0; k < m->nparams + m->nbufs; k++) {
        const nn_slot *t = k < m->nparams ? &m->params[k] : &m->bufs[k - m->nparams];
        em_device td = em_device_of(t->t);
        if (!em_device_equal(td, d))
            return em_error(EM_ERR_DEVICE, "%s: module must have its parameters and buffers on device %s "
                            "(devices[0]) but found one of them on device: %s (\"%s%s\")", fn,
                            em_device_str(d).s, em_device_str(td).s, prefix, t->name);
    }
    for (int i = 0; i < m->nkids; i++) {
        char sub[256];
        snprintf(sub, sizeof sub, "%s%s.", prefix, m->kids[i].name);
        if (check_tree_device(m->kids[i].m, d, fn, sub) != EM_OK) return em_last_status();
    }
    return EM_OK;
}

static em_status check_model_device(em_dp *dp, const char *fn) {
    return check_tree_device(dp->model, dp->devs[0], fn, "");
}

/* Listings of every replica's parameters and buffers, flattened (pointers stay valid while
 * no module of the trees changes). */
static em_status list_tensors(em_dp *dp) {
    unsigned long seq = em__error_seq();
    dp->nparams = em_module_parameters(dp->model, NULL, 0);
    dp->nbufs = em_module_buffers(dp->model, NULL, 0);
    if (em__error_seq() != seq) return em_last_status();
    dp->params = calloc((size_t)dp->n * (size_t)dp->nparams + 1, sizeof *dp->params);
    dp->bufs = calloc((size_t)dp->n * (size_t)dp->nbufs + 1, sizeof *dp->bufs);
    if (!dp->params || !dp->bufs) return em_error(EM_ERR_OUT_OF_MEMORY, "em_data_parallel: out of host memory");
    for (int r = 0; r < dp->n; r++) {
        em_module_parameters(dp->replicas[r], dp->params + (size_t)r * dp->nparams, dp->nparams);
        em_module_buffers(dp->replicas[r], dp->bufs + (size_t)r * dp->nbufs, dp->nbufs);
    }
    return em__error_seq() != seq ? em_last_status() : EM_OK;
}

/* ---- workers ---- */

static void worker_fail(dp_worker *w) {
    w->status = em_failed() ? em_last_status() : EM_ERR_INTERNAL;
    snprintf(w->msg, sizeof w->msg, "%s", em_failed() ? em_last_error() : "failed without an error message");
    em_clear_error();
}

static void drop_grads(dp_worker *w) {
    if (!w->grads) return;
    for (int k = 0; k < w->dp->nparams; k++) em_release(w->grads[k]);
    free(w->grads);
    w->grads = NULL;
}

/* The replica's part of the batch, its forward; keeps the output (with its graph). */
static void do_forward(dp_worker *w) {
    em_dp *dp = w->dp;
    em_scope s = em_scope_begin();
    em_tensor *xi = em_to(em_narrow(dp->x, 0, w->start, w->len), dp->devs[w->index]);
    em_tensor *y = em_forward(dp->replicas[w->index], xi);
    if (y) w->y = em_retain(y);
    else worker_fail(w);
    em_scope_end(s);
}

/* The replica's backward from its output; a replica other than the model then hands its
 * gradients over, moved to devices[0], and drops its own. */
static void do_backward(dp_worker *w) {
    em_dp *dp = w->dp;
    em_status st = em_backward_with(w->y, w->gy, false);
    if (st == EM_OK && w->index > 0) {
        w->grads = calloc((size_t)dp->nparams + 1, sizeof *w->grads);
        if (!w->grads) st = em_error(EM_ERR_OUT_OF_MEMORY, "em_dp_backward: out of host memory");
        em_named_tensor *p = dp->params + (size_t)w->index * dp->nparams;
        for (int k = 0; k < dp->nparams && st == EM_OK; k++) {
            em_scope s = em_scope_begin();
            em_tensor *g = em_grad(p[k].tensor);
            if (g) {
                em_tensor *moved = em_to(g, dp->devs[0]);
                if (moved == g) moved = em_clone(g);   /* the replica's .grad is dropped below */
                if (moved) w->grads[k] = em_retain(moved);
                st = moved ? em_set_grad(p[k].tensor, NULL) : em_last_status();
            }
            em_scope_end(s);
        }
    }
    if (st != EM_OK) {
        worker_fail(w);
        drop_grads(w);
        /* a replica keeps no gradient of a failed backward: the next one must not add to it */
        if (w->index > 0)
            for (int k = 0; k < dp->nparams; k++) em_set_grad(dp->params[(size_t)w->index * dp->nparams + k].tensor, NULL);
        em_clear_error();
    }
}

/* The model's parameters and buffers into this replica. */
static void do_sync(dp_worker *w) {
    em_dp *dp = w->dp;
    em_grad_mode g = em_no_grad_begin();
    em_status st = EM_OK;
    for (int k = 0; k < dp->nparams && st == EM_OK; k++)
        st = em_copy_(dp->params[(size_t)w->index * dp->nparams + k].tensor, dp->params[k].tensor);
    for (int k = 0; k < dp->nbufs && st == EM_OK; k++)
        st = em_copy_(dp->bufs[(size_t)w->index * dp->nbufs + k].tensor, dp->bufs[k].tensor);
    /* the copies may still be queued: finished before the caller's next step reads the model */
    if (st == EM_OK) st = em_device_synchronize(dp->devs[w->index]);
    em_no_grad_end(g);
    if (st != EM_OK) worker_fail(w);
}

/* The caller's autocast regions entered on a worker's thread (replica 0 runs on the
 * caller's, already inside them); ended, innermost first, after the forward. */
static int enter_autocast(em_dp *dp, em_autocast *open) {
    int n = 0;
    for (int t = 0; t < EM_DEVICE_TYPE_COUNT; t++) {
        if (!dp->ac_on[t]) continue;
        em_autocast r = em_autocast_begin((em_device_type)t, dp->ac_dtype[t]);
        if (r.depth > 0) open[n++] = r;
    }
    return n;
}

static void run_one(dp_worker *w, dp_job job, bool grad) {
    em_grad_mode g = em_set_grad_enabled(grad);
    if (job == JOB_FORWARD && w->index > 0) {
        em_autocast open[EM_DEVICE_TYPE_COUNT];
        unsigned long seq = em__error_seq();
        int n = enter_autocast(w->dp, open);
        if (em__error_seq() != seq) worker_fail(w);
        else do_forward(w);
        while (n > 0) em_autocast_end(open[--n]);
    } else if (job == JOB_FORWARD) do_forward(w);
    else if (job == JOB_BACKWARD) do_backward(w);
    else if (job == JOB_SYNC) do_sync(w);
    em_set_grad_enabled(g.previous);
}

/* The thread of replica i >= 1 (the caller's thread runs replica 0). */
static void *worker_main(void *arg) {
    dp_worker *w = arg;
    em_dp *dp = w->dp;
    for (;;) {
        pthread_mutex_lock(&dp->mu);
        while (w->seen == dp->seq) pthread_cond_wait(&dp->go, &dp->mu);
        w->seen = dp->seq;
        dp_job job = dp->job == JOB_QUIT ? JOB_QUIT : w->active ? dp->job : JOB_NONE;
        bool grad = dp->grad_enabled;
        pthread_mutex_unlock(&dp->mu);
        if (job == JOB_QUIT) return NULL;
        if (job != JOB_NONE) {
            run_one(w, job, grad);
            pthread_mutex_lock(&dp->mu);
            if (--dp->pending == 0) pthread_cond_signal(&dp->done);
            pthread_mutex_unlock(&dp->mu);
        }
    }
}

/* Run job on the replicas marked active: replica 0 on the caller's thread (no hand-off for
 * it, none at all with one device) while the others' threads run theirs; wait for them;
 * then the first failure (by replica order) becomes the caller's error. */
static em_status run_job(em_dp *dp, dp_job job, const char *fn) {
    int threaded = 0;
    dp->grad_enabled = em_is_grad_enabled();
    for (int i = 0; i < dp->n; i++) {
        dp->workers[i].status = EM_OK;
        dp->workers[i].msg[0] = '\0';
        threaded += i > 0 && dp->workers[i].active;
    }
    if (threaded) {
        pthread_mutex_lock(&dp->mu);
        dp->job = job;
        dp->pending = threaded;
        dp->seq++;
        pthread_cond_broadcast(&dp->go);
        pthread_mutex_unlock(&dp->mu);
    }
    /* the caller's own error state is clear here (every entry point checks): replica 0's
     * failure is captured like a worker's and raised below with the others' */
    if (dp->workers[0].active) run_one(&dp->workers[0], job, dp->grad_enabled);
    if (threaded) {
        pthread_mutex_lock(&dp->mu);
        while (dp->pending > 0) pthread_cond_wait(&dp->done, &dp->mu);
        pthread_mutex_unlock(&dp->mu);
    }
    for (int i = 0; i < dp->n; i++) {
        dp_worker *w = &dp->workers[i];
        if (w->active && w->status != EM_OK)
            return em_error(w->status, "%s: replica %d on %s failed: %s", fn, i, em_device_str(dp->devs[i]).s, w->msg);
    }
    return EM_OK;
}

static void set_active(em_dp *dp, int count) {
    for (int i = 0; i < dp->n; i++) dp->workers[i].active = i < count;
}

/* Forget the last forward's graphs (a forward without a backward, an error). */
static void drop_forward(em_dp *dp) {
    for (int i = 0; i < dp->n; i++) {
        dp_worker *w = &dp->workers[i];
        em_release(w->y);
        em_release(w->gy);
        w->y = w->gy = NULL;
        drop_grads(w);
        em_release(dp->leaves[i]);
        dp->leaves[i] = NULL;
    }
    dp->nactive = 0;
}

/* ---- the API ---- */

em_dp *em_data_parallel(em_module *model, const em_device *devices, int n) {
    const char *fn = "em_data_parallel";
    if (!model || !devices) {
        em__error_unless_pending(EM_ERR_ARGUMENT, "%s: %s is NULL", fn, model ? "the device list" : "the module");
        return NULL;
    }
    if (n < 1 || n > EM_DP_MAX_DEVICES) {
        em_error(EM_ERR_ARGUMENT, "%s: expected 1 to %d devices, got %d%s", fn, EM_DP_MAX_DEVICES, n,
                 n < 1 ? " (an empty device list)" : "");
        return NULL;
    }
    em_dp *dp = calloc(1, sizeof *dp);
    if (!dp) {
        em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
        return NULL;
    }
    dp->n = n;
    dp->model = model;
    for (int i = 0; i < n; i++) {
        em_device d = em_device_resolve(devices[i]);
        em_device_props props;
        if (em_device_get_props(d, &props) != EM_OK) {
            em_clear_error();
            em_error(EM_ERR_DEVICE, "%s: device %d (%s) does not exist (%d %s device%s here)", fn, i,
                     em_device_str(devices[i]).s, em_device_count(d.type), em_device_type_name(d.type),
                     em_device_count(d.type) == 1 ? "" : "s");
            free(dp);
            return NULL;
        }
        for (int j = 0; j < i; j++)
            if (em_device_equal(dp->devs[j], d)) {
                em_error(EM_ERR_ARGUMENT, "%s: device %s is listed twice (entries %d and %d): each device holds one "
                         "replica", fn, em_device_str(d).s, j, i);
                free(dp);
                return NULL;
            }
        dp->devs[i] = d;
    }
    dp->replicas[0] = model;
    pthread_mutex_init(&dp->mu, NULL);
    pthread_cond_init(&dp->go, NULL);
    pthread_cond_init(&dp->done, NULL);
    /* the model's device first: a wrong one fails before any copy is made */
    bool ok = check_model_device(dp, fn) == EM_OK;
    for (int i = 1; i < n && ok; i++) {
        dp->replicas[i] = replicate(model, dp->devs[i]);
        ok = dp->replicas[i] != NULL;
    }
    if (ok) {
        for (int i = 1; i < n; i++) share_ctx(dp->replicas[i], model);
        ok = list_tensors(dp) == EM_OK;
    }
    for (int i = 0; i < n && ok; i++) {
        dp_worker *w = &dp->workers[i];
        *w = (dp_worker){.dp = dp, .index = i};
        if (i == 0) continue;   /* the caller's thread */
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            em_error(EM_ERR_INTERNAL, "%s: cannot start the thread of replica %d", fn, i);
            ok = false;
        } else {
            w->started = true;
        }
    }
    if (!ok) {
        em_dp_free(dp);
        return NULL;
    }
    return dp;
}

void em_dp_free(em_dp *dp) {
    if (!dp) return;
    drop_forward(dp);
    pthread_mutex_lock(&dp->mu);
    dp->job = JOB_QUIT;
    dp->seq++;
    pthread_cond_broadcast(&dp->go);
    pthread_mutex_unlock(&dp->mu);
    for (int i = 0; i < dp->n; i++)
        if (dp->workers[i].started) pthread_join(dp->workers[i].thread, NULL);
    for (int i = 1; i < dp->n; i++) replica_free(dp->replicas[i]);
    free(dp->params);
    free(dp->bufs);
    pthread_mutex_destroy(&dp->mu);
    pthread_cond_destroy(&dp->go);
    pthread_cond_destroy(&dp->done);
    free(dp);
}

/* The model still has the parameters the replicas were made from, on devices[0], in their
 * dtypes. */
static em_status check_unchanged(em_dp *dp, const char *fn) {
    if (em_module_parameters(dp->model, NULL, 0) != dp->nparams || em_module_buffers(dp->model, NULL, 0) != dp->nbufs)
        return em_error(EM_ERR_ARGUMENT, "%s: the module gained or lost parameters or buffers after em_data_parallel "
                        "(%d and %d then); make a new em_dp", fn, dp->nparams, dp->nbufs);
    for (int k = 0; dp->n > 1 && k < dp->nparams + dp->nbufs; k++) {
        const em_named_tensor *a = k < dp->nparams ? &dp->params[k] : &dp->bufs[k - dp->nparams];
        const em_named_tensor *b = k < dp->nparams ? &dp->params[dp->nparams + k] : &dp->bufs[dp->nbufs + k - dp->nparams];
        if (em_dtype_of(a->tensor) != em_dtype_of(b->tensor))
            return em_error(EM_ERR_DTYPE, "%s: \"%s\" is %s in the module but %s in the replicas: the module's dtype "
                            "changed after em_data_parallel; make a new em_dp", fn, a->name,
                            em_dtype_name(em_dtype_of(a->tensor)), em_dtype_name(em_dtype_of(b->tensor)));
    }
    return check_model_device(dp, fn);
}

/* The replicas follow the model's train/eval mode (set on the model after em_data_parallel). */
static void follow_training(em_module *r, const em_module *src) {
    r->training = src->training;
    for (int i = 0; i < r->nkids && i < src->nkids; i++) follow_training(r->kids[i].m, src->kids[i].m);
}

em_tensor *em_dp_forward(em_dp *dp, em_tensor *x) {
    const char *fn = "em_dp_forward";
    if (!dp || !x) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "%s: %s is NULL", fn, dp ? "input" : "the em_dp");
        return NULL;
    }
    drop_forward(dp);
    if (check_unchanged(dp, fn) != EM_OK) return NULL;
    for (int i = 1; i < dp->n; i++) follow_training(dp->replicas[i], dp->model);
    if (em_ndim(x) < 1 || em_size(x, 0) < 1) {
        em_error(EM_ERR_SHAPE, "%s: expected an input with a batch dimension of size >= 1 to split along dim 0, "
                 "got %s", fn, em_ndim(x) < 1 ? "a 0-dim tensor" : "an empty batch (dim 0 has size 0)");
        return NULL;
    }
    /* torch.chunk's split: chunks of ceil(rows / n) rows, the last one shorter, as many as needed */
    int64_t rows = em_size(x, 0), chunk = (rows + dp->n - 1) / dp->n;
    int used = (int)((rows + chunk - 1) / chunk);
    for (int i = 0; i < dp->n; i++) {
        dp->workers[i].start = i * chunk;
        dp->workers[i].len = i < used ? (i * chunk + chunk > rows ? rows - i * chunk : chunk) : 0;
    }
    set_active(dp, used);
    for (int t = 0; t < EM_DEVICE_TYPE_COUNT; t++) {   /* the region the replicas run in */
        dp->ac_on[t] = em_autocast_enabled((em_device_type)t);
        dp->ac_dtype[t] = em_autocast_dtype((em_device_type)t);
    }
    /* detached: the replicas' backwards, on several threads, must not all accumulate into
     * x's graph (x's gradient is not DataParallel's to give, as documented) */
    em_scope sx = em_scope_begin();
    dp->x = em_detach(x);
    em_status st = dp->x ? run_job(dp, JOB_FORWARD, fn) : em_last_status();
    dp->x = NULL;
    em_scope_end(sx);
    if (st != EM_OK) {
        drop_forward(dp);
        return NULL;
    }
    /* the gather, on the caller's thread: its graph ends at one leaf per replica */
    em_scope s = em_scope_begin();
    em_tensor *parts[EM_DP_MAX_DEVICES];
    bool keep = false;
    for (int i = 0; i < used && st == EM_OK; i++) {
        em_tensor *y = dp->workers[i].y;
        em_tensor *leaf = em_detach(y);
        if (leaf && em_requires_grad(y)) {
            keep = true;
            if (em_set_requires_grad(leaf, true) == EM_OK) dp->leaves[i] = em_retain(leaf);
        }
        /* scalars are gathered into a vector, as PyTorch does (with a warning) */
        if (leaf && em_ndim(leaf) == 0) leaf = em_reshape(leaf, EM_SHAPE(1));
        parts[i] = em_to(leaf, dp->devs[0]);
        if (!parts[i]) st = em_last_status();
    }
    em_tensor *out = st == EM_OK ? (used == 1 ? parts[0] : em_cat(parts, used, 0)) : NULL;
    if (out) em_retain(out);
    em_scope_end(s);
    if (!out || !keep) {
        drop_forward(dp);   /* no graph to keep (no grad mode), or a failure */
        return em__scoped(out);
    }
    dp->nactive = used;
    return em__scoped(out);
}

em_status em_dp_backward(em_dp *dp, em_tensor *loss) {
    const char *fn = "em_dp_backward";
    if (!dp || !loss) return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "%s: %s is NULL", fn,
                                                                        dp ? "loss" : "the em_dp");
    if (dp->nactive == 0)
        return em_error(EM_ERR_AUTOGRAD, "%s: no em_dp_forward output with a graph to run backward through "
                        "(call em_dp_forward with grad mode on first; each forward takes one backward)", fn);
    em_status st = em_backward(loss);
    for (int i = 0; i < dp->nactive && st == EM_OK; i++) {
        em_tensor *g = em_grad(dp->leaves[i]);
        if (!g) st = em_error(EM_ERR_AUTOGRAD, "%s: the loss does not depend on the output of the last em_dp_forward "
                              "(replica %d got no gradient)", fn, i);
        else dp->workers[i].gy = em_retain(g);
    }
    if (st == EM_OK) {
        set_active(dp, dp->nactive);
        st = run_job(dp, JOB_BACKWARD, fn);
    }
    /* the sum into the model's .grad, in replica order */
    em_grad_mode gm = em_no_grad_begin();
    for (int k = 0; k < dp->nparams && st == EM_OK; k++) {
        em_scope s = em_scope_begin();
        em_tensor *p = dp->params[k].tensor;
        for (int i = 1; i < dp->nactive && st == EM_OK; i++) {
            em_tensor *g = dp->workers[i].grads[k];
            if (!g) continue;
            em_tensor *acc = em_grad(p);
            st = acc ? em_add_(acc, g, 1.0) : em_set_grad(p, g);
            /* the model's .grad now is g itself: it must not be added to again */
            if (!acc) dp->workers[i].grads[k] = NULL, em_release(g);
        }
        em_scope_end(s);
    }
    em_no_grad_end(gm);
    drop_forward(dp);
    return st;
}

em_status em_dp_sync(em_dp *dp) {
    if (!dp) return em_failed() ? em_last_status() : em_error(EM_ERR_ARGUMENT, "em_dp_sync: the em_dp is NULL");
    if (check_unchanged(dp, "em_dp_sync") != EM_OK) return em_last_status();
    if (dp->n == 1) return EM_OK;
    /* the model's values may still be queued on devices[0]: finished before others read them */
    em_status st = em_device_synchronize(dp->devs[0]);
    if (st != EM_OK) return st;
    for (int i = 0; i < dp->n; i++) dp->workers[i].active = i > 0;
    return run_job(dp, JOB_SYNC, "em_dp_sync");
}

em_module *em_dp_module(const em_dp *dp) { return dp ? dp->model : NULL; }
em_module *em_dp_replica(const em_dp *dp, int i) { return dp && i >= 0 && i < dp->n ? dp->replicas[i] : NULL; }
int em_dp_device_count(const em_dp *dp) { return dp ? dp->n : 0; }
em_device em_dp_device(const em_dp *dp, int i) { return dp && i >= 0 && i < dp->n ? dp->devs[i] : EM_DEVICE_CPU; }
