/* ember mem: how much memory a model needs for inference, full fine-tuning and LoRA, and
 * which devices it fits on. The arithmetic lives in src/memory/estimate.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <ember/ember.h>
#include <ember/estimate.h>
#include "commands.h"
#include "mlp.h"
#include "train_amp.h"
#include "model_cnn.h"
#include "model_gpt.h"
#include "mem_measured.h"
#include "options.h"
#include "text_io.h"

enum { M_PARAMS, M_MODEL, M_CKPT_ACT, M_DTYPE, M_MODE, M_OPTIM, M_MASTER_WEIGHTS, M_LORA_RANK, M_LORA_TARGETS,
       M_HIDDEN, M_LAYERS, M_BATCH, M_SEQ, M_ACT_BYTES, M_AMP, M_JSON, M_ZERO, M_RANKS };
static const opt_choice dtype_choices[] = {
    {"f16", EM_F16}, {"fp16", EM_F16}, {"float16", EM_F16}, {"half", EM_F16},
    {"bf16", EM_BF16}, {"bfloat16", EM_BF16},
    {"f32", EM_F32}, {"fp32", EM_F32}, {"float32", EM_F32}, {"float", EM_F32},
    {NULL, 0},
};
static const opt_choice mode_choices[] = {{"all", 0}, {"inference", 1}, {"full", 2}, {"lora", 3}, {NULL, 0}};
static const char *const mode_names[] = {"all", "inference", "full", "lora"};
static const opt_choice optim_choices[] = {
    {"sgd", EM_ESTIMATE_SGD}, {"sgd-momentum", EM_ESTIMATE_SGD_MOMENTUM}, {"adam", EM_ESTIMATE_ADAM},
    {"adamw", EM_ESTIMATE_ADAMW}, {NULL, 0},
};
#define MEM_MAX_SHAPE 1000000000
#define MEM_STR_(x) #x
#define MEM_STR(x) MEM_STR_(x)
static const opt_spec mem_table[] = {
    [M_PARAMS] = OPTION_STRING("--params", "PARAMS", "the parameter count, as PARAMS"),
    [M_MODEL] = OPTION_STRING("--model", "NAME|FILE|DIR",
                              "mlp or cnn: `ember train --model mlp|cnn`'s network (float32 unless --dtype; --batch "
                              "default 64); the training estimates print the CPU allocator's measured peak over two "
                              "real steps of the same training.\n"
                              "gpt: the GPT of `ember train --model gpt` (--layers, --hidden = d_model, --seq = "
                              "context, --batch, within that command's ranges), the step's peak counted op by op "
                              "and the measured peak alongside; --lora-rank R: LoRA on every Linear.\n"
                              "The estimate comes from the formula at once; the steps are measured only when they "
                              "are small (at most " MEM_STR(MEM_MEASURE_MAX_MB) " MB and " MEM_STR(MEM_MEASURE_MAX_GFLOP) " GFLOP), else 'not "
                              "measured' says why.\n"
                              "FILE: an Ember checkpoint (em_module_save): parameters, dtype and the Linear layers' "
                              "widths come from its tensors; with --batch the activations and the optimizer's "
                              "workspace are counted too.\n"
                              "DIR: a Hugging Face model folder (LlamaForCausalLM, MistralForCausalLM, "
                              "Qwen2ForCausalLM, GPT2LMHeadModel): its config.json's exact shape, the parameters "
                              "counted tensor by tensor, the KV cache num_key_value_heads x head_dim wide, LoRA on "
                              "q_proj and v_proj (GPT-2: c_attn); --dtype defaults to the config's; --batch and --seq "
                              "count the activations (for inference, the KV cache); with them, the LoRA estimate is "
                              "the peak of one step of `ember finetune` with the same --batch-size, --seq, "
                              "--lora-rank, --dtype, --amp and --checkpoint-activations, counted block by block "
                              "(em_model_estimate_finetune)"),
    [M_CKPT_ACT] = OPTION_FLAG("--checkpoint-activations",
                               "with --model mlp, cnn or gpt: as `ember train --checkpoint-activations` (mlp/cnn: "
                               "em_checkpoint_sequential over sqrt(layers) segments; gpt: each block): only segment "
                               "inputs are kept, the segment being backpropagated is recomputed and counted; with a "
                               "model folder, --batch and --seq: as `ember finetune --checkpoint-activations` (each "
                               "decoder block)"),
    [M_DTYPE] = {.name = "--dtype", .kind = OPT_CHOICE, .choices = dtype_choices, .flags = OPT_NOCASE,
                 .help = "the weights' dtype (default f16)"},
    [M_MODE] = OPTION_CHOICE("--mode", mode_choices, "which estimates to print (default all)"),
    [M_OPTIM] = {.name = "--optim", .kind = OPT_CHOICE, .choices = optim_choices, .flags = OPT_NOCASE,
                 .help = "optimizer for fine-tuning (default adam)"},
    [M_MASTER_WEIGHTS] = OPTION_FLAG("--master-weights",
                                     "full fine-tuning keeps float32 master weights and optimizer states (mixed "
                                     "precision); default: everything in --dtype"),
    [M_LORA_RANK] = OPTION_INT("--lora-rank", "R", 1, MEM_MAX_SHAPE, "LoRA rank (default 8)"),
    [M_LORA_TARGETS] = OPTION_INT("--lora-targets", "M", 1, MEM_MAX_SHAPE,
                                  "adapted hidden x hidden matrices per layer (default 2: q, v)"),
    [M_HIDDEN] = OPTION_INT("--hidden", "H", 1, MEM_MAX_SHAPE, "the model's width (default: inferred as a transformer)"),
    [M_LAYERS] = OPTION_INT("--layers", "L", 1, MEM_MAX_SHAPE, "the model's layers (default: inferred as a transformer)"),
    [M_BATCH] = OPTION_INT("--batch", "B", 1, MEM_MAX_SHAPE, "also count activations for this batch (with --seq)"),
    [M_SEQ] = OPTION_INT("--seq", "S", 1, MEM_MAX_SHAPE, "the sequence length of --batch's samples"),
    [M_ACT_BYTES] = OPTION_SIZE("--act-bytes", "SIZE", 1, INT64_MAX,
                                "activation bytes per sample instead of the formula (e.g. 300MB)"),
    [M_AMP] = {.name = "--amp", .kind = OPT_CHOICE, .choices = train_amp_choices, .flags = OPT_NOCASE,
               .help = "training under autocast (ember train --amp): float32 weights (unless --dtype), activations "
                       "in the low dtype plus the weights' casts"},
    [M_JSON] = OPTION_FLAG("--json", "machine-readable output"),
    [M_ZERO] = OPTION_INT("--zero", "S", 0, 3,
                          "full fine-tuning with Adam sharded by ZeRO stage S over --ranks (0: plain data parallel, "
                          "and with it DDP's buckets, a second copy of the gradients; "
                          "1: optimizer states, 2: and gradients, 3: and parameters): the bytes per rank by the ZeRO "
                          "paper's formulas (em_zero_estimate), activations not counted; for a PARAMS count or a "
                          "model folder; --dtype f32 trains in float32, f16/bf16 in mixed precision with float32 "
                          "master weights"),
    [M_RANKS] = OPTION_INT("--ranks", "N", 1, 1000000, "with --zero: the number of ranks the state is sharded over"),
};
OPT_TABLE_FITS(mem_table);

const opt_command mem_options = {
    .name = "ember mem",
    .usage = "ember mem PARAMS [options]\n"
             "ember mem --model mlp|cnn|gpt|FILE.safetensors|MODEL_DIR [options]",
    .about = "Estimate the memory a model needs, in GB (1e9 bytes) with GiB alongside.",
    .positional = "PARAMS",
    .positional_help = "parameter count: 7B, 125M, 350K, 1.3e9 (or --params PARAMS)",
    .extra = "one parameter count only",
    .options = mem_table,
    .count = OPT_COUNT(mem_table),
    .exit_status = "0 done; 1 a checkpoint or model folder that cannot be read; 2 bad arguments",
};

typedef struct ref_device { const char *name; double bytes; } ref_device;
static const ref_device reference[] = {
    {"RTX 4090 24 GB", 24e9}, {"A100 40 GB", 40e9}, {"A100 80 GB", 80e9}, {"H100 80 GB", 80e9},
};

#define MAX_DEVICES 32
typedef struct fit_device { char name[300]; double bytes; } fit_device;

/* The reference GPUs, then every Ember device that reports its memory. */
static int list_devices(fit_device *out) {
    int n = 0;
    for (size_t i = 0; i < sizeof reference / sizeof reference[0]; i++) {
        snprintf(out[n].name, sizeof out[n].name, "%s", reference[i].name);
        out[n++].bytes = reference[i].bytes;
    }
    for (int t = 0; t < EM_DEVICE_TYPE_COUNT; t++) {
        int count = em_device_count((em_device_type)t);
        for (int i = 0; i < count && n < MAX_DEVICES; i++) {
            em_device_props p;
            em_device d = EM_DEVICE((em_device_type)t, i);
            if (em_device_get_props(d, &p) != EM_OK || p.total_memory <= 0) continue;
            snprintf(out[n].name, sizeof out[n].name, "%s (%s, %.1f GB)", em_device_str(d).s, p.name,
                     (double)p.total_memory / 1e9);
            out[n++].bytes = (double)p.total_memory;
        }
    }
    em_clear_error();   /* a backend that cannot start is simply not listed */
    return n;
}

