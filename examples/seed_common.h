/* Small helpers shared by the seed programs (examples/seed_*.c): Python-style printing,
 * a check that stops the program on an unexpected error (the examples run as tests),
 * the choice of a second device to show moves on a machine without a GPU, and checks on
 * modules (where their parameters are) and losses (finite numbers on the host). */
#ifndef EMBER_EXAMPLES_SEED_COMMON_H
#define EMBER_EXAMPLES_SEED_COMMON_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* True when every parameter of m is on d (PyTorch: all(p.device == d for p in m.parameters())).
 * The examples check this after em_module_to, so a move that leaves a parameter behind fails. */
static inline bool module_on(em_module *m, em_device d) {
    em_named_tensor ps[64];
    int n = em_module_parameters(m, ps, 64);
    if (n <= 0 || n > 64) return false;
    for (int i = 0; i < n; i++)
        if (!em_device_equal(em_device_of(ps[i].tensor), d)) return false;
    return true;
}

/* model.weight: the parameter called name (borrowed: valid as long as the module). */
static inline em_tensor *module_param(em_module *m, const char *name) {
    em_named_tensor ps[64];
    int n = em_module_parameters(m, ps, 64);
    for (int i = 0; i < n && i < 64; i++)
        if (strcmp(ps[i].name, name) == 0) return ps[i].tensor;
    fprintf(stderr, "no parameter called %s\n", name);
    exit(1);
}

/* The loss as a number on the host (loss.item(): the one copy back per step). */
static inline double loss_value(const em_tensor *loss) {
    SEED_CHECK(loss);
    double v = em_item(loss);
    SEED_CHECK(isfinite(v));
    return v;
}

#endif
