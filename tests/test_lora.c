/* LoRA: adapters train while the base stays frozen, B = 0 leaves the output unchanged,
 * merging keeps the output, the adapters round-trip through safetensors with PEFT's names,
 * a task trains, and bad input is a clear error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "test.h"
#include <ember/estimate.h>

#define IN 12
#define HID 16
#define OUT 5

static em_module *mlp(void) {
    return em_nn_sequential(em_nn_linear(IN, HID), em_nn_relu(), em_nn_linear(HID, OUT));
}

static em_tensor *param(em_module *m, const char *name) {
    em_named_tensor list[16];
    int n = em_module_parameters(m, list, 16);
    for (int i = 0; i < n && i < 16; i++)
        if (!strcmp(list[i].name, name)) return list[i].tensor;
    return NULL;
}

static double absmax(em_tensor *t) {
    return em_item(em_max(em_abs(t), EM_ALL_DIMS, false));
}

static double max_diff(em_tensor *a, em_tensor *b) {
    return absmax(em_sub(a, b));
}

/* bytes of t, copied to a malloc'd buffer */
static float *host(em_tensor *t) {
    size_t n = (size_t)em_numel(t);
    float *p = malloc(n * sizeof *p);
    if (p && em_copy_to_host(t, p, n * sizeof *p) != EM_OK) {
        free(p);
        return NULL;
    }
    return p;
}

static void test_wrap_freezes_and_names(void) {
    em_manual_seed(1);
    em_module *m = mlp();
    int64_t total = em_module_num_parameters(m);
    CHECK(em_module_num_trainable_parameters(m) == total);
    CHECK_OK(em_lora_wrap(m, 4, 8.0, EM_LORA_LINEAR));
    /* adapters: 4*12 + 16*4 + 4*16 + 5*4 */
    int64_t adapters = 4 * IN + HID * 4 + 4 * HID + OUT * 4;
    CHECK(em_module_num_trainable_parameters(m) == adapters);
    CHECK(em_module_num_parameters(m) == total + adapters);
    CHECK(!em_requires_grad(param(m, "0.weight")));
    CHECK(!em_requires_grad(param(m, "2.bias")));
    em_tensor *a = param(m, "0.lora_A.weight"), *b = param(m, "2.lora_B.weight");
    CHECK(a && em_requires_grad(a) && em_shape_of(a).d[0] == 4 && em_shape_of(a).d[1] == IN);
    CHECK(b && em_requires_grad(b) && em_shape_of(b).d[0] == OUT && em_shape_of(b).d[1] == 4);
    /* A ~ U(-1/sqrt(in), 1/sqrt(in)) and not all zero; B = 0 */
    em_scope s = em_scope_begin();
    double amax = absmax(a);
    CHECK(amax > 0.0 && amax <= 1.0 / sqrt((double)IN));
    CHECK(absmax(b) == 0.0);
    em_scope_end(s);
    CHECK(!strcmp(em_module_name(em_module_child(m, 0)), "lora.Linear"));
    char buf[1024];
    em_module_format(m, buf, sizeof buf);
    CHECK(strstr(buf, "(lora_A): Linear(in_features=12, out_features=4, bias=False)") != NULL);
    em_module_free(m);
}

static void test_init_output_equals_base(void) {
    em_manual_seed(2);
    em_module *m = mlp();
    em_scope s = em_scope_begin();
    em_tensor *x = em_randn(EM_SHAPE(7, IN), (em_opts){0});
    em_tensor *y0 = em_forward(m, x);
    CHECK_OK(em_lora_wrap(m, 3, 6.0, EM_LORA_LINEAR));
    em_tensor *y1 = em_forward(m, x);
    CHECK(y0 && y1 && max_diff(y0, y1) == 0.0);
    /* 3-d input goes through the adapters too */
    em_tensor *y3 = em_forward(m, em_reshape(x, EM_SHAPE(1, 7, IN)));
    CHECK(y3 && em_ndim(y3) == 3 && max_diff(em_reshape(y3, EM_SHAPE(7, OUT)), y0) == 0.0);
    em_scope_end(s);
    em_module_free(m);
}

