// SPDX-License-Identifier: MIT
// cuDNN convolution plans, shared by conv.cpp (every filter reads every channel) and
// depthwise_conv.cpp (cuDNN's grouped convolution, one group per input channel): the
// descriptors of one (pass, shape, dtype), the algorithm chosen once per process
// (algo_choice.h; cuda.conv_algo, cuda.deterministic, cuda.workspace_mb), its workspace and
// the cuDNN call. NHWC activations, filters in cuDNN's NHWC filter layout ([K, R, S, C] for
// a full convolution, [K, R, S, 1] for a depthwise one), float32 compute: Tensor Core math
// for 16-bit operands, FMA-only math (no TF32) for float32. docs/gpu.md, "Choosing
// convolution algorithms".
#pragma once

#include <cudnn.h>

#include <string>

#include "backend/cuda/algo_choice.h"
#include "backend/cuda/context.h"
#include "backend/cuda/conv_geometry.h"
#include "core/tensor.h"

namespace mpx::cuda {

enum class ConvPass : int64_t { Forward = 1, BackwardData = 2, BackwardFilter = 3 };

/// Which convolution a plan runs: Full (groups 1, filters of g.Cp channels) or Depthwise
/// (g.C groups, filters of one channel; K = C * depth multiplier).
enum class ConvGroups { Full, Depthwise };

/// Descriptors, algorithm and workspace of one (pass, shape, dtype, operand alignment).
struct ConvPlan : Plan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  int algo = 0;  // a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t, by the plan's pass
  size_t ws_bytes = 0;
  ~ConvPlan() override;
};

/// The buffers of a pass, in the order cuDNN's call takes them: forward x, w, y; backward
/// data w, dy, dx; backward filter x, dy, dw. The search (cuda.conv_algo: search) times the
/// candidates on them; `out` is overwritten by the pass itself afterwards.
struct ConvData {
  const void* a = nullptr;
  const void* b = nullptr;
  void* out = nullptr;
};

/// "convolution forward (float32) for x [..], w [..], stride ..": the plan's name in the
/// kernels list and in errors.
std::string conv_what(ConvPass pass, ConvGroups groups, const ConvGeo& g, DType t);

/// Fills the plan's four descriptors for g and t (the math type set for t's default).
void make_conv_descriptors(ConvPlan& plan, ConvGroups groups, const ConvGeo& g, DType t);

/// The algorithm cuDNN's heuristic ranking gives the pass on the plan's descriptors, within
/// the settings' budget; throws naming the shape when there is none (probe_conv2d's check).
AlgoChoice choose_conv_heuristic(Context& ctx, ConvPass pass, ConvGroups groups, ConvPlan& plan, const ConvGeo& g,
                                 DType t, const AlgoSettings& s);

/// The Context's plan of the pass on g, built the first time its key is seen (descriptors,
/// and the algorithm from the process-wide cache; d: the buffers the search times on). The
/// key holds the pass, the groups, the shape, the dtype and the alignment of d's pointers
/// (weights are views into the parameter arena at any element offset, and cuDNN's fastest
/// kernels need aligned operands).
ConvPlan& conv_plan(Context& ctx, ConvPass pass, ConvGroups groups, const Conv2dParams& p, const ConvGeo& g,
                    DType t, const ConvData& d);

/// The input cuDNN reads: x itself, or x padded (spatially, and in channels up to g.Cp) into
/// the planned buffer.
Tensor conv_input(Context& ctx, const ConvGeo& g, const Tensor& x);

/// Where cuDNN writes the input gradient: dx itself, or a buffer of the padded input's shape,
/// which the caller crops into dx (crop_nhwc at g.top, g.left) after the pass.
Tensor conv_input_grad(Context& ctx, const ConvGeo& g, const Tensor& dx);

/// Runs the plan's pass on d (alpha 1, beta 0: the output is overwritten).
void run_conv(Context& ctx, ConvPass pass, const ConvPlan& plan, const ConvData& d);

}  // namespace mpx::cuda
