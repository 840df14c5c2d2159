/* Memory estimates from a parameter count (include/ember/estimate.h, `ember mem`). */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <ember/estimate.h>
#include "../core/errors.h"

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
                                  "activations", "total"};
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
        o->seq < 0 || o->activation_bytes_per_sample < 0)
        return em_error(EM_ERR_ARGUMENT, "em_estimate_memory: rank, targets, hidden, layers, batch, seq and "
                        "activation bytes must not be negative");
    double P = o->params;
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
        double T = out->trainable_params = L * m * r * 2.0 * h;  /* A: r x h and B: h x r per matrix */
        fmt_count(t, sizeof t, T);
        B[EM_ESTIMATE_WEIGHTS] = P * w + T * 4;
        B[EM_ESTIMATE_GRADIENTS] = T * 4;
        B[EM_ESTIMATE_OPTIMIZER_STATES] = T * k * 4;
        snprintf(why[0], 256, "frozen base %s x %.0f B (%s) + adapters %s x 4 B (%lld layers x %d matrices x "
                 "rank %d x 2 x %lld)", p, w, dt, t, (long long)out->layers, m, r, (long long)out->hidden);
        snprintf(why[1], 256, "float32 gradients for the %s adapter parameters only", t);
        snprintf(why[2], 256, "%s per adapter parameter in float32: %d x %s x 4 B", state_names(o->optimizer), k, t);
        snprintf(why[3], 256, "none: the adapters are float32 already");
    }

    if (o->activation_bytes_per_sample > 0 && o->batch > 0) {
        B[EM_ESTIMATE_ACTIVATIONS] = (double)o->batch * o->activation_bytes_per_sample;
        snprintf(why[4], 256, "given: %lld samples x %.0f B per sample", (long long)o->batch,
                 o->activation_bytes_per_sample);
    } else if (o->batch > 0 && o->seq > 0) {
        double b = (double)o->batch, s = (double)o->seq, heads = h >= 128 ? floor(h / 128) : 1;
        if (o->mode == EM_ESTIMATE_INFERENCE) {   /* the KV cache dominates */
            B[EM_ESTIMATE_ACTIVATIONS] = 2 * L * b * s * h * w;
            snprintf(why[4], 256, "KV cache: 2 x %lld layers x batch %lld x seq %lld x hidden %lld x %.0f B",
                     (long long)out->layers, (long long)o->batch, (long long)o->seq, (long long)out->hidden, w);
        } else {   /* saved for backward, no recomputation (Korthikanti et al. 2022), 16-bit */
            B[EM_ESTIMATE_ACTIVATIONS] = L * s * b * h * (34 + 5 * heads * s / h) * (w / 2);
            snprintf(why[4], 256, "saved for backward: %lld layers x seq x batch x hidden x (34 + 5 x heads x "
                     "seq / hidden) B%s, %lld heads", (long long)out->layers, w > 2 ? " x 2 (float32)" : "",
                     (long long)heads);
        }
    } else {
        snprintf(why[4], 256, "not counted: give a batch and sequence length (or bytes per sample)");
    }
    for (int i = 0; i < EM_ESTIMATE_TOTAL; i++) B[EM_ESTIMATE_TOTAL] += B[i];
    snprintf(why[5], 256, "sum of the above; a framework adds its context and workspace (~0.5-1 GB on a GPU)");
    return EM_OK;
}