/* one step of plain regression: mse(m(x), y) */
static double step(em_module *m, em_optimizer *opt, em_tensor *x, em_tensor *y) {
    em_scope s = em_scope_begin();
    em_zero_grad(opt);
    em_tensor *loss = em_mse_loss(em_forward(m, x), y);
    double l = loss ? em_item(loss) : NAN;
    if (loss) CHECK_OK(em_backward(loss));
    CHECK_OK(em_step(opt));
    em_scope_end(s);
    return l;
}

static void test_only_adapters_train(void) {
    em_manual_seed(3);
    em_module *m = mlp();
    CHECK_OK(em_lora_wrap(m, 4, 8.0, EM_LORA_LINEAR));
    const char *base[] = {"0.weight", "0.bias", "2.weight", "2.bias"};
    float *before[4];
    for (int i = 0; i < 4; i++) before[i] = host(param(m, base[i]));
    float *a0 = host(param(m, "0.lora_A.weight"));
    em_optimizer *opt = em_adam(m, 1e-2);
    em_scope s = em_scope_begin();
    em_tensor *x = em_randn(EM_SHAPE(9, IN), (em_opts){0});
    em_tensor *y = em_randn(EM_SHAPE(9, OUT), (em_opts){0});
    for (int k = 0; k < 3; k++) step(m, opt, x, y);
    /* after a backward: only adapters have gradients */
    em_zero_grad(opt);
    CHECK_OK(em_backward(em_mse_loss(em_forward(m, x), y)));
    for (int i = 0; i < 4; i++) CHECK(em_grad(param(m, base[i])) == NULL);
    CHECK(em_grad(param(m, "0.lora_A.weight")) != NULL);
    CHECK(em_grad(param(m, "2.lora_B.weight")) != NULL);
    em_scope_end(s);
    for (int i = 0; i < 4; i++) {
        em_tensor *p = param(m, base[i]);
        float *now = host(p);
        CHECK(before[i] && now && !memcmp(before[i], now, (size_t)em_numel(p) * sizeof(float)));
        free(now);
        free(before[i]);
    }
    float *a1 = host(param(m, "0.lora_A.weight"));
    CHECK(a0 && a1 && memcmp(a0, a1, (size_t)4 * IN * sizeof(float)) != 0);
    free(a0);
    free(a1);
    s = em_scope_begin();
    CHECK(absmax(param(m, "2.lora_B.weight")) > 0.0);
    em_scope_end(s);
    em_optim_free(opt);
    em_module_free(m);
}

static void test_merge_keeps_output(void) {
    em_manual_seed(4);
    em_module *m = mlp();
    CHECK_OK(em_lora_wrap(m, 4, 16.0, EM_LORA_LINEAR));
    em_optimizer *opt = em_adam(m, 5e-2);
    em_scope s = em_scope_begin();
    em_tensor *x = em_randn(EM_SHAPE(8, IN), (em_opts){0});
    em_tensor *y = em_randn(EM_SHAPE(8, OUT), (em_opts){0});
    for (int k = 0; k < 5; k++) step(m, opt, x, y);
    em_optim_free(opt);
    em_tensor *w0 = em_clone(param(m, "0.weight"));
    em_tensor *wrapped = em_detach(em_forward(m, x));
    CHECK_OK(em_lora_merge(m));
    /* the weight changed by (alpha / r) B A, the adapters are gone */
    CHECK(max_diff(w0, param(m, "0.weight")) > 1e-4);
    CHECK(param(m, "0.lora_A.weight") == NULL && param(m, "2.lora_B.weight") == NULL);
    CHECK(em_module_kind_of(em_module_child(m, 0)) == EM_MODULE_LINEAR);
    CHECK(em_module_num_parameters(m) == (int64_t)IN * HID + HID + HID * OUT + OUT);
    em_tensor *merged = em_forward(m, x);
    double d = max_diff(wrapped, merged);
    printf("  merge: max |wrapped - merged| = %.3g\n", d);
    CHECK(d <= 1e-5);
    em_scope_end(s);
    /* nothing left to merge; can be wrapped again */
    CHECK(em_lora_merge(m) != EM_OK);
    CHECK_ERROR(EM_ERR_ARGUMENT, "no LoRA adapters");
    CHECK_OK(em_lora_wrap(m, 2, 2.0, EM_LORA_LINEAR));
    em_module_free(m);
}

