/* Memory estimates (include/ember/estimate.h) where both the optimizers and the models are
 * known: optim, which builds on nn. What each optimizer keeps per parameter is said here; the
 * arithmetic is memory's (src/memory/estimate.c, through internal_api.h). An Ember model or
 * checkpoint is walked through nn's public calls (its layers' kinds and shapes) and the
 * counts fed to the same arithmetic. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <ember/estimate.h>
#include <ember/io.h>
#include <ember/nn.h>
#include <ember/tensor.h>
#include "../core/internal_api.h"
#include "../nn/nn_internal.h"

/* ---- the optimizers ---- */

/* What each em_estimate_optimizer keeps per trainable parameter, in the enum's order: the
 * states optimizer.c makes (momentum_buffer; exp_avg and exp_avg_sq, without amsgrad's
 * max_exp_avg_sq), and the name the parser takes. */
static const em_estimate_states optimizer_states[] = {
    [EM_ESTIMATE_SGD] = {0, "plain SGD keeps no state", "sgd"},
    [EM_ESTIMATE_SGD_MOMENTUM] = {1, "SGD with momentum keeps 1 buffer", "sgd-momentum"},
    [EM_ESTIMATE_ADAM] = {2, "Adam keeps 2 states (exp_avg, exp_avg_sq)", "adam"},
    [EM_ESTIMATE_ADAMW] = {2, "AdamW keeps 2 states (exp_avg, exp_avg_sq)", "adamw"},
};
#define N_OPTIMIZERS ((int)(sizeof optimizer_states / sizeof *optimizer_states))

static const em_estimate_states *states_of(em_estimate_optimizer o) {
    return (unsigned)o < (unsigned)N_OPTIMIZERS ? &optimizer_states[o] : NULL;
}

em_status em_estimate_parse_optimizer(const char *s, em_estimate_optimizer *out) {
    for (int i = 0; s && i < N_OPTIMIZERS; i++)
        if (!strcasecmp(s, optimizer_states[i].name)) {
            *out = (em_estimate_optimizer)i;
            return EM_OK;
        }
    return em_error(EM_ERR_ARGUMENT, "unknown optimizer '%s': expected sgd, sgd-momentum, adam or adamw",
                    s ? s : "(null)");
}

const char *em_estimate_optimizer_name(em_estimate_optimizer o) {
    const em_estimate_states *st = states_of(o);
    return st ? st->name : "?";
}

em_status em_estimate_memory(const em_estimate_opts *o, em_estimate *out) {
    return em__estimate_memory(o, o ? states_of(o->optimizer) : NULL, out);
}

/* ---- models and checkpoints ---- */

/* What the layers of a model keep per sample, in elements (see the header). */
typedef struct model_walk {
    double params, largest, lora_in_out;   /* lora_in_out: sum of in + out over Linears */
    double first_params;                   /* the first Linear's weight and bias */
    int64_t input, width, widest, widest_out, saved;
    int linears;
    em_dtype dt;
    bool dt_set, dt_mixed;
    char unknown[64];                      /* the first module kind not known, or "" */
} model_walk;

static void walk_dtype(model_walk *walk, em_tensor *t) {
    em_dtype d = em_dtype_of(t);
    if (!walk->dt_set) walk->dt = d, walk->dt_set = true;
    else if (d != walk->dt) walk->dt_mixed = true;
    double n = (double)em_numel(t);
    walk->params += n;
    if (n > walk->largest) walk->largest = n;
}

static void walk_linear(model_walk *walk, int64_t in, int64_t out) {
    if (!walk->linears++) walk->input = in, walk->first_params = (double)in * (double)out + (double)out;
    walk->width = out;
    walk->saved += out;
    walk->lora_in_out += (double)(in + out);
    if (out > walk->widest_out) walk->widest_out = out;
    if (out > walk->widest) walk->widest = out;
    if (in > walk->widest) walk->widest = in;
}

static void walk_module(model_walk *walk, em_module *m) {
    if (em_module_child(m, 0)) {
        for (int i = 0; em_module_child(m, i); i++) walk_module(walk, em_module_child(m, i));
        return;
    }
    int64_t in, out;
    switch (em_module_kind_of(m)) {
    case EM_MODULE_LINEAR:
        if (em_module_linear_shape(m, &in, &out) == EM_OK) walk_linear(walk, in, out);
        break;
    case EM_MODULE_RELU: case EM_MODULE_SIGMOID: case EM_MODULE_TANH: case EM_MODULE_FLATTEN:
        break;   /* keeps its output, the Linear's is freed; Flatten is a view */
    case EM_MODULE_GELU:
        walk->saved += walk->width;
        break;
    case EM_MODULE_DROPOUT:
        walk->saved += 2 * walk->width;
        break;
    default:
        walk->saved += walk->width;
        if (!walk->unknown[0]) snprintf(walk->unknown, sizeof walk->unknown, "%s", em_module_name(m));
    }
}

