/* Memory estimates for a config's exact shape: em_estimate_memory (src/optim/estimate.c, its
 * arithmetic in src/memory/estimate.c) given the model's true counts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models_internal.h"

em_status em_model_estimate(const em_model_config *cfg, const em_estimate_opts *o, em_estimate *out) {
    if (!cfg || !o || !out) return em_error(EM_ERR_ARGUMENT, "em_model_estimate: NULL argument");
    model_param *p;
    int n;
    if (em__model_param_specs(cfg, &p, &n) != EM_OK) return em_last_status();
    double params = 0, largest = 0;
    for (int i = 0; i < n; i++) {
        double numel = (double)p[i].shape[0] * (double)(p[i].ndim == 2 ? p[i].shape[1] : 1);
        params += numel;
        if (numel > largest) largest = numel;
    }
    free(p);
    em_estimate_opts e = *o;
    e.params = params;
    e.hidden = cfg->hidden_size;
    e.layers = cfg->num_hidden_layers;
    e.kv_width = cfg->num_key_value_heads * cfg->head_dim;
    e.largest_param = largest;
    /* LoRA on PEFT's default targets: q_proj and v_proj ([q, H] and [kv, H]), GPT-2's c_attn
     * ([H, 3H]); rank x (in + out) adapter parameters each */
    int64_t rank = o->lora_rank ? o->lora_rank : 8, h = cfg->hidden_size;
    int64_t q = cfg->num_attention_heads * cfg->head_dim, kv = cfg->num_key_value_heads * cfg->head_dim;
    int64_t narrowest = cfg->family == EM_MODEL_GPT2 ? h : (kv < h ? kv : h);
    if (o->mode == EM_ESTIMATE_LORA && rank > narrowest)
        return em_error(EM_ERR_ARGUMENT, "em_model_estimate: LoRA rank %lld is larger than the narrowest adapted "
                        "matrix (%lld): the rank must be at most that", (long long)rank, (long long)narrowest);
    double per_layer = cfg->family == EM_MODEL_GPT2 ? (double)rank * (double)(h + 3 * h)
                                                    : (double)rank * (double)(h + q) + (double)rank * (double)(h + kv);
    e.lora_targets = cfg->family == EM_MODEL_GPT2 ? 1 : 2;
    e.lora_params = per_layer * (double)cfg->num_hidden_layers;
    return em_estimate_memory(&e, out);
}

/* ---- one LoRA fine-tuning step ---- */

/* A projection LoRA can adapt: its module name and its in and out widths. */
typedef struct ft_site {
    const char *name;
    int64_t in, out;
} ft_site;

/* The family's projections (GPT-2's c_proj is two: the attention's and the MLP's). */
static int ft_sites(const em_model_config *c, ft_site *s) {
    int64_t h = c->hidden_size, i = c->intermediate_size;
    int64_t q = c->num_attention_heads * c->head_dim, kv = c->num_key_value_heads * c->head_dim;
    if (c->family == EM_MODEL_GPT2) {
        s[0] = (ft_site){"c_attn", h, 3 * h};
        s[1] = (ft_site){"c_proj", h, h};
        s[2] = (ft_site){"c_fc", h, i};
        s[3] = (ft_site){"c_proj", i, h};
        return 4;
    }
    s[0] = (ft_site){"q_proj", h, q};
    s[1] = (ft_site){"k_proj", h, kv};
    s[2] = (ft_site){"v_proj", h, kv};
    s[3] = (ft_site){"o_proj", q, h};
    s[4] = (ft_site){"gate_proj", h, i};
    s[5] = (ft_site){"up_proj", h, i};
    s[6] = (ft_site){"down_proj", i, h};
    return 7;
}

/* Marks the sites the comma-separated targets name (as em_model_lora_add matches a module
 * name: the last path component here, since every layer has the same projections). */
static em_status ft_select(const char *op, const ft_site *s, int n, const char *targets, bool *sel) {
    for (const char *p = targets; *p;) {
        size_t len = strcspn(p, ",");
        const char *name = p;
        while (len && *name == ' ') name++, len--;
        while (len && name[len - 1] == ' ') len--;
        bool any = false;
        for (int k = 0; k < n && len; k++)
            if (strlen(s[k].name) == len && !memcmp(s[k].name, name, len)) sel[k] = any = true;
        if (len && !any) {
            char names[128] = "";
            for (int k = 0; k < n; k++)
                if (!strstr(names, s[k].name))
                    snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "", s[k].name);
            return em_error(EM_ERR_ARGUMENT, "%s: LoRA target '%.*s' names no projection of the model (its "
                            "projections: %s)", op, (int)len, name, names);
        }
        p += strcspn(p, ",");
        if (*p == ',') p++;
    }
    return EM_OK;
}

