/* `ember train --model cnn`: a LeNet-5-style network for Fashion-MNIST (two conv + pool
 * blocks, two linear layers), and the model names the tools share. The loader hands rows of
 * 784 pixels, as for the MLP; the network's first layer turns them into 1x28x28 images
 * (PyTorch's nn.Unflatten), so both models train from the same dataset. */
#include <stdio.h>
#include <string.h>
#include "mlp.h"
#include "model_cnn.h"

/* The first layer: rows of 784 pixels in [0, 1] become 1x28x28 images standardized with
 * Fashion-MNIST's mean and std (torchvision's Normalize((0.2860,), (0.3530,)), done inside
 * the model so that a checkpoint evaluates the same anywhere). */
#define FMNIST_MEAN 0.2860
#define FMNIST_STD 0.3530

static em_tensor *input_forward(em_module *m, em_tensor *x) {
    (void)m;
    return em_div_scalar(em_sub_scalar(em_reshape(x, EM_SHAPE(-1, 1, 28, 28)), FMNIST_MEAN), FMNIST_STD);
}

static void input_describe(const em_module *m, char *buf, size_t size) {
    (void)m;
    snprintf(buf, size, "unflattened_size=(1, 28, 28), mean=%.4f, std=%.4f", FMNIST_MEAN, FMNIST_STD);
}

static const em_module_ops input_ops = {.name = "UnflattenNormalize", .forward = input_forward,
                                        .describe = input_describe};

em_module *cnn_new(void) {
    return em_nn_sequential(em_module_new(&input_ops, NULL),
                         em_nn_conv2d_ex(1, CNN_C1, EM_HW1(5), EM_HW1(1), EM_HW1(2), EM_HW1(1), 1, true),
                         em_nn_relu(), em_nn_max_pool2d(EM_HW1(2), EM_HW1(0), EM_HW1(0), EM_HW1(1), false),
                         em_nn_conv2d(CNN_C1, CNN_C2, EM_HW1(5)), em_nn_relu(),
                         em_nn_max_pool2d(EM_HW1(2), EM_HW1(0), EM_HW1(0), EM_HW1(1), false),
                         em_nn_flatten(), em_nn_linear(CNN_C2 * 5 * 5, CNN_HIDDEN), em_nn_relu(),
                         em_nn_linear(CNN_HIDDEN, 10));
}

em_module *model_new(const char *name) { return !strcmp(name, "cnn") ? cnn_new() : mlp_new(); }

const char *model_summary(const char *name) {
    return !strcmp(name, "cnn") ? "CNN: Conv2d(1, 16, 5, padding=2) ReLU MaxPool2d(2) Conv2d(16, 32, 5) ReLU MaxPool2d(2) "
                                  "Linear(800, 128) ReLU Linear(128, 10)"
                                : "Linear(784, 256) ReLU Linear(256, 10)";
}

const char *model_default_checkpoint(const char *name) {
    return !strcmp(name, "cnn") ? "ember-cnn.safetensors" : "ember-mlp.safetensors";
}

const char *model_of_file(const em_safetensors *f) {
    const char *gpt = em_safetensors_metadata(f, "ember.model");   /* ember train --model gpt's key */
    if (gpt && !strcmp(gpt, "gpt")) return "gpt";
    const char *kind = em_safetensors_metadata(f, "model");
    const char *r = !kind || !strcmp(kind, "mlp") ? "mlp" : !strcmp(kind, "cnn") ? "cnn" : NULL;
    if (!r) em_error(EM_ERR_FORMAT, "%s: metadata 'model' = '%.40s': expected mlp or cnn", em_safetensors_path(f), kind);
    return r;
}

