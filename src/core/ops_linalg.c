/* torch.matmul: 1-d operands become a row / column and lose that dim again; leading
 * (batch) dims broadcast. The backend sees [..., M, K] x [..., K, N] -> [..., M, N] with
 * equal batch dims (stride 0 where broadcast). */
#include "ops_internal.h"
#include <stdio.h>

em_tensor *em_matmul(em_tensor *a, em_tensor *b) {
    EM_CHECK_ARG(a, "em_matmul", "a");
    EM_CHECK_ARG(b, "em_matmul", "b");
    EM_AUTOCAST2(EM_AC_MATMUL, em_matmul(a, b), a, b);
    em_tensor *in[2] = {a, b};
    if (em__check_same_device("em_matmul", 2, (const em_tensor *const *)in)) return NULL;
    if (a->ndim == 0 || b->ndim == 0) {
        em_error(EM_ERR_SHAPE, "em_matmul: both arguments to matmul need to be at least 1D, but they are %dD and %dD",
                 a->ndim, b->ndim);
        return NULL;
    }
    bool a_vec = a->ndim == 1, b_vec = b->ndim == 1;
    int64_t M = a_vec ? 1 : a->shape[a->ndim - 2], K = a->shape[a->ndim - 1];
    int64_t Kb = b_vec ? b->shape[0] : b->shape[b->ndim - 2], N = b_vec ? 1 : b->shape[b->ndim - 1];
    if (K != Kb) {
        em_error(EM_ERR_SHAPE, "em_matmul: mat1 and mat2 shapes cannot be multiplied (%lldx%lld and %lldx%lld)",
                 (long long)M, (long long)K, (long long)Kb, (long long)N);
        return NULL;
    }
    /* Broadcast the batch dims (all but the matrix dims). */
    int na = a->ndim > 2 ? a->ndim - 2 : 0, nb = b->ndim > 2 ? b->ndim - 2 : 0;
    int nbatch = na > nb ? na : nb;
    int64_t shape[EM_MAX_DIMS];
    for (int i = 0; i < nbatch; i++) {
        int ia = i - (nbatch - na), ib = i - (nbatch - nb);
        int64_t sa = ia >= 0 ? a->shape[ia] : 1, sb = ib >= 0 ? b->shape[ib] : 1;
        if (sa != sb && sa != 1 && sb != 1) {
            char s1[128], s2[128];
            em_error(EM_ERR_SHAPE, "em_matmul: batch shapes %s and %s cannot be broadcast: dim %d is %lld vs %lld",
                     em__shape_str(s1, sizeof s1, na, a->shape), em__shape_str(s2, sizeof s2, nb, b->shape),
                     i - nbatch, (long long)sa, (long long)sb);
            return NULL;
        }
        shape[i] = sa == 1 ? sb : sa;
    }
    em_dtype dt = a->dtype == b->dtype ? a->dtype : em__result_type(2, in);
    const em_backend *be = a->storage->backend;
    em_device dev = a->storage->device;
    int nd = nbatch + 2;
    shape[nbatch] = M;
    shape[nbatch + 1] = N;
    em_tensor *out = em__tensor_new_on(be, dev, nd, shape, dt);
    if (!out) return NULL;
    em_tensor *ta = NULL, *tb = NULL;
    em_status st = EM_OK;
    const em_tensor *ca = a, *cb = b;
    if (a->dtype != dt && !(ca = ta = em__copy_raw(a, dt))) st = em_last_status();
    if (st == EM_OK && b->dtype != dt && !(cb = tb = em__copy_raw(b, dt))) st = em_last_status();
    if (st == EM_OK && em__numel_raw(nd, shape) > 0) {
        if (K == 0) {
            st = em__run_fill(out, 0.0, "em_matmul");
        } else {
            /* Stack views [batch..., M, K] and [batch..., K, N] with stride 0 on broadcast dims. */
            int64_t sa[EM_MAX_DIMS], sb[EM_MAX_DIMS], ash[EM_MAX_DIMS], bsh[EM_MAX_DIMS];
            for (int i = 0; i < nbatch; i++) {
                int ia = i - (nbatch - na), ib = i - (nbatch - nb);
                ash[i] = bsh[i] = shape[i];
                sa[i] = ia >= 0 && ca->shape[ia] == shape[i] ? ca->strides[ia] : 0;
                sb[i] = ib >= 0 && cb->shape[ib] == shape[i] ? cb->strides[ib] : 0;
            }
            ash[nbatch] = M;
            ash[nbatch + 1] = K;
            sa[nbatch] = a_vec ? 0 : ca->strides[ca->ndim - 2];
            sa[nbatch + 1] = ca->strides[ca->ndim - 1];
            bsh[nbatch] = K;
            bsh[nbatch + 1] = N;
            sb[nbatch] = b_vec ? cb->strides[0] : cb->strides[cb->ndim - 2];
            sb[nbatch + 1] = b_vec ? 0 : cb->strides[cb->ndim - 1];
            em_tensor va, vb;
            em__stack_view(&va, ca, nd, ash, sa, ca->offset);
            em__stack_view(&vb, cb, nd, bsh, sb, cb->offset);
            st = em__op_run(&(em_op_call){.op = EM_OP_MATMUL, .dtype = dt, .dst = {out}, .src = {&va, &vb}}, "em_matmul");
        }
    }
    em_release(ta);
    em_release(tb);
    if (st != EM_OK) {
        em_release(out);
        return NULL;
    }
    if (a_vec || b_vec) { /* drop the dims the vectors gained; out is fresh and contiguous */
        int n = nbatch;
        if (!a_vec) out->shape[n++] = M;
        if (!b_vec) out->shape[n++] = N;
        out->ndim = n;
        em__contiguous_strides(n, out->shape, out->strides);
    }
    return em__finish(out, EM_GRAD_MATMUL, 2, in, &em__no_args);
}

