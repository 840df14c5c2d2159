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
    return em_sequential(em_module_new(&input_ops, NULL),
                         em_conv2d_module_ex(1, CNN_C1, EM_HW1(5), EM_HW1(1), EM_HW1(2), EM_HW1(1), 1, true),
                         em_relu_module(), em_max_pool2d_module(EM_HW1(2), EM_HW1(0), EM_HW1(0), EM_HW1(1), false),
                         em_conv2d_module(CNN_C1, CNN_C2, EM_HW1(5)), em_relu_module(),
                         em_max_pool2d_module(EM_HW1(2), EM_HW1(0), EM_HW1(0), EM_HW1(1), false),
                         em_flatten_module(), em_linear(CNN_C2 * 5 * 5, CNN_HIDDEN), em_relu_module(),
                         em_linear(CNN_HIDDEN, 10));
}

bool model_parse(const char *tool, const char *opt, const char *name) {
    if (!strcmp(name, "mlp") || !strcmp(name, "cnn")) return true;
    fprintf(stderr, "%s: %s expects mlp, cnn or gpt, got '%s'\n", tool, opt, name);
    return false;
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

const char *model_of_checkpoint(const char *path) {
    em_safetensors *f = em_safetensors_load(path, EM_DEVICE_CPU);
    if (!f) return NULL;
    const char *kind = em_safetensors_metadata(f, "model");
    const char *r = !kind || !strcmp(kind, "mlp") ? "mlp" : !strcmp(kind, "cnn") ? "cnn" : NULL;
    if (!r) em_error(EM_ERR_FORMAT, "%s: metadata 'model' = '%.40s': expected mlp or cnn", path, kind);
    em_safetensors_free(f);
    return r;
}

bool model_cnn_estimate_opts(em_estimate_opts *o, bool dtype_given, char *why, size_t why_size) {
    em_module *m = cnn_new();
    if (!m) return false;
    o->params = (double)em_module_num_parameters(m);
    em_module_free(m);
    if (!dtype_given) o->dtype = EM_F32;
    o->hidden = CNN_C2 * 5 * 5;
    o->layers = 4;
    o->largest_param = CNN_C2 * 5 * 5 * CNN_HIDDEN;
    double es = o->dtype == EM_F32 ? 4 : 2;
    /* per sample, in elements: what the step keeps for backward. Conv2d keeps its input,
     * ReLU its output, MaxPool2d its int64 indices (two floats' worth each), Linear its input,
     * cross-entropy its log-softmax; the convolutions' outputs die once ReLU has its own. */
    double conv1_in = 784, relu1 = CNN_C1 * 28 * 28, idx1 = CNN_C1 * 14 * 14, pool1 = CNN_C1 * 14 * 14;
    double relu2 = CNN_C2 * 10 * 10, idx2 = CNN_C2 * 5 * 5, pool2 = CNN_C2 * 5 * 5, relu3 = CNN_HIDDEN, logits = 10;
    double kept = relu1 + pool1 + relu2 + pool2 + relu3 + logits + (idx1 + idx2) * 8 / es;
    /* backward's widest moment: the gradient of ReLU 1's output and of its input at once (an
     * upper bound: measured on a batch-64 Adam step, the allocator's peak was 13.2 MB against
     * 15.6 MB estimated in all) */
    double transient = 2 * relu1;
    if (o->batch > 0 && o->activation_bytes_per_sample <= 0) {
        o->input_bytes_per_sample = conv1_in * es;
        o->activation_bytes_per_sample = (kept + transient) * es; /* a training step's */
        snprintf(why, why_size, "per sample: %.0f elements kept for backward (ReLU outputs, pool outputs and indices, "
                 "logits) + %.0f in backward's widest step", kept, transient);
    } else {
        snprintf(why, why_size, "%s", "");
    }
    return true;
}
