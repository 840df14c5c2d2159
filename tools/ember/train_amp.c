/* Mixed precision for `ember train --amp` and `ember mem --amp`: the forward pass under an
 * autocast region (matmul and Linear in the low dtype, the loss in float32), float32 master
 * weights and optimizer, and for f16 a gradient scaler whose skips and scale updates stay on
 * the device (include/ember/amp.h). Also `ember train`'s one batch step, where --amp,
 * --devices and --accumulate combine, and the scaler's state in its checkpoints. */
#include "train_amp.h"

#include <float.h>
#include <inttypes.h>
#include <stdio.h>
#include <ember/parse.h>

const opt_choice train_amp_choices[] = {
    {"bf16", EM_BF16}, {"bfloat16", EM_BF16},
    {"f16", EM_F16}, {"fp16", EM_F16}, {"float16", EM_F16}, {"half", EM_F16},
    {NULL, 0},
};

bool train_amp_check_scale(const char *tool, const char *opt, const char *text, double scale) {
    if ((float)scale > 0) return true;
    fprintf(stderr, "%s: %s expects a number > 0 and at most %g (float32's largest), got '%s' (underflows to 0 in "
            "float32, the scaler's dtype)\n", tool, opt, (double)FLT_MAX, text);
    return false;
}

bool train_amp_start(train_amp *a, bool on, em_dtype dtype, double init_scale) {
    *a = (train_amp){.on = on, .dtype = dtype};
    if (!on || dtype != EM_F16) return true;
    em_grad_scaler_opts so = em_grad_scaler_defaults();
    if (init_scale > 0) so.init_scale = init_scale;
    a->scaler = em_grad_scaler_new(so);
    return a->scaler != NULL;
}

void train_amp_free(train_amp *a) {
    em_grad_scaler_free(a->scaler);
    a->scaler = NULL;
}

em_autocast train_amp_begin(const train_amp *a, em_device device) {
    if (!a->on) return (em_autocast){.depth = -1};   /* its end does nothing */
    return em_autocast_begin(device.type, a->dtype);
}

void train_amp_epoch_line(train_amp *a, char *buf, size_t size) {
    const char *name = em_dtype_name(a->dtype);
    if (!a->on) {
        snprintf(buf, size, "float32");
    } else if (!a->scaler) {
        snprintf(buf, size, "amp %s: no loss scaling (bfloat16 has float32's range)", name);
    } else {
        int64_t skipped = em_grad_scaler_skipped_steps(a->scaler);
        snprintf(buf, size, "amp %s: loss scale %g, %" PRId64 " skipped steps (%" PRId64 " this epoch)", name,
                 em_grad_scaler_get_scale(a->scaler), skipped, skipped - a->skipped_before);
        a->skipped_before = skipped;
    }
}

/* ---- the scaler in checkpoints ---- */

static const char *const meta_keys[TRAIN_AMP_META] = {
    "amp.scaler.scale", "amp.scaler.growth_tracker", "amp.scaler.skipped_steps", "amp.scaler.growth_factor",
    "amp.scaler.backoff_factor", "amp.scaler.growth_interval", "amp.scaler.enabled"};

em_status train_amp_meta_of(const train_amp *a, train_amp_meta *m) {
    m->n = 0;
    if (!a->scaler) return EM_OK;
    em_grad_scaler_state st;
    if (em_grad_scaler_state_dict(a->scaler, &st) != EM_OK) return em_last_status();
    /* %.17g: a double read back exactly (the scale is a float32 value) */
    snprintf(m->vals[0], sizeof m->vals[0], "%.17g", st.scale);
    snprintf(m->vals[1], sizeof m->vals[1], "%" PRId64, st.growth_tracker);
    snprintf(m->vals[2], sizeof m->vals[2], "%" PRId64, st.skipped_steps);
    snprintf(m->vals[3], sizeof m->vals[3], "%.17g", st.growth_factor);
    snprintf(m->vals[4], sizeof m->vals[4], "%.17g", st.backoff_factor);
    snprintf(m->vals[5], sizeof m->vals[5], "%" PRId64, st.growth_interval);
    snprintf(m->vals[6], sizeof m->vals[6], "%d", st.enabled ? 1 : 0);
    for (int i = 0; i < TRAIN_AMP_META; i++) m->keys[i] = meta_keys[i];
    m->n = TRAIN_AMP_META;
    return EM_OK;
}

