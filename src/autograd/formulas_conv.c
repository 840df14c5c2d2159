/* Gradient formulas of convolution and pooling: core's backward passes (internal_api.h). */
#include "../core/internal_api.h"
#include "formulas.h"

void em__ag_backward_conv(ag_node *n, em_tensor *g, em_tensor **out) {
    const ag_input *in = &n->in[0];
    switch (n->op) {
    case EM_GRAD_CONV2D: {
        if (ag_input_needs(&n->in[0]))
            out[0] = em__conv2d_backward_input(g, ag_saved_t(n, 1), in->shape, n->args.win);
        bool need_bias = n->n > 2 && ag_input_needs(&n->in[2]);
        if (ag_input_needs(&n->in[1])) /* the bias's gradient with the weight's: one pass over g */
            out[1] = em__conv2d_backward_weight_bias(g, ag_saved_t(n, 0), n->in[1].shape, n->args.win,
                                                     need_bias ? &out[2] : NULL);
        if (need_bias && !out[2]) out[2] = em_sum(g, EM_DIMS(0, 2, 3), false);
        break;
    }
    case EM_GRAD_MAX_POOL2D: out[0] = em__pool2d_backward(0, g, ag_saved_t(n, 0), in->shape, n->args.win); break;
    case EM_GRAD_AVG_POOL2D: out[0] = em__pool2d_backward(1, g, NULL, in->shape, n->args.win); break;
    case EM_GRAD_ADAPTIVE_AVG_POOL2D: out[0] = em__pool2d_backward(2, g, NULL, in->shape, n->args.win); break;
    default: break;
    }
}
