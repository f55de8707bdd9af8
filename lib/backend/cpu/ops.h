// SPDX-License-Identifier: MIT
// The CPU backend's operations (namespace mpx::cpu), one group per file with
// the same names as lib/backend/cuda/. Inputs are already validated by
// Backend's public methods (op_table.inc, backend_ops.cpp). 16-bit contract: operands are read as
// 16-bit values, math is float32 with float32 accumulation, each 16-bit output
// is rounded to nearest-even once from its float32 result.
#pragma once

#include "backend/backend.h"
#include "backend/cpu/context.h"

namespace mpx::cpu {

// The op table's ops (backend/op_table.inc), each in the file of its family:
// memory.cpp (fill, copy), cast.cpp, conv.cpp, dense.cpp, activation.cpp (activations, add),
// global_pool.cpp (global average pooling), batch_norm.cpp, loss.cpp, dropout.cpp, optimizer.cpp.
#define MPX_OP(NAME, GROUP, PARAMS, ARGS, ...) void NAME(Context& ctx, MPX_OP_ARGS PARAMS);
#include "backend/op_table.inc"

// activation.cpp
/// The end of a fused conv/dense: z (float32, y.numel() elements) holds the pre-activation, in
/// y's own memory when y is float32 (f32_out). In one pass: pre (when not empty) = z rounded to
/// its dtype, then y = act(z) rounded to y's dtype. z is overwritten.
void activation_epilogue(Activation act, float* z, const Tensor& y, const Tensor& pre);
/// activation_epilogue over n contiguous elements in the calling thread (a kernel's row in
/// cache): pre (when not null) = z rounded to t, y = act(z) rounded to t; z is overwritten.
/// The same bits as activation_epilogue for the same z.
void activation_epilogue_span(Activation act, float* z, int64_t n, void* y, void* pre, DType t);
/// The build of the activation loops that runs now: "avx512", "avx2" or "baseline".
const char* activation_build();

// batch_norm_rows.cpp: the batch-norm ops on mpx's row loops (bn_rows.h), for 16-bit tensors
// and with an activation fused after the normalization; batch_norm.cpp routes them here.
void bn_forward_training_rows(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                              float momentum, float epsilon, const Tensor& running_mean, const Tensor& running_var,
                              const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& y, Activation act);
void bn_forward_inference_rows(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                               const Tensor& running_mean, const Tensor& running_var, float epsilon, const Tensor& y,
                               Activation act);
void bn_backward_rows(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& saved_mean,
                      const Tensor& saved_invstd, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta,
                      const Tensor& beta, Activation act);

// dense.cpp
/// dense_backward_data and the backward of the relu whose output is x
/// (Backend::dense_relu_backward_data): in the few-output loops' registers, else a pass after.
void dense_relu_backward_data(Context& ctx, const Tensor& dy, const Tensor& w, const Tensor& x, const Tensor& dx);
/// Backend::dense_backward in one walk over x on the few-output loops, where the chooser
/// (choose_dense_backward) says so; false: nothing done, run the two passes.
bool dense_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& w, const Tensor& dw,
                    const Tensor& db, const Tensor& dx, bool relu);
/// Backend::dense_conv_backward in one walk over x on the few-output loops, where the chooser
/// (choose_dense_conv_backward) and the convolution's shape allow; false: nothing done, run the
/// ops one after the other.
bool dense_conv_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& w, const Tensor& dw,
                         const Tensor& db, const Conv2dParams& p, const Tensor& conv_x, const Tensor& conv_dw,
                         const Tensor& conv_db);
/// Backend::conv_max_pool_forward: each window's rows of the convolution's relu output pooled as
/// they are computed, where the pooling runs the tiled kernels that can keep its argmax (written
/// where given) and the convolution runs on the few-channel kernel (conv2d_forward_pooled); false:
/// nothing done, run the ops one after the other. conv_max_pool_forward_fuses: whether it would,
/// from the shapes (at plan time).
bool conv_max_pool_forward(Context& ctx, const Conv2dParams& cp, const Tensor& x, const Tensor& w, const Tensor& bias,
                           const Tensor& conv_y, const PoolParams& pp, const Tensor& y, const Tensor& argmax);