static em_status estimate_walk(const char *fn, model_walk *walk, const em_estimate_opts *o, em_estimate *out,
                               bool assumed_acts) {
    if (walk->params < 1) return em_error(EM_ERR_ARGUMENT, "%s: the model has no parameters", fn);
    if (walk->dt_mixed || !(walk->dt == EM_F32 || walk->dt == EM_F16 || walk->dt == EM_BF16))
        return em_error(EM_ERR_DTYPE, "%s: expected every parameter in one of float32, float16 or bfloat16, "
                        "found %s", fn, walk->dt_mixed ? "mixed dtypes" : em_dtype_name(walk->dt));
    em_estimate_opts mo = *o;
    mo.params = walk->params;
    mo.dtype = walk->dt;
    mo.hidden = walk->widest > 0 ? walk->widest : 1;
    mo.layers = walk->linears > 0 ? walk->linears : 1;
    mo.seq = 0;
    int rank = o->lora_rank ? o->lora_rank : 8;
    mo.lora_params = walk->linears > 0 ? rank * walk->lora_in_out : 0;
    bool training = o->mode != EM_ESTIMATE_INFERENCE;
    mo.largest_param = o->mode == EM_ESTIMATE_LORA ? rank * (double)walk->widest : walk->largest;
    bool amp = o->autocast_dtype == EM_F16 || o->autocast_dtype == EM_BF16;
    double elem_bytes = walk->dt == EM_F32 && !amp ? 4 : 2;
    /* training: + cross-entropy's log-softmax + two gradients of the widest output in backward */
    int64_t kept = training ? walk->saved + walk->width + 2 * walk->widest_out : 2 * walk->widest_out;
    /* LoRA: an adapted Linear's base output lives next to the sum it adds the adapters to;
     * in backward the input's two gradient parts (the frozen Linear's and the adapter's) are
     * summed in place into the first (src/autograd/engine.c), so no third widest gradient */
    bool counted = o->batch > 0 && o->activation_bytes_per_sample <= 0 && walk->linears > 0;
    if (counted) {
        double in_bytes = walk->dt == EM_F32 ? 4 : 2;
        mo.input_bytes_per_sample = (double)walk->input * in_bytes;
        mo.activation_bytes_per_sample = (double)kept * elem_bytes;
        if (amp) /* the input's cast saved by the first Linear; the loss runs in float32 (logits cast + log-softmax) */
            mo.activation_bytes_per_sample += (double)walk->input * 2 + (training ? (double)walk->width * 4 * 2 - (double)walk->width * 2 : 0);
    }
    em_status st = em_estimate_memory(&mo, out);
    if (st != EM_OK) return st;
    out->shape_inferred = false;
    if (counted) {
        char tail[128] = "";
        if (walk->unknown[0])
            snprintf(tail, sizeof tail, "; a %s layer counted as one output", walk->unknown);
        else if (assumed_acts && walk->linears > 1)
            snprintf(tail, sizeof tail, "; assumes ReLU-like activations between the Linears");
        if (amp) {
            size_t len = strlen(tail);
            if (training)
                snprintf(tail + len, sizeof tail - len, "; autocast: + input cast, f32 loss, weight casts %.0f x 2 B",
                         walk->params);
            else
                snprintf(tail + len, sizeof tail - len, "; autocast: + the input's cast");
        }
        if (training)
            snprintf(out->why[EM_ESTIMATE_ACTIVATIONS], 256, "batch %lld x (input %lld + layer outputs %lld + "
                     "log-softmax %lld + 2 x %lld gradients in backward%s) x %.0f B%s", (long long)o->batch,
                     (long long)walk->input, (long long)walk->saved, (long long)walk->width,
                     (long long)walk->widest_out,
                     o->mode == EM_ESTIMATE_LORA ? ", one of them LoRA's base output's sum" : "", elem_bytes, tail);
        else
            snprintf(out->why[EM_ESTIMATE_ACTIVATIONS], 256, "batch %lld x (input %lld + 2 x the widest output "
                     "%lld: matmul and bias sum) x %.0f B", (long long)o->batch, (long long)walk->input,
                     (long long)walk->widest_out, elem_bytes);
    } else if (o->batch <= 0) {
        snprintf(out->why[EM_ESTIMATE_ACTIVATIONS], 256, "not counted: give a batch size");
    }
    /* Training's peak is one of two moments. The widest layer's backward (where the activations
     * above peak) comes before the first Linear's gradient exists: backward makes it last. The
     * step's end has every gradient and, of the activations, only the input. The activation
     * line absorbs the difference so the lines still sum to the total. */
    if (counted && o->mode == EM_ESTIMATE_FULL && walk->first_params > 0 && out->trainable_params > 0 &&
        out->bytes[EM_ESTIMATE_WORKSPACE] == 0) {
        double total = out->bytes[EM_ESTIMATE_TOTAL];
        double first_grad = walk->first_params * out->bytes[EM_ESTIMATE_GRADIENTS] / out->trainable_params;
        double input = (double)o->batch * mo.input_bytes_per_sample;
        double backward = total - first_grad, end = total - out->bytes[EM_ESTIMATE_ACTIVATIONS] + input;
        double peak = backward > end ? backward : end;
        out->bytes[EM_ESTIMATE_ACTIVATIONS] -= total - peak;
        out->bytes[EM_ESTIMATE_TOTAL] = peak;
        size_t len = strlen(out->why[EM_ESTIMATE_ACTIVATIONS]);
        snprintf(out->why[EM_ESTIMATE_ACTIVATIONS] + len, 256 - len, backward > end
                 ? "; at the peak (the widest layer's backward) less the first Linear's gradient, not made yet"
                 : "; the peak is the step's end: every gradient, only the input");
    }
    return EM_OK;
}