static int bad(const char *fmt, const char *arg) {
    fprintf(stderr, "ember mem: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(ember mem --help for the options)\n");
    return 2;
}

/* The parameter count as a decimal number with an optional suffix (em_estimate_parse_params
 * reads it; strtod there would also take "0x10", "inf" and " 7B"). */
static bool strict_count(const char *s) {
    const char *p = s + (*s == '-' || *s == '+');   /* a sign: em_estimate_parse_params says what is wrong */
    size_t n = opt_decimal_prefix(p);
    if (n && (!p[n] || (strchr("KkMmBbGgTt", p[n]) && !p[n + 1]))) return true;
    bad("cannot read the parameter count '%s': expected a decimal number with an optional suffix K, M, B (or G) "
        "or T, e.g. 7B, 125M, 1.3e9", s);
    return false;
}

/* An estimate from a checkpoint failed: a bad request is a usage error (exit 2); a file that
 * cannot be read or holds what Ember cannot read is a failure (exit 1), as `ember --help` says. */
static int estimate_failed(void) {
    if (em_last_status() == EM_ERR_ARGUMENT) return bad("%s", em_last_error());
    fprintf(stderr, "ember mem: %s\n", em_last_error());
    return 1;
}

/* LoRA adapts matrices of the model: a rank wider than them, more adapted matrices than the
 * model can hold, or adapters larger than the model describe no real fine-tuning. */
static bool lora_fits(const em_estimate_opts *o, const em_estimate *e, bool from_file) {
    int r = o->lora_rank ? o->lora_rank : 8, m = o->lora_targets ? o->lora_targets : 2;
    char msg[320];
    if (r > e->hidden)
        snprintf(msg, sizeof msg, "--lora-rank %d is larger than the model's %s (%lld): the rank must be at most that",
                 r, from_file ? "widest Linear layer" : "hidden size", (long long)e->hidden);
    else if (!from_file && (double)m * (double)e->hidden * (double)e->hidden * (double)e->layers > e->params)
        snprintf(msg, sizeof msg, "--lora-targets %d: %d matrices of %lld x %lld in each of %lld layers would hold "
                 "more parameters than the model's %.0f", m, m, (long long)e->hidden, (long long)e->hidden,
                 (long long)e->layers, e->params);
    else if (e->trainable_params > e->params)
        snprintf(msg, sizeof msg, "LoRA rank %d: the adapters (%.0f parameters) would be larger than the model "
                 "(%.0f parameters)", r, e->trainable_params, e->params);
    else
        return true;
    bad("%s", msg);
    return false;
}

