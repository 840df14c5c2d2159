/* Convolution and pooling in bfloat16 and float16 on the CPU (cpu_conv_lowp.c). The backend
 * table points at these entries: float32/float64 go on to cpu_conv.c / cpu_conv_dnnl.c
 * unchanged, f16/bf16 run here with float32 accumulation. */
#ifndef EM_BACKENDS_CPU_CONV_LOWP_H
#define EM_BACKENDS_CPU_CONV_LOWP_H

#include "cpu_internal.h"

em_status em__cpu_im2col_any(em_tensor *cols, const em_tensor *in, const em_window2d *g);
em_status em__cpu_col2im_any(em_tensor *in, const em_tensor *cols, const em_window2d *g);
em_status em__cpu_pool2d_any(em_pool_kind kind, em_tensor *out, em_tensor *indices, const em_tensor *in,
                             const em_window2d *g);
em_status em__cpu_pool2d_backward_any(em_pool_kind kind, em_tensor *gin, const em_tensor *gout,
                                      const em_tensor *indices, const em_window2d *g);
#ifdef EMBER_HAVE_DNNL
/* bf16: oneDNN's bf16 convolution where this CPU has AVX512-BF16/AMX (and
 * EMBER_CPU_LOWP_GEMM is not "portable"); f16, or bf16 otherwise: float32 copies through
 * the float32 oneDNN convolution. EM_ERR_NOT_SUPPORTED (nothing recorded): core runs im2col. */
em_status em__cpu_conv2d_any(em_tensor *out, const em_tensor *in, const em_tensor *w, const em_tensor *bias,
                             const em_window2d *g, int64_t groups);
em_status em__cpu_conv2d_backward_input_any(em_tensor *gin, const em_tensor *gout, const em_tensor *w,
                                            const em_window2d *g, int64_t groups);
em_status em__cpu_conv2d_backward_weight_any(em_tensor *gw, const em_tensor *gout, const em_tensor *in,
                                             const em_window2d *g, int64_t groups);
/* Which kernel a bf16 convolution pass gets here ("oneDNN <impl>" or why float32); for
 * tests and benchmarks. */
const char *em__cpu_conv_lowp_describe(void);
#endif

#endif