em_status em_estimate_module(em_module *m, const em_estimate_opts *o, em_estimate *out) {
    if (!m || !o || !out) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_estimate_module: NULL argument");
    model_walk walk = {0};
    em_named_tensor stack[64], *ps = stack;
    int n = em_module_parameters(m, stack, 64);
    if (n > 64) {
        if (!(ps = malloc(sizeof *ps * (size_t)n))) return em_error(EM_ERR_OUT_OF_MEMORY, "em_estimate_module");
        em_module_parameters(m, ps, n);
    }
    for (int i = 0; i < n; i++) walk_dtype(&walk, ps[i].tensor);
    if (ps != stack) free(ps);
    walk_module(&walk, m);
    return estimate_walk("em_estimate_module", &walk, o, out, false);
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
    if (!path || !o || !out) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_estimate_checkpoint: NULL argument");
    em_safetensors *st = em_safetensors_load(path, EM_DEVICE_CPU);
    if (!st) return em_last_status();
    em_status status = em_estimate_safetensors(st, o, out);
    em_safetensors_free(st);
    return status;
}

em_status em_estimate_safetensors(const em_safetensors *st, const em_estimate_opts *o, em_estimate *out) {
    if (!st || !o || !out) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_estimate_safetensors: NULL argument");
    const char *path = em_safetensors_path(st);
    int n = em_safetensors_count(st);
    const char **names = malloc(sizeof *names * (size_t)(n > 0 ? n : 1));
    if (!names) return em_error(EM_ERR_OUT_OF_MEMORY, "em_estimate_checkpoint");
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
    model_walk walk = {0};
    int not_floating = 0;   /* integer and bool tensors (buffers, indices): not parameters */
    char first_other[160] = "";
    em_scope s = em_scope_begin();
    for (int i = 0; i < n; i++) {
        em_tensor *t = em_safetensors_get(st, names[i]);
        if (!t) continue;
        if (em_dtype_is_floating(em_dtype_of(t))) {
            walk_dtype(&walk, t);
        } else if (!not_floating++) {
            snprintf(first_other, sizeof first_other, "'%.100s' is %s", names[i], em_dtype_name(em_dtype_of(t)));
        }
        size_t len = strlen(names[i]);
        bool weight = len >= 6 && !strcmp(names[i] + len - 6, "weight") && (len == 6 || names[i][len - 7] == '.');
        if (weight && em_ndim(t) == 2) walk_linear(&walk, em_size(t, 1), em_size(t, 0));
    }
    em_scope_end(s);
    free(names);
    char fn[300];
    snprintf(fn, sizeof fn, "em_estimate_checkpoint('%.256s')", path);
    if (walk.params < 1 && not_floating > 0)   /* say what the file holds instead */
        return em_error(EM_ERR_DTYPE, "%s: no parameters to count: the file's %d tensor%s %s integer or bool (%s); "
                        "parameters are float32, float16 or bfloat16", fn, not_floating, not_floating == 1 ? "" : "s",
                        not_floating == 1 ? "is" : "are all", first_other);
    return estimate_walk(fn, &walk, o, out, true);
}
