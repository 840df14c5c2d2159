/* Placeholder until autograd lands: nothing is ever recorded. */
#include "record.h"

bool em__grad_needed(int n, em_tensor *const *inputs) {
    (void)n; (void)inputs;
    return false;
}

em_status em__grad_record(em_grad_op op, em_tensor *out, int n, em_tensor *const *inputs,
                          const em_grad_args *args) {
    (void)op; (void)out; (void)n; (void)inputs; (void)args;
    return EM_OK;
}
