/* cuDNN, optional and found at run time like cuBLAS (cuda_loader.c loads it; cuda_cudnn.c
 * runs Conv2d on it).
 *
 * The CUDA toolkit ships no cudnn.h, so the stable subset Ember uses is declared here, as NVML
 * is in cuda_loader.h. Signatures and values are those of NVIDIA's headers, identical in
 * cuDNN 8 (cudnn_ops_infer.h, cudnn_cnn_infer.h) and cuDNN 9 (cudnn_graph.h, cudnn_ops.h,
 * cudnn_cnn.h): cudnnDataType_t FLOAT 0, DOUBLE 1, HALF 2, BFLOAT16 9; cudnnTensorFormat_t
 * NCHW 0; cudnnConvolutionMode_t CROSS_CORRELATION 1 (what deep-learning "convolution"
 * means); cudnnMathType_t DEFAULT 0, TENSOR_OP 1, FMA 3; the *AlgoPerf_t structs {algo,
 * status, time, memory, determinism, mathType, reserved[3]}. Status codes differ between
 * the two (9 renumbered every error: BAD_PARAM is 3 in 8, 2000 in 9), so Ember tests only
 * for success (0, in both) and names failures with cudnnGetErrorString. Enums are passed as
 * int, which is how the C ABI passes them. */
#ifndef EM_BACKENDS_CUDA_CUDNN_H
#define EM_BACKENDS_CUDA_CUDNN_H

#include <stddef.h>
#include <stdio.h>

typedef int em_cudnn_status; /* cudnnStatus_t */
#define EM_CUDNN_STATUS_SUCCESS 0
typedef struct em_cudnn_context *em_cudnn_handle;      /* cudnnHandle_t */
typedef struct em_cudnn_tensor_st *em_cudnn_tensor;    /* cudnnTensorDescriptor_t */
typedef struct em_cudnn_filter_st *em_cudnn_filter;    /* cudnnFilterDescriptor_t */
typedef struct em_cudnn_conv_st *em_cudnn_conv;        /* cudnnConvolutionDescriptor_t */

#define EM_CUDNN_DATA_FLOAT 0
#define EM_CUDNN_DATA_DOUBLE 1
#define EM_CUDNN_DATA_HALF 2
#define EM_CUDNN_DATA_BFLOAT16 9
#define EM_CUDNN_TENSOR_NCHW 0
#define EM_CUDNN_CROSS_CORRELATION 1
#define EM_CUDNN_DEFAULT_MATH 0
#define EM_CUDNN_TENSOR_OP_MATH 1
#define EM_CUDNN_FMA_MATH 3

/* cudnnConvolutionFwdAlgoPerf_t, ...BwdDataAlgoPerf_t, ...BwdFilterAlgoPerf_t: one layout */
typedef struct em_cudnn_algo_perf {
    int algo;
    em_cudnn_status status;
    float time;
    size_t memory;
    int determinism;
    int math_type;
    int reserved[3];
} em_cudnn_algo_perf;

/* X(function, required): the symbols the loader resolves, by these names. */
#define EM_CUDNN_FUNCS(X)                                                                   \
    X(cudnnGetVersion, 1) X(cudnnGetCudartVersion, 0) X(cudnnGetErrorString, 1)            \
    X(cudnnCreate, 1) X(cudnnDestroy, 1) X(cudnnSetStream, 1)                               \
    X(cudnnCreateTensorDescriptor, 1) X(cudnnSetTensor4dDescriptorEx, 1)                   \
    X(cudnnDestroyTensorDescriptor, 1) X(cudnnCreateFilterDescriptor, 1)                   \
    X(cudnnSetFilter4dDescriptor, 1) X(cudnnDestroyFilterDescriptor, 1)                    \
    X(cudnnCreateConvolutionDescriptor, 1) X(cudnnSetConvolution2dDescriptor, 1)           \
    X(cudnnSetConvolutionGroupCount, 1) X(cudnnSetConvolutionMathType, 1)                  \
    X(cudnnDestroyConvolutionDescriptor, 1) X(cudnnGetConvolution2dForwardOutputDim, 1)    \
    X(cudnnGetConvolutionForwardAlgorithm_v7, 1) X(cudnnGetConvolutionForwardWorkspaceSize, 1) \
    X(cudnnConvolutionForward, 1) X(cudnnGetConvolutionBackwardDataAlgorithm_v7, 1)        \
    X(cudnnGetConvolutionBackwardDataWorkspaceSize, 1) X(cudnnConvolutionBackwardData, 1)  \
    X(cudnnGetConvolutionBackwardFilterAlgorithm_v7, 1)                                     \
    X(cudnnGetConvolutionBackwardFilterWorkspaceSize, 1) X(cudnnConvolutionBackwardFilter, 1)

