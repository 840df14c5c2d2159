/* LoRA on a loaded model (include/ember/finetune.h): the adapters as a module tree named as
 * PEFT names them, their place in the decoder layers' projections, PEFT's adapter folder
 * (adapter_config.json, adapter_model.safetensors) both ways, merging into a full model
 * folder, and the causal LM loss.
 *
 * The adapters live in an em_module so that everything written for modules (the optimizers,
 * clipping, training checkpoints) works on them; a module's parameter names have no dots, so
 * the tree is built one path component at a time: model > layers > 0 > self_attn > q_proj >
 * lora_A > weight gives "model.layers.0.self_attn.q_proj.lora_A.weight". */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <ember/finetune.h>
#include <ember/io.h>

#include "models_internal.h"
#include "../data/json.h"
#include "../data/parsers.h"
#include "../util/strbuf.h"

/* A projection that can carry an adapter: its module name, the group it sits in, its role. */
typedef struct lora_site {
    const char *name;   /* "q_proj" */
    const char *group;  /* "self_attn" */
    int role;           /* LW_Q */
} lora_site;

static const lora_site llama_sites[] = {
    {"q_proj", "self_attn", LW_Q},  {"k_proj", "self_attn", LW_K}, {"v_proj", "self_attn", LW_V},
    {"o_proj", "self_attn", LW_O},  {"gate_proj", "mlp", LW_GATE}, {"up_proj", "mlp", LW_UP},
    {"down_proj", "mlp", LW_DOWN},
};
static const lora_site gpt2_sites[] = {
    {"c_attn", "attn", GW_ATTN}, {"c_proj", "attn", GW_ATTN_PROJ}, {"c_fc", "mlp", GW_FC}, {"c_proj", "mlp", GW_MLP_PROJ},
};

static const lora_site *sites_of(const em_model *m, int *n) {
    bool gpt2 = m->cfg.family == EM_MODEL_GPT2;
    *n = gpt2 ? (int)(sizeof gpt2_sites / sizeof *gpt2_sites) : (int)(sizeof llama_sites / sizeof *llama_sites);
    return gpt2 ? gpt2_sites : llama_sites;
}

/* "model.layers" / "transformer.h": where the decoder layers sit in transformers' names. */
static const char *layers_path(const em_model *m) {
    return m->cfg.family == EM_MODEL_GPT2 ? "transformer.h" : "model.layers";
}

/* Conv1D weights are [in, out] (GPT-2), Linear's [out, in]. */
static void site_shape(const em_model *m, int layer, int role, int64_t *in, int64_t *out) {
    em_tensor *w = m->layers[layer][role];
    bool conv1d = m->cfg.family == EM_MODEL_GPT2;
    *in = em_size(w, conv1d ? 0 : 1);
    *out = em_size(w, conv1d ? 1 : 0);
}

/* PEFT's match of one target key against a module path: equal, or the path ends in ".key". */
static bool target_matches(const char *path, const char *key, size_t keylen) {
    size_t n = strlen(path);
    if (n == keylen && !memcmp(path, key, keylen)) return true;
    return n > keylen && path[n - keylen - 1] == '.' && !memcmp(path + n - keylen, key, keylen);
}

/* ---- the module tree ---- */

static em_tensor *container_forward(em_module *m, em_tensor *x) {
    (void)m;
    (void)x;
    em_error(EM_ERR_NOT_SUPPORTED, "LoRA adapters: the adapters' module holds parameters only; run the model "
             "(em_model_forward) instead");
    return NULL;
}
static const em_module_ops container_ops = {.name = "ModuleDict", .forward = container_forward};

/* The child of parent named name, made (an empty container) when missing. *cache remembers
 * the last child made under this parent, enough for a tree built in order. */
typedef struct tree_node {
    em_module *mod;
    char name[32];
} tree_node;

static em_module *child_named(em_module *parent, tree_node *last, const char *name) {
    if (last->mod && !strcmp(last->name, name)) return last->mod;
    em_module *c = em_module_new(&container_ops, NULL);
    if (!c || em_module_add_child(parent, name, c) != EM_OK) return NULL;
    last->mod = c;
    snprintf(last->name, sizeof last->name, "%s", name);
    return c;
}

void em__model_lora_free(em_model *m) {
    if (!m) return;
    em_module_free(m->lora);
    free(m->lora_ab);
    m->lora = NULL;
    m->lora_ab = NULL;
}

/* Which (layer, role) pairs the targets select, into sel[layer * LAYER_WEIGHTS + role];
 * an error names a target that matches nothing. */
static em_status select_sites(const em_model *m, const char *targets, bool *sel, char *canonical, size_t cap) {
    int nsites;
    const lora_site *sites = sites_of(m, &nsites);
    int nl = (int)m->cfg.num_hidden_layers;
    canonical[0] = '\0';
    const char *p = targets;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len && (*p == ' ')) p++, len--;
        while (len && p[len - 1] == ' ') len--;
        if (!len) {
            if (!end) break;
            p = end + 1;
            continue;
        }
        bool any = false;
        for (int L = 0; L < nl; L++) {
            for (int s = 0; s < nsites; s++) {
                char path[160];
                snprintf(path, sizeof path, "%s.%d.%s.%s", layers_path(m), L, sites[s].group, sites[s].name);
                if (target_matches(path, p, len)) {
                    sel[L * LAYER_WEIGHTS + sites[s].role] = true;
                    any = true;
                }
            }
        }
        if (!any) {
            char names[160] = "";
            for (int s = 0; s < nsites; s++)
                if (!strstr(names, sites[s].name))
                    snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", s ? ", " : "", sites[s].name);
            return em_error(EM_ERR_ARGUMENT, "LoRA target '%.*s' matches no module of %s (its projections: %s)",
                            (int)len, p, m->family_name, names);
        }
        size_t used = strlen(canonical);
        if (used + len + 2 > cap) return em_error(EM_ERR_ARGUMENT, "LoRA targets: the list is too long (%zu bytes)",
                                                  strlen(targets));
        snprintf(canonical + used, cap - used, "%s%.*s", used ? "," : "", (int)len, p);
        if (!end) break;
        p = end + 1;
    }
    if (!canonical[0]) return em_error(EM_ERR_ARGUMENT, "LoRA targets: the list names no module");
    return EM_OK;
}