static const char *mode_title(em_estimate_mode m) {
    return m == EM_ESTIMATE_INFERENCE ? "Inference" : m == EM_ESTIMATE_FULL ? "Full fine-tuning" : "LoRA fine-tuning";
}

static void print_fits(double total, const fit_device *dev, int ndev) {
    int fit = 0;
    printf("  fits on:");
    for (int i = 0; i < ndev; i++)
        if (total <= dev[i].bytes) printf("%s %s", fit++ ? "," : "", dev[i].name);
    printf("%s\n", fit ? "" : " none of these");
    if (fit == ndev) return;
    printf("  too small:");
    for (int i = 0, n = 0; i < ndev; i++)
        if (total > dev[i].bytes)
            printf("%s %s (%.0f needed, sharded)", n++ ? "," : "", dev[i].name, ceil(total / dev[i].bytes));
    printf("\n");
}

static void print_text(const em_estimate_opts *o, const em_estimate *e, const em_estimate *alt,
                       const fit_device *dev, int ndev) {
    printf("\n%s", mode_title(o->mode));
    if (o->mode != EM_ESTIMATE_INFERENCE) printf(" (%s)", em_estimate_optimizer_name(o->optimizer));
    if (o->mode == EM_ESTIMATE_LORA)
        printf(", rank %d, %.0f trainable parameters", o->lora_rank ? o->lora_rank : 8, e->trainable_params);
    printf("\n");
    /* small models (an Ember checkpoint) in MB, so that the numbers are not all 0.00 */
    bool mb = e->bytes[EM_ESTIMATE_TOTAL] < 1e8;
    double u = mb ? 1e6 : 1e9, ui = mb ? 1048576.0 : 1073741824.0;
    for (int l = 0; l < EM_ESTIMATE_LINES; l++)
        printf("  %-17s %9.2f %s (%8.2f %s)  %s\n", em_estimate_line_name((em_estimate_line)l),
               e->bytes[l] / u, mb ? "MB" : "GB", e->bytes[l] / ui, mb ? "MiB" : "GiB", e->why[l]);
    if (o->mode == EM_ESTIMATE_FULL && alt) {
        if (!o->master_weights && o->dtype != EM_F32)
            printf("  the seed's count: weights %.2f GB + optimizer states %.2f GB (gradients + the optimizer's "
                   "states) = %.2f GB\n", e->bytes[EM_ESTIMATE_WEIGHTS] / 1e9,
                   (e->bytes[EM_ESTIMATE_GRADIENTS] + e->bytes[EM_ESTIMATE_OPTIMIZER_STATES]) / 1e9,
                   (e->bytes[EM_ESTIMATE_TOTAL] - e->bytes[EM_ESTIMATE_ACTIVATIONS]) / 1e9);
        if (!o->master_weights)
            printf("  with float32 master weights and states (mixed precision, as PyTorch users meet it): "
                   "%.2f GB (%.2f GiB)\n", alt->bytes[EM_ESTIMATE_TOTAL] / 1e9, alt->bytes[EM_ESTIMATE_TOTAL] / 1073741824.0);
        else
            printf("  without master weights (everything in the weights' dtype): %.2f GB (%.2f GiB)\n",
                   alt->bytes[EM_ESTIMATE_TOTAL] / 1e9, alt->bytes[EM_ESTIMATE_TOTAL] / 1073741824.0);
    }
    print_fits(e->bytes[EM_ESTIMATE_TOTAL], dev, ndev);
}

static void print_json(const em_estimate_opts *o, const em_estimate *e, const em_estimate *alt,
                       const fit_device *dev, int ndev, bool first, double measured) {
    printf("%s\n    {\"mode\": \"%s\", \"optimizer\": \"%s\", \"uses_master_weights\": %s, \"trainable_params\": %.0f",
           first ? "" : ",", em_estimate_mode_name(o->mode), em_estimate_optimizer_name(o->optimizer),
           o->master_weights ? "true" : "false", e->trainable_params);
    for (int l = 0; l < EM_ESTIMATE_LINES; l++) {
        char key[32];
        snprintf(key, sizeof key, "%s", em_estimate_line_name((em_estimate_line)l));
        for (char *c = key; *c; c++) if (*c == ' ') *c = '_';
        printf(", \"%s_bytes\": %.0f, \"%s_why\": ", key, e->bytes[l], key);
        tool_json_string(stdout, e->why[l], strlen(e->why[l]));
    }
    if (!isnan(measured)) printf(", \"measured_peak_bytes\": %.0f", measured);
    if (alt) printf(", \"%s_total_bytes\": %.0f", o->master_weights ? "without_master_weights" : "with_master_weights",
                    alt->bytes[EM_ESTIMATE_TOTAL]);
    printf(", \"devices\": [");
    for (int i = 0; i < ndev; i++) {
        printf("%s{\"name\": ", i ? ", " : "");
        tool_json_string(stdout, dev[i].name, strlen(dev[i].name));
        printf(", \"bytes\": %.0f, \"fits\": %s, \"needed\": %.0f}", dev[i].bytes,
               e->bytes[EM_ESTIMATE_TOTAL] <= dev[i].bytes ? "true" : "false",
               ceil(e->bytes[EM_ESTIMATE_TOTAL] / dev[i].bytes));
    }
    printf("]}");
}

