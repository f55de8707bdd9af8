// SPDX-License-Identifier: MIT
// The dense layer's oneDNN inner product in chunks of rows, shared by dense.cpp (float32
// and widened operands) and dense_native.cpp (native 16-bit operands).
#pragma once

#include <algorithm>
#include <cstring>

#include "backend/cpu/dnnl_util.h"

namespace mpx::cpu::dense_detail {

// oneDNN's gemm-based inner product changes a row's last bits with the batch size (its
// sgemm picks other kernels and blockings for another M; measured: rows of a batch of 3
// differ from the same rows of a batch of 5), while the model runs a partial last batch as
// a row slice and expects the same rows (test_nn "a partial batch uses row slices and gives
// the same rows"). Forward and backward-data therefore always run the primitive on chunks
// of kRows rows: full chunks in place, the last partial chunk through padded scratch. With
// one fixed M, a row's result depends only on that row (checked; no gemm row reads another),
// so every row comes out the same in any batch. Backward-weights sums over the batch and
// runs once on all N rows.

// The chunk: the configs' batch sizes (128, 256) are multiples, so a full batch runs
// without copies. Smaller chunks are slow for a long Cin: 256 rows of 5408 -> 10 forward
// took 60 ms in chunks of 32, 1.7 ms in chunks of 64, 1.25 ms in chunks of 128, 0.87 ms
// in one call of 256 (2 threads, AVX2); the plain loop takes ~6 ms.
constexpr int64_t kRows = 128;

struct DenseDescs {
  dnnl::memory::desc src, wei, wei_any, bias, dst;
};

// x [N, Cin] "nc", w [Cout, Cin] "oi", y [N, Cout] "nc": the user layouts. oneDNN 2.6 runs
// its gemm-based inner product on them directly (no reorders; checked on AVX2). Its AMX
// and AVX512-FP16 kernels want blocked weights (wei_any; with "oi" oneDNN 3.2 picks its
// gemm or reference kernel for 16-bit operands).
inline DenseDescs dense_descs(int64_t N, int64_t Ci, int64_t Co, dt src_t = dt::f32, dt wei_t = dt::f32,
                       dt dst_t = dt::f32) {
  DenseDescs d;
  d.src = dnnl::memory::desc({N, Ci}, src_t, tag::nc);
  d.wei = dnnl::memory::desc({Co, Ci}, wei_t, tag::oi);
  d.wei_any = dnnl::memory::desc({Co, Ci}, wei_t, tag::any);
  d.bias = dnnl::memory::desc({Co}, dt::f32, tag::x);
  d.dst = dnnl::memory::desc({N, Co}, dst_t, tag::nc);
  return d;
}

/// A primitive over kRows rows. A partial last chunk goes through the two temporary
/// scratch slots, [kRows, in_cols] and [kRows, out_cols] (grown once, shared with other ops;
/// what the rows past the chunk hold does not matter: no gemm row reads another).
struct RowsPlan : DnnlPlan {
  int arg_in = 0, arg_out = 0;
  int64_t in_cols = 0, out_cols = 0;
  size_t in_size = sizeof(float), out_size = sizeof(float);  // bytes per element
  bool usable = true;                                        // make_native (native16.h)

  /// Runs rows [0, N) of in -> out in chunks of kRows (the other arguments already bound).
  void run_rows(Context& ctx, const void* in, void* out, int64_t N) {
    const size_t in_row = in_size * static_cast<size_t>(in_cols), out_row = out_size * static_cast<size_t>(out_cols);
    for (int64_t r0 = 0; r0 < N; r0 += kRows) {
      const int64_t n = std::min(kRows, N - r0);
      const char* src = static_cast<const char*>(in) + static_cast<size_t>(r0) * in_row;
      char* dst = static_cast<char*>(out) + static_cast<size_t>(r0) * out_row;
      if (n == kRows) {
        bind(arg_in, src);
        bind(arg_out, dst);
        run(ctx);
      } else {
        float* pad_in = ctx.scratch(kSlotTmp0, (kRows * in_row + 3) / 4);
        float* pad_out = ctx.scratch(kSlotTmp1, (kRows * out_row + 3) / 4);
        std::memcpy(pad_in, src, in_row * static_cast<size_t>(n));
        bind(arg_in, pad_in);
        bind(arg_out, pad_out);
        run(ctx);
        std::memcpy(dst, pad_out, out_row * static_cast<size_t>(n));
      }
    }
  }
};

}  // namespace mpx::cpu::dense_detail
