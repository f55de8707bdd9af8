// SPDX-License-Identifier: MIT
// Which kernel runs a dense layer's pass, and why: the one place the CPU backend decides it
// (docs/cpu-performance.md, "Which kernel runs"). From the pass, the shapes, the dtypes, the
// CPU and the environment switches (switches.h), never from a timing. dense.cpp runs what it
// says; a test may ask it without running the op.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace mpx::cpu {

enum class DensePass { Forward, BackwardData, BackwardWeights };

enum class DenseKernel {
  Native16,    // oneDNN's native 16-bit inner product
  FewOutputs,  // mpx's loops for at most kDenseFewMaxOut outputs (dense_few.h), converting in registers
  OneDnn,      // oneDNN's float32 inner product, 16-bit operands widened into copies
  Reference,   // MPX_CPU_REFERENCE: mpx's plain loops on float32 copies
};

/// What the chooser looks at: x [N, Ci], w [Co, Ci]. `in` is the dtype the native path is
/// decided by (x; dy for backward-data), `big` the dtype of the long operand (x; dx for
/// backward-data).
struct DenseQuery {
  DensePass pass = DensePass::Forward;
  int64_t N = 0, Ci = 0, Co = 0;
  DType in = DType::F32, big = DType::F32;
  /// The native kernel was asked for and oneDNN has only its reference kernel (or none).
  bool native_refused = false;
};

struct DenseChoice {
  DenseKernel kernel = DenseKernel::OneDnn;
  std::string name;  // as `mpx bench` lists it (conv_choose.h's ConvChoice::name)
  std::string why;
};

DenseChoice choose_dense(const DenseQuery& q);

/// Whether both backward passes (q.pass ignored; `in` dy's dtype, `big` x's and dx's) run in
/// one walk over x (dense_few_backward): kernel FewOutputs with its name, or OneDnn (not
/// fused: each pass asks choose_dense).
DenseChoice choose_dense_backward(const DenseQuery& q);

/// Whether both backward passes and a first convolution's weight gradient from dx
/// (dense_few_backward_conv; the convolution's shape checked by the caller) run in one walk
/// over x: kernel FewOutputs with its name, or OneDnn (each op on its own).
DenseChoice choose_dense_conv_backward(const DenseQuery& q);

}  // namespace mpx::cpu