static bool parse_mode(const char *mode, em_estimate_mode *modes, int *nmodes) {
    *nmodes = 0;
    if (!strcmp(mode, "all")) {
        modes[0] = EM_ESTIMATE_INFERENCE, modes[1] = EM_ESTIMATE_FULL, modes[2] = EM_ESTIMATE_LORA;
        *nmodes = 3;
    } else if (!strcmp(mode, "inference")) {
        modes[(*nmodes)++] = EM_ESTIMATE_INFERENCE;
    } else if (!strcmp(mode, "full")) {
        modes[(*nmodes)++] = EM_ESTIMATE_FULL;
    } else if (!strcmp(mode, "lora")) {
        modes[(*nmodes)++] = EM_ESTIMATE_LORA;
    }
    return *nmodes > 0;
}

/* The report of mem_model from the loaded file. */
static int mem_model_file(const em_safetensors *file, const char *path, const em_estimate_mode *modes, int nmodes,
                          bool json, em_estimate_opts o) {
    em_estimate e, alt;
    em_estimate_opts mo = o;
    mo.mode = EM_ESTIMATE_INFERENCE;
    if (em_estimate_safetensors(file, &mo, &e) != EM_OK) return estimate_failed();
    double params_n = e.params;
    o.dtype = e.dtype;
    if (modes[nmodes - 1] == EM_ESTIMATE_LORA) {   /* checked before anything is printed */
        mo = o;
        mo.mode = EM_ESTIMATE_LORA;
        if (em_estimate_safetensors(file, &mo, &e) != EM_OK) return estimate_failed();
        if (!lora_fits(&mo, &e, true)) return 2;
    }
    const char *dt = o.dtype == EM_F32 ? "float32" : o.dtype == EM_F16 ? "float16" : "bfloat16";
    fit_device dev[MAX_DEVICES];
    int ndev = list_devices(dev);
    if (json) {
        printf("{\n  \"model\": ");
        tool_json_string(stdout, path, strlen(path));
        printf(", \"params\": %.0f, \"dtype\": \"%s\", \"linear_layers\": %lld, \"widest\": %lld, "
               "\"batch\": %lld,\n  \"estimates\": [", params_n, dt, (long long)e.layers, (long long)e.hidden,
               (long long)o.batch);
    } else {
        printf("ember mem: %s: %.0f parameters, %s weights, %lld Linear layers (widest %lld)%s%s\n", path, params_n,
               dt, (long long)e.layers, (long long)e.hidden, o.autocast_dtype != EM_F32 ? ", autocast " : "",
               o.autocast_dtype != EM_F32 ? em_dtype_name(o.autocast_dtype) : "");
        if (o.batch <= 0)
            printf("give --batch B to count activations and the optimizer's workspace for that batch\n");
        printf("GB = 1e9 bytes, GiB = 2^30 bytes; MB = 1e6 bytes, MiB = 2^20 bytes for totals under 100 MB\n");
    }
    for (int m = 0; m < nmodes; m++) {
        mo = o;
        mo.mode = modes[m];
        if (em_estimate_safetensors(file, &mo, &e) != EM_OK) return estimate_failed();
        bool has_alt = modes[m] == EM_ESTIMATE_FULL && o.dtype != EM_F32;
        if (has_alt) {
            em_estimate_opts ao = mo;
            ao.master_weights = !mo.master_weights;
            if (em_estimate_safetensors(file, &ao, &alt) != EM_OK) return estimate_failed();
        }
        if (json) print_json(&mo, &e, has_alt ? &alt : NULL, dev, ndev, m == 0, NAN);
        else print_text(&mo, &e, has_alt ? &alt : NULL, dev, ndev);
    }
    if (json) printf("\n  ]\n}\n");
    return 0;
}

/* ember mem --model FILE: the same report, counted from a checkpoint's tensors. */
static int mem_model(const char *path, const char *params, bool shape_given, const char *mode, bool json,
                     em_estimate_opts o) {
    if (params) return bad("give either a parameter count or --model, not both (got '%s')", params);
    if (shape_given)
        return bad("%s", "--dtype, --hidden, --layers and --seq come from the checkpoint with --model");
    if (o.activation_bytes_per_sample > 0 && o.batch <= 0) return bad("%s", "--act-bytes needs --batch");
    em_estimate_mode modes[3];
    int nmodes;
    if (!parse_mode(mode, modes, &nmodes)) return bad("unknown mode '%s': expected all, inference, full or lora", mode);
    /* read once: every estimate below comes from the same read of the file */
    em_safetensors *file = em_safetensors_load(path, EM_DEVICE_CPU);
    if (!file) return estimate_failed();
    int rc = mem_model_file(file, path, modes, nmodes, json, o);
    em_safetensors_free(file);
    return rc;
}

/* ember mem --model MODEL_DIR: the estimates for a model folder's exact shape (em_model_estimate). */
/* The LoRA line of a model folder with a batch, and the full line with float32 weights: one
 * step of `ember finetune [--full]` counted from the shape (em_model_estimate_finetune), PEFT's
 * default targets. */
static em_status finetune_estimate(const em_model_config *cfg, const em_estimate_opts *o, bool ckpt, em_estimate *e) {
    em_finetune_estimate_opts fo = {.batch = o->batch, .seq = o->seq, .lora_rank = o->lora_rank, .checkpoint = ckpt,
                                    .dtype = o->dtype, .autocast_dtype = o->autocast_dtype,
                                    .full = o->mode == EM_ESTIMATE_FULL};
    return em_model_estimate_finetune(cfg, &fo, e);
}

/* whether mode's line is one step of `ember finetune` (a batch and float32 weights for --full) */
static bool is_finetune_step(em_estimate_mode mode, bool step_shape, em_dtype dtype) {
    return step_shape && (mode == EM_ESTIMATE_LORA || (mode == EM_ESTIMATE_FULL && dtype == EM_F32));
}

