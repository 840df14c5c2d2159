/* Memory estimates from a parameter count (include/ember/estimate.h, `ember mem`): the
 * arithmetic, from plain numbers. The optimizers' states and names are the caller's
 * (src/optim/estimate.c, which also walks models and checkpoints): memory knows no optimizer. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "estimate_arith.h"
#include "../util/errors.h"

em_status em_estimate_parse_params(const char *s, double *out) {
    if (!s || !out) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_estimate_parse_params: NULL argument");
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

const char *em_estimate_mode_name(em_estimate_mode m) {
    static const char *names[] = {"inference", "full", "lora"};
    return (unsigned)m < 3 ? names[m] : "?";
}

const char *em_estimate_line_name(em_estimate_line l) {
    static const char *names[] = {"weights", "gradients", "optimizer states", "master weights",
                                  "activations", "workspace", "total"};
    return (unsigned)l < EM_ESTIMATE_LINES ? names[l] : "?";
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

em_status em__estimate_memory(const em_estimate_opts *o, const em_estimate_states *states, em_estimate *out) {
    if (!o || !out) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_estimate_memory: NULL argument");
    memset(out, 0, sizeof *out);
    if (!(o->params >= 1) || !isfinite(o->params))
        return em_error(EM_ERR_ARGUMENT, "em_estimate_memory: params must be at least 1, got %g", o->params);
    double weight_bytes;
    const char *dtype_name;
    switch (o->dtype) {
    case EM_F32: weight_bytes = 4; dtype_name = "float32"; break;
    case EM_F16: weight_bytes = 2; dtype_name = "float16"; break;
    case EM_BF16: weight_bytes = 2; dtype_name = "bfloat16"; break;
    default:
        return em_error(EM_ERR_DTYPE, "em_estimate_memory: weights must be float32, float16 or bfloat16");
    }
    if ((unsigned)o->mode > EM_ESTIMATE_LORA || !states)
        return em_error(EM_ERR_ARGUMENT, "em_estimate_memory: unknown mode %d or optimizer %d", (int)o->mode,
                        (int)o->optimizer);
    if (o->lora_rank < 0 || o->lora_targets < 0 || o->hidden < 0 || o->layers < 0 || o->batch < 0 ||
        o->seq < 0 || o->kv_width < 0 || !(o->activation_bytes_per_sample >= 0) || !(o->input_bytes_per_sample >= 0) ||
        !(o->largest_param >= 0) || !(o->lora_params >= 0))
        return em_error(EM_ERR_ARGUMENT, "em_estimate_memory: rank, targets, hidden, layers, batch, seq, KV width, "
                        "activation and input bytes, largest parameter and LoRA parameters must not be negative");
    if (o->autocast_dtype != EM_F32 && o->autocast_dtype != EM_F16 && o->autocast_dtype != EM_BF16)
        return em_error(EM_ERR_DTYPE, "em_estimate_memory: autocast_dtype must be float16 or bfloat16 (or float32 "
                        "for none), got %s", em_dtype_name(o->autocast_dtype));
    /* autocast: activations in its 16-bit dtype whatever the weights' */
    bool amp = o->autocast_dtype != EM_F32;
    double act_bytes = amp ? 2 : weight_bytes;
    double params = out->params = o->params;
    out->dtype = o->dtype;
    int nstates = states->per_param;
    bool master = o->master_weights && weight_bytes < 4;   /* float32 weights are their own master copy */
    double state_bytes = master ? 4 : weight_bytes;        /* bytes per optimizer state */
    out->hidden = o->hidden;
    out->layers = o->layers;
    out->shape_inferred = o->hidden <= 0 || o->layers <= 0;
    infer_shape(params, &out->hidden, &out->layers);
    double hidden = (double)out->hidden, layers = (double)out->layers;
    char params_text[32], trainable_text[32];
    fmt_count(params_text, sizeof params_text, params);
    double *bytes = out->bytes;
    char (*why)[256] = out->why;

    if (o->mode == EM_ESTIMATE_INFERENCE) {
        out->trainable_params = 0;
        bytes[EM_ESTIMATE_WEIGHTS] = params * weight_bytes;
        snprintf(why[0], 256, "%s parameters x %.0f B (%s)", params_text, weight_bytes, dtype_name);
        snprintf(why[1], 256, "none: inference computes no gradients");
        snprintf(why[2], 256, "none: no optimizer");
        snprintf(why[3], 256, "none");
    } else if (o->mode == EM_ESTIMATE_FULL) {
        double trainable = out->trainable_params = params;
        bytes[EM_ESTIMATE_WEIGHTS] = params * weight_bytes;
        bytes[EM_ESTIMATE_GRADIENTS] = trainable * weight_bytes;
        bytes[EM_ESTIMATE_OPTIMIZER_STATES] = trainable * nstates * state_bytes;
        bytes[EM_ESTIMATE_MASTER_WEIGHTS] = master ? trainable * 4 : 0;
        snprintf(why[0], 256, "%s parameters x %.0f B (%s)", params_text, weight_bytes, dtype_name);
        snprintf(why[1], 256, "one %s gradient per parameter: %s x %.0f B", dtype_name, params_text,
                 weight_bytes);
        snprintf(why[2], 256, "%s per parameter in %s: %d x %s x %.0f B", states->what,
                 master ? "float32" : dtype_name, nstates, params_text, state_bytes);
        if (master)
            snprintf(why[3], 256, "float32 copy of the weights that the optimizer updates: %s x 4 B", params_text);
        else snprintf(why[3], 256, "none: weights, gradients and states all stay in %s", dtype_name);
    } else {
        int rank = o->lora_rank ? o->lora_rank : 8, targets = o->lora_targets ? o->lora_targets : 2;
        /* A: rank x hidden, B: hidden x rank */
        double trainable = out->trainable_params = o->lora_params > 0 ? o->lora_params
                                                                      : layers * targets * rank * 2.0 * hidden;
        fmt_count(trainable_text, sizeof trainable_text, trainable);
        bytes[EM_ESTIMATE_WEIGHTS] = params * weight_bytes + trainable * 4;
        bytes[EM_ESTIMATE_GRADIENTS] = trainable * 4;
        bytes[EM_ESTIMATE_OPTIMIZER_STATES] = trainable * nstates * 4;
        if (o->lora_params > 0)
            snprintf(why[0], 256, "frozen base %s x %.0f B (%s) + adapters %s x 4 B (rank %d x (in + out) per "
                     "Linear)", params_text, weight_bytes, dtype_name, trainable_text, rank);
        else
            snprintf(why[0], 256, "frozen base %s x %.0f B (%s) + adapters %s x 4 B (%lld layers x %d matrices "
                     "x rank %d x 2 x %lld)", params_text, weight_bytes, dtype_name, trainable_text,
                     (long long)out->layers, targets, rank, (long long)out->hidden);
        snprintf(why[1], 256, "float32 gradients for the %s adapter parameters only", trainable_text);
        snprintf(why[2], 256, "%s per adapter parameter in float32: %d x %s x 4 B", states->what,
                 nstates, trainable_text);
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
        double batch = (double)o->batch, seq = (double)o->seq, heads = hidden >= 128 ? floor(hidden / 128) : 1;
        if (o->mode == EM_ESTIMATE_INFERENCE) {   /* the KV cache dominates */
            double width = o->kv_width > 0 ? (double)o->kv_width : hidden;
            saved = 2 * layers * batch * seq * width * weight_bytes;
            snprintf(why[4], 256, "%sKV cache: 2 x %lld layers x batch %lld x seq %lld x %s %.0f x %.0f B",
                     in_why, (long long)out->layers, (long long)o->batch, (long long)o->seq,
                     o->kv_width > 0 ? "key-value width" : "hidden", width, weight_bytes);
        } else {   /* saved for backward, no recomputation (Korthikanti et al. 2022), 16-bit */
            saved = layers * seq * batch * hidden * (34 + 5 * heads * seq / hidden) * (act_bytes / 2);
            snprintf(why[4], 256, "%ssaved for backward: %lld layers x seq x batch x hidden x (34 + 5 x heads x "
                     "seq / hidden) B%s, %lld heads", in_why, (long long)out->layers,
                     act_bytes > 2 ? " x 2 (float32)" : amp ? " (autocast)" : "", (long long)heads);
        }
    } else if (input > 0) {
        snprintf(why[4], 256, "input only: %lld x %.0f B", (long long)o->batch, o->input_bytes_per_sample);
    } else {
        snprintf(why[4], 256, "not counted: give a batch and sequence length (or bytes per sample)");
    }
    if (amp && o->mode != EM_ESTIMATE_INFERENCE && saved > 0) {
        /* the region's casts of the weights, kept by the graph until backward */
        double casts = params * 2;
        saved += casts;
        size_t len = strlen(why[4]);
        snprintf(why[4] + len, 256 - len, " + the weights' %s casts %.0f x 2 B",
                 o->autocast_dtype == EM_F16 ? "float16" : "bfloat16", params);
    }
    bytes[EM_ESTIMATE_ACTIVATIONS] = input + saved;

    /* No parameter-sized temporary (see the header): the fused steps make none, and backward's
     * gradients become .grad without a copy. */
    int temporaries = 0;
    double workspace_elem_bytes = o->mode == EM_ESTIMATE_FULL ? state_bytes : 4;   /* LoRA adapters are float32 */
    if (o->mode == EM_ESTIMATE_INFERENCE) {
        snprintf(why[5], 256, "none: no optimizer");
    } else if (o->largest_param > 0 && temporaries == 0) {
        snprintf(why[5], 256, "none: %s's fused step makes no temporaries and gradients become .grad without "
                 "a copy", states->name);
    } else if (o->largest_param > 0) {
        char largest_text[32];
        fmt_count(largest_text, sizeof largest_text, o->largest_param);
        bytes[EM_ESTIMATE_WORKSPACE] = temporaries * o->largest_param * workspace_elem_bytes;
        snprintf(why[5], 256, "the largest tensor's gradient made in backward (%s's fused step needs no "
                 "temporaries): %d temporary x %s x %.0f B", states->name, temporaries,
                 largest_text, workspace_elem_bytes);
    } else {
        snprintf(why[5], 256, "not counted: the largest tensor is unknown (%d x its size for %s)", temporaries,
                 states->name);
    }
    double workspace = bytes[EM_ESTIMATE_WORKSPACE];
    for (int i = 0; i < EM_ESTIMATE_ACTIVATIONS; i++) bytes[EM_ESTIMATE_TOTAL] += bytes[i];
    bytes[EM_ESTIMATE_TOTAL] += input + (workspace > 0 ? fmax(saved, workspace) : saved);
    if (workspace > 0)
        snprintf(why[6], 256, "weights to master weights + input + the larger of the other activations (freed "
                 "by backward) and the workspace (made by the step)");
    else
        snprintf(why[6], 256, "sum of the above; a framework adds its context and workspace (~0.5-1 GB on a GPU)");
    return EM_OK;
}