bool model_cnn_estimate_opts(em_estimate_opts *o, bool dtype_given, bool ckpt, char *why, size_t why_size) {
    em_module *m = cnn_new();
    if (!m) return false;
    o->params = (double)em_module_num_parameters(m);
    em_module_free(m);
    if (!dtype_given) o->dtype = EM_F32;
    o->hidden = CNN_C2 * 5 * 5;
    o->layers = 4;
    bool lora = o->mode == EM_ESTIMATE_LORA;
    int rank = o->lora_rank ? o->lora_rank : 8;
    /* LoRA adapts the two Linears: rank x (in + out) each */
    o->lora_params = rank * (double)(CNN_C2 * 25 + CNN_HIDDEN + CNN_HIDDEN + 10);
    o->largest_param = lora ? rank * (double)(CNN_C2 * 25) : CNN_C2 * 5 * 5 * CNN_HIDDEN;
    double es = o->dtype == EM_F32 ? 4 : 2;
    /* per sample, in elements, measured op by op against the CPU allocator (docs/BENCHMARKS.md):
     * the normalized input (conv1 keeps it), ReLU outputs, pool outputs and their int64
     * indices (two floats' worth each), the logits and log-softmax */
    double in = 784, r1 = CNN_C1 * 28 * 28, p1 = CNN_C1 * 14 * 14, r2 = CNN_C2 * 10 * 10, p2 = CNN_C2 * 5 * 5;
    double h = CNN_HIDDEN, out = 10, idx = 8 / es;
    double peak;
    const char *moment;
    if (o->mode == EM_ESTIMATE_INFERENCE) {
        /* no autograd: every layer's output lives until the Sequential returns, no indices */
        peak = 2 * in + 2 * r1 + p1 + 2 * r2 + p2 + 2 * h + 2 * out;
        moment = "the forward's end, every layer's output alive until the Sequential returns";
    } else if (lora) {
        /* the convolutions are frozen and their input needs no gradient: nothing is recorded
         * before fc1 (the pools make no indices); the forward's outputs live until the
         * Sequential returns */
        double fwd = 2 * in + 2 * r1 + p1 + 2 * r2 + p2 + 2 * h + 4 * rank + 2 * out; /* no indices: no gradient */
        peak = fwd;
        moment = "forward's end, every layer's output alive (frozen convolutions: nothing kept before fc1)";
    } else if (ckpt) {
        /* 3 segments: (input, conv1, ReLU) and (pool, conv2, ReLU) recomputed in backward;
         * kept: the second segment's input (ReLU 1's output) and the last segment's tensors */
        double kept = r1 + p2 * (1 + idx) + h + 2 * out;
        double fwd = in + 2 * r1;                      /* segment 1 without autograd */
        /* a recomputed segment keeps only what its graph saves (its own scope): segment 2
         * recomputed and backpropagated holds its kept input (ReLU 1's output) and the gradient
         * going out to it, the pool's output and indices, ReLU 2's output and the gradient
         * coming in (the normalized input belongs to segment 1, not recomputed yet); segment
         * 1's moment (the normalized input, ReLU 1's kept and recomputed outputs and the
         * gradient) is smaller */
        double bwd2 = 2 * r1 + p1 * (1 + idx) + 2 * r2, bwd1 = in + 3 * r1;
        double bwd = bwd2 > bwd1 ? bwd2 : bwd1;
        peak = fwd > bwd ? fwd : bwd;
        if (kept + h > peak) peak = kept + h;
        moment = "segment 2 recomputed in backward: its input and that input's gradient, the pool's output and "
                 "indices, ReLU 2's output and its gradient";
    } else {
        double kept = in + r1 + p1 * (1 + idx) + r2 + p2 * (1 + idx) + h + 2 * out;
        double fwd = kept + r1 + r2 + h;               /* conv1, conv2, fc1 outputs until the Sequential returns */
        double bwd = in + 3 * r1;                      /* ReLU 1's backward: output, gradient in and out */
        peak = fwd > bwd ? fwd : bwd;
        moment = "forward's end, kept for backward + conv1, conv2, fc1 outputs (freed as the Sequential returns)";
    }
    if (o->batch > 0) {
        o->input_bytes_per_sample = 784 * es;
        o->activation_bytes_per_sample = peak * es;
        snprintf(why, why_size, "input %lld x %.0f B + %lld x %.0f elements at the peak, %s", (long long)o->batch,
                 784 * es, (long long)o->batch, peak, moment);
    } else {
        snprintf(why, why_size, "%s", "");
    }
    return true;
}