bool conv_max_pool_forward_fuses(WinogradMode configured, const Conv2dParams& cp, const Shape& x, const Shape& w,
                                 DType t, const PoolParams& pp, const Shape& conv_y);
// conv.cpp
struct WgradDyRows;  // conv/conv_wgrad_small.h
/// conv2d_backward_filter with dy's rows from `rows` (never stored), where the chooser gives the
/// weight gradient to the few-channel kernel (conv_wgrad_small); false: nothing done. The kernels
/// list names it "convolution backward weights with <source>".
bool conv2d_backward_filter_routed(Context& ctx, const Conv2dParams& p, const Tensor& x, const WgradDyRows& rows,
                                   const Tensor& dw, const Tensor& db, const char* source);
struct FwdPoolRows;  // conv/conv_fwd_small.h
/// Whether conv2d_forward_pooled takes this convolution (relu; x, w and the output in t):
/// where the chooser gives its pooled forward to the few-channel kernel. `configured`: the
/// config's cpu.winograd, as the op's chooser sees it.
bool conv2d_forward_pools(WinogradMode configured, const Conv2dParams& p, const Shape& x, const Shape& w, DType t);
/// conv2d_forward with relu whose output rows go to `pool` a pooling window at a time, never
/// stored (conv_fwd_small_pooled); y: the output's tensor, which is not written. False: nothing
/// done (the chooser gives the shape another kernel).
bool conv2d_forward_pooled(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& w, const Tensor& bias,
                           const Tensor& y, const FwdPoolRows& pool);
// pieces.cpp: the rules of the forward in pieces of the batch (Backend::dense_input_piece_rows,
// max_pool_input_piece_rows, conv2d_forward_in_pieces; docs/cpu-performance.md, "Pieces of the
// batch").
int64_t dense_input_piece_rows(int64_t features, int64_t units, DType t, DType x);
int64_t max_pool_input_piece_rows(const PoolParams& p, const Shape& x, DType t);
bool conv2d_forward_in_pieces(const Conv2dParams& p, const Shape& x, const Shape& w, DType t);

// pool.cpp
/// Global average pooling's float32 forward on oneDNN (x's shape [N, H, W, C]), for
/// global_pool.cpp.
void global_avg_pool_dnnl(Context& ctx, const Shape& x, const float* xf, float* yf);
// global_pool.cpp
/// global_avg_pool_backward and the backward of the relu whose output is x
/// (Backend::global_avg_pool_relu_backward), in one pass that writes dx once.
void global_avg_pool_relu_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& dx);
void pool_forward(Context& ctx, const PoolParams& p, const Tensor& x, const Tensor& y);
/// relu_input (max pooling only): x is a relu's output, and dx is also that relu's gradient.
void pool_backward(Context& ctx, const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                   const Tensor& dx, bool relu_input = false);
/// Max pooling that keeps each output's window position (Backend::max_pool_keeps_argmax):
/// the tiled geometries, where the kernels are mpx's own.
bool max_pool_keeps_argmax(const PoolParams& p, const Shape& x);
void max_pool_forward_argmax(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& argmax);
void max_pool_backward_argmax(const PoolParams& p, const Tensor& y, const Tensor& argmax, const Tensor& dy,
                              const Tensor& dx, bool relu_input);
/// Backend::max_pool_conv_backward: the convolution's weight gradient takes each row of the
/// pooling's dx (relu included) as it is routed from the forward's argmax, where the forward kept
/// one and the weight gradient runs on the few-channel kernel (conv2d_backward_filter_routed);
/// false: nothing done, run the ops one after the other.
bool max_pool_conv_backward(Context& ctx, const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                            const Tensor& argmax, const Conv2dParams& cp, const Tensor& conv_x, const Tensor& conv_dw,
                            const Tensor& conv_db);

// optimizer.cpp
bool unscale_and_check(const Tensor& grads, float inv_scale);
TensorStats stats(const Tensor& x);

}  // namespace mpx::cpu