static void test_save_load_peft_names(void) {
    const char *path = "test_lora_adapters.safetensors";
    em_manual_seed(5);
    em_module *m = mlp();
    CHECK_OK(em_lora_wrap(m, 4, 8.0, EM_LORA_LINEAR));
    em_optimizer *opt = em_sgd(m, 0.1);
    em_scope s = em_scope_begin();
    em_tensor *x = em_randn(EM_SHAPE(6, IN), (em_opts){0});
    em_tensor *y = em_randn(EM_SHAPE(6, OUT), (em_opts){0});
    for (int k = 0; k < 3; k++) step(m, opt, x, y);
    em_optim_free(opt);
    em_tensor *ref = em_retain(em_detach(em_forward(m, x))); /* outlives the scope */
    x = em_retain(x);
    CHECK_OK(em_lora_save(m, path));
    em_scope_end(s);
    /* the file holds exactly the four adapters, under PEFT's names */
    em_safetensors *f = em_safetensors_load(path, EM_DEVICE_CPU);
    CHECK(f != NULL);
    if (f) {
        const char *want[] = {"base_model.model.0.lora_A.weight", "base_model.model.0.lora_B.weight",
                              "base_model.model.2.lora_A.weight", "base_model.model.2.lora_B.weight"};
        CHECK(em_safetensors_count(f) == 4);
        for (int i = 0; i < 4; i++) {
            bool found = false;
            for (int k = 0; k < em_safetensors_count(f); k++) found |= !strcmp(em_safetensors_name(f, k), want[i]);
            CHECK(found);
        }
        s = em_scope_begin();
        em_tensor *b2 = em_safetensors_get(f, "base_model.model.2.lora_B.weight");
        CHECK(b2 && max_diff(b2, param(m, "2.lora_B.weight")) == 0.0);
        em_scope_end(s);
        em_safetensors_free(f);
    }
    /* a fresh copy of the same base with fresh adapters, then the saved ones loaded */
    em_module *base = mlp();
    em_named_tensor list[16];
    int n = em_module_parameters(m, list, 16);
    em_grad_mode g = em_no_grad_begin();
    for (int i = 0; i < n; i++) {
        em_tensor *dst = param(base, list[i].name);
        if (dst) CHECK_OK(em_copy_(dst, list[i].tensor));
    }
    em_no_grad_end(g);
    CHECK_OK(em_lora_wrap(base, 4, 8.0, EM_LORA_LINEAR));
    s = em_scope_begin();
    CHECK(max_diff(em_forward(base, x), ref) > 1e-6); /* B = 0 here: differs before loading */
    CHECK_OK(em_lora_load(base, path));
    CHECK(max_diff(em_forward(base, x), ref) == 0.0);
    em_scope_end(s);
    em_module_free(base);

    /* wrong rank: a shape error naming the tensor, the model unchanged */
    em_module *other = mlp();
    CHECK_OK(em_lora_wrap(other, 2, 8.0, EM_LORA_LINEAR));
    int64_t live = em_memory_allocated(EM_DEVICE_CPU);
    CHECK(em_lora_load(other, path) == EM_ERR_SHAPE);
    CHECK_ERROR(EM_ERR_SHAPE, "base_model.model.0.lora_A.weight");
    CHECK(em_memory_allocated(EM_DEVICE_CPU) == live);
    s = em_scope_begin();
    CHECK(absmax(param(other, "0.lora_B.weight")) == 0.0);
    em_scope_end(s);
    em_module_free(other);

    /* a model with other layers: missing key */
    em_module *deeper = em_nn_sequential(em_nn_linear(IN, HID), em_nn_relu(), em_nn_linear(HID, OUT), em_nn_relu(),
                                      em_nn_linear(OUT, OUT));
    CHECK_OK(em_lora_wrap(deeper, 4, 8.0, EM_LORA_LINEAR));
    CHECK(em_lora_load(deeper, path) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "has no tensor \"base_model.model.4.lora_A.weight\"");
    em_module_free(deeper);
    /* and one with fewer: the file's extra adapters are refused */
    em_module *shallow = em_nn_sequential(em_nn_linear(IN, HID));
    CHECK_OK(em_lora_wrap(shallow, 4, 8.0, EM_LORA_LINEAR));
    CHECK(em_lora_load(shallow, path) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "which is no adapter of this model");
    em_module_free(shallow);
    em_module_free(m);
    em_release(ref);
    em_release(x);
    remove(path);
}