em_status em_model_lora_add(em_model *m, const em_lora_config *c) {
    const char *op = "em_model_lora_add";
    if (!m) return em_error(EM_ERR_ARGUMENT, "%s: the model is NULL", op);
    em_lora_config cfg = c ? *c : (em_lora_config){0};
    if (!cfg.rank) cfg.rank = 8;
    if (cfg.alpha == 0) cfg.alpha = 8;
    if (!cfg.targets || !*cfg.targets) cfg.targets = m->cfg.family == EM_MODEL_GPT2 ? "c_attn" : "q_proj,v_proj";
    if (m->lora) return em_error(EM_ERR_ARGUMENT, "%s: the model already has adapters", op);
    if (cfg.rank < 1) return em_error(EM_ERR_ARGUMENT, "%s: rank must be at least 1, got %lld", op, (long long)cfg.rank);
    if (!(cfg.alpha > 0) || !isfinite(cfg.alpha))
        return em_error(EM_ERR_ARGUMENT, "%s: lora_alpha must be a positive number, got %g", op, cfg.alpha);
    int nl = (int)m->cfg.num_hidden_layers;
    bool *sel = calloc((size_t)nl * LAYER_WEIGHTS, sizeof *sel);
    if (!sel) return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    char canonical[sizeof m->lora_targets];
    em_status st = select_sites(m, cfg.targets, sel, canonical, sizeof canonical);
    int nsites;
    const lora_site *sites = sites_of(m, &nsites);
    for (int L = 0; L < nl && st == EM_OK; L++)
        for (int s = 0; s < nsites && st == EM_OK; s++) {
            if (!sel[L * LAYER_WEIGHTS + sites[s].role]) continue;
            int64_t in, out;
            site_shape(m, L, sites[s].role, &in, &out);
            if (cfg.rank > (in < out ? in : out))
                st = em_error(EM_ERR_ARGUMENT, "%s: rank %lld exceeds min(in, out) = %lld of %s.%d.%s.%s", op,
                              (long long)cfg.rank, (long long)(in < out ? in : out), layers_path(m), L,
                              sites[s].group, sites[s].name);
        }
    em_module *root = NULL;
    em_tensor *(*ab)[LAYER_WEIGHTS][2] = NULL;
    if (st == EM_OK) {
        root = em_module_new(&container_ops, NULL);
        ab = calloc((size_t)nl, sizeof *ab);
        if (!root || !ab) st = em_failed() ? em_last_status() : em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory", op);
    }
    /* the path's first two components: "model" > "layers" (GPT-2: "transformer" > "h") */
    const char *lp = layers_path(m);
    char first[32], second[32];
    snprintf(first, sizeof first, "%.*s", (int)(strchr(lp, '.') - lp), lp);
    snprintf(second, sizeof second, "%s", strchr(lp, '.') + 1);
    tree_node top = {0}, mid = {0};
    em_module *layers = NULL;
    if (st == EM_OK) {
        em_module *base = child_named(root, &top, first);
        layers = base ? child_named(base, &mid, second) : NULL;
        if (!layers) st = em_last_status();
    }
    em_scope scope = em_scope_begin();
    for (int L = 0; L < nl && st == EM_OK; L++) {
        tree_node layer_node = {0}, group_node = {0};
        char idx[16];
        snprintf(idx, sizeof idx, "%d", L);
        for (int s = 0; s < nsites && st == EM_OK; s++) {
            if (!sel[L * LAYER_WEIGHTS + sites[s].role]) continue;
            int64_t in, out;
            site_shape(m, L, sites[s].role, &in, &out);
            em_module *lm = child_named(layers, &layer_node, idx);
            em_module *gm = lm ? child_named(lm, &group_node, sites[s].group) : NULL;
            tree_node none = {0};
            em_module *pm = gm ? child_named(gm, &none, sites[s].name) : NULL;
            /* kaiming_uniform(a=sqrt(5)) on [r, in]: U(-1/sqrt(in), 1/sqrt(in)), as nn.Linear's
             * default init that em_nn_linear_ex draws; lora_B zeros */
            em_module *a = pm ? em_nn_linear_ex(in, cfg.rank, false) : NULL;
            if (!a || em_module_add_child(pm, "lora_A", a) != EM_OK) {
                st = em_failed() ? em_last_status() : em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory", op);
                break;
            }
            em_module *b = em_nn_linear_ex(cfg.rank, out, false);
            if (!b || em_module_add_child(pm, "lora_B", b) != EM_OK) {
                st = em_failed() ? em_last_status() : em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory", op);
                break;
            }
            em_named_tensor wa, wb;
            em_module_parameters(a, &wa, 1);
            em_module_parameters(b, &wb, 1);
            em_grad_mode g = em_no_grad_begin();
            st = em_zero_(wb.tensor);
            em_no_grad_end(g);
            if (st != EM_OK) break;
            ab[L][sites[s].role][0] = wa.tensor;
            ab[L][sites[s].role][1] = wb.tensor;
        }
    }
    em_scope_end(scope);
    if (st == EM_OK && root && m->device.type != EM_CPU) st = em_module_to(root, m->device);
    free(sel);
    if (st != EM_OK) {
        em_module_free(root);
        free(ab);
        return st;
    }
    m->lora = root;
    m->lora_ab = ab;
    m->lora_rank = cfg.rank;
    m->lora_alpha = cfg.alpha;
    m->lora_scale = cfg.alpha / (double)cfg.rank;
    snprintf(m->lora_targets, sizeof m->lora_targets, "%s", canonical);
    return EM_OK;
}

bool em_model_has_lora(const em_model *m) { return m && m->lora; }

em_module *em_model_lora_module(em_model *m) {
    if (!m || !m->lora) {
        em_error(EM_ERR_ARGUMENT, "em_model_lora_module: %s", m ? "the model has no adapters (em_model_lora_add)"
                                                                : "the model is NULL");
        return NULL;
    }
    return m->lora;
}

em_status em_model_lora_config(const em_model *m, em_lora_config *out) {
    if (!m || !out || !m->lora)
        return em_error(EM_ERR_ARGUMENT, "em_model_lora_config: %s",
                        !m || !out ? "NULL argument" : "the model has no adapters");
    *out = (em_lora_config){.rank = m->lora_rank, .alpha = m->lora_alpha, .targets = m->lora_targets};
    return EM_OK;
}