static int mem_model_dir(const char *dir, const char *params, bool dtype_given, bool shape_given, const char *mode,
                         bool json, bool ckpt, em_estimate_opts o) {
    if (params) return bad("give either a parameter count or --model, not both (got '%s')", params);
    if (shape_given) return bad("%s", "--hidden and --layers come from the model folder's config.json");
    if (o.lora_targets)
        return bad("%s", "--lora-targets: with a model folder LoRA adapts q_proj and v_proj (GPT-2: c_attn), PEFT's "
                   "default targets");
    if (o.activation_bytes_per_sample > 0 && o.batch <= 0) return bad("%s", "--act-bytes needs --batch");
    if ((o.batch > 0) != (o.seq > 0) && o.activation_bytes_per_sample <= 0)
        return bad("%s", "activations need both --batch and --seq (or --batch and --act-bytes)");
    em_estimate_mode modes[3];
    int nmodes;
    if (!parse_mode(mode, modes, &nmodes)) return bad("unknown mode '%s': expected all, inference, full or lora", mode);
    /* with a batch, LoRA is one step of `ember finetune` counted block by block */
    bool lora_step = o.batch > 0 && o.seq > 0 && o.activation_bytes_per_sample <= 0;
    if (ckpt && !lora_step)
        return bad("%s", "--checkpoint-activations with a model folder: the LoRA step's estimate needs --batch and --seq");
    em_model_config cfg;
    if (em_model_config_load(dir, &cfg) != EM_OK) {
        fprintf(stderr, "ember mem: %s\n", em_last_error());
        return 1;
    }
    if (!dtype_given && o.autocast_dtype == EM_F32) o.dtype = cfg.dtype;
    em_estimate e, alt;
    for (int m = 0; m < nmodes; m++) {   /* every request checked before anything is printed */
        em_estimate_opts mo = o;
        mo.mode = modes[m];
        em_status st = is_finetune_step(mo.mode, lora_step, mo.dtype) ? finetune_estimate(&cfg, &mo, ckpt, &e)
                                                                        : em_model_estimate(&cfg, &mo, &e);
        if (st != EM_OK) return bad("%s", em_last_error());
    }
    fit_device dev[MAX_DEVICES];
    int ndev = list_devices(dev);
    const char *dt = o.dtype == EM_F32 ? "float32" : o.dtype == EM_F16 ? "float16" : "bfloat16";
    int64_t kv = cfg.num_key_value_heads * cfg.head_dim;
    if (json) {
        printf("{\n  \"model\": ");
        tool_json_string(stdout, dir, strlen(dir));
        printf(", \"architecture\": ");
        tool_json_string(stdout, cfg.architecture, strlen(cfg.architecture));
        printf(", \"params\": %.0f, \"dtype\": \"%s\", \"hidden\": %lld, \"layers\": %lld, \"kv_width\": %lld, "
               "\"batch\": %lld, \"seq\": %lld,\n  \"estimates\": [", e.params, dt, (long long)cfg.hidden_size,
               (long long)cfg.num_hidden_layers, (long long)kv, (long long)o.batch, (long long)o.seq);
    } else {
        printf("ember mem: %s: %s, %.0f parameters, %s weights, hidden %lld, %lld layers, %lld heads and %lld "
               "key-value heads of %lld%s%s\n", dir, cfg.architecture, e.params, dt, (long long)cfg.hidden_size,
               (long long)cfg.num_hidden_layers, (long long)cfg.num_attention_heads, (long long)cfg.num_key_value_heads,
               (long long)cfg.head_dim, o.autocast_dtype != EM_F32 ? ", autocast " : "",
               o.autocast_dtype != EM_F32 ? em_dtype_name(o.autocast_dtype) : "");
        if (o.batch <= 0) printf("give --batch B and --seq S to count the activations (for inference, the KV cache)\n");
        printf("GB = 1e9 bytes, GiB = 2^30 bytes; MB = 1e6 bytes, MiB = 2^20 bytes for totals under 100 MB\n");
    }
    for (int m = 0; m < nmodes; m++) {
        em_estimate_opts mo = o;
        mo.mode = modes[m];
        if (is_finetune_step(mo.mode, lora_step, mo.dtype)) {
            mo.optimizer = EM_ESTIMATE_ADAMW;   /* ember finetune's */
            if (finetune_estimate(&cfg, &mo, ckpt, &e) != EM_OK) return bad("%s", em_last_error());
            if (!json)
                printf("\none step of `ember finetune%s --batch-size %lld --seq %lld%s` on the CPU (weights in %s%s)",
                       mo.mode == EM_ESTIMATE_FULL ? " --full" : "", (long long)o.batch, (long long)o.seq,
                       ckpt ? " --checkpoint-activations" : "", dt, o.autocast_dtype != EM_F32 ? ", --amp" : "");
            if (json) print_json(&mo, &e, NULL, dev, ndev, m == 0, NAN);
            else print_text(&mo, &e, NULL, dev, ndev);
            continue;
        }
        if (em_model_estimate(&cfg, &mo, &e) != EM_OK) return bad("%s", em_last_error());
        bool has_alt = modes[m] == EM_ESTIMATE_FULL && o.dtype != EM_F32;
        if (has_alt) {
            em_estimate_opts ao = mo;
            ao.master_weights = !mo.master_weights;
            if (em_model_estimate(&cfg, &ao, &alt) != EM_OK) return bad("%s", em_last_error());
        }
        if (json) print_json(&mo, &e, has_alt ? &alt : NULL, dev, ndev, m == 0, NAN);
        else print_text(&mo, &e, has_alt ? &alt : NULL, dev, ndev);
    }
    if (json) printf("\n  ]\n}\n");
    return 0;
}

static bool is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* ember mem --zero S --ranks N: the per-rank bytes of full fine-tuning with Adam under ZeRO,
 * for a parameter count or a model folder's. */
