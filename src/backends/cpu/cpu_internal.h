/* Shared pieces of the CPU backend: the strided N-d iterator, dtype load/store helpers
 * and the kernels that cpu_backend.c's run dispatches to. */
#ifndef EM_BACKENDS_CPU_INTERNAL_H
#define EM_BACKENDS_CPU_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include "../backend.h"
#include "../../core/tensor_impl.h" /* the tensors of an op call */
#include "../../util/errors.h"
#include "cpu_threads.h"
#include <stdatomic.h>

/* ---- the strided iterator ----
 * Operands share out's shape (ts[0] is out). Size-1 dims are dropped, dims are ordered by
 * out's strides (unless keep_order) and adjacent dims that are contiguous in every operand
 * are merged, so most views become one long 1-d loop. */
#define EM_CPU_MAX_OPS 4

typedef struct cpu_iter {
    int nops, ndim;                               /* ndim >= 1 after init */
    int64_t numel;
    int64_t shape[EM_MAX_DIMS];                   /* innermost last */
    int64_t strides[EM_CPU_MAX_OPS][EM_MAX_DIMS]; /* in bytes */
    char *base[EM_CPU_MAX_OPS];
} cpu_iter;

/* The inner loop: n elements from data[k] stepping strides[k] bytes; `index` is the flat
 * position of the first one (row-major in out when the iterator keeps order). */
typedef void (*cpu_loop_fn)(void *ctx, char **data, const int64_t *strides, int64_t n, int64_t index);

void em__cpu_iter_init(cpu_iter *it, int nops, const em_tensor *const *ts, bool keep_order);
/* Run loop over every element; split across threads (chunks of at least grain / 2) when
 * numel >= grain (0: never). */
void em__cpu_iter_run(const cpu_iter *it, cpu_loop_fn loop, void *ctx, int64_t grain);

/* Elementwise work splits across threads from this many elements. */
#define EM_CPU_PARALLEL_ELEMS 262144

/* for (i = 0; i < n; i++) BODY, in groups of 8 with a fixed inner trip count: the shape GCC's
 * -O2 ("very cheap" cost model) vectorizes; plain loops with unknown counts stay scalar. */
#define EM_CPU_VLOOP(n, BODY)                                                            \
    {                                                                                    \
        int64_t k_ = 0;                                                                  \
        for (; k_ + 8 <= (n); k_ += 8)                                                   \
            for (int j_ = 0; j_ < 8; j_++) {                                             \
                int64_t i = k_ + j_;                                                     \
                BODY                                                                     \
            }                                                                            \
        for (int64_t i = k_; i < (n); i++) {                                             \
            BODY                                                                         \
        }                                                                                \
    }

/* Bytes per element without a call (hot paths). */
static inline size_t em__cpu_esize(em_dtype dt) {
    static const unsigned char size[EM_DTYPE_COUNT] = {4, 8, 2, 2, 8, 4, 1, 1};
    return (unsigned)dt < EM_DTYPE_COUNT ? size[dt] : 0;
}

static inline int64_t em__cpu_numel(const em_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}
static inline bool em__cpu_is_contiguous(const em_tensor *t) { return em__tensor_dense(t); }

/* ---- conversions with defined results (no UB for NaN or out-of-range values) ----
 * Like x86 (and so PyTorch there): NaN or out of range gives the type's minimum. */
static inline int64_t em__cpu_f2i64(double v) {
    if (!(v >= -9223372036854775808.0 && v < 9223372036854775808.0)) return INT64_MIN;
    return (int64_t)v;
}
static inline int32_t em__cpu_f2i32(double v) {
    if (!(v > -2147483649.0 && v < 2147483648.0)) return INT32_MIN;
    return (int32_t)v;
}

/* Element i of any dtype as a double / int64 (slow path helpers for odd layouts). */
double em__cpu_load_f64(const void *p, em_dtype dt);
void em__cpu_store_f64(void *p, em_dtype dt, double v);
int64_t em__cpu_load_i64(const void *p, em_dtype dt);
void em__cpu_store_i64(void *p, em_dtype dt, int64_t v);

