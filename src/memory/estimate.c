/* Memory estimates from a parameter count (include/ember/estimate.h, `ember mem`). */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <ember/estimate.h>
#include <ember/io.h>
#include <ember/nn.h>
#include <ember/tensor.h>
#include "../core/errors.h"
#include "../nn/module_impl.h"
#include "../nn/nn_internal.h"

em_status em_estimate_parse_params(const char *s, double *out) {
    if (!s || !out) return em_error(EM_ERR_ARGUMENT, "em_estimate_parse_params: NULL argument");
    const char *p = s;
    while (isspace((unsigned char)*p)) p++;
    char *end;
    double v = strtod(p, &end);
    bool ok = end != p && isfinite(v);
    if (ok) {
        double mult = 1;
        switch (toupper((unsigned char)*end)) {
        case 'K': mult = 1e3; end++; break;
        case 'M': mult = 1e6; end++; break;
        case 'B': case 'G': mult = 1e9; end++; break;
        case 'T': mult = 1e12; end++; break;
        default: break;
        }
        while (isspace((unsigned char)*end)) end++;
        ok = *end == '\0';
        v *= mult;
    }
    if (!ok)
        return em_error(EM_ERR_ARGUMENT, "cannot read the parameter count '%s': expected a number with an "
                        "optional suffix K, M, B (or G) or T, e.g. 7B, 125M, 1.3e9", s);
    if (v < 1)
        return em_error(EM_ERR_ARGUMENT, "the parameter count must be at least 1, got '%s'", s);
    if (v > 1e15)
        return em_error(EM_ERR_ARGUMENT, "the parameter count '%s' is beyond 1e15; did you mean a smaller unit?", s);
    *out = v;
    return EM_OK;
}

static const char *optimizer_names[] = {"sgd", "sgd-momentum", "adam", "adamw"};

em_status em_estimate_parse_optimizer(const char *s, em_estimate_optimizer *out) {
    for (int i = 0; s && i < 4; i++)
        if (!strcasecmp(s, optimizer_names[i])) {
            *out = (em_estimate_optimizer)i;
            return EM_OK;
        }
    return em_error(EM_ERR_ARGUMENT, "unknown optimizer '%s': expected sgd, sgd-momentum, adam or adamw",
                    s ? s : "(null)");
}

const char *em_estimate_optimizer_name(em_estimate_optimizer o) {
    return (unsigned)o < 4 ? optimizer_names[o] : "?";
}

const char *em_estimate_mode_name(em_estimate_mode m) {
    static const char *names[] = {"inference", "full", "lora"};
    return (unsigned)m < 3 ? names[m] : "?";
}

const char *em_estimate_line_name(em_estimate_line l) {
    static const char *names[] = {"weights", "gradients", "optimizer states", "master weights",
                                  "activations", "workspace", "total"};
    return (unsigned)l < EM_ESTIMATE_LINES ? names[l] : "?";
}

static int optimizer_states(em_estimate_optimizer o) {
    return o == EM_ESTIMATE_SGD ? 0 : o == EM_ESTIMATE_SGD_MOMENTUM ? 1 : 2;
}

static const char *state_names(em_estimate_optimizer o) {
    switch (o) {
    case EM_ESTIMATE_SGD: return "plain SGD keeps no state";
    case EM_ESTIMATE_SGD_MOMENTUM: return "SGD with momentum keeps 1 buffer";
    case EM_ESTIMATE_ADAM: return "Adam keeps 2 states (exp_avg, exp_avg_sq)";
    default: return "AdamW keeps 2 states (exp_avg, exp_avg_sq)";
    }
}

/* A transformer's shape from its size: P ~ 12 * layers * hidden^2 with hidden ~ 128 * layers
 * (LLaMA-7B: 4096 x 32), hidden rounded to a multiple of 64. */
static void infer_shape(double params, int64_t *hidden, int64_t *layers) {
    if (*hidden <= 0 && *layers <= 0) *hidden = (int64_t)llround(cbrt(params * 128.0 / 12.0) / 64.0) * 64;
    else if (*hidden <= 0) *hidden = (int64_t)llround(sqrt(params / (12.0 * (double)*layers)) / 64.0) * 64;
    if (*hidden < 64) *hidden = 64;
    if (*layers <= 0) *layers = (int64_t)llround(params / (12.0 * (double)*hidden * (double)*hidden));
    if (*layers < 1) *layers = 1;
}

