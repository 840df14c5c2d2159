/* The models `ember train --model NAME` builds and `ember eval` reloads: the seed's MLP
 * ("mlp") and a LeNet-5-style CNN ("cnn"). A checkpoint names its model in the metadata
 * key "model" (a checkpoint without it is an MLP's, from before the key). */
#ifndef EMBER_TOOL_MODEL_CNN_H
#define EMBER_TOOL_MODEL_CNN_H

#include <stdbool.h>
#include <ember/ember.h>
#include <ember/estimate.h>

/* A new model of that kind (random init from Ember's generator), or NULL with an error. */
em_module *model_new(const char *name);
/* One line describing the layers, for the training banner. */
const char *model_summary(const char *name);
/* The default checkpoint file: ember-mlp.safetensors, ember-cnn.safetensors. */
const char *model_default_checkpoint(const char *name);
/* The model a loaded checkpoint holds: "gpt" when its "ember.model" metadata says so (ember
 * train --model gpt), else its "model" metadata ("mlp" when absent); NULL with an error when
 * it names a model these tools do not know. */
const char *model_of_file(const em_safetensors *f);

/* The CNN, LeNet-5's layout with wider layers: the input as 1x28x28 images standardized
 * with the dataset's mean and std, Conv2d(1, 16, 5, padding=2), ReLU, MaxPool2d(2),
 * Conv2d(16, 32, 5), ReLU, MaxPool2d(2), Flatten, Linear(800, 128), ReLU, Linear(128, 10).
 * (LeNet-5's own 6 and 16 channels reach about 88% after 5 epochs; these reach 90%.) */
#define CNN_C1 16
#define CNN_C2 32
#define CNN_HIDDEN 128
em_module *cnn_new(void);

/* ember mem --model cnn: fills o's params, dtype (float32 unless dtype_given), shape
 * (hidden = the widest Linear input, CNN_C2 * 25; layers = 4 weighted layers), largest tensor,
 * LoRA's adapter count (the two Linears) and, with o->batch > 0, the input and activation
 * bytes per sample at the step's peak for o->mode (full: what autograd keeps plus the
 * forward's outputs the Sequential holds; LoRA: the frozen convolutions record nothing),
 * ckpt: ember train --checkpoint-activations' 3 segments. why gets the activation line's
 * explanation ("" without a batch). */
bool model_cnn_estimate_opts(em_estimate_opts *o, bool dtype_given, bool ckpt, char *why, size_t why_size);

#endif