static double dtype_bytes(em_dtype dt) { return dt == EM_BF16 || dt == EM_F16 ? 2.0 : 4.0; }

em_status em_model_estimate_finetune(const em_model_config *cfg, const em_finetune_estimate_opts *o,
                                     em_estimate *out) {
    const char *op = "em_model_estimate_finetune";
    if (!cfg || !o || !out) return em_error(EM_ERR_ARGUMENT, "%s: NULL argument", op);
    if (o->batch < 1 || o->seq < 1)
        return em_error(EM_ERR_ARGUMENT, "%s: batch and seq must be positive, got %lld and %lld", op,
                        (long long)o->batch, (long long)o->seq);
    if (o->dtype != EM_F32 && o->dtype != EM_BF16 && o->dtype != EM_F16)
        return em_error(EM_ERR_DTYPE, "%s: the weights' dtype must be float32, bfloat16 or float16, got %s", op,
                        em_dtype_name(o->dtype));
    if (o->autocast_dtype != EM_F32 && o->autocast_dtype != EM_BF16 && o->autocast_dtype != EM_F16)
        return em_error(EM_ERR_DTYPE, "%s: the autocast dtype must be bfloat16 or float16 (or none), got %s", op,
                        em_dtype_name(o->autocast_dtype));
    if (o->full && o->dtype != EM_F32)
        return em_error(EM_ERR_DTYPE, "%s: full fine-tuning trains float32 weights (em_model_unfreeze; lower "
                        "precision comes from autocast), got %s", op, em_dtype_name(o->dtype));
    int64_t rank = o->lora_rank ? o->lora_rank : 8;
    if (rank < 1) return em_error(EM_ERR_ARGUMENT, "%s: the LoRA rank must be positive, got %lld", op, (long long)rank);
    const char *targets = o->lora_targets && *o->lora_targets ? o->lora_targets
                          : cfg->family == EM_MODEL_GPT2 ? "c_attn" : "q_proj,v_proj";
    ft_site site[8];
    bool sel[8] = {false};
    int nsites = ft_sites(cfg, site);
    if (ft_select(op, site, nsites, targets, sel) != EM_OK) return em_last_status();
    int64_t nparams = em_model_config_num_parameters(cfg);
    if (nparams <= 0) return em_last_status();
    double params = (double)nparams;
    double L = (double)cfg->num_hidden_layers, H = (double)cfg->hidden_size, I = (double)cfg->intermediate_size;
    double Q = (double)(cfg->num_attention_heads * cfg->head_dim), K = (double)(cfg->num_key_value_heads * cfg->head_dim);
    double heads = (double)cfg->num_attention_heads, V = (double)cfg->vocab_size;
    double B = (double)o->batch, T = (double)o->seq, n = B * T, r = (double)rank;
    /* dtypes: the residual stream and the norms in the weights' dtype; the projections'
     * outputs in the autocast dtype when the weights are float32 under autocast */
    bool amp = o->autocast_dtype != EM_F32 && o->dtype == EM_F32;
    double wb = dtype_bytes(o->dtype), sr = wb, sa = amp ? dtype_bytes(o->autocast_dtype) : wb;
    /* adapters: rank x (in + out) each; every adapted projection also keeps its input as
     * float32 (PEFT's x.to(lora_A.dtype): a copy unless it is float32 already) and the [n, r]
     * product for lora_B */
    double adapter_params = 0, adapter_inputs = 0;
    for (int k = 0; k < nsites && !o->full; k++) {
        if (!sel[k]) continue;
        if (rank > (site[k].in < site[k].out ? site[k].in : site[k].out))
            return em_error(EM_ERR_ARGUMENT, "%s: rank %lld exceeds min(in, out) = %lld of %s", op, (long long)rank,
                            (long long)(site[k].in < site[k].out ? site[k].in : site[k].out), site[k].name);
        adapter_params += r * (double)(site[k].in + site[k].out) * L;
        adapter_inputs += 4.0 * ((sa == 4.0 ? 0.0 : (double)site[k].in) + r);
    }
    /* the attention: the fused kernel in every dtype, which keeps no [T, T] tensor, only
     * each query row's float32 log-sum-exp */
    double per_token;
    if (cfg->family == EM_MODEL_GPT2)   /* LayerNorms' inputs and outputs, q k v, the heads' merge, gelu_new's chain */
        per_token = sr * 4 * H + sa * (4 * H + 5 * I);
    else                                /* RMSNorms' inputs and outputs, q k v, the heads' merge, the SwiGLU's three */
        per_token = sr * 4 * H + sa * (2 * Q + 2 * K + 3 * I);
    if (amp) per_token += sa * 2 * H;   /* the norms' float32 outputs cast for the projections */
    per_token += adapter_inputs;
    double block = n * per_token + B * heads * T * 4;
    double keep = o->checkpoint ? L * n * sr * H : L * block;
    /* the backward of one block: the larger of the MLP's gradients and the attention's (q's,
     * k's and v's at the fused kernel, before the rotary embedding and from the adapters'
     * branches, the attention output's, the o projection's and the residual's) */
    double mlp_grads = 2 * I + 2 * H, attention_grads = 3 * Q + 4 * K + 3 * H;
    double backward = n * sa * (mlp_grads > attention_grads ? mlp_grads : attention_grads);
    /* the fused loss: the final norm's output, its [N, H] rows and their gradient, and the
     * chunk loop's float32 [chunk, V] logits and log-softmax (the gradient is made in the
     * log-softmax's buffer, the 16-bit logits are gone before it) */
    double N = B * (T - 1), chunk = (double)em__model_loss_chunk(cfg->vocab_size);
    if (chunk > N) chunk = N;
    double loss = 3 * n * sa * H + 2 * chunk * V * 4 + (amp ? V * H * sa : 0);
    double step = (o->checkpoint ? block : 0) + backward;
    memset(out, 0, sizeof *out);
    out->params = params;
    out->trainable_params = adapter_params;
    out->dtype = o->dtype;
    out->hidden = cfg->hidden_size;
    out->layers = cfg->num_hidden_layers;
    double cast_cache = amp ? params * sa : 0;
    if (o->full) { /* every weight trains, float32 (em_model_unfreeze), AdamW on all of them */
        out->trainable_params = params;
        /* AdamW's states exist from the first step on; the gradients from the backward to the
         * step (em_zero_grad sets them to none): the forward's peak holds the weights, the
         * states, the casts autocast saved for the backward, the activations and the loss,
         * whose head weight's float32 gradient is summed over the chunks there; the
         * backward's end holds the weights, their gradients and the states, the activations
         * and casts freed block by block as their gradients came */
        double head_grad = V * H * 4;
        double fwd = params * 12 + cast_cache + keep + loss + head_grad, bwd = params * 16 + step;
        bool at_forward = fwd >= bwd;
        out->bytes[EM_ESTIMATE_WEIGHTS] = params * 4 + (at_forward ? cast_cache : 0);
        snprintf(out->why[EM_ESTIMATE_WEIGHTS], sizeof out->why[0], "%.4g parameters x 4 B (float32, all trained)%s",
                 params, at_forward && amp ? " + the autocast casts the forward saves" : "");
        out->bytes[EM_ESTIMATE_GRADIENTS] = at_forward ? head_grad : params * 4;
        if (at_forward)
            snprintf(out->why[EM_ESTIMATE_GRADIENTS], sizeof out->why[0], "at the forward's peak only the output "
                     "head's, summed by the fused loss: %.0f x %.0f x 4 B (the rest come in backward)", V, H);
        else
            snprintf(out->why[EM_ESTIMATE_GRADIENTS], sizeof out->why[0], "one float32 gradient per parameter: "
                     "%.4g x 4 B", params);
        out->bytes[EM_ESTIMATE_OPTIMIZER_STATES] = params * 8;
        snprintf(out->why[EM_ESTIMATE_OPTIMIZER_STATES], sizeof out->why[0], "AdamW's exp_avg and exp_avg_sq: "
                 "%.4g x 8 B", params);
        snprintf(out->why[EM_ESTIMATE_MASTER_WEIGHTS], sizeof out->why[0], "none: the weights are float32 themselves");
        out->bytes[EM_ESTIMATE_ACTIVATIONS] = at_forward ? keep : 0;
        snprintf(out->why[EM_ESTIMATE_ACTIVATIONS], sizeof out->why[0], "%s%lld blocks x %.4g MB kept for backward%s",
                 at_forward ? "" : "freed by the backward's end: ", (long long)cfg->num_hidden_layers,
                 (o->checkpoint ? n * sr * H : block) / 1048576.0,
                 o->checkpoint ? " (checkpointed: the blocks' inputs)" : " (fused attention)");
        out->bytes[EM_ESTIMATE_WORKSPACE] = at_forward ? loss : step;
        if (at_forward)
            snprintf(out->why[EM_ESTIMATE_WORKSPACE], sizeof out->why[0], "the fused loss's %.4g MB (%.0f rows x %.0f "
                     "ids of float32 logits, x 2)", loss / 1048576.0, chunk, V);
        else
            snprintf(out->why[EM_ESTIMATE_WORKSPACE], sizeof out->why[0], "the first block's backward%s: %.4g MB",
                     o->checkpoint ? " and its recomputed forward" : "", step / 1048576.0);
        for (int l = 0; l < EM_ESTIMATE_TOTAL; l++) out->bytes[EM_ESTIMATE_TOTAL] += out->bytes[l];
        snprintf(out->why[EM_ESTIMATE_TOTAL], sizeof out->why[0], "the step's peak, at the %s: the lines above "
                 "together", at_forward ? "forward's loss" : "backward's end");
        return EM_OK;
    }
    out->bytes[EM_ESTIMATE_WEIGHTS] = params * wb + cast_cache + adapter_params * 4;
    snprintf(out->why[EM_ESTIMATE_WEIGHTS], sizeof out->why[0], "%.4g base parameters x %g B (frozen, no gradient)%s + "
             "%.4g adapter parameters x 4 B (rank %lld on %s)", params, wb,
             amp ? " + their autocast casts" : "", adapter_params, (long long)rank, targets);
    out->bytes[EM_ESTIMATE_GRADIENTS] = adapter_params * 4;
    snprintf(out->why[EM_ESTIMATE_GRADIENTS], sizeof out->why[0], "the adapters' only: %.4g x 4 B", adapter_params);
    out->bytes[EM_ESTIMATE_OPTIMIZER_STATES] = adapter_params * 8;
    snprintf(out->why[EM_ESTIMATE_OPTIMIZER_STATES], sizeof out->why[0], "AdamW's exp_avg and exp_avg_sq: %.4g x 8 B",
             adapter_params);
    snprintf(out->why[EM_ESTIMATE_MASTER_WEIGHTS], sizeof out->why[0], "none: the adapters are float32 themselves");
    out->bytes[EM_ESTIMATE_ACTIVATIONS] = keep;
    if (o->checkpoint)
        snprintf(out->why[EM_ESTIMATE_ACTIVATIONS], sizeof out->why[0], "checkpointed: %lld block inputs of %.4g "
                 "MB (one block, recomputed in backward: %.4g MB, under workspace)", (long long)cfg->num_hidden_layers,
                 n * sr * H / 1048576.0, block / 1048576.0);
    else
        snprintf(out->why[EM_ESTIMATE_ACTIVATIONS], sizeof out->why[0], "%lld blocks x %.4g MB kept for backward "
                 "(fused attention)", (long long)cfg->num_hidden_layers, block / 1048576.0);
    out->bytes[EM_ESTIMATE_WORKSPACE] = step > loss ? step : loss;
    snprintf(out->why[EM_ESTIMATE_WORKSPACE], sizeof out->why[0], "the larger of the backward's %.4g MB (%sone "
             "block's gradients) and the fused loss's %.4g MB (%.0f rows x %.0f ids of float32 logits, x 2)",
             step / 1048576.0, o->checkpoint ? "the recomputed block and " : "", loss / 1048576.0, chunk, V);
    for (int l = 0; l < EM_ESTIMATE_TOTAL; l++) out->bytes[EM_ESTIMATE_TOTAL] += out->bytes[l];
    snprintf(out->why[EM_ESTIMATE_TOTAL], sizeof out->why[0], "the step's peak: the lines above together");
    return EM_OK;
}