/* The compute type of a dtype: f32/f16/bf16 -> f32, f64 -> f64, integers and bool -> i64. */
static inline em_dtype em__cpu_compute_type(em_dtype dt) {
    switch (dt) {
    case EM_F32: case EM_F16: case EM_BF16: return EM_F32;
    case EM_F64: return EM_F64;
    default: return EM_I64;
    }
}
/* Convert n elements between a strided tensor run and a contiguous compute-type buffer. */
void em__cpu_load_block(void *buf, const char *p, int64_t stride, int64_t n, em_dtype dt);
void em__cpu_store_block(char *p, int64_t stride, int64_t n, em_dtype dt, const void *buf);
/* Convert n elements of dtype dti (stride si bytes) to dto (stride so bytes). */
void em__cpu_cast_block(char *o, int64_t so, em_dtype dto, const char *i, int64_t si, em_dtype dti, int64_t n);
/* n contiguous float32 values cast to dto at o (contiguous), bf16 with streaming stores where
 * it can (the fused Adam step's weight copy); the same roundings as the cast. */
void em__cpu_cast_f32_stream(char *o, em_dtype dto, const float *i, int64_t n);
/* Saturating double -> int64 for scalar parameters (NaN gives 0). */
static inline int64_t em__cpu_param_i64(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775808.0) return INT64_MAX;
    if (v <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}
/* "add", "sum", ... for messages. */
const char *em__cpu_op_name(em_op op);
/* Whether big host buffers are advised as transparent huge pages (EMBER_CPU_HUGE_PAGES is not
 * "0"): the allocator's large segments (cpu_backend.c) and the AMX kernel's packing buffers. */
bool em__cpu_huge_pages(void);

/* ---- kernels (one file per family) ---- */
em_status em__cpu_fill(em_tensor *out, double value);
em_status em__cpu_fill_affine(em_tensor *out, double start, double step);
em_status em__cpu_copy(em_tensor *out, const em_tensor *in);
/* A contiguous scratch tensor on the host over malloc'd memory (never registered anywhere;
 * cpu_copy.c). _make fails with EM_ERR_OUT_OF_MEMORY recorded under op's name; _free takes
 * one that _make filled. */
typedef struct em_cpu_tmp { em_storage s; em_tensor t; } em_cpu_tmp;
em_status em__cpu_tmp_make(em_cpu_tmp *x, em_dtype dt, int nd, const int64_t *shape, const char *op);
void em__cpu_tmp_free(em_cpu_tmp *x);
em_status em__cpu_unary(em_op op, em_tensor *out, const em_tensor *in, const double *params);
em_status em__cpu_binary(em_op op, em_tensor *out, const em_tensor *a, const em_tensor *b);
em_status em__cpu_where(em_tensor *out, const em_tensor *cond, const em_tensor *a, const em_tensor *b);
em_status em__cpu_reduce(em_op op, em_tensor *out, const em_tensor *in, const bool *reduce);
em_status em__cpu_matmul(em_tensor *out, const em_tensor *a, const em_tensor *b);
em_status em__cpu_matmul_acc(em_tensor *out, const em_tensor *a, const em_tensor *b); /* out += a @ b */
em_status em__cpu_addmm_bias(em_tensor *out, const em_tensor *bias, const em_tensor *a, const em_tensor *b);
em_status em__cpu_matmul_widen(em_tensor *out, const em_tensor *a, const em_tensor *b); /* f32 out = bf16/f16 a @ b */
em_status em__cpu_softmax(em_tensor *out, const em_tensor *in, int dim, bool log);
em_status em__cpu_index_select(em_tensor *out, const em_tensor *in, int dim, const em_tensor *index);
em_status em__cpu_index_add(em_tensor *out, int dim, const em_tensor *index, const em_tensor *src);
em_status em__cpu_gather(em_tensor *out, const em_tensor *in, int dim, const em_tensor *index);
em_status em__cpu_scatter_add(em_tensor *out, int dim, const em_tensor *index, const em_tensor *src);
em_status em__cpu_rng(em_tensor *out, em_rng_kind kind, uint64_t seed, uint64_t offset, double p0, double p1);
em_status em__cpu_fused_sgd(const em_optim_args *a, em_tensor *p, const em_tensor *g, em_tensor *buf);
em_status em__cpu_fused_adam(const em_optim_args *a, em_tensor *p, const em_tensor *g, em_tensor *m,
                             em_tensor *v, em_tensor *vmax);