/* y = x W* + noise-free target from a teacher; the student's base is a different random net */
static void test_training_reduces_loss(void) {
    em_manual_seed(6);
    em_module *teacher = mlp(), *m = mlp();
    em_scope s = em_scope_begin();
    em_tensor *x = em_randn(EM_SHAPE(64, IN), (em_opts){0});
    em_tensor *y = em_detach(em_forward(teacher, x));
    CHECK_OK(em_lora_wrap(m, 4, 8.0, EM_LORA_LINEAR));
    em_optimizer *opt = em_adam(m, 1e-2);
    double first = step(m, opt, x, y), last = first;
    for (int k = 0; k < 200; k++) last = step(m, opt, x, y);
    printf("  LoRA regression: loss %.4f -> %.4f after 200 Adam steps (rank 4, %lld of %lld parameters trained)\n",
           first, last, (long long)em_module_num_trainable_parameters(m), (long long)em_module_num_parameters(m));
    CHECK(last < 0.3 * first);
    em_optim_free(opt);
    em_scope_end(s);
    em_module_free(teacher);
    em_module_free(m);
}

/* classification: labels from a teacher's argmax; LoRA on a different random base */
static void test_classification_improves(void) {
    em_manual_seed(9);
    em_module *teacher = mlp(), *m = mlp();
    em_scope s = em_scope_begin();
    em_tensor *x = em_randn(EM_SHAPE(128, IN), (em_opts){0});
    em_tensor *y = em_argmax(em_forward(teacher, x), 1, false);
    CHECK_OK(em_lora_wrap(m, 4, 8.0, EM_LORA_LINEAR));
    em_optimizer *opt = em_adam(m, 2e-2);
    double first = 0, last = 0, acc0 = 0, acc1 = 0;
    for (int k = 0; k <= 150; k++) {
        em_scope t = em_scope_begin();
        em_zero_grad(opt);
        em_tensor *logits = em_forward(m, x);
        em_tensor *loss = em_cross_entropy(logits, y, 0.0);
        double acc = em_item(em_mean(em_to_dtype(em_eq(em_argmax(logits, 1, false), y), EM_F32), EM_ALL_DIMS, false));
        if (k == 0) first = em_item(loss), acc0 = acc;
        last = em_item(loss), acc1 = acc;
        CHECK_OK(em_backward(loss));
        CHECK_OK(em_step(opt));
        em_scope_end(t);
    }
    printf("  LoRA classification: loss %.4f -> %.4f, accuracy %.3f -> %.3f after 150 Adam steps\n", first, last,
           acc0, acc1);
    CHECK(last < 0.5 * first && acc1 > acc0 + 0.2);
    em_optim_free(opt);
    em_scope_end(s);
    em_module_free(teacher);
    em_module_free(m);
}

static void test_bad_input(void) {
    em_module *m = mlp();
    int64_t live = em_memory_allocated(EM_DEVICE_CPU);
    CHECK(em_lora_wrap(m, 0, 8.0, EM_LORA_LINEAR) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "rank must be >= 1, got 0");
    CHECK(em_lora_wrap(m, -3, 8.0, EM_LORA_LINEAR) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "got -3");
    /* rank 6 fits the first layer (12 -> 16) but not the last (16 -> 5): nothing changes */
    CHECK(em_lora_wrap(m, 6, 8.0, EM_LORA_LINEAR) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "rank 6 is larger than min(in_features, out_features) = 5");
    CHECK(em_memory_allocated(EM_DEVICE_CPU) == live);
    CHECK(em_module_num_trainable_parameters(m) == em_module_num_parameters(m));
    CHECK(!strcmp(em_module_name(em_module_child(m, 0)), "Linear"));
    CHECK(em_lora_wrap(m, 2, 0.0, EM_LORA_LINEAR) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "alpha");
    CHECK(em_lora_wrap(m, 2, 4.0, EM_LORA_TARGET(EM_MODULE_CONV2D)) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "only Linear");
    CHECK(em_lora_wrap(NULL, 2, 4.0, EM_LORA_LINEAR) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "model is NULL");
    CHECK(em_lora_save(m, "never.safetensors") == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "no LoRA adapters");
    CHECK_OK(em_lora_wrap(m, 2, 4.0, EM_LORA_LINEAR));
    CHECK(em_lora_wrap(m, 2, 4.0, EM_LORA_LINEAR) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "already has LoRA adapters");
    CHECK(em_lora_load(m, "no_such_lora_file.safetensors") != EM_OK);
    CHECK(em_failed());
    em_clear_error();
    em_module_free(m);

    em_module *acts = em_nn_sequential(em_nn_relu(), em_nn_tanh());
    CHECK(em_lora_wrap(acts, 1, 1.0, EM_LORA_LINEAR) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "no layer of the targeted kinds");
    em_module_free(acts);
    CHECK(em_memory_allocated(EM_DEVICE_CPU) <= live);
}

