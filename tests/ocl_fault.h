/* A failing OpenCL for tests: the test links with -Wl,--wrap=<each function below>, so
 * Ember's calls (and only Ember's: the ICD loader and PoCL are shared libraries) come here
 * and go on to the real driver unless a fault is armed for that function. A fault lets
 * `skip` calls through, then fails the next `count` calls (-1: all of them) with `err`,
 * as a driver that ran out of resources or broke would. Included by one test program. */
#ifndef EMBER_TESTS_OCL_FAULT_H
#define EMBER_TESTS_OCL_FAULT_H

#include <CL/cl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static struct {
    char fn[48];
    int skip, count, failed;
    cl_int err;
} g_fault;
static pthread_mutex_t g_fault_lock = PTHREAD_MUTEX_INITIALIZER;

static void fault_arm(const char *fn, int skip, int count, cl_int err) {
    pthread_mutex_lock(&g_fault_lock);
    snprintf(g_fault.fn, sizeof g_fault.fn, "%s", fn);
    g_fault.skip = skip;
    g_fault.count = count;
    g_fault.failed = 0;
    g_fault.err = err;
    pthread_mutex_unlock(&g_fault_lock);
}
static int fault_clear(void) { /* returns how many calls failed */
    pthread_mutex_lock(&g_fault_lock);
    int n = g_fault.failed;
    g_fault.fn[0] = 0;
    pthread_mutex_unlock(&g_fault_lock);
    return n;
}
/* CL_SUCCESS, or the error this call of fn must fail with */
static cl_int fault_hit(const char *fn) {
    cl_int e = CL_SUCCESS;
    pthread_mutex_lock(&g_fault_lock);
    if (g_fault.fn[0] && strcmp(g_fault.fn, fn) == 0) {
        if (g_fault.skip > 0) g_fault.skip--;
        else if (g_fault.count != 0) {
            if (g_fault.count > 0) g_fault.count--;
            g_fault.failed++;
            e = g_fault.err;
        }
    }
    pthread_mutex_unlock(&g_fault_lock);
    return e;
}

/* Functions returning cl_int: fail with the error, else call the real one. */
#define FAULT_INT(name, params, args)                                   \
    cl_int __real_##name params;                                        \
    cl_int __wrap_##name params;                                        \
    cl_int __wrap_##name params {                                       \
        cl_int fe = fault_hit(#name);                                   \
        return fe != CL_SUCCESS ? fe : __real_##name args;              \
    }
/* Functions returning an object and an error through their last parameter. */
#define FAULT_OBJ(type, name, params, args)                             \
    type __real_##name params;                                          \
    type __wrap_##name params;                                          \
    type __wrap_##name params {                                         \
        cl_int fe = fault_hit(#name);                                   \
        if (fe != CL_SUCCESS) {                                         \
            if (err) *err = fe;                                         \
            return NULL;                                                \
        }                                                               \
        return __real_##name args;                                      \
    }

FAULT_INT(clGetPlatformIDs, (cl_uint n, cl_platform_id *p, cl_uint *np), (n, p, np))
FAULT_INT(clGetDeviceIDs, (cl_platform_id p, cl_device_type t, cl_uint n, cl_device_id *d, cl_uint *nd),
          (p, t, n, d, nd))
FAULT_INT(clGetDeviceInfo, (cl_device_id d, cl_device_info w, size_t n, void *v, size_t *r), (d, w, n, v, r))
FAULT_INT(clEnqueueWriteBuffer, (cl_command_queue q, cl_mem m, cl_bool b, size_t o, size_t n, const void *p,
                                 cl_uint nw, const cl_event *w, cl_event *e), (q, m, b, o, n, p, nw, w, e))
FAULT_INT(clEnqueueReadBuffer, (cl_command_queue q, cl_mem m, cl_bool b, size_t o, size_t n, void *p,
                                cl_uint nw, const cl_event *w, cl_event *e), (q, m, b, o, n, p, nw, w, e))
FAULT_INT(clEnqueueCopyBuffer, (cl_command_queue q, cl_mem s, cl_mem d, size_t so, size_t dof, size_t n,
                                cl_uint nw, const cl_event *w, cl_event *e), (q, s, d, so, dof, n, nw, w, e))
FAULT_INT(clEnqueueMarkerWithWaitList, (cl_command_queue q, cl_uint nw, const cl_event *w, cl_event *e),
          (q, nw, w, e))
FAULT_INT(clEnqueueBarrierWithWaitList, (cl_command_queue q, cl_uint nw, const cl_event *w, cl_event *e),
          (q, nw, w, e))
FAULT_INT(clFinish, (cl_command_queue q), (q))
FAULT_INT(clFlush, (cl_command_queue q), (q))
FAULT_INT(clGetEventInfo, (cl_event ev, cl_event_info w, size_t n, void *v, size_t *r), (ev, w, n, v, r))
FAULT_INT(clWaitForEvents, (cl_uint n, const cl_event *l), (n, l))
FAULT_INT(clBuildProgram, (cl_program p, cl_uint n, const cl_device_id *d, const char *o,
                           void(CL_CALLBACK *cb)(cl_program, void *), void *u), (p, n, d, o, cb, u))
FAULT_INT(clGetProgramInfo, (cl_program p, cl_program_info w, size_t n, void *v, size_t *r), (p, w, n, v, r))
FAULT_INT(clSetKernelArg, (cl_kernel k, cl_uint i, size_t n, const void *v), (k, i, n, v))
FAULT_INT(clEnqueueNDRangeKernel, (cl_command_queue q, cl_kernel k, cl_uint dims, const size_t *o,
                                   const size_t *g, const size_t *l, cl_uint nw, const cl_event *w,
                                   cl_event *e), (q, k, dims, o, g, l, nw, w, e))
FAULT_OBJ(cl_context, clCreateContext, (const cl_context_properties *p, cl_uint n, const cl_device_id *d,
                                        void(CL_CALLBACK *cb)(const char *, const void *, size_t, void *),
                                        void *u, cl_int *err), (p, n, d, cb, u, err))
FAULT_OBJ(cl_command_queue, clCreateCommandQueue, (cl_context c, cl_device_id d, cl_command_queue_properties p,
                                                   cl_int *err), (c, d, p, err))
FAULT_OBJ(cl_mem, clCreateBuffer, (cl_context c, cl_mem_flags f, size_t n, void *h, cl_int *err),
          (c, f, n, h, err))
FAULT_OBJ(cl_mem, clCreateSubBuffer, (cl_mem m, cl_mem_flags f, cl_buffer_create_type t, const void *i,
                                      cl_int *err), (m, f, t, i, err))
FAULT_OBJ(cl_program, clCreateProgramWithSource, (cl_context c, cl_uint n, const char **s, const size_t *l,
                                                  cl_int *err), (c, n, s, l, err))
FAULT_OBJ(cl_program, clCreateProgramWithBinary, (cl_context c, cl_uint n, const cl_device_id *d,
                                                  const size_t *l, const unsigned char **b, cl_int *bs,
                                                  cl_int *err), (c, n, d, l, b, bs, err))
FAULT_OBJ(cl_kernel, clCreateKernel, (cl_program p, const char *name, cl_int *err), (p, name, err))

#endif