/* Loss scaling (cpu_amp.c). */
em_status em__cpu_amp_unscale(em_tensor *g, em_tensor *state);
em_status em__cpu_amp_update(em_tensor *state, double growth, double backoff, int64_t interval);
/* The fused ops (op_list.h's EMK_OPS_FUSED), each taking its call as it is: declared here from
 * the list and dispatched by cpu_backend.c's switch, so a new one is a function in any file. */
#define EM_CPU_FUSED_DECL_(NAME, name, dtypes, gpu) em_status em__cpu_##name(const em_op_call *call);
EMK_OPS_FUSED(EM_CPU_FUSED_DECL_)
/* ReLU on contiguous bf16 straight on the bits (cpu_relu.c), where _applies says it may run:
 * the same bits as the float32 round trip. */
bool em__cpu_relu_bf16_applies(const em_tensor *out, const em_tensor *in);
void em__cpu_relu_bf16(em_tensor *out, const em_tensor *in);

/* fused scaled-dot-product attention (cpu_attention.c) */
em_status em__cpu_sdpa(const em_op_call *c);
em_status em__cpu_sdpa_backward(const em_op_call *c);
/* OpenBLAS single-threaded, once: Ember's pool splits big GEMMs (BLAS's idle threads spin). */
void em__cpu_blas_init(void);

/* ---- convolution and pooling (cpu_conv.c; oneDNN in cpu_conv_dnnl.c) ---- */
em_status em__cpu_im2col(em_tensor *cols, const em_tensor *in, const em_window2d *g);
em_status em__cpu_col2im(em_tensor *in, const em_tensor *cols, const em_window2d *g);
em_status em__cpu_pool2d(em_pool_kind kind, em_tensor *out, em_tensor *indices, const em_tensor *in,
                         const em_window2d *g);
em_status em__cpu_pool2d_backward(em_pool_kind kind, em_tensor *gin, const em_tensor *gout, const em_tensor *indices,
                                  const em_window2d *g);
#ifdef EMBER_HAVE_DNNL
em_status em__cpu_conv2d_dnnl(em_tensor *out, const em_tensor *in, const em_tensor *w, const em_tensor *bias,
                              const em_window2d *g, int64_t groups);
em_status em__cpu_conv2d_backward_input_dnnl(em_tensor *gin, const em_tensor *gout, const em_tensor *w,
                                             const em_window2d *g, int64_t groups);
em_status em__cpu_conv2d_backward_weight_dnnl(em_tensor *gw, const em_tensor *gout, const em_tensor *in,
                                              const em_window2d *g, int64_t groups);
/* the same and the bias's gradient from the same read of gout */
em_status em__cpu_conv2d_backward_weight_bias_dnnl(em_tensor *gw, em_tensor *gbias, const em_tensor *gout,
                                                   const em_tensor *in, const em_window2d *g, int64_t groups);
/* One pass in dtype EM_F32 or EM_BF16 over Ember's plain (NCHW, (G)OIHW) buffers ptr:
 * forward {in, w, out, bias}, data gradient {gout, w, gin}, weight gradient {in, gout, gw,
 * gbias}; O output channels, G groups. EM_ERR_NOT_SUPPORTED, nothing recorded, when oneDNN
 * cannot run it (for bf16 also when it has only its reference kernel). */
typedef enum { EM_CONV_FWD, EM_CONV_BWD_DATA, EM_CONV_BWD_WEIGHTS } em_conv_pass;
em_status em__cpu_conv_dnnl_run(const char *op, em_conv_pass pass, em_dtype dtype, const em_window2d *g, int64_t O,
                                int64_t G, bool bias, void *const *ptr);
/* which kernel the last new bf16 pass got ("oneDNN <impl>, ..." or why float32), into out */
void em__cpu_conv_dnnl_bf16_kernel(char *out, size_t n);
#endif

#endif