/* One amp.scaler.* number; says which and why when it is missing or not a number. */
static bool meta_num(const char *tool, const em_safetensors *meta, const char *path, const char *key, bool integer,
                     double *out) {
    const char *v = em_safetensors_metadata(meta, key);
    em_num_result r;
    if (integer) {
        int64_t i = 0;
        r = em_parse_i64(v, -(INT64_C(1) << 53), INT64_C(1) << 53, &i);   /* exact in a double */
        *out = (double)i;
    } else {
        r = em_parse_f64(v, -DBL_MAX, DBL_MAX, out);
    }
    if (r == EM_NUM_OK) return true;
    fprintf(stderr, "%s: cannot resume: %s: metadata '%s' = '%.60s' (%s): expected %s\n", tool, path, key,
            v ? v : "", v ? em_num_why(r) : "missing", integer ? "an integer" : "a finite number");
    return false;
}

bool train_amp_resume(const char *tool, train_amp *a, const em_safetensors *meta, const char *path) {
    bool has = em_safetensors_metadata(meta, meta_keys[0]) != NULL;
    if (!a->scaler) {
        if (has) printf("note: %s holds a loss scaler's state; without --amp f16 it is not used\n", path);
        return true;
    }
    if (!has) {
        printf("note: %s holds no loss scaler state (saved without --amp f16): the scaler starts from its "
               "initial scale %g\n", path, em_grad_scaler_get_scale(a->scaler));
        return true;
    }
    double v[TRAIN_AMP_META];
    for (int i = 0; i < TRAIN_AMP_META; i++)
        if (!meta_num(tool, meta, path, meta_keys[i], i == 1 || i == 2 || i == 5 || i == 6, &v[i])) return false;
    em_grad_scaler_state st = {.scale = v[0], .growth_tracker = (int64_t)v[1], .skipped_steps = (int64_t)v[2],
                               .growth_factor = v[3], .backoff_factor = v[4], .growth_interval = (int64_t)v[5],
                               .enabled = v[6] != 0};
    if (em_grad_scaler_load_state_dict(a->scaler, &st) != EM_OK) {
        fprintf(stderr, "%s: cannot resume: %s: the loss scaler's state is unusable: %s\n", tool, path,
                em_last_error());
        em_clear_error();
        return false;
    }
    a->skipped_before = st.skipped_steps;
    return true;
}

/* ---- one training batch: --amp with --devices and --accumulate ---- */

/* Autocast regions for every device type the forward runs on (a DataParallel over cpu and
 * opencl:0 autocasts on both); the workers of em_dp enter the same ones. */
static int begin_regions(const train_amp *a, em_device device, em_dp *dp, em_autocast *open) {
    int n = 0;
    if (!a->on) return 0;
    int count = dp ? em_dp_device_count(dp) : 1;
    for (int i = 0; i < count; i++) {
        em_device_type t = dp ? em_dp_device(dp, i).type : device.type;
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= (dp ? em_dp_device(dp, j).type : device.type) == t;
        if (!seen) open[n++] = em_autocast_begin(t, a->dtype);
    }
    return n;
}

em_tensor *train_amp_batch(const train_amp *a, em_device device, em_module *model, em_dp *dp, em_optimizer *opt,
                           em_tensor *x, em_tensor *y, int64_t accumulate, int64_t *micro) {
    int64_t n = accumulate > 1 ? accumulate : 1;
    if (*micro == 0 && em_zero_grad(opt) != EM_OK) return NULL;   /* a group starts from zero gradients */
    em_autocast open[EM_DEVICE_TYPE_COUNT];
    int nopen = begin_regions(a, device, dp, open);
    em_tensor *loss = em_cross_entropy(dp ? em_dp_forward(dp, x) : em_forward(model, x), y, 0.0);
    em_status st = EM_OK;
    while (nopen > 0) {   /* backward outside the regions, as PyTorch advises */
        em_status e = em_autocast_end(open[--nopen]);
        if (st == EM_OK) st = e;
    }
    if (!loss || st != EM_OK) return NULL;
    /* the mean over n equal micro-batches is the mean loss of their union; the scaler
     * scales each micro-batch's loss, its unscale and step come once per group */
    em_tensor *l = n > 1 ? em_div_scalar(loss, (double)n) : loss;
    if (a->scaler) l = em_grad_scaler_scale(a->scaler, l);
    st = dp ? em_dp_backward(dp, l) : em_backward(l);
    if (st != EM_OK) return NULL;
    if (++*micro < n) return loss;
    return train_amp_flush(a, dp, opt, micro) == EM_OK ? loss : NULL;
}

em_status train_amp_flush(const train_amp *a, em_dp *dp, em_optimizer *opt, int64_t *micro) {
    if (*micro == 0) return EM_OK;
    *micro = 0;
    em_status st;
    if (a->scaler) {   /* one inf/NaN check on the summed gradients decides for every replica */
        st = em_grad_scaler_step(a->scaler, opt);
        if (st == EM_OK) st = em_grad_scaler_update(a->scaler);
    } else {
        st = em_step(opt);
    }
    if (st == EM_OK && dp) st = em_dp_sync(dp);   /* the replicas take the model's (stepped or not) */
    return st;
}
