/* Mixed precision, as torch.autocast and torch.cuda.amp.GradScaler.
 *
 *   em_grad_scaler *scaler = em_grad_scaler_new(em_grad_scaler_defaults());
 *   for (...) {
 *       em_autocast ac = em_autocast_begin(EM_CUDA, EM_F16);   // matmul/linear in f16
 *       em_tensor *loss = em_cross_entropy(em_forward(model, x), y, 0.0);  // loss in f32
 *       em_autocast_end(ac);
 *       em_zero_grad(opt);
 *       em_backward(em_grad_scaler_scale(scaler, loss));       // float32 .grad on the f32 weights
 *       em_grad_scaler_step(scaler, opt);                       // skipped on the device on inf/NaN
 *       em_grad_scaler_update(scaler);
 *   }
 *
 * Autocast regions are per thread and nest. Inside a region for a device type, ops on
 * tensors of that type follow PyTorch's autocast lists for it (src/core/autocast.c has the
 * table): matmul, addmm (nn's Linear) and conv2d (nn's Conv2d) run in the region's dtype
 * (the pools run in their input's); the losses
 * (cross_entropy, nll_loss, mse_loss) and, on GPUs, exp, log, pow, softmax, log_softmax,
 * sum and mean run in float32; ops with mixed inputs (add, cat, stack, where...) promote to
 * the widest. The casts are differentiable (a float32 parameter gets a float32 gradient).
 * A parameter (a leaf requiring grad) is cast once per outermost region; the cached cast is
 * dropped when the parameter changes (an optimizer step bumps its version). Outside every
 * region nothing changes. End every region on its thread before the thread exits (the
 * outermost end frees the cast cache). Run backward outside the region, as PyTorch advises:
 * backward then runs each op in the dtype its forward used. */
#ifndef EMBER_AMP_H
#define EMBER_AMP_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/export.h>
#include <ember/tensor.h>
#include <ember/optim.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A region handle: pass it to em_autocast_end on the thread that began it. */
typedef struct em_autocast {
    int depth;          /* 1 for the outermost region; 0 when begin failed */
    const void *owner;  /* the thread that began it */
} em_autocast;

/* torch.autocast(device_type, dtype): dtype must be EM_F16 or EM_BF16 (anything else is an
 * EM_ERR_DTYPE error and a handle whose end does nothing). */
EM_API em_autocast em_autocast_begin(em_device_type type, em_dtype dtype);
/* torch.autocast(..., enabled=False) when enabled is false: switches autocast off for that
 * device type until the matching end (dtype is then ignored). */
EM_API em_autocast em_autocast_begin_ex(em_device_type type, em_dtype dtype, bool enabled);
/* Ends the innermost region. Ending a region that is not the innermost open one (ended
 * twice, out of order) or on another thread is an EM_ERR_ARGUMENT error that changes
 * nothing. The outermost end releases the cast cache. */
EM_API em_status em_autocast_end(em_autocast region);
/* torch.is_autocast_enabled(device_type) / torch.get_autocast_dtype on this thread. */
EM_API bool em_autocast_enabled(em_device_type type);
EM_API em_dtype em_autocast_dtype(em_device_type type); /* the region's dtype (EM_BF16 when none) */

/* ---- loss scaling (torch.amp.GradScaler) ----
 * The scale, growth tracker, found-inf flag and skipped-step count live in one float32
 * tensor on the loss's device. Unscaling checks the gradients for inf/NaN on the device;
 * the fused optimizer kernels read that flag and leave parameters and state untouched when
 * it is set; update changes the scale on the device. So a scaled step makes no host
 * synchronisation (reading the scale or the skipped count does). An optimizer whose
 * parameters take the op-by-op path (non-contiguous) reads the flag on the host instead. */
typedef struct em_grad_scaler em_grad_scaler;
/* The scaler's settings: PyTorch's GradScaler arguments and defaults. */
typedef struct em_grad_scaler_opts {
    double init_scale;        /* 65536 */
    double growth_factor;     /* 2 */
    double backoff_factor;    /* 0.5 */
    int64_t growth_interval;  /* 2000 clean steps */
    bool enabled;             /* false: scale/unscale are identities, step is em_step */
} em_grad_scaler_opts;
EM_API em_grad_scaler_opts em_grad_scaler_defaults(void);          /* PyTorch's defaults, enabled */
EM_API em_grad_scaler *em_grad_scaler_new(em_grad_scaler_opts opts); /* NULL and an error on bad opts */
EM_API void em_grad_scaler_free(em_grad_scaler *s);                 /* NULL is ignored */
/* loss * scale (differentiable; the scale is made on loss's device on the first call). */
EM_API em_tensor *em_grad_scaler_scale(em_grad_scaler *s, em_tensor *loss);
/* Divide every gradient of opt's parameters by the scale in place and record inf/NaN in the
 * device flag (optional before step: lets em_clip_grad_norm see the true gradients). */
EM_API em_status em_grad_scaler_unscale(em_grad_scaler *s, em_optimizer *opt);
/* Unscale (unless done since the last update), then em_step, skipped on the device when a
 * gradient was inf/NaN. */
EM_API em_status em_grad_scaler_step(em_grad_scaler *s, em_optimizer *opt);
/* After the steps of an iteration: backoff on inf/NaN (and count a skipped step), growth
 * after growth_interval clean steps in a row. */
EM_API em_status em_grad_scaler_update(em_grad_scaler *s);
/* The current scale, growth tracker and skipped steps (these wait for the device). */
EM_API double em_grad_scaler_get_scale(em_grad_scaler *s);
EM_API int64_t em_grad_scaler_growth_tracker(em_grad_scaler *s); /* clean steps since the last change */
EM_API int64_t em_grad_scaler_skipped_steps(em_grad_scaler *s);  /* steps skipped for inf/NaN */

/* ---- the scaler in checkpoints (GradScaler.state_dict / load_state_dict) ----
 * What a checkpoint keeps of a scaler, as PyTorch's state_dict: the scale and growth tracker
 * (the state that evolves) and the settings, so that a resumed run scales as an
 * uninterrupted one would. */
typedef struct em_grad_scaler_state {
    double scale;             /* the current loss scale: finite, > 0, within float32's range */
    int64_t growth_tracker;   /* clean steps since the last scale change, 0 <= t < growth_interval */
    int64_t skipped_steps;    /* steps skipped for inf/NaN so far (Ember's addition), 0 to 2^24 */
    double growth_factor;     /* the scaler's settings (em_grad_scaler_opts) */
    double backoff_factor;    /* see em_grad_scaler_opts */
    int64_t growth_interval;  /* see em_grad_scaler_opts */
    bool enabled;             /* false for a disabled scaler (its state dict is empty in PyTorch) */
} em_grad_scaler_state;
/* scaler.state_dict() into *out (reads the device's state: waits for it once). A disabled
 * scaler gives enabled false, scale 1 and its settings. */
EM_API em_status em_grad_scaler_state_dict(em_grad_scaler *s, em_grad_scaler_state *out);
/* scaler.load_state_dict(): the scale, tracker, skipped count and settings from st. Every
 * field is checked first (a negative, zero, NaN or infinite scale, a tracker outside
 * [0, growth_interval), settings em_grad_scaler_new refuses, the state of a disabled scaler,
 * or a disabled scaler to load into are EM_ERR_ARGUMENT errors that change nothing). Not
 * between unscale/step and update. The device state is made again at the next
 * em_grad_scaler_scale, on the loss's device. */
EM_API em_status em_grad_scaler_load_state_dict(em_grad_scaler *s, const em_grad_scaler_state *st);

#ifdef __cplusplus
}
#endif
#endif
