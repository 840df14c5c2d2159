/* Memory estimates for a config's exact shape: em_estimate_memory (src/optim/estimate.c, its
 * arithmetic in src/memory/estimate.c) given the model's true counts. */
#include <stdlib.h>

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