/* "7.00e9" for counts in the explanations (plain digits below 10000). */
static void fmt_count(char *buf, size_t size, double v) {
    if (v < 1e4) {
        snprintf(buf, size, "%.0f", v);
        return;
    }
    int e = (int)floor(log10(v));
    double m = v / pow(10, e);
    if (m >= 9.995) m /= 10, e++;   /* 9.999e9 prints as 1.00e10 */
    snprintf(buf, size, "%.2fe%d", m, e);
}

em_status em_estimate_memory(const em_estimate_opts *o, em_estimate *out) {
    if (!o || !out) return em_error(EM_ERR_ARGUMENT, "em_estimate_memory: NULL argument");
    memset(out, 0, sizeof *out);
    if (!(o->params >= 1) || !isfinite(o->params))
        return em_error(EM_ERR_ARGUMENT, "em_estimate_memory: params must be at least 1, got %g", o->params);
    double w;
    const char *dt;
    switch (o->dtype) {
    case EM_F32: w = 4; dt = "float32"; break;
    case EM_F16: w = 2; dt = "float16"; break;
    case EM_BF16: w = 2; dt = "bfloat16"; break;
    default:
        return em_error(EM_ERR_DTYPE, "em_estimate_memory: weights must be float32, float16 or bfloat16");
    }
    if ((unsigned)o->mode > EM_ESTIMATE_LORA || (unsigned)o->optimizer > EM_ESTIMATE_ADAMW)
        return em_error(EM_ERR_ARGUMENT, "em_estimate_memory: unknown mode %d or optimizer %d", (int)o->mode,
                        (int)o->optimizer);
    if (o->lora_rank < 0 || o->lora_targets < 0 || o->hidden < 0 || o->layers < 0 || o->batch < 0 ||
        o->seq < 0 || !(o->activation_bytes_per_sample >= 0) || !(o->input_bytes_per_sample >= 0) ||
        !(o->largest_param >= 0) || !(o->lora_params >= 0))
        return em_error(EM_ERR_ARGUMENT, "em_estimate_memory: rank, targets, hidden, layers, batch, seq, "
                        "activation and input bytes, largest parameter and LoRA parameters must not be negative");
    double P = out->params = o->params;
    out->dtype = o->dtype;
    int k = optimizer_states(o->optimizer);
    bool master = o->master_weights && w < 4;   /* float32 weights are their own master copy */
    double sw = master ? 4 : w;                 /* bytes per optimizer state */
    out->hidden = o->hidden;
    out->layers = o->layers;
    out->shape_inferred = o->hidden <= 0 || o->layers <= 0;
    infer_shape(P, &out->hidden, &out->layers);
    double h = (double)out->hidden, L = (double)out->layers;
    char p[32], t[32];
    fmt_count(p, sizeof p, P);
    double *B = out->bytes;
    char (*why)[256] = out->why;

    if (o->mode == EM_ESTIMATE_INFERENCE) {
        out->trainable_params = 0;
        B[EM_ESTIMATE_WEIGHTS] = P * w;
        snprintf(why[0], 256, "%s parameters x %.0f B (%s)", p, w, dt);
        snprintf(why[1], 256, "none: inference computes no gradients");
        snprintf(why[2], 256, "none: no optimizer");
        snprintf(why[3], 256, "none");
    } else if (o->mode == EM_ESTIMATE_FULL) {
        double T = out->trainable_params = P;
        B[EM_ESTIMATE_WEIGHTS] = P * w;
        B[EM_ESTIMATE_GRADIENTS] = T * w;
        B[EM_ESTIMATE_OPTIMIZER_STATES] = T * k * sw;
        B[EM_ESTIMATE_MASTER_WEIGHTS] = master ? T * 4 : 0;
        snprintf(why[0], 256, "%s parameters x %.0f B (%s)", p, w, dt);
        snprintf(why[1], 256, "one %s gradient per parameter: %s x %.0f B", dt, p, w);
        snprintf(why[2], 256, "%s per parameter in %s: %d x %s x %.0f B", state_names(o->optimizer),
                 master ? "float32" : dt, k, p, sw);
        if (master) snprintf(why[3], 256, "float32 copy of the weights that the optimizer updates: %s x 4 B", p);
        else snprintf(why[3], 256, "none: weights, gradients and states all stay in %s", dt);
    } else {
        int r = o->lora_rank ? o->lora_rank : 8, m = o->lora_targets ? o->lora_targets : 2;
        double T = out->trainable_params = o->lora_params > 0 ? o->lora_params
                                                              : L * m * r * 2.0 * h;  /* A: r x h, B: h x r */
        fmt_count(t, sizeof t, T);
        B[EM_ESTIMATE_WEIGHTS] = P * w + T * 4;
        B[EM_ESTIMATE_GRADIENTS] = T * 4;
        B[EM_ESTIMATE_OPTIMIZER_STATES] = T * k * 4;
        if (o->lora_params > 0)
            snprintf(why[0], 256, "frozen base %s x %.0f B (%s) + adapters %s x 4 B (rank %d x (in + out) per "
                     "Linear)", p, w, dt, t, r);
        else
            snprintf(why[0], 256, "frozen base %s x %.0f B (%s) + adapters %s x 4 B (%lld layers x %d matrices "
                     "x rank %d x 2 x %lld)", p, w, dt, t, (long long)out->layers, m, r, (long long)out->hidden);
        snprintf(why[1], 256, "float32 gradients for the %s adapter parameters only", t);
        snprintf(why[2], 256, "%s per adapter parameter in float32: %d x %s x 4 B", state_names(o->optimizer), k, t);
        snprintf(why[3], 256, "none: the adapters are float32 already");
    }

    /* Activations: the input batch (kept through the step) plus what backward frees. */
    double saved = 0, input = o->batch > 0 ? (double)o->batch * o->input_bytes_per_sample : 0;
    char in_why[96] = "";
    if (input > 0)
        snprintf(in_why, sizeof in_why, "input %lld x %.0f B + ", (long long)o->batch, o->input_bytes_per_sample);
    if (o->activation_bytes_per_sample > 0 && o->batch > 0) {
        saved = (double)o->batch * o->activation_bytes_per_sample;
        snprintf(why[4], 256, "%sgiven: %lld samples x %.0f B per sample", in_why, (long long)o->batch,
                 o->activation_bytes_per_sample);
    } else if (o->batch > 0 && o->seq > 0) {
        double b = (double)o->batch, s = (double)o->seq, heads = h >= 128 ? floor(h / 128) : 1;
        if (o->mode == EM_ESTIMATE_INFERENCE) {   /* the KV cache dominates */
            saved = 2 * L * b * s * h * w;
            snprintf(why[4], 256, "%sKV cache: 2 x %lld layers x batch %lld x seq %lld x hidden %lld x %.0f B",
                     in_why, (long long)out->layers, (long long)o->batch, (long long)o->seq,
                     (long long)out->hidden, w);
        } else {   /* saved for backward, no recomputation (Korthikanti et al. 2022), 16-bit */
            saved = L * s * b * h * (34 + 5 * heads * s / h) * (w / 2);
            snprintf(why[4], 256, "%ssaved for backward: %lld layers x seq x batch x hidden x (34 + 5 x heads x "
                     "seq / hidden) B%s, %lld heads", in_why, (long long)out->layers, w > 2 ? " x 2 (float32)" : "",
                     (long long)heads);
        }
    } else if (input > 0) {
        snprintf(why[4], 256, "input only: %lld x %.0f B", (long long)o->batch, o->input_bytes_per_sample);
    } else {
        snprintf(why[4], 256, "not counted: give a batch and sequence length (or bytes per sample)");
    }
    B[EM_ESTIMATE_ACTIVATIONS] = input + saved;

    /* No parameter-sized temporary (see the header): the fused steps make none, and backward's
     * gradients become .grad without a copy. */
    int tmp = 0;
    double ws_bytes = o->mode == EM_ESTIMATE_FULL ? sw : 4;   /* LoRA adapters are float32 */
    if (o->mode == EM_ESTIMATE_INFERENCE) {
        snprintf(why[5], 256, "none: no optimizer");
    } else if (o->largest_param > 0 && tmp == 0) {
        snprintf(why[5], 256, "none: %s's fused step makes no temporaries and gradients become .grad without "
                 "a copy", em_estimate_optimizer_name(o->optimizer));
    } else if (o->largest_param > 0) {
        char lp[32];
        fmt_count(lp, sizeof lp, o->largest_param);
        B[EM_ESTIMATE_WORKSPACE] = tmp * o->largest_param * ws_bytes;
        snprintf(why[5], 256, "the largest tensor's gradient made in backward (%s's fused step needs no "
                 "temporaries): %d temporary x %s x %.0f B", em_estimate_optimizer_name(o->optimizer), tmp, lp,
                 ws_bytes);
    } else {
        snprintf(why[5], 256, "not counted: the largest tensor is unknown (%d x its size for %s)", tmp,
                 em_estimate_optimizer_name(o->optimizer));
    }
    double ws = B[EM_ESTIMATE_WORKSPACE];
    for (int i = 0; i < EM_ESTIMATE_ACTIVATIONS; i++) B[EM_ESTIMATE_TOTAL] += B[i];
    B[EM_ESTIMATE_TOTAL] += input + (ws > 0 ? fmax(saved, ws) : saved);
    if (ws > 0)
        snprintf(why[6], 256, "weights to master weights + input + the larger of the other activations (freed "
                 "by backward) and the workspace (made by the step)");
    else
        snprintf(why[6], 256, "sum of the above; a framework adds its context and workspace (~0.5-1 GB on a GPU)");
    return EM_OK;
}