em_tensor *em__matmul_widen(em_tensor *a, em_tensor *b) {
    if (!a || !b || a->ndim != 2 || b->ndim != 2 || a->dtype != b->dtype || (a->dtype != EM_BF16 && a->dtype != EM_F16) ||
        a->shape[1] != b->shape[0] || !em__same_device(a, b) ||
        !em__op_supported(a->storage->backend, EM_OP_MATMUL_WIDEN, a->dtype))
        return NULL;
    const em_backend *be = a->storage->backend;
    int64_t shape[2] = {a->shape[0], b->shape[1]};
    em_tensor *out = em__tensor_new_on(be, a->storage->device, 2, shape, EM_F32);
    em_status st = out ? em__op_try(&(em_op_call){.op = EM_OP_MATMUL_WIDEN, .dtype = a->dtype, .dst = {out}, .src = {a, b}})
                       : em_last_status();
    if (st != EM_OK) {
        em_release(out);
        return NULL;
    }
    return em__scoped(out);
}

em_status em__addmm_acc_(em_tensor *out, em_tensor *a, em_tensor *b) {
    const char *op = "em__addmm_acc_";
    if (!out || !a || !b) return em_error(EM_ERR_ARGUMENT, "%s: a tensor is NULL", op);
    em_tensor *in[3] = {out, a, b};
    if (em__check_same_device(op, 3, (const em_tensor *const *)in)) return em_last_status();
    if (a->ndim != 2 || b->ndim != 2 || out->ndim != 2 || a->shape[1] != b->shape[0] || out->shape[0] != a->shape[0] ||
        out->shape[1] != b->shape[1] || a->dtype != out->dtype || b->dtype != out->dtype ||
        !em_dtype_is_floating(out->dtype) || !em_is_contiguous(out))
        return em_error(EM_ERR_SHAPE, "%s: expected out [M, N] contiguous += a [M, K] @ b [K, N] of one floating dtype", op);
    if (out->shape[0] * out->shape[1] == 0) return EM_OK;
    if (em__op_supported(out->storage->backend, EM_OP_MATMUL_ACC, out->dtype)) {
        em_status st = em__op_try(&(em_op_call){.op = EM_OP_MATMUL_ACC, .dtype = out->dtype, .dst = {out}, .src = {a, b}});
        if (st != EM_ERR_NOT_SUPPORTED) return st;
    }
    em_scope s = em_scope_begin();
    em_tensor *prod = em_matmul(a, b);
    em_status st = prod ? em_add_(out, prod, 1.0) : em_last_status();
    em_scope_end(s);
    return st;
}

/* torch.addmm: beta * input + alpha * (mat1 @ mat2), input broadcast to [M, N]. With
 * beta = alpha = 1 on one floating dtype and a backend that accumulates (matmul_acc), out is
 * filled with the broadcast input and the GEMM adds into it (PyTorch's linear on the CPU):
 * no pass to zero the product and none to add the bias, and PyTorch's rounding order.
 * Otherwise it is composed of matmul, mul_scalar and add. */
