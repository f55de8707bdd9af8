// SPDX-License-Identifier: MIT
// The CPU backend's rules for the forward in pieces of the batch (docs/cpu-performance.md,
// "Pieces of the batch"): which consumer asks for pieces (a dense layer on mpx's few-output
// loops, a max pooling on mpx's tiled kernels, each reading a float32 input) and which
// convolutions may run in pieces before it. Fixed rules from measurements, never a timing.
#include "backend/cpu/conv/conv_loops.h"
#include "backend/cpu/dense/dense_choose.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/switches.h"

namespace mpx::cpu {

namespace {

/// Rows per piece: the seed MNIST net's step took the same time with pieces of 8, 16 and 32.
constexpr int64_t kPieceRows = 16;

/// Whether MPX_CPU_PIECES lets a consumer reading dtype x ask: auto, a float32 x (a 16-bit one
/// gained nothing where measured); on, any; off, none.
bool asks(DType x) {
  const PiecesMode mode = pieces_mode();
  return mode == PiecesMode::On || (mode == PiecesMode::Auto && x == DType::F32);
}

}  // namespace

int64_t dense_input_piece_rows(int64_t features, int64_t units, DType t, DType x) {
  if (!asks(x)) return 0;
  DenseQuery q;  // as dense_forward asks: w's dtype (the layer's) and x's
  q.pass = DensePass::Forward, q.Ci = features, q.Co = units, q.in = t, q.big = x;
  return choose_dense(q).kernel == DenseKernel::FewOutputs ? kPieceRows : 0;
}

int64_t max_pool_input_piece_rows(const PoolParams& p, const Shape& x, DType t) {
  return asks(t) && max_pool_keeps_argmax(p, x) ? kPieceRows : 0;
}

bool conv2d_forward_in_pieces(const Conv2dParams& p, const Shape& x, const Shape& w, DType) {
  // The first layers' shapes, those measured (the seed MNIST and smoke nets; their forward runs
  // mpx's few-channel kernel or oneDNN's direct one). Others may not gain: the Winograd forward
  // transforms its filters at every call, and oneDNN's kernels block over the batch.
  return !reference_loops() && conv_detail::few_channel_shape(conv_detail::geometry(p, x, w));
}

}  // namespace mpx::cpu