/* ---- estimates for an Ember model ---- */

/* What the layers of a model keep per sample, in elements (see the header). */
typedef struct model_walk {
    double params, largest, lora_in_out;   /* lora_in_out: sum of in + out over Linears */
    int64_t input, width, widest, widest_out, saved;
    int linears;
    em_dtype dt;
    bool dt_set, dt_mixed;
    char unknown[64];                      /* the first module kind not known, or "" */
} model_walk;

static void walk_dtype(model_walk *w, em_tensor *t) {
    em_dtype d = em_dtype_of(t);
    if (!w->dt_set) w->dt = d, w->dt_set = true;
    else if (d != w->dt) w->dt_mixed = true;
    double n = (double)em_numel(t);
    w->params += n;
    if (n > w->largest) w->largest = n;
}

static void walk_linear(model_walk *w, int64_t in, int64_t out) {
    if (!w->linears++) w->input = in;
    w->width = out;
    w->saved += out;
    w->lora_in_out += (double)(in + out);
    if (out > w->widest_out) w->widest_out = out;
    if (out > w->widest) w->widest = out;
    if (in > w->widest) w->widest = in;
}

static void walk_module(model_walk *w, em_module *m) {
    if (m->nkids > 0) {
        for (int i = 0; i < m->nkids; i++) walk_module(w, m->kids[i].m);
        return;
    }
    const char *k = m->ops && m->ops->name ? m->ops->name : "?";
    if (!strcmp(k, "Linear") && m->nparams > 0 && em_ndim(m->params[0].t) == 2) {
        walk_linear(w, em_size(m->params[0].t, 1), em_size(m->params[0].t, 0));
    } else if (!strcmp(k, "ReLU") || !strcmp(k, "Sigmoid") || !strcmp(k, "Tanh") || !strcmp(k, "Flatten")) {
        /* keeps its output, the Linear's is freed; Flatten is a view */
    } else if (!strcmp(k, "GELU")) {
        w->saved += w->width;
    } else if (!strcmp(k, "Dropout")) {
        w->saved += 2 * w->width;
    } else {
        w->saved += w->width;
        if (!w->unknown[0]) snprintf(w->unknown, sizeof w->unknown, "%s", k);
    }
}