em_tensor *em__model_lora(em_model *m, int layer, int role, em_tensor *x, em_tensor *y) {
    if (!y || !m->lora_ab || !m->lora_ab[layer][role][0]) return y;
    em_tensor *a = m->lora_ab[layer][role][0], *b = m->lora_ab[layer][role][1];
    /* PEFT: result + lora_B(lora_A(x.to(A.dtype))) * scaling, added back in result's dtype */
    em_tensor *xa = em_matmul(em_to_dtype(x, EM_F32), em_transpose(a, 0, 1));
    em_tensor *delta = em_mul_scalar(em_matmul(xa, em_transpose(b, 0, 1)), m->lora_scale);
    return em_add(y, em_to_dtype(delta, em_dtype_of(y)));
}

/* ---- PEFT's folder ---- */

static em_status make_dir(const char *dir, const char *op) {
    if (mkdir(dir, 0777) == 0 || errno == EEXIST) {
        struct stat st;
        if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return EM_OK;
        return em_error(EM_ERR_IO, "%s: %s exists and is not a folder", op, dir);
    }
    return em_error(EM_ERR_IO, "%s: cannot create the folder %s: %s", op, dir, strerror(errno));
}

em_status em_model_lora_save(em_model *m, const char *dir, const char *base_model) {
    const char *op = "em_model_lora_save";
    if (!m || !dir) return em_error(EM_ERR_ARGUMENT, "%s: NULL model or folder", op);
    if (!m->lora) return em_error(EM_ERR_ARGUMENT, "%s: the model has no adapters", op);
    em_status st = make_dir(dir, op);
    if (st != EM_OK) return st;
    char path[4096];
    if (snprintf(path, sizeof path, "%s/adapter_config.json", dir) >= (int)sizeof path)
        return em_error(EM_ERR_ARGUMENT, "%s: the folder's path is too long", op);
    FILE *f = fopen(path, "w");
    if (!f) return em_error(EM_ERR_IO, "%s: cannot write %s: %s", op, path, strerror(errno));
    fputs("{\n  \"alpha_pattern\": {},\n  \"auto_mapping\": null,\n  \"base_model_name_or_path\": ", f);
    em__json_fputs(f, base_model ? base_model : "");
    fprintf(f, ",\n  \"bias\": \"none\",\n  \"fan_in_fan_out\": %s,\n  \"inference_mode\": true,\n"
            "  \"init_lora_weights\": true,\n  \"layers_pattern\": null,\n  \"layers_to_transform\": null,\n"
            "  \"lora_alpha\": %.17g,\n  \"lora_dropout\": 0.0,\n  \"modules_to_save\": null,\n"
            "  \"peft_type\": \"LORA\",\n  \"r\": %lld,\n  \"rank_pattern\": {},\n  \"revision\": null,\n"
            "  \"target_modules\": [", m->cfg.family == EM_MODEL_GPT2 ? "true" : "false", m->lora_alpha,
            (long long)m->lora_rank);
    char targets[sizeof m->lora_targets];
    snprintf(targets, sizeof targets, "%s", m->lora_targets);
    int k = 0;
    for (char *save = NULL, *t = strtok_r(targets, ",", &save); t; t = strtok_r(NULL, ",", &save), k++) {
        fputs(k ? ", " : "", f);
        em__json_fputs(f, t);
    }
    fputs("],\n  \"task_type\": \"CAUSAL_LM\",\n  \"use_dora\": false,\n  \"use_rslora\": false\n}\n", f);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) return em_error(EM_ERR_IO, "%s: writing %s failed", op, path);

    int n = em_module_parameters(m->lora, NULL, 0);
    em_named_tensor *params = calloc((size_t)n, sizeof *params);
    char **names = calloc((size_t)n, sizeof *names);
    if (!params || !names) {
        free(params);
        free(names);
        return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    }
    em_module_parameters(m->lora, params, n);
    em_tensor **tensors = calloc((size_t)n, sizeof *tensors);
    st = tensors ? EM_OK : em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    for (int i = 0; i < n && st == EM_OK; i++) {
        size_t len = strlen(params[i].name) + sizeof "base_model.model.";
        names[i] = malloc(len);
        if (!names[i]) st = em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
        else snprintf(names[i], len, "base_model.model.%s", params[i].name);
        tensors[i] = params[i].tensor;
    }
    if (st == EM_OK && snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir) >= (int)sizeof path)
        st = em_error(EM_ERR_ARGUMENT, "%s: the folder's path is too long", op);
    const char *meta_k[] = {"format"}, *meta_v[] = {"pt"};
    if (st == EM_OK)
        st = em_safetensors_save_meta(path, (const char *const *)names, tensors, n, meta_k, meta_v, 1);
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    free(tensors);
    free(params);
    return st;
}

/* adapter_config.json's r, lora_alpha and target_modules (a list or one string). */
static em_status read_adapter_config(const char *dir, em_lora_config *out, char *targets, size_t cap) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/adapter_config.json", dir) >= (int)sizeof path)
        return em_error(EM_ERR_ARGUMENT, "em_model_lora_load: the folder's path is too long");
    em__file_map map;
    if (em__file_map_open(path, &map) != EM_OK) return em_last_status();
    em__json root;
    em_status st = em__json_parse_file(path, (const char *)map.data, map.len, &root);
    em__file_map_close(&map);
    if (st != EM_OK) return st;
    const em__json *peft = em__json_get(&root, "peft_type"), *r = em__json_get(&root, "r");
    const em__json *alpha = em__json_get(&root, "lora_alpha"), *tm = em__json_get(&root, "target_modules");
    const em__json *dora = em__json_get(&root, "use_dora"), *rs = em__json_get(&root, "use_rslora");
    if (root.type != EM__JSON_OBJECT) st = em_error(EM_ERR_FORMAT, "%s: expected a JSON object", path);
    else if (!peft || peft->type != EM__JSON_STRING || strcmp(peft->str, "LORA"))
        st = em_error(EM_ERR_FORMAT, "%s: peft_type must be \"LORA\"", path);
    else if (!r || !r->is_uint || r->u < 1 || r->u > (1u << 20))
        st = em_error(EM_ERR_FORMAT, "%s: 'r' must be a positive integer", path);
    else if (!alpha || alpha->type != EM__JSON_NUMBER || !(alpha->num > 0))
        st = em_error(EM_ERR_FORMAT, "%s: 'lora_alpha' must be a positive number", path);
    else if ((dora && dora->type == EM__JSON_BOOL && dora->b) || (rs && rs->type == EM__JSON_BOOL && rs->b))
        st = em_error(EM_ERR_NOT_SUPPORTED, "%s: use_dora and use_rslora are not supported", path);
    else if (!tm || (tm->type != EM__JSON_ARRAY && tm->type != EM__JSON_STRING))
        st = em_error(EM_ERR_FORMAT, "%s: 'target_modules' must be a list of module names", path);
    if (st == EM_OK) {
        targets[0] = '\0';
        int count = tm->type == EM__JSON_ARRAY ? tm->count : 1;
        for (int i = 0; i < count && st == EM_OK; i++) {
            const em__json *t = tm->type == EM__JSON_ARRAY ? &tm->items[i] : tm;
            size_t used = strlen(targets);
            if (t->type != EM__JSON_STRING || strchr(t->str, ','))
                st = em_error(EM_ERR_FORMAT, "%s: target_modules[%d] must be a module name", path, i);
            else if (used + t->len + 2 > cap) st = em_error(EM_ERR_FORMAT, "%s: target_modules is too long", path);
            else snprintf(targets + used, cap - used, "%s%s", used ? "," : "", t->str);
        }
        *out = (em_lora_config){.rank = (int64_t)r->u, .alpha = alpha->num, .targets = targets};
    }
    em__json_free(&root);
    return st;
}

