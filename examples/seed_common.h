/* Small helpers shared by the seed programs (examples/seed_*.c): Python-style printing,
 * a check that stops the program on an unexpected error (the examples run as tests),
 * and the choice of a second device to show moves on a machine without a GPU. */
#ifndef EMBER_EXAMPLES_SEED_COMMON_H
#define EMBER_EXAMPLES_SEED_COMMON_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <ember/ember.h>

/* Python's True / False. */
static inline const char *py_bool(bool b) { return b ? "True" : "False"; }

/* Stop on an unexpected failure: print Ember's message and exit non-zero, so that the
 * example fails as a test. Use for calls that must work on every machine. */
#define SEED_CHECK(cond)                                                                   \
    do {                                                                                   \
        if (!(cond) || em_failed()) {                                                      \
            fflush(stdout);                                                                \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #cond,           \
                    em_failed() ? em_last_error() : "(no error recorded)");                \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

/* print(x.device) */
static inline void print_device_of(const char *label, const em_tensor *t) {
    printf("%s%s\n", label, em_device_str(em_device_of(t)).s);
}

/* print(x) */
static inline void print_tensor(const char *label, const em_tensor *t) {
    fputs(label, stdout);
    fflush(stdout);
    SEED_CHECK(em_print(t) == EM_OK);
}

/* torch.cuda.get_device_name(d), as a value usable inside printf: device_name(d).s */
typedef struct seed_name { char s[256]; } seed_name;
static inline seed_name device_name(em_device d) {
    seed_name n;
    em_device_props p;
    if (em_device_get_props(d, &p) == EM_OK) snprintf(n.s, sizeof n.s, "%s", p.name);
    else {
        snprintf(n.s, sizeof n.s, "unknown: %s", em_last_error());
        em_clear_error();
    }
    return n;
}

/* Print and forget the error an operation was expected to record (PyTorch's RuntimeError). */
static inline void print_expected_error(const char *what) {
    printf("%s -> error (%s): %s\n", what, em_status_name(em_last_status()), em_last_error());
    em_clear_error();
}

/* The seeds move tensors to "cuda". Without CUDA the programs still show real moves
 * between two devices when there is one: an OpenCL device (PoCL runs on the CPU).
 * Returns the CPU when no other device exists (moves then return the same tensor). */
static inline em_device second_device(void) {
    em_device d = em_device_auto();
    if (d.type != EM_CPU) return d;
    if (em_device_available(EM_OPENCL)) return EM_DEVICE(EM_OPENCL, 0);
    return EM_DEVICE_CPU;
}

/* Until the nn API lands (em_linear, em_sequential, em_module_to from the train helper),
 * a linear layer written with tensor ops: y = x @ W^T + b, with PyTorch's initialisation
 * U(-1/sqrt(in), 1/sqrt(in)). Call these inside a scope: the scope frees every tensor.
 * TODO(nn): replace with em_linear / em_forward / em_module_to. */
typedef struct seed_linear { em_tensor *weight, *bias; } seed_linear;

static inline seed_linear seed_linear_new(int64_t in, int64_t out, em_device dev) {
    double k = 1.0 / sqrt((double)in);
    seed_linear l;
    l.weight = em_sub_scalar(em_mul_scalar(em_rand(EM_SHAPE(out, in), EM_OPTS(.device = dev)), 2 * k), k);
    l.bias = em_sub_scalar(em_mul_scalar(em_rand(EM_SHAPE(out), EM_OPTS(.device = dev)), 2 * k), k);
    SEED_CHECK(l.weight && l.bias);
    return l;
}

/* model(x); NULL (and Ember's error) when x is on another device than the weights. */
static inline em_tensor *seed_linear_forward(const seed_linear *l, em_tensor *x) {
    return em_add(em_matmul(x, em_transpose(l->weight, 0, 1)), l->bias);
}

/* model.to(device): the layer's tensors move (new tensors on the device; the old ones
 * stay with the scope). */
static inline void seed_linear_to(seed_linear *l, em_device dev) {
    l->weight = em_to(l->weight, dev);
    l->bias = em_to(l->bias, dev);
    SEED_CHECK(l->weight && l->bias);
}

#endif
