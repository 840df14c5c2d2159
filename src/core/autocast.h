/* Autocast's hook at the op entry points (the table and regions are in autocast.c). An op
 * on autocast's lists starts with one line, e.g.
 *     EM_AUTOCAST2(EM_AC_MATMUL, em_matmul(a, b), a, b);
 * When a region for the inputs' device type is on and some input needs a cast, the inputs
 * are replaced by their (differentiable, possibly cached) casts, the op calls itself again
 * (the casts already fit, so the inner call runs normally) and returns; otherwise the line
 * does nothing: outside every region it costs one thread-local load. */
#ifndef EM_CORE_AUTOCAST_H
#define EM_CORE_AUTOCAST_H

#include <stdbool.h>
#include <ember/tensor.h>

/* The ops that autocast knows (rows of the table in autocast.c). */
typedef enum em_ac_op {
    EM_AC_MATMUL, EM_AC_ADDMM, EM_AC_CONV2D,
    EM_AC_EXP, EM_AC_LOG, EM_AC_POW, EM_AC_SOFTMAX, EM_AC_LOG_SOFTMAX, EM_AC_SUM, EM_AC_MEAN,
    EM_AC_CROSS_ENTROPY, EM_AC_NLL_LOSS, EM_AC_MSE_LOSS,
    EM_AC_RMS_NORM, EM_AC_ATTENTION,
    EM_AC_NONE,
    EM_AC_COUNT
} em_ac_op;

/* Number of enabled regions open on this thread (the hooks' fast test). */
extern _Thread_local int em__autocast_on;

#define EM_AC_MAX_IN 3
typedef struct em_ac_held { em_tensor *t[EM_AC_MAX_IN]; int n; } em_ac_held;

/* Casts *in[i] in place as op's policy says for the region that applies; the casts are new
 * references kept in held. Returns 1 when something was cast, 0 when nothing needs to be
 * (in untouched), -1 on failure (error recorded, nothing held). */
int em__autocast_apply(em_ac_op op, int n, em_tensor **const *in, em_ac_held *held);
/* Releases held and returns r (the op's result). */
em_tensor *em__autocast_done(em_ac_held *held, em_tensor *r);

#define EM__AC_RUN(op, call, n, ...)                                                     \
    do {                                                                                  \
        if (em__autocast_on) {                                                            \
            em_tensor **const ac_in_[] = {__VA_ARGS__};                                   \
            em_ac_held ac_held_;                                                          \
            int ac_r_ = em__autocast_apply((op), (n), ac_in_, &ac_held_);                 \
            if (ac_r_ < 0) return NULL;                                                   \
            if (ac_r_ > 0) return em__autocast_done(&ac_held_, (call));                   \
        }                                                                                 \
    } while (0)
#define EM_AUTOCAST1(op, call, a) EM__AC_RUN(op, call, 1, &(a))
#define EM_AUTOCAST2(op, call, a, b) EM__AC_RUN(op, call, 2, &(a), &(b))
#define EM_AUTOCAST3(op, call, a, b, c) EM__AC_RUN(op, call, 3, &(a), &(b), &(c))

#endif
