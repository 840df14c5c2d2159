/* `ember train --model cnn`: a LeNet-5-style network for Fashion-MNIST (two conv + pool
 * blocks, two linear layers), and the model names the tools share. The loader hands rows of
 * 784 pixels, as for the MLP; the network's first layer turns them into 1x28x28 images
 * (PyTorch's nn.Unflatten), so both models train from the same dataset. */
#include <stdio.h>
#include <string.h>
#include "mlp.h"
#include "model_cnn.h"

static em_tensor *unflatten_forward(em_module *m, em_tensor *x) {
    (void)m;
    return em_reshape(x, EM_SHAPE(-1, 1, 28, 28));
}

static void unflatten_describe(const em_module *m, char *buf, size_t size) {
    (void)m;
    snprintf(buf, size, "dim=1, unflattened_size=(1, 28, 28)");
}

static const em_module_ops unflatten_ops = {.name = "Unflatten", .forward = unflatten_forward,
                                            .describe = unflatten_describe};

em_module *cnn_new(void) {
    return em_sequential(em_module_new(&unflatten_ops, NULL),
                         em_conv2d_module_ex(1, 6, EM_HW1(5), EM_HW1(1), EM_HW1(2), EM_HW1(1), 1, true),
                         em_relu_module(), em_max_pool2d_module(EM_HW1(2), EM_HW1(0), EM_HW1(0), EM_HW1(1), false),
                         em_conv2d_module(6, 16, EM_HW1(5)), em_relu_module(),
                         em_max_pool2d_module(EM_HW1(2), EM_HW1(0), EM_HW1(0), EM_HW1(1), false),
                         em_flatten_module(), em_linear(16 * 5 * 5, 120), em_relu_module(), em_linear(120, 10));
}

bool model_parse(const char *tool, const char *opt, const char *name) {
    if (!strcmp(name, "mlp") || !strcmp(name, "cnn")) return true;
    fprintf(stderr, "%s: %s expects mlp or cnn, got '%s'\n", tool, opt, name);
    return false;
}

em_module *model_new(const char *name) { return !strcmp(name, "cnn") ? cnn_new() : mlp_new(); }

const char *model_summary(const char *name) {
    return !strcmp(name, "cnn") ? "CNN: Conv2d(1, 6, 5, padding=2) ReLU MaxPool2d(2) Conv2d(6, 16, 5) ReLU MaxPool2d(2) "
                                  "Linear(400, 120) ReLU Linear(120, 10)"
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