static int mem_zero(const char *params, const char *model, const char *mode, bool dtype_given, em_dtype dtype,
                    int stage, int ranks, bool json) {
    if (mode && strcmp(mode, "full") != 0 && strcmp(mode, "all") != 0)
        return bad("--zero estimates full fine-tuning: --mode %s does not apply", mode);
    double p = 0, unit = 0;   /* unit: a model folder's largest ZeRO unit, in parameters */
    const char *what = params;
    char label[320];
    if (model) {
        if (params) return bad("give either a parameter count or --model, not both (got '%s')", params);
        if (!is_dir(model))
            return bad("--zero takes a parameter count or a Hugging Face model folder, got --model %s", model);
        em_model_config cfg;
        em_estimate e;
        if (em_model_config_load(model, &cfg) != EM_OK) {
            fprintf(stderr, "ember mem: %s\n", em_last_error());
            return 1;
        }
        if (!dtype_given) dtype = cfg.dtype;
        if (em_model_estimate(&cfg, &(em_estimate_opts){.mode = EM_ESTIMATE_FULL, .dtype = dtype}, &e) != EM_OK)
            return bad("%s", em_last_error());
        p = e.params;
        /* ember finetune's units (em_model_unit_of): the embeddings, each decoder layer, the
         * final norm with an untied head (tied: the norm joins the embeddings) */
        double h = (double)cfg.hidden_size, v = (double)cfg.vocab_size;
        bool gpt2 = cfg.family == EM_MODEL_GPT2;
        double embed = v * h + (gpt2 ? (double)cfg.max_position_embeddings * h : 0);
        double final = (gpt2 ? 2 * h : h) + (cfg.tie_word_embeddings ? 0 : v * h);
        double layer = cfg.num_hidden_layers > 0 ? (p - embed - final) / (double)cfg.num_hidden_layers : 0;
        if (cfg.tie_word_embeddings) embed += final, final = 0;
        unit = embed > layer ? embed : layer;
        if (final > unit) unit = final;
        snprintf(label, sizeof label, "%.200s (%.100s)", model, cfg.architecture);
        what = label;
    } else {
        if (!params) return bad("%s", "give a parameter count or --model DIR with --zero, e.g. ember mem 7B --zero 3 --ranks 8");
        if (em_estimate_parse_params(params, &p) != EM_OK) return bad("%s", em_last_error());
    }
    bool mixed = dtype != EM_F32;
    em_zero_memory z, plain;
    if (em_zero_estimate(p, stage, ranks, mixed, &z) != EM_OK || em_zero_estimate(p, 0, ranks, mixed, &plain) != EM_OK)
        return bad("%s", em_last_error());
    /* Stage 0 as Ember runs it (em_ddp: `ember finetune` under `ember launch` without --zero)
     * also holds DDP's buckets, a flat copy of every gradient that the all-reduce averages in
     * place, beside the paper's 16 bytes a parameter (PyTorch's DDP the same; with
     * gradient_as_bucket_view, in either, the gradients are the buckets' views) */
    double buckets = plain.gradients;
    if (json) {
        printf("{\n  \"params\": %.0f, \"dtype\": \"%s\", \"mixed_precision\": %s, \"zero_stage\": %d, \"ranks\": %d,\n"
               "  \"per_rank\": {\"parameters_bytes\": %.0f, \"gradients_bytes\": %.0f, \"master_weights_bytes\": %.0f, "
               "\"optimizer_states_bytes\": %.0f, \"total_bytes\": %.0f},\n  \"stage0_total_bytes\": %.0f,\n"
               "  \"ddp_buckets_bytes\": %.0f, \"ddp_total_bytes\": %.0f\n}\n",
               p, em_dtype_name(dtype), mixed ? "true" : "false", stage, ranks, z.parameters, z.gradients,
               z.master_weights, z.optimizer, z.total, plain.total, buckets, plain.total + buckets);
        return 0;
    }
    printf("ember mem: %s, %.0f parameters, full fine-tuning with Adam, ZeRO stage %d over %d rank%s, %s\n", what, p,
           stage, ranks, ranks == 1 ? "" : "s",
           mixed ? "mixed precision (16-bit parameters and gradients, float32 master weights and states)"
                 : "float32 (parameters, gradients and states)");
    bool mb = z.total < 1e8;
    double u = mb ? 1e6 : 1e9, ui = mb ? 1048576.0 : 1073741824.0;
    const char *un = mb ? "MB" : "GB", *uin = mb ? "MiB" : "GiB";
    printf("  %-17s %9.2f %s (%8.2f %s)  %s\n", "parameters", z.parameters / u, un, z.parameters / ui, uin,
           stage >= 3 ? "this rank's shard" : "every parameter");
    printf("  %-17s %9.2f %s (%8.2f %s)  %s\n", "gradients", z.gradients / u, un, z.gradients / ui, uin,
           stage >= 2 ? "this rank's shard" : "every gradient");
    if (mixed)
        printf("  %-17s %9.2f %s (%8.2f %s)  %s\n", "master weights", z.master_weights / u, un, z.master_weights / ui,
               uin, stage >= 1 ? "float32, this rank's shard" : "float32, every parameter");
    printf("  %-17s %9.2f %s (%8.2f %s)  %s\n", "optimizer states", z.optimizer / u, un, z.optimizer / ui, uin,
           stage >= 1 ? "Adam's two float32 states, this rank's shard" : "Adam's two float32 states, every parameter");
    if (stage == 0) {
        printf("  %-17s %9.2f %s (%8.2f %s)  per rank, plus activations (not counted): the paper's stage 0\n", "total",
               z.total / u, un, z.total / ui, uin);
        printf("  %-17s %9.2f %s (%8.2f %s)  DDP's flat copy of every gradient (em_ddp, ember finetune under ember "
               "launch; none with gradient_as_bucket_view); with it %.2f %s\n", "+ DDP buckets", buckets / u, un,
               buckets / ui, uin, (z.total + buckets) / u, un);
    } else {
        printf("  %-17s %9.2f %s (%8.2f %s)  per rank, plus activations (not counted); stage 0 (plain data parallel): "
               "%.2f %s, %.2f %s with DDP's buckets\n", "total", z.total / u, un, z.total / ui, uin, plain.total / u, un,
               (plain.total + buckets) / u, un);
    }
    if (unit > 0 && stage >= 2) {
        /* stage 3 gathers the largest unit's weights and holds its gradients for its backward;
         * stage 2 holds its gradients until they are reduced */
        double w = mixed ? 2 : 4, extra = (stage == 3 ? 2 : 1) * w * unit;
        printf("  %-17s %9.2f %s (%8.2f %s)  the largest unit (%.0f parameters): %s, during its backward; "
               "with it %.2f %s\n", "+ working set", extra / u, un, extra / ui, uin, unit,
               stage == 3 ? "its gathered weights and their gradients" : "its full gradients", (z.total + extra) / u, un);
    }
    return 0;
}