typedef struct em_cudnn_api {
    size_t (*cudnnGetVersion)(void);
    size_t (*cudnnGetCudartVersion)(void); /* optional: the CUDA runtime cuDNN was built for */
    const char *(*cudnnGetErrorString)(em_cudnn_status s);
    em_cudnn_status (*cudnnCreate)(em_cudnn_handle *h);
    em_cudnn_status (*cudnnDestroy)(em_cudnn_handle h);
    em_cudnn_status (*cudnnSetStream)(em_cudnn_handle h, void *stream); /* cudaStream_t == CUstream */
    em_cudnn_status (*cudnnCreateTensorDescriptor)(em_cudnn_tensor *t);
    em_cudnn_status (*cudnnSetTensor4dDescriptorEx)(em_cudnn_tensor t, int dtype, int n, int c, int h, int w,
                                                    int ns, int cs, int hs, int ws);
    em_cudnn_status (*cudnnDestroyTensorDescriptor)(em_cudnn_tensor t);
    em_cudnn_status (*cudnnCreateFilterDescriptor)(em_cudnn_filter *f);
    em_cudnn_status (*cudnnSetFilter4dDescriptor)(em_cudnn_filter f, int dtype, int format, int k, int c, int h,
                                                  int w);
    em_cudnn_status (*cudnnDestroyFilterDescriptor)(em_cudnn_filter f);
    em_cudnn_status (*cudnnCreateConvolutionDescriptor)(em_cudnn_conv *c);
    em_cudnn_status (*cudnnSetConvolution2dDescriptor)(em_cudnn_conv c, int pad_h, int pad_w, int u, int v,
                                                       int dilation_h, int dilation_w, int mode, int compute);
    em_cudnn_status (*cudnnSetConvolutionGroupCount)(em_cudnn_conv c, int groups);
    em_cudnn_status (*cudnnSetConvolutionMathType)(em_cudnn_conv c, int math);
    em_cudnn_status (*cudnnDestroyConvolutionDescriptor)(em_cudnn_conv c);
    em_cudnn_status (*cudnnGetConvolution2dForwardOutputDim)(em_cudnn_conv c, em_cudnn_tensor x, em_cudnn_filter w,
                                                             int *n, int *ch, int *h, int *wd);
    em_cudnn_status (*cudnnGetConvolutionForwardAlgorithm_v7)(em_cudnn_handle h, em_cudnn_tensor x,
                                                              em_cudnn_filter w, em_cudnn_conv c, em_cudnn_tensor y,
                                                              int requested, int *returned, em_cudnn_algo_perf *perf);
    em_cudnn_status (*cudnnGetConvolutionForwardWorkspaceSize)(em_cudnn_handle h, em_cudnn_tensor x,
                                                               em_cudnn_filter w, em_cudnn_conv c, em_cudnn_tensor y,
                                                               int algo, size_t *bytes);
    em_cudnn_status (*cudnnConvolutionForward)(em_cudnn_handle h, const void *alpha, em_cudnn_tensor xd,
                                               const void *x, em_cudnn_filter wd, const void *w, em_cudnn_conv c,
                                               int algo, void *ws, size_t ws_bytes, const void *beta,
                                               em_cudnn_tensor yd, void *y);
    em_cudnn_status (*cudnnGetConvolutionBackwardDataAlgorithm_v7)(em_cudnn_handle h, em_cudnn_filter w,
                                                                   em_cudnn_tensor dy, em_cudnn_conv c,
                                                                   em_cudnn_tensor dx, int requested, int *returned,
                                                                   em_cudnn_algo_perf *perf);
    em_cudnn_status (*cudnnGetConvolutionBackwardDataWorkspaceSize)(em_cudnn_handle h, em_cudnn_filter w,
                                                                    em_cudnn_tensor dy, em_cudnn_conv c,
                                                                    em_cudnn_tensor dx, int algo, size_t *bytes);
    em_cudnn_status (*cudnnConvolutionBackwardData)(em_cudnn_handle h, const void *alpha, em_cudnn_filter wd,
                                                    const void *w, em_cudnn_tensor dyd, const void *dy,
                                                    em_cudnn_conv c, int algo, void *ws, size_t ws_bytes,
                                                    const void *beta, em_cudnn_tensor dxd, void *dx);
    em_cudnn_status (*cudnnGetConvolutionBackwardFilterAlgorithm_v7)(em_cudnn_handle h, em_cudnn_tensor x,
                                                                     em_cudnn_tensor dy, em_cudnn_conv c,
                                                                     em_cudnn_filter dw, int requested, int *returned,
                                                                     em_cudnn_algo_perf *perf);
    em_cudnn_status (*cudnnGetConvolutionBackwardFilterWorkspaceSize)(em_cudnn_handle h, em_cudnn_tensor x,
                                                                      em_cudnn_tensor dy, em_cudnn_conv c,
                                                                      em_cudnn_filter dw, int algo, size_t *bytes);
    em_cudnn_status (*cudnnConvolutionBackwardFilter)(em_cudnn_handle h, const void *alpha, em_cudnn_tensor xd,
                                                      const void *x, em_cudnn_tensor dyd, const void *dy,
                                                      em_cudnn_conv c, int algo, void *ws, size_t ws_bytes,
                                                      const void *beta, em_cudnn_filter dwd, void *dw);
} em_cudnn_api;

/* "9.6.0" from cudnnGetVersion: cuDNN 9 encodes major * 10000 + minor * 100 + patch, cuDNN 8
 * major * 1000 + minor * 100 + patch (cudnn_version.h's CUDNN_VERSION). */
static inline void em__cudnn_version_str(size_t v, char *buf, size_t size) {
    unsigned long u = (unsigned long)v;
    if (u >= 90000)
        snprintf(buf, size, "%lu.%lu.%lu", u / 10000, u % 10000 / 100, u % 100);
    else
        snprintf(buf, size, "%lu.%lu.%lu", u / 1000, u % 1000 / 100, u % 100);
}

#endif