em_tensor *em_addmm(em_tensor *input, em_tensor *mat1, em_tensor *mat2, double beta, double alpha) {
    const char *op = "em_addmm";
    EM_CHECK_ARG(input, op, "input");
    EM_CHECK_ARG(mat1, op, "mat1");
    EM_CHECK_ARG(mat2, op, "mat2");
    EM_AUTOCAST3(EM_AC_ADDMM, em_addmm(input, mat1, mat2, beta, alpha), input, mat1, mat2);
    em_tensor *in[3] = {input, mat1, mat2};
    if (em__check_same_device(op, 3, (const em_tensor *const *)in)) return NULL;
    if (mat1->ndim != 2 || mat2->ndim != 2) {
        em_error(EM_ERR_SHAPE, "%s: %s must be a matrix, got %d-D tensor", op, mat1->ndim != 2 ? "mat1" : "mat2",
                 mat1->ndim != 2 ? mat1->ndim : mat2->ndim);
        return NULL;
    }
    int64_t M = mat1->shape[0], K = mat1->shape[1], N = mat2->shape[1];
    if (mat2->shape[0] != K) {
        em_error(EM_ERR_SHAPE, "%s: mat1 and mat2 shapes cannot be multiplied (%lldx%lld and %lldx%lld)", op,
                 (long long)M, (long long)K, (long long)mat2->shape[0], (long long)N);
        return NULL;
    }
    int64_t shape[2] = {M, N}, bstr[2] = {0, 0};
    bool fits = input->ndim <= 2;
    for (int d = 0; fits && d < input->ndim; d++) {
        int od = d + 2 - input->ndim;
        fits = input->shape[d] == shape[od] || input->shape[d] == 1;
        bstr[od] = input->shape[d] == 1 ? 0 : input->strides[d];
    }
    if (!fits) {
        char s1[128];
        em_error(EM_ERR_SHAPE, "%s: input of shape %s cannot be broadcast to the product's shape [%lld, %lld]", op,
                 em__shape_str(s1, sizeof s1, input->ndim, input->shape), (long long)M, (long long)N);
        return NULL;
    }
    const em_backend *be = mat1->storage->backend;
    em_dtype dt = mat1->dtype;
    if (beta == 1.0 && alpha == 1.0 && em_dtype_is_floating(dt) && em__op_supported(be, EM_OP_MATMUL_ACC, dt) &&
        mat2->dtype == dt && input->dtype == dt) {
        em_tensor *out = em__tensor_new_on(be, mat1->storage->device, 2, shape, dt);
        if (!out) return NULL;
        em_tensor bias;
        em_status st = EM_ERR_NOT_SUPPORTED;
        if (bstr[0] == 0 && (N == 1 || bstr[1] == 1) && M * N > 0) { /* a Linear's bias row */
            em__stack_view(&bias, input, 1, &N, &bstr[1], input->offset);
            st = em__op_try(&(em_op_call){.op = EM_OP_ADDMM_BIAS, .dtype = dt, .dst = {out}, .src = {&bias, mat1, mat2}});
        }
        if (st == EM_ERR_NOT_SUPPORTED) {
            em__stack_view(&bias, input, 2, shape, bstr, input->offset);
            st = M * N > 0 ? em__run_copy(out, &bias, "em_addmm") : EM_OK;
            if (st == EM_OK)
                st = em__op_run(&(em_op_call){.op = EM_OP_MATMUL_ACC, .dtype = dt, .dst = {out}, .src = {mat1, mat2}},
                                "em_addmm");
        }
        if (st != EM_OK) {
            em_release(out);
            return NULL;
        }
        return em__finish(out, EM_GRAD_ADDMM, 3, in, &em__no_args);
    }
    em_scope s = em_scope_begin();
    em_tensor *prod = em_matmul(mat1, mat2);
    if (alpha != 1.0) prod = em_mul_scalar(prod, alpha);
    /* beta = 0 ignores input (its nan and inf do not reach the result), as in PyTorch */
    em_tensor *r = em_retain(beta == 0.0 ? prod : em_add(beta == 1.0 ? input : em_mul_scalar(input, beta), prod));
    em_scope_end(s);
    return em__scoped(r);
}