/* Whether two comma-separated lists hold the same names (PEFT saves target_modules as a set). */
static bool same_targets(const char *a, const char *b) {
    for (int pass = 0; pass < 2; pass++) {
        const char *x = pass ? b : a, *y = pass ? a : b;
        for (const char *p = x; *p;) {
            size_t len = strcspn(p, ",");
            bool found = false;
            for (const char *q = y; *q && !found;) {
                size_t qlen = strcspn(q, ",");
                found = qlen == len && !memcmp(p, q, len);
                q += qlen + (q[qlen] == ',');
            }
            if (!found) return false;
            p += len + (p[len] == ',');
        }
    }
    return true;
}

em_status em_model_lora_load(em_model *m, const char *dir) {
    const char *op = "em_model_lora_load";
    if (!m || !dir) return em_error(EM_ERR_ARGUMENT, "%s: NULL model or folder", op);
    em_lora_config cfg;
    char targets[sizeof m->lora_targets];
    em_status st = read_adapter_config(dir, &cfg, targets, sizeof targets);
    if (st != EM_OK) return em__model_error_prefix("%s(%s)", op, dir);
    bool added = false;
    if (!m->lora) {
        if ((st = em_model_lora_add(m, &cfg)) != EM_OK)
            return em__model_error_prefix("%s(%s): the adapter does not fit %s", op, dir, m->family_name);
        added = true;
    } else if (cfg.rank != m->lora_rank || cfg.alpha != m->lora_alpha || !same_targets(m->lora_targets, targets)) {
        return em_error(EM_ERR_ARGUMENT, "%s(%s): the folder's adapters (r=%lld, lora_alpha=%g, targets %s) differ from "
                        "the model's (r=%lld, lora_alpha=%g, targets %s)", op, dir, (long long)cfg.rank, cfg.alpha,
                        targets, (long long)m->lora_rank, m->lora_alpha, m->lora_targets);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    em_safetensors *file = em_safetensors_load(path, m->device);
    int n = em_module_parameters(m->lora, NULL, 0);
    em_named_tensor *params = calloc((size_t)n > 0 ? (size_t)n : 1, sizeof *params);
    em_tensor **found = calloc((size_t)n > 0 ? (size_t)n : 1, sizeof *found);
    st = !file ? em_last_status() : !params || !found ? em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory", op) : EM_OK;
    em_scope scope = em_scope_begin();
    if (st == EM_OK) {
        em_module_parameters(m->lora, params, n);
        /* PEFT saves without the adapter's name; older versions wrote ".lora_A.default.weight" */
        for (int i = 0; i < n && st == EM_OK; i++) {
            char name[256];
            snprintf(name, sizeof name, "base_model.model.%s", params[i].name);
            found[i] = em_safetensors_get(file, name);
            if (!found[i]) {
                em_clear_error();
                st = em_error(EM_ERR_ARGUMENT, "%s: %s has no tensor '%s': the adapter was made for another model "
                              "than this %s", op, path, name, m->family_name);
            } else if (em_ndim(found[i]) != 2 || em_size(found[i], 0) != em_size(params[i].tensor, 0) ||
                       em_size(found[i], 1) != em_size(params[i].tensor, 1)) {
                st = em_error(EM_ERR_ARGUMENT, "%s: %s: '%s' is [%lld, %lld] but this %s's adapter is [%lld, %lld]: the "
                              "adapter was made for another base model", op, path, name,
                              (long long)em_size(found[i], 0), (long long)(em_ndim(found[i]) > 1 ? em_size(found[i], 1) : 0),
                              m->family_name, (long long)em_size(params[i].tensor, 0),
                              (long long)em_size(params[i].tensor, 1));
            }
        }
        if (st == EM_OK && em_safetensors_count(file) != n) {
            for (int j = 0; j < em_safetensors_count(file) && st == EM_OK; j++) {
                const char *name = em_safetensors_name(file, j);
                bool known = false;
                for (int i = 0; i < n && !known; i++)
                    known = !strncmp(name, "base_model.model.", 17) && !strcmp(name + 17, params[i].name);
                if (!known)
                    st = em_error(EM_ERR_ARGUMENT, "%s: %s holds '%s', which no adapter of this %s (targets %s) has: "
                                  "the adapter was made for another model", op, path, name, m->family_name,
                                  m->lora_targets);
            }
        }
    }
    if (st == EM_OK) {
        em_grad_mode g = em_no_grad_begin();
        for (int i = 0; i < n && st == EM_OK; i++) st = em_copy_(params[i].tensor, found[i]);
        em_no_grad_end(g);
    }
    em_scope_end(scope);
    free(params);
    free(found);
    em_safetensors_free(file);
    if (st != EM_OK && added) em__model_lora_free(m);
    return st;
}

/* ---- merging ---- */

/* Copies src_dir/name to out_dir/name when it exists. */
static em_status copy_file(const char *src_dir, const char *out_dir, const char *name) {
    char from[4096], to[4096];
    snprintf(from, sizeof from, "%s/%s", src_dir, name);
    snprintf(to, sizeof to, "%s/%s", out_dir, name);
    FILE *in = fopen(from, "rb");
    if (!in) return errno == ENOENT ? EM_OK : em_error(EM_ERR_IO, "cannot read %s: %s", from, strerror(errno));
    FILE *out = fopen(to, "wb");
    if (!out) {
        fclose(in);
        return em_error(EM_ERR_IO, "cannot write %s: %s", to, strerror(errno));
    }
    char buf[1 << 16];
    size_t got;
    bool ok = true;
    while ((got = fread(buf, 1, sizeof buf, in)) > 0) ok = ok && fwrite(buf, 1, got, out) == got;
    ok = ok && !ferror(in);
    fclose(in);
    if (fclose(out) != 0) ok = false;
    return ok ? EM_OK : em_error(EM_ERR_IO, "copying %s to %s failed", from, to);
}

em_status em_model_save_merged(em_model *m, const char *src_dir, const char *out_dir) {
    const char *op = "em_model_save_merged";
    if (!m || !src_dir || !out_dir) return em_error(EM_ERR_ARGUMENT, "%s: NULL argument", op);
    em_status st = make_dir(out_dir, op);
    static const char *const files[] = {"config.json", "generation_config.json", "tokenizer.json",
                                        "tokenizer_config.json", "special_tokens_map.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files && st == EM_OK; i++) st = copy_file(src_dir, out_dir, files[i]);
    if (st != EM_OK) return st;
    const char **names = calloc((size_t)m->nparams, sizeof *names);
    em_tensor **tensors = calloc((size_t)m->nparams, sizeof *tensors);
    if (!names || !tensors) {
        free(names);
        free(tensors);
        return em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    }
    int n = 0;
    em_grad_mode g = em_no_grad_begin();
    em_scope scope = em_scope_begin();
    bool conv1d = m->cfg.family == EM_MODEL_GPT2;
    for (int i = 0; i < m->nparams && st == EM_OK; i++) {
        model_param *p = &m->params[i];
        em_tensor *t = p->t;
        em_tensor **ab = p->layer >= 0 && m->lora_ab ? m->lora_ab[p->layer][p->role] : NULL;
        if (ab && ab[0]) {
            /* W + scale * B A ([out, in]); a Conv1D weight [in, out] takes its transpose */
            em_tensor *delta = em_mul_scalar(em_matmul(ab[1], ab[0]), m->lora_scale);
            if (conv1d) delta = em_transpose(delta, 0, 1);
            t = em_contiguous(em_to_dtype(em_add(em_to_dtype(p->t, EM_F32), delta), em_dtype_of(p->t)));
            if (!t) st = em_last_status();
        }
        names[n] = p->name;
        tensors[n++] = t;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    const char *meta_k[] = {"format"}, *meta_v[] = {"pt"};
    if (st == EM_OK) st = em_safetensors_save_meta(path, names, tensors, n, meta_k, meta_v, 1);
    em_scope_end(scope);
    em_no_grad_end(g);
    free(names);
    free(tensors);
    return st == EM_OK ? EM_OK : em__model_error_prefix("%s(%s)", op, out_dir);
}

/* ---- a sharded full fine-tuning's folder, a unit at a time ---- */

typedef struct unit_writer {
    em_model *m;
    const char *out_dir;
    int unit, units;
    bool write;
    em_status st;   /* the first failure; later units are still gathered (the others wait on them) */
} unit_writer;

static void unit_file(const unit_writer *w, int unit, char *buf, size_t size) {
    snprintf(buf, size, "model-%05d-of-%05d.safetensors", unit + 1, w->units);
}

/* The unit's weights, gathered by the runner around this call, into their own file. */
static em_tensor *write_unit(void *ctx, em_tensor *const *in, int n) {
    (void)in;
    (void)n;
    unit_writer *w = ctx;
    em_model *m = w->m;
    if (w->write && w->st == EM_OK) {
        const char **names = calloc((size_t)m->nparams, sizeof *names);
        em_tensor **tensors = calloc((size_t)m->nparams, sizeof *tensors);
        int k = 0;
        for (int i = 0; names && tensors && i < m->nparams; i++)
            if (em_model_unit_of(m, m->params[i].name) == w->unit) {
                names[k] = m->params[i].name;
                tensors[k++] = m->params[i].t;
            }
        char file[64], path[4096];
        unit_file(w, w->unit, file, sizeof file);
        snprintf(path, sizeof path, "%s/%s", w->out_dir, file);
        const char *meta_k[] = {"format"}, *meta_v[] = {"pt"};
        w->st = !names || !tensors ? em_error(EM_ERR_OUT_OF_MEMORY, "em_model_save_units: out of host memory")
                                   : em_safetensors_save_meta(path, names, tensors, k, meta_k, meta_v, 1);
        free(names);
        free(tensors);
    }
    return em_scalar(0, EM_OPTS(0));   /* the runner wants a tensor; nothing uses it */
}

/* model.safetensors.index.json: every weight's file. */
static em_status write_index(const unit_writer *w) {
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", w->out_dir);
    FILE *f = fopen(path, "w");
    if (!f) return em_error(EM_ERR_IO, "em_model_save_units: cannot write %s: %s", path, strerror(errno));
    double total = 0;
    for (int i = 0; i < w->m->nparams; i++)
        total += (double)em_numel(w->m->params[i].t) * (double)em_dtype_size(em_dtype_of(w->m->params[i].t));
    fprintf(f, "{\n  \"metadata\": {\"total_size\": %.0f},\n  \"weight_map\": {", total);
    for (int i = 0; i < w->m->nparams; i++) {
        char file[64];
        unit_file(w, em_model_unit_of(w->m, w->m->params[i].name), file, sizeof file);
        fputs(i ? ",\n    " : "\n    ", f);
        em__json_fputs(f, w->m->params[i].name);
        fputs(": ", f);
        em__json_fputs(f, file);
    }
    fputs("\n  }\n}\n", f);
    bool ok = !ferror(f);
    if (fclose(f) != 0) ok = false;
    return ok ? EM_OK : em_error(EM_ERR_IO, "em_model_save_units: writing %s failed", path);
}

em_status em_model_save_units(em_model *m, const char *src_dir, const char *out_dir, bool write) {
    const char *op = "em_model_save_units";
    if (!m || !src_dir || !out_dir) return em_error(EM_ERR_ARGUMENT, "%s: NULL argument", op);
    if (!m->full)
        return em_error(EM_ERR_ARGUMENT, "%s: the model's weights are frozen: it writes a full fine-tuning's units "
                        "(em_model_unfreeze first; adapters: em_model_save_merged)", op);
    unit_writer w = {.m = m, .out_dir = out_dir, .units = em_model_num_units(m), .write = write};
    if (write) {
        w.st = make_dir(out_dir, op);
        static const char *const files[] = {"config.json", "generation_config.json", "tokenizer.json",
                                            "tokenizer_config.json", "special_tokens_map.json"};
        for (size_t i = 0; i < sizeof files / sizeof *files && w.st == EM_OK; i++)
            w.st = copy_file(src_dir, out_dir, files[i]);
        char stale[4096];   /* a single-file model.safetensors would be read instead of the index */
        snprintf(stale, sizeof stale, "%s/model.safetensors", out_dir);
        if (w.st == EM_OK && unlink(stale) != 0 && errno != ENOENT)
            w.st = em_error(EM_ERR_IO, "%s: cannot remove %s: %s", op, stale, strerror(errno));
    }
    em_status run_st = EM_OK;
    em_grad_mode g = em_no_grad_begin();
    for (w.unit = 0; w.unit < w.units; w.unit++) {
        em_scope s = em_scope_begin();
        em_tensor *done = m->unit_runner ? m->unit_runner(m->runner_ctx, w.unit, write_unit, &w, NULL, NULL, 0)
                                         : write_unit(&w, NULL, 0);
        if (!done && run_st == EM_OK) run_st = em_last_status();
        em_scope_end(s);
    }
    em_no_grad_end(g);
    if (w.st == EM_OK) w.st = run_st;
    if (write && w.st == EM_OK) w.st = write_index(&w);
    return w.st == EM_OK ? EM_OK : em__model_error_prefix("%s(%s)", op, out_dir);
}

/* ---- the loss ---- */

/* transformers' shift: the label of position t + 1 is the target of position t. Reads labels
 * [B, T] (int64 or int32, any device) into targets[B * (T - 1)] (-100 kept) and counts the
 * targets that are not -100; a label outside [0, V) other than -100 is an error naming its
 * position. */
static em_status shifted_targets(const char *op, em_tensor *labels, int64_t B, int64_t T, int64_t V, int64_t *targets,
                                 int64_t *counted) {
    em_scope scope = em_scope_begin();
    em_tensor *host = em_contiguous(em_to_dtype(em_to(labels, EM_DEVICE_CPU), EM_I64));
    int64_t *lab = malloc((size_t)(B * T) * sizeof *lab);
    em_status st = !host ? em_last_status() : !lab ? em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", op)
                                                   : em_copy_to_host(host, lab, (size_t)(B * T) * sizeof *lab);
    *counted = 0;
    for (int64_t b = 0; b < B && st == EM_OK; b++)
        for (int64_t t = 1; t < T && st == EM_OK; t++) {
            int64_t y = lab[b * T + t];
            if (y != -100 && (y < 0 || y >= V))
                st = em_error(EM_ERR_ARGUMENT, "%s: labels[%lld, %lld] = %lld is neither -100 nor a token id in [0, %lld)",
                              op, (long long)b, (long long)t, (long long)y, (long long)V);
            targets[b * (T - 1) + t - 1] = y;
            *counted += y != -100;
        }
    free(lab);
    em_scope_end(scope);
    return st;
}

/* The summed loss divided as ForCausalLMLoss divides it: by num_items, else by the counted
 * tokens; none counted gives 0, not NaN. */
static em_tensor *divide_loss(em_tensor *total, int64_t num_items, int64_t counted) {
    int64_t denom = num_items ? num_items : counted;
    return denom ? em_div_scalar(total, (double)denom) : em_mul_scalar(total, 0.0);
}

em_tensor *em_causal_lm_loss(em_tensor *logits, em_tensor *labels, int64_t num_items) {
    const char *op = "em_causal_lm_loss";
    EM_CHECK_ARG(logits, op, "logits");
    EM_CHECK_ARG(labels, op, "labels");
    em_dtype ldt = em_dtype_of(labels);
    if (em_ndim(logits) != 3 || em_ndim(labels) != 2 || em_size(labels, 0) != em_size(logits, 0) ||
        em_size(labels, 1) != em_size(logits, 1) || (ldt != EM_I64 && ldt != EM_I32)) {
        em_error(EM_ERR_ARGUMENT, "%s: expected logits [B, T, V] and int64/int32 labels [B, T], got %d and %d dims (%s "
                 "labels)", op, em_ndim(logits), em_ndim(labels), em_dtype_name(ldt));
        return NULL;
    }
    if (num_items < 0) {
        em_error(EM_ERR_ARGUMENT, "%s: num_items must not be negative, got %lld", op, (long long)num_items);
        return NULL;
    }
    int64_t B = em_size(logits, 0), T = em_size(logits, 1), V = em_size(logits, 2), N = B * (T - 1);
    em_scope scope = em_scope_begin();
    if (N == 0) {   /* one position: nothing to predict */
        em_tensor *zero = em_mul_scalar(em_sum(em_to_dtype(logits, EM_F32), EM_ALL_DIMS, false), 0.0);
        return em__scope_return(scope, zero);
    }
    int64_t *safe = malloc((size_t)N * sizeof *safe);
    float *weight = malloc((size_t)N * sizeof *weight);
    em_tensor *loss = NULL;
    int64_t counted = 0;
    if (!safe || !weight) em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    else if (shifted_targets(op, labels, B, T, V, safe, &counted) == EM_OK) {
        for (int64_t i = 0; i < N; i++) {
            weight[i] = safe[i] == -100 ? 0.0f : 1.0f;
            if (safe[i] == -100) safe[i] = 0;
        }
        em_device dev = em_device_of(logits);
        em_tensor *idx = em_from_data(safe, EM_I64, EM_SHAPE(N, 1), EM_OPTS(.dtype = EM_I64, .device = dev));
        em_tensor *w = em_from_data(weight, EM_F32, EM_SHAPE(N, 1), EM_OPTS(.dtype = EM_F32, .device = dev));
        em_tensor *shifted = em_reshape(em_narrow(em_to_dtype(logits, EM_F32), 1, 0, T - 1), EM_SHAPE(N, V));
        em_tensor *picked = em_gather(em_log_softmax(shifted, 1), 1, idx);
        loss = divide_loss(em_neg(em_sum(em_mul(picked, w), EM_ALL_DIMS, false)), num_items, counted);
    }
    free(safe);
    free(weight);
    return em__scope_return(scope, loss);
}

int64_t em__model_loss_chunk(int64_t vocab) {
    /* A chunk's float32 logits and the two more [chunk, V] float32 tensors the chunk loop
     * holds with them (the log-softmax and the gradient) are the loss's largest temporaries:
     * rows enough for about 32 MiB of logits, a power of two, at least 128. With Llama 2's
     * 32000 ids that is 256 rows; a 128256-id vocabulary gets the minimum, 197 MB in all. Thinner
     * chunks cost speed: at 64 rows the [rows, 2048] x [2048, 128256] product and its input
     * gradient ran at 187 and 135 bf16 GFLOP per CPU-second on one thread, at 128 rows 204
     * and 169, at 256 rows 210 and 189 (EPYC Zen 4, oneDNN 2.6). */
    int64_t rows = 32;
    while (rows * 2 * vocab * 4 <= ((int64_t)32 << 20)) rows *= 2;
    if (rows < 128) rows = 128;
    return rows;
}

/* The loss from the final hidden states h [B, T, H] and the output embedding, chunk by chunk
 * (em_linear_cross_entropy): the same numbers as em_causal_lm_loss on the output projection's
 * logits, without the [B * (T - 1), V] float32 logits ever existing at once. */
static em_tensor *fused_causal_lm_loss(em_model *m, em_tensor *h, em_tensor *labels, int64_t num_items, double scale) {
    const char *op = "em_model_loss";
    int64_t B = em_size(h, 0), T = em_size(h, 1), H = em_size(h, 2), N = B * (T - 1);
    em_tensor *head = m->w[MW_LM_HEAD];   /* the embedding itself when tied */
    if (N == 0) return em_mul_scalar(em_sum(em_to_dtype(h, EM_F32), EM_ALL_DIMS, false), 0.0);
    int64_t *targets = malloc((size_t)N * sizeof *targets);
    if (!targets) {
        em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
        return NULL;
    }
    int64_t counted = 0;
    em_status st = shifted_targets(op, labels, B, T, em_size(head, 0), targets, &counted);
    em_tensor *target = st == EM_OK ? em_from_data(targets, EM_I64, EM_SHAPE(N), EM_OPTS(.dtype = EM_I64, .device = m->device))
                                    : NULL;
    free(targets);
    if (!target) return NULL;
    /* Under autocast the output projection is a linear in the autocast dtype, as the unfused
     * forward's matmul would run it; the chunk loop's own ops then run as written. */
    em_device_type dt = m->device.type;
    bool cast = em_autocast_enabled(dt) && em_dtype_of(h) == EM_F32;
    em_dtype low = em_autocast_dtype(dt);
    em_tensor *rows = em_reshape(em_narrow(h, 1, 0, T - 1), EM_SHAPE(N, H));
    if (cast) {
        rows = em_to_dtype(rows, low);
        head = em_to_dtype(head, low);
    }
    /* divided inside: the gradients of the forward's chunk loop are then backward's own */
    int64_t denom = num_items ? num_items : counted;
    em_autocast off = em_autocast_begin_ex(dt, low, false);
    em_tensor *loss = em_linear_cross_entropy(rows, head, NULL, target,
                                              &(em_linear_ce_opts){.reduction = EM_REDUCTION_SUM,
                                                                   .chunk_size = em__model_loss_chunk(em_size(head, 0)),
                                                                   .divisor = (double)denom / scale});
    em_autocast_end(off);
    return loss && !denom ? em_mul_scalar(loss, 0.0) : loss;
}

/* The sharded loss's unit: the final norm of x (in[0]), then the fused loss against the
 * labels (in[1]). */
typedef struct sharded_loss_ctx {
    em_model *m;
    int64_t num_items;
    double scale;
} sharded_loss_ctx;

static em_tensor *sharded_loss(void *ctx, em_tensor *const *in, int n) {
    (void)n;
    sharded_loss_ctx *c = ctx;
    em_tensor *h = em__model_final_norm(c->m, in[0]);
    return h ? fused_causal_lm_loss(c->m, h, in[1], c->num_items, c->scale) : NULL;
}

em_tensor *em_model_loss(em_model *m, em_tensor *input_ids, em_tensor *labels, const em_model_loss_opts *opts) {
    const char *op = "em_model_loss";
    EM_CHECK_ARG(labels, op, "labels");
    em_model_loss_opts o = opts ? *opts : (em_model_loss_opts){0};
    if (o.num_items < 0) {
        em_error(EM_ERR_ARGUMENT, "%s: num_items must not be negative, got %lld", op, (long long)o.num_items);
        return NULL;
    }
    if (!(o.scale >= 0.0) || isinf(o.scale)) {
        em_error(EM_ERR_ARGUMENT, "%s: scale must be finite and >= 0 (0: 1), got %g", op, o.scale);
        return NULL;
    }
    if (o.scale == 0.0) o.scale = 1.0;
    /* the labels checked against the ids before the forward spends anything on them (the
     * ids themselves are the forward's to check) */
    em_dtype ldt = em_dtype_of(labels);
    if (input_ids && em_ndim(input_ids) == 2 &&
        (em_ndim(labels) != 2 || em_size(labels, 0) != em_size(input_ids, 0) ||
         em_size(labels, 1) != em_size(input_ids, 1) || (ldt != EM_I64 && ldt != EM_I32))) {
        em_error(EM_ERR_ARGUMENT, "%s: expected int64/int32 labels [%lld, %lld] as the ids, got %d dims (%s)", op,
                 (long long)em_size(input_ids, 0), (long long)em_size(input_ids, 1), em_ndim(labels),
                 em_dtype_name(ldt));
        return NULL;
    }
    em_scope scope = em_scope_begin();
    em_forward_opts fo = {.attention_mask = o.attention_mask, .checkpoint_layers = o.checkpoint_layers};
    em_tensor *loss = NULL;
    if (m && m->unit_runner) {
        /* sharded: the final norm, the output projection and the loss run as one unit */
        em_tensor *x = em__model_trunk(m, input_ids, &fo);
        sharded_loss_ctx *c = x ? malloc(sizeof *c) : NULL;
        if (x && !c) em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
        if (c) {
            *c = (sharded_loss_ctx){.m = m, .num_items = o.num_items, .scale = o.scale};
            em_tensor *in[2] = {x, labels};
            loss = m->unit_runner(m->runner_ctx, em__model_final_unit(m), sharded_loss, c, free, in, 2);
        }
        return em__scope_return(scope, loss);
    }
    /* the hidden states meet the output embedding and the loss here, and only here */
    em_tensor *h = em__model_hidden(m, input_ids, &fo);
    loss = h ? fused_causal_lm_loss(m, h, labels, o.num_items, o.scale) : NULL;
    return em__scope_return(scope, loss);
}

/* ---- sharded full fine-tuning: the units ---- */

int em_model_num_units(const em_model *m) {
    if (!m) return 0;
    return 1 + (int)m->cfg.num_hidden_layers + (m->cfg.tie_word_embeddings ? 0 : 1);
}

int em_model_unit_of(const em_model *m, const char *name) {
    if (!m || !name) return -1;
    for (int i = 0; i < m->nparams; i++) {
        const model_param *p = &m->params[i];
        if (strcmp(p->name, name)) continue;
        if (p->layer >= 0) return 1 + p->layer;
        if (p->role == MW_EMBED || p->role == MW_POSITIONS) return 0;
        return em__model_final_unit(m);   /* the final norm, the untied output projection */
    }
    return -1;
}

em_status em_model_set_unit_runner(em_model *m, em_model_unit_runner run, void *runner_ctx) {
    if (!m) return em_error(EM_ERR_ARGUMENT, "em_model_set_unit_runner: the model is NULL");
    if (run && !m->full)
        return em_error(EM_ERR_ARGUMENT, "em_model_set_unit_runner: the model's weights are frozen: units shard a full "
                        "fine-tuning (em_model_unfreeze first)");
    m->unit_runner = run;
    m->runner_ctx = run ? runner_ctx : NULL;
    return EM_OK;
}

/* ---- full fine-tuning ---- */

/* The tree of containers a dotted name needs under root, made as the names come in order:
 * levels[d] is the last container made at depth d, reused while the names share it. */
#define FULL_DEPTH 8
static em_module *parent_of(em_module *root, tree_node *levels, const char *name, const char **leaf) {
    em_module *cur = root;
    const char *p = name;
    int d = 0;
    for (const char *dot; (dot = strchr(p, '.')) != NULL; p = dot + 1, d++) {
        if (d >= FULL_DEPTH || (size_t)(dot - p) >= sizeof levels[d].name) {
            em_error(EM_ERR_ARGUMENT, "em_model_unfreeze: the weight name '%s' is too deep or long", name);
            return NULL;
        }
        char comp[32];
        snprintf(comp, sizeof comp, "%.*s", (int)(dot - p), p);
        if (!levels[d].mod || strcmp(levels[d].name, comp)) {
            for (int e = d + 1; e < FULL_DEPTH; e++) levels[e].mod = NULL; /* a new branch */
            levels[d].mod = NULL;
        }
        cur = child_named(cur, &levels[d], comp);
        if (!cur) return NULL;
    }
    *leaf = p;
    return cur;
}

em_status em_model_unfreeze(em_model *m) {
    const char *op = "em_model_unfreeze";
    if (!m) return em_error(EM_ERR_ARGUMENT, "%s: the model is NULL", op);
    if (m->full) return EM_OK;
    if (m->lora)
        return em_error(EM_ERR_ARGUMENT, "%s: the model has LoRA adapters, which train alone; full fine-tuning "
                        "needs a model without them", op);
    if (m->dtype != EM_F32)
        return em_error(EM_ERR_DTYPE, "%s: full fine-tuning keeps float32 weights, the model computes in %s (load "
                        "it with dtype float32 and train under autocast for bf16 compute)", op, em_dtype_name(m->dtype));
    em_tensor **copies = calloc((size_t)m->nparams, sizeof *copies);
    em_module *root = em_module_new(&container_ops, NULL);
    em_status st = copies && root ? EM_OK
                                  : (em_failed() ? em_last_status() : em_error(EM_ERR_OUT_OF_MEMORY, "%s: out of memory", op));
    tree_node levels[FULL_DEPTH] = {{0}};
    /* every copy is made before any weight is replaced: a failure leaves the model as it was */
    em_grad_mode g = em_no_grad_begin();
    em_scope scope = em_scope_begin();
    for (int i = 0; i < m->nparams && st == EM_OK; i++) {
        /* a view of the file's read-only bytes is copied; a weight converted on load is the
         * model's own already and trains in place (no second copy of the model at once) */
        em_tensor *c = m->params[i].read_only ? em_clone(m->params[i].t) : em_retain(m->params[i].t);
        copies[i] = c && m->params[i].read_only ? em_keep(c) : c; /* the model's own reference */
        const char *leaf = NULL;
        em_module *parent = copies[i] ? parent_of(root, levels, m->params[i].name, &leaf) : NULL;
        if (!parent || em_module_add_parameter(parent, leaf, copies[i]) != EM_OK) st = em_last_status();
    }
    em_scope_end(scope);
    em_no_grad_end(g);
    if (st != EM_OK) {
        for (int i = 0; i < m->nparams; i++) em_release(copies[i]);
        free(copies);
        em_module_free(root);
        return st;
    }
    for (int i = 0; i < m->nparams; i++) {
        model_param *p = &m->params[i];
        em_tensor *old = p->t;
        if (p->layer >= 0) {
            m->layers[p->layer][p->role] = copies[i];
        } else {
            m->w[p->role] = copies[i];
            if (p->role == MW_EMBED && m->cfg.tie_word_embeddings) m->w[MW_LM_HEAD] = copies[i];
        }
        p->t = copies[i];
        em_release(old);
    }
    free(copies);
    m->full = root;
    m->mapped_bytes = 0;
    return EM_OK;
}

em_module *em_model_module(em_model *m) {
    if (!m) {
        em_error(EM_ERR_ARGUMENT, "em_model_module: the model is NULL");
        return NULL;
    }
    if (!m->full)
        em_error(EM_ERR_ARGUMENT, "em_model_module: the model's weights are frozen (em_model_unfreeze makes them "
                 "parameters)");
    return m->full;
}