/* a bare Linear (the root itself) can be wrapped and merged */
static void test_root_linear(void) {
    em_manual_seed(7);
    em_module *m = em_nn_linear(6, 3);
    CHECK_OK(em_lora_wrap(m, 3, 3.0, EM_LORA_LINEAR));
    CHECK(em_module_num_trainable_parameters(m) == 3 * 6 + 3 * 3);
    const char *path = "test_lora_root.safetensors";
    CHECK_OK(em_lora_save(m, path));
    em_safetensors *f = em_safetensors_load(path, EM_DEVICE_CPU);
    CHECK(f && em_safetensors_count(f) == 2);
    bool found = false;
    for (int k = 0; f && k < em_safetensors_count(f); k++)
        found |= !strcmp(em_safetensors_name(f, k), "base_model.model.lora_A.weight");
    CHECK(found);
    em_safetensors_free(f);
    remove(path);
    CHECK_OK(em_lora_merge(m));
    CHECK(em_module_kind_of(m) == EM_MODULE_LINEAR);
    em_module_free(m);
}

/* `ember mem --lora-rank`'s count (em_estimate_module, LoRA mode) against a wrapped model:
 * the same trainable parameters, and the estimated total next to the allocator's peak over
 * two Adam steps. */
static void test_estimate_matches(void) {
    int64_t batches[] = {1, 64, 1024};
    for (int b = 0; b < 3; b++) {
        em_manual_seed(8);
        em_module *m = em_nn_sequential(em_nn_linear(784, 256), em_nn_relu(), em_nn_linear(256, 10));
        em_estimate e;
        CHECK_OK(em_estimate_module(m, &(em_estimate_opts){.mode = EM_ESTIMATE_LORA, .optimizer = EM_ESTIMATE_ADAM,
                                                           .lora_rank = 8, .batch = batches[b]}, &e));
        CHECK_OK(em_lora_wrap(m, 8, 16.0, EM_LORA_LINEAR));
        CHECK(e.trainable_params == (double)em_module_num_trainable_parameters(m));
        em_optimizer *opt = em_adam(m, 1e-3);
        em_scope s0 = em_scope_begin();
        em_tensor *x = em_keep(em_randn(EM_SHAPE(batches[b], 784), (em_opts){0}));
        em_tensor *y = em_keep(em_randint(0, 10, EM_SHAPE(batches[b]), EM_OPTS(.dtype = EM_I64)));
        em_scope_end(s0);
        em_memory_reset_peak_stats(EM_DEVICE_CPU);
        for (int k = 0; k < 2; k++) {
            em_scope s = em_scope_begin();
            CHECK_OK(em_zero_grad(opt));
            CHECK_OK(em_backward(em_cross_entropy(em_forward(m, x), y, 0.0)));
            CHECK_OK(em_step(opt));
            em_scope_end(s);
        }
        double peak = (double)em_memory_max_allocated(EM_DEVICE_CPU), est = e.bytes[EM_ESTIMATE_TOTAL];
        printf("  LoRA r=8 784-256-10 batch %4lld: %.0f trainable, estimate %9.0f B, measured peak %9.0f B: %+.1f%%\n",
               (long long)batches[b], e.trainable_params, est, peak, 100.0 * (est - peak) / peak);
        CHECK(fabs(est - peak) / peak < 0.15);
        em_release(x);
        em_release(y);
        em_optim_free(opt);
        em_module_free(m);
    }
}

int main(void) {
    RUN(test_wrap_freezes_and_names);
    RUN(test_init_output_equals_base);
    RUN(test_only_adapters_train);
    RUN(test_merge_keeps_output);
    RUN(test_save_load_peft_names);
    RUN(test_training_reduces_loss);
    RUN(test_classification_improves);
    RUN(test_bad_input);
    RUN(test_root_linear);
    RUN(test_estimate_matches);
    return test_summary();
}