int cmd_mem(int argc, char **argv) {
    em_estimate_opts o = {.dtype = EM_F16, .optimizer = EM_ESTIMATE_ADAM};
    opt_result opts;
    int status = opt_parse(&mem_options, argc, argv, &opts, stdout, stderr);
    if (status >= 0) return status;
    const opt_value *v = opts.v;
    const char *params = opts.positional, *model = v[M_MODEL].text;
    const char *mode = v[M_MODE].given ? mode_names[v[M_MODE].choice] : "all";
    bool dtype_given = v[M_DTYPE].given, json = v[M_JSON].given, ckpt = v[M_CKPT_ACT].given;
    bool shape_given = dtype_given || v[M_HIDDEN].given || v[M_LAYERS].given || v[M_SEQ].given;
    if (v[M_PARAMS].given) {
        if (params) return bad("the parameter count is given twice ('%s' and --params)", params);
        params = v[M_PARAMS].text;
    }
    if (params && !strict_count(params)) return 2;
    if (dtype_given) o.dtype = (em_dtype)v[M_DTYPE].choice;
    if (v[M_AMP].given) o.autocast_dtype = (em_dtype)v[M_AMP].choice;
    if (v[M_OPTIM].given) o.optimizer = (em_estimate_optimizer)v[M_OPTIM].choice;
    o.master_weights = v[M_MASTER_WEIGHTS].given;
    o.lora_rank = (int)v[M_LORA_RANK].i;
    o.lora_targets = (int)v[M_LORA_TARGETS].i;
    o.hidden = v[M_HIDDEN].i;
    o.layers = v[M_LAYERS].i;
    o.batch = v[M_BATCH].i;
    o.seq = v[M_SEQ].i;
    o.activation_bytes_per_sample = (double)v[M_ACT_BYTES].i;
    if (o.autocast_dtype != EM_F32 && !dtype_given) o.dtype = EM_F32;   /* autocast keeps float32 weights */
    if (v[M_RANKS].given && !v[M_ZERO].given) return bad("%s", "--ranks goes with --zero S");
    if (v[M_ZERO].given) {
        if (!v[M_RANKS].given) return bad("%s", "--zero needs --ranks N (the ranks the state is sharded over)");
        if (v[M_OPTIM].given && o.optimizer != EM_ESTIMATE_ADAM && o.optimizer != EM_ESTIMATE_ADAMW)
            return bad("%s", "--zero counts Adam's two states per parameter (the paper's formulas): --optim adam or adamw");
        return mem_zero(params, model, v[M_MODE].given ? mode : NULL, dtype_given, o.dtype, (int)v[M_ZERO].i,
                        (int)v[M_RANKS].i, json);
    }
    /* ember train's models: --model cnn counts the CNN from its layers, --model mlp walks the
     * MLP (em_estimate_module); both print the measured peak of real steps alongside */
    bool cnn = model && !strcmp(model, "cnn"), mlp = model && !strcmp(model, "mlp"), classifier = cnn || mlp;
    char cnn_why[256] = "";
    if (ckpt && !classifier && !(model && !strcmp(model, "gpt")) && !(model && is_dir(model)))
        return bad("%s", "--checkpoint-activations needs --model mlp, cnn or gpt (ember train's models) or a model "
                   "folder (ember finetune's LoRA step)");
    if (classifier) {
        if (params) {
            char msg[200];
            snprintf(msg, sizeof msg, "give either a parameter count or --model %s, not both (got '%.100s')", model, params);
            return bad("%s", msg);
        }
        if (o.hidden || o.layers || o.seq)
            return bad("--hidden, --layers and --seq come from the %s with --model cnn or mlp", cnn ? "CNN" : "MLP");
        if (o.activation_bytes_per_sample > 0) return bad("%s", "--act-bytes: the activations of --model cnn or mlp are counted from its layers");
        if (o.batch <= 0) o.batch = 64;   /* ember train's default batch size */
        if (ckpt && o.lora_rank)
            return bad("%s", "--checkpoint-activations with --lora-rank: LoRA trains only the Linear layers of ember "
                       "train's MLP and CNN; checkpointing recomputes the frozen layers for nothing (not estimated)");
        if (!dtype_given) o.dtype = EM_F32;
        if (cnn && !model_cnn_estimate_opts(&o, true, ckpt, cnn_why, sizeof cnn_why)) return bad("%s", em_last_error());
        if (mlp && !classifier_estimate("mlp", &o, ckpt, NULL)) return bad("%s", em_last_error());
        params = model;
    } else if (model && !strcmp(model, "gpt")) {
        return gpt_mem_main(&(gpt_mem_args){.batch = o.batch, .layers = o.layers, .hidden = o.hidden, .seq = o.seq,
                                            .lora_rank = o.lora_rank, .ckpt = ckpt, .json = json});
    } else if (model && is_dir(model)) {
        return mem_model_dir(model, params, dtype_given, v[M_HIDDEN].given || v[M_LAYERS].given, mode, json, ckpt, o);
    } else if (model) {
        return mem_model(model, params, shape_given, mode, json, o);
    }
    if (!params) return bad("%s", "give a parameter count, e.g. ember mem 7B");
    if (!classifier && em_estimate_parse_params(params, &o.params) != EM_OK) return bad("%s", em_last_error());
    if (o.activation_bytes_per_sample > 0 && o.batch <= 0) return bad("%s", "--act-bytes needs --batch");
    if (!classifier && (o.batch > 0) != (o.seq > 0) && o.activation_bytes_per_sample <= 0)
        return bad("%s", "activations need both --batch and --seq (or --batch and --act-bytes)");
    em_estimate_mode modes[3];
    int nmodes;
    if (!parse_mode(mode, modes, &nmodes)) return bad("unknown mode '%s': expected all, inference, full or lora", mode);
    if (classifier && !strcmp(mode, "all")) nmodes--;   /* LoRA adapts transformers' matrices: only when asked */
    em_estimate e, alt;
    if (classifier && o.lora_rank > 256) {
        char msg[160];
        snprintf(msg, sizeof msg, "--lora-rank %d is larger than the model's widest Linear (256): the rank must be at "
                 "most that", o.lora_rank);
        return bad("%s", msg);
    }
    if (!classifier && modes[nmodes - 1] == EM_ESTIMATE_LORA) {   /* checked before anything is printed */
        em_estimate_opts lo = o;
        lo.mode = EM_ESTIMATE_LORA;
        if (em_estimate_memory(&lo, &e) != EM_OK) return bad("%s", em_last_error());
        if (!lora_fits(&lo, &e, false)) return 2;
    }
    fit_device dev[MAX_DEVICES];
    int ndev = list_devices(dev);
    if (em_estimate_memory(&(em_estimate_opts){.params = o.params, .dtype = o.dtype}, &e) != EM_OK)
        return bad("%s", em_last_error());
    const char *dt = o.dtype == EM_F32 ? "float32" : o.dtype == EM_F16 ? "float16" : "bfloat16";
    if (json) {
        printf("{\n  \"params\": %.0f, \"dtype\": \"%s\", \"hidden\": %lld, \"layers\": %lld, "
               "\"shape_inferred\": %s,\n  \"estimates\": [", o.params, dt, (long long)(o.hidden ? o.hidden : e.hidden),
               (long long)(o.layers ? o.layers : e.layers), o.hidden && o.layers ? "false" : "true");
    } else {
        if (classifier) printf("ember mem: ember train's %s (%.0f parameters), %s weights, batch %lld", cnn ? "CNN" : "MLP",
                               o.params, dt, (long long)o.batch);
        else printf("ember mem: %s parameters (%.0f), %s weights", params, o.params, dt);
        if (o.autocast_dtype != EM_F32) printf(", autocast %s activations", em_dtype_name(o.autocast_dtype));
        if (ckpt) printf("; --checkpoint-activations: %s", mem_classifier_ckpt_why(model));
        if (!classifier && (!o.hidden || !o.layers))
            printf("; assumed transformer shape: hidden %lld, %lld layers (set --hidden/--layers for your model)",
                   (long long)(o.hidden ? o.hidden : e.hidden), (long long)(o.layers ? o.layers : e.layers));
        printf("\nGB = 1e9 bytes, GiB = 2^30 bytes\n");
    }
    for (int m = 0; m < nmodes; m++) {
        em_estimate_opts mo = o;
        mo.mode = modes[m];
        if (cnn && !model_cnn_estimate_opts(&mo, true, ckpt, cnn_why, sizeof cnn_why)) return bad("%s", em_last_error());
        if (mlp ? !classifier_estimate("mlp", &mo, ckpt, &e) : em_estimate_memory(&mo, &e) != EM_OK)
            return bad("%s", em_last_error());
        if (cnn && cnn_why[0]) snprintf(e.why[EM_ESTIMATE_ACTIVATIONS], sizeof e.why[0], "%s", cnn_why);
        bool has_alt = !classifier && modes[m] == EM_ESTIMATE_FULL && o.dtype != EM_F32;
        if (has_alt) {
            em_estimate_opts ao = mo;
            ao.master_weights = !mo.master_weights;
            if (em_estimate_memory(&ao, &alt) != EM_OK) return bad("%s", em_last_error());
        }
        /* the estimate first, at once; then the same training step measured, when it is
         * small (mem_measure_fits) and in float32 (ember train's dtype) */
        if (!json) {
            print_text(&mo, &e, has_alt ? &alt : NULL, dev, ndev);
            fflush(stdout);
        }
        double peak = NAN;
        char what[160], why_not[320] = "";
        bool measured = classifier && modes[m] != EM_ESTIMATE_INFERENCE;
        if (measured && (o.dtype != EM_F32 || o.autocast_dtype != EM_F32)) {
            snprintf(why_not, sizeof why_not, "ember train's models train in float32 without --amp here");
        } else if (measured && mem_measure_fits(e.bytes[EM_ESTIMATE_TOTAL], 2 * mem_classifier_step_flops(model, o.batch),
                                                why_not, sizeof why_not)) {
            peak = mem_measure_classifier(&(mem_classifier){model, mo.optimizer,
                                                            modes[m] == EM_ESTIMATE_LORA ? (mo.lora_rank ? mo.lora_rank : 8) : 0,
                                                            ckpt}, o.batch);
            snprintf(what, sizeof what, "two %s steps of ember train's %s%s at batch %lld",
                     em_estimate_optimizer_name(mo.optimizer), cnn ? "CNN" : "MLP",
                     modes[m] == EM_ESTIMATE_LORA ? " with LoRA" : "", (long long)o.batch);
        }
        if (json) print_json(&mo, &e, has_alt ? &alt : NULL, dev, ndev, m == 0, peak);
        else if (measured) mem_print_measured(e.bytes[EM_ESTIMATE_TOTAL], peak, what, why_not[0] ? why_not : NULL);
    }
    if (json) printf("\n  ]\n}\n");
    return 0;
}
