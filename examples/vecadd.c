/* The seed's CUDA VecAdd made real: a kernel written once in Ember's kernel dialect,
 * compiled at run time for the first OpenCL device and launched <<<blocks, threads>>>.
 *
 *   __global__ void VecAdd(float *A, float *B, float *C) { int i = threadIdx.x; C[i] = A[i] + B[i]; }
 *   VecAdd<<<1, N>>>(A, B, C);
 */
#include <ember/ember.h>
#include <stdio.h>

static const char *vecadd_src =
    "KERNEL VecAdd(GLOBAL const float *A, GLOBAL const float *B, GLOBAL float *C, int n) {\n"
    "    i64 i = GLOBAL_ID(0);\n"
    "    if (i < n) C[i] = A[i] + B[i];\n"
    "}\n";

int main(void) {
    if (em_device_count(EM_OPENCL) == 0) {
        const char *why = em_device_unavailable_reason(EM_OPENCL);
        printf("no OpenCL device (%s); nothing to do\n", why ? why : "none found");
        return 0;
    }
    em_device dev = EM_DEVICE(EM_OPENCL, 0);
    em_device_props props;
    if (em_device_get_props(dev, &props) == EM_OK) printf("device: opencl:0 (%s)\n", props.name);

    em_scope scope = em_scope_begin(); /* frees every tensor below at em_scope_end */
    const int n = 1000;
    em_manual_seed(0);
    em_tensor *a = em_rand(EM_SHAPE(n), EM_OPTS(.device = dev));
    em_tensor *b = em_rand(EM_SHAPE(n), EM_OPTS(.device = dev));
    em_tensor *c = em_empty(EM_SHAPE(n), EM_OPTS(.device = dev));

    em_kernel *k = em_kernel_compile(vecadd_src, "VecAdd", dev);
    const int threads = 256, blocks = (n + threads - 1) / threads;
    em_kernel_launch(k, EM_DIM3(blocks), EM_DIM3(threads),
                     EM_KARGS(em_arg_tensor(a), em_arg_tensor(b), em_arg_tensor(c), em_arg_i32(n)));

    /* check C = A + B against Ember's own add, on the host */
    em_tensor *ref = em_add(a, b);
    em_tensor *diff = em_max(em_abs(em_sub(c, ref)), EM_ALL_DIMS, false);
    double worst = em_item(diff);
    em_kernel_free(k);
    em_scope_end(scope);
    if (em_failed()) {
        fprintf(stderr, "vecadd: %s\n", em_last_error());
        return 1;
    }
    printf("C = A + B for %d elements on %d blocks of %d threads: max |C - (A + B)| = %g\n", n,
           blocks, threads, worst);
    return worst == 0.0 ? 0 : 1;
}