static em_status estimate_walk(const char *fn, model_walk *w, const em_estimate_opts *o, em_estimate *out,
                               bool assumed_acts) {
    if (w->params < 1) return em_error(EM_ERR_ARGUMENT, "%s: the model has no parameters", fn);
    if (w->dt_mixed || !(w->dt == EM_F32 || w->dt == EM_F16 || w->dt == EM_BF16))
        return em_error(EM_ERR_DTYPE, "%s: expected every parameter in one of float32, float16 or bfloat16, "
                        "found %s", fn, w->dt_mixed ? "mixed dtypes" : em_dtype_name(w->dt));
    em_estimate_opts mo = *o;
    mo.params = w->params;
    mo.dtype = w->dt;
    mo.hidden = w->widest > 0 ? w->widest : 1;
    mo.layers = w->linears > 0 ? w->linears : 1;
    mo.seq = 0;
    int rank = o->lora_rank ? o->lora_rank : 8;
    mo.lora_params = w->linears > 0 ? rank * w->lora_in_out : 0;
    bool training = o->mode != EM_ESTIMATE_INFERENCE;
    mo.largest_param = o->mode == EM_ESTIMATE_LORA ? rank * (double)w->widest : w->largest;
    double e = w->dt == EM_F32 ? 4 : 2;
    /* training: + cross-entropy's log-softmax + two gradients of the widest output in backward */
    int64_t kept = training ? w->saved + w->width + 2 * w->widest_out : 2 * w->widest_out;
    bool counted = o->batch > 0 && o->activation_bytes_per_sample <= 0 && w->linears > 0;
    if (counted) {
        mo.input_bytes_per_sample = (double)w->input * e;
        mo.activation_bytes_per_sample = (double)kept * e;
    }
    em_status st = em_estimate_memory(&mo, out);
    if (st != EM_OK) return st;
    out->shape_inferred = false;
    if (counted) {
        char tail[128] = "";
        if (w->unknown[0])
            snprintf(tail, sizeof tail, "; a %s layer counted as one output", w->unknown);
        else if (assumed_acts && w->linears > 1)
            snprintf(tail, sizeof tail, "; assumes ReLU-like activations between the Linears");
        if (training)
            snprintf(out->why[EM_ESTIMATE_ACTIVATIONS], 256, "batch %lld x (input %lld + layer outputs %lld + "
                     "log-softmax %lld + 2 x %lld gradients in backward) x %.0f B%s", (long long)o->batch,
                     (long long)w->input, (long long)w->saved, (long long)w->width, (long long)w->widest_out, e, tail);
        else
            snprintf(out->why[EM_ESTIMATE_ACTIVATIONS], 256, "batch %lld x (input %lld + 2 x the widest output "
                     "%lld: matmul and bias sum) x %.0f B", (long long)o->batch, (long long)w->input,
                     (long long)w->widest_out, e);
    } else if (o->batch <= 0) {
        snprintf(out->why[EM_ESTIMATE_ACTIVATIONS], 256, "not counted: give a batch size");
    }
    return EM_OK;
}

em_status em_estimate_module(em_module *m, const em_estimate_opts *o, em_estimate *out) {
    if (!m || !o || !out) return em_error(EM_ERR_ARGUMENT, "em_estimate_module: NULL argument");
    model_walk w = {0};
    em_named_tensor stack[64], *ps = stack;
    int n = em_module_parameters(m, stack, 64);
    if (n > 64) {
        if (!(ps = malloc(sizeof *ps * (size_t)n))) return em_error(EM_ERR_OUT_OF_MEMORY, "em_estimate_module");
        em_module_parameters(m, ps, n);
    }
    for (int i = 0; i < n; i++) walk_dtype(&w, ps[i].tensor);
    if (ps != stack) free(ps);
    walk_module(&w, m);
    return estimate_walk("em_estimate_module", &w, o, out, false);
}

/* "10.weight" after "2.weight": digit runs compare by value. */
static int natural_cmp(const char *a, const char *b) {
    while (*a && *b) {
        if (isdigit((unsigned char)*a) && isdigit((unsigned char)*b)) {
            char *ea, *eb;
            unsigned long long x = strtoull(a, &ea, 10), y = strtoull(b, &eb, 10);
            if (x != y) return x < y ? -1 : 1;
            a = ea, b = eb;
        } else {
            if (*a != *b) return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
            a++, b++;
        }
    }
    return (unsigned char)*a - (unsigned char)*b;
}

static int by_name(const void *x, const void *y) {
    return natural_cmp(*(const char *const *)x, *(const char *const *)y);
}

em_status em_estimate_checkpoint(const char *path, const em_estimate_opts *o, em_estimate *out) {
    if (!path || !o || !out) return em_error(EM_ERR_ARGUMENT, "em_estimate_checkpoint: NULL argument");
    em_safetensors *st = em_safetensors_load(path, EM_DEVICE_CPU);
    if (!st) return em_last_status();
    int n = em_safetensors_count(st);
    const char **names = malloc(sizeof *names * (size_t)(n > 0 ? n : 1));
    if (!names) {
        em_safetensors_free(st);
        return em_error(EM_ERR_OUT_OF_MEMORY, "em_estimate_checkpoint");
    }
    /* a training checkpoint (em_checkpoint_save) also holds the optimizer's state: not the model */
    const char *format = em_safetensors_metadata(st, "format");
    bool checkpoint = format && !strcmp(format, EM__CHECKPOINT_FORMAT);
    int kept = 0;
    for (int i = 0; i < n; i++) {
        const char *name = em_safetensors_name(st, i);
        if (!checkpoint || strncmp(name, "optimizer.", 10)) names[kept++] = name;
    }
    n = kept;
    qsort(names, (size_t)n, sizeof *names, by_name);
    model_walk w = {0};
    em_scope s = em_scope_begin();
    for (int i = 0; i < n; i++) {
        em_tensor *t = em_safetensors_get(st, names[i]);
        if (!t) continue;
        if (em_dtype_is_floating(em_dtype_of(t))) walk_dtype(&w, t);
        size_t len = strlen(names[i]);
        bool weight = len >= 6 && !strcmp(names[i] + len - 6, "weight") && (len == 6 || names[i][len - 7] == '.');
        if (weight && em_ndim(t) == 2) walk_linear(&w, em_size(t, 1), em_size(t, 0));
    }
    em_scope_end(s);
    free(names);
    em_safetensors_free(st);
    char fn[300];
    snprintf(fn, sizeof fn, "em_estimate_checkpoint('%.256s')", path);
    return estimate_walk(fn, &w, o, out, true);
}
