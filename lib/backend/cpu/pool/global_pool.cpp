// SPDX-License-Identifier: MIT
// Global average pooling, forward and backward (ops.h): the float32 forward on oneDNN's
// average pooling with an H x W window (pool.cpp), the 16-bit forward and the backward
// mpx's loops; the backward fused with a relu's (Backend::global_avg_pool_relu_backward).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include <omp.h>

#include "backend/cpu/ops.h"
#include "backend/cpu/pool/pool_tiled.h"

namespace mpx::cpu {

namespace {

// 16-bit global average pooling: each thread widens a block of an image's rows into a buffer
// that stays in its cache and sums it there, so the input is read once and no float32 copy of
// it is written (docs/cpu-performance.md, "16-bit without native math"). Each block's rows are
// summed first, then the blocks in order (kGapRows, pool_tiled.h): float32 sums of at most
// kGapRows terms, and the result does not depend on the thread count. bfloat16 takes the
// same sums in the vector build of pool_tiled.inc, widening in registers; float16 (which
// needs F16C to widen) stays here.

void gap_forward_16(Context& ctx, const Tensor& x, const Tensor& y) {
  const int64_t N = x.shape[0], HW = x.shape[1] * x.shape[2], C = x.shape[3];
  const size_t per_thread = static_cast<size_t>((kGapRows + 1) * C + 16);
  float* bufs = ctx.scratch(kSlotTmp0, per_thread * static_cast<size_t>(omp_get_max_threads()));
  float* yf = f32_out(ctx, kSlotY, y);
  const float inv = 1.0f / static_cast<float>(HW);
  const size_t esize = dtype_size(x.dtype);
#pragma omp parallel
  {
    float* rows = bufs + per_thread * static_cast<size_t>(omp_get_thread_num());
    float* part = rows + kGapRows * C;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      float* yo = yf + n * C;
      for (int64_t c = 0; c < C; ++c) yo[c] = 0.0f;
      for (int64_t i0 = 0; i0 < HW; i0 += kGapRows) {
        const int64_t nr = std::min(kGapRows, HW - i0);
        convert(static_cast<const char*>(x.data) + static_cast<size_t>((n * HW + i0) * C) * esize, x.dtype, rows,
                DType::F32, static_cast<size_t>(nr * C));
        for (int64_t c = 0; c < C; ++c) part[c] = rows[c];
        for (int64_t r = 1; r < nr; ++r) {
          const float* xr = rows + r * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) part[c] += xr[c];
        }
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) yo[c] += part[c];
      }
      for (int64_t c = 0; c < C; ++c) yo[c] *= inv;
    }
  }
  f32_commit(yf, y);
}

}  // namespace

void global_avg_pool_forward(Context& ctx, const Tensor& x, const Tensor& y) {
  const int64_t N = x.shape[0], HW = x.shape[1] * x.shape[2], C = x.shape[3];
  if (x.dtype == DType::BF16 && !reference_loops()) {
    float* yf = f32_out(ctx, kSlotY, y);
    gap_forward_bf16_dispatch(N, HW, C, static_cast<const uint16_t*>(x.data), yf);
    f32_commit(yf, y);
    return;
  }
  if (is_16bit(x.dtype) && !reference_loops()) {
    gap_forward_16(ctx, x, y);
    return;
  }
  const float* xf = f32_in(ctx, kSlotX, x);
  float* yf = f32_out(ctx, kSlotY, y);
  if (!reference_loops()) {
    global_avg_pool_dnnl(ctx, x.shape, xf, yf);
    f32_commit(yf, y);
    return;
  }
  const float inv = 1.0f / static_cast<float>(HW);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* yo = yf + n * C;
    for (int64_t c = 0; c < C; ++c) yo[c] = 0.0f;
    for (int64_t i = 0; i < HW; ++i) {
      const float* xi = xf + (n * HW + i) * C;
      for (int64_t c = 0; c < C; ++c) yo[c] += xi[c];
    }
    for (int64_t c = 0; c < C; ++c) yo[c] *= inv;
  }
  f32_commit(yf, y);
}

namespace {

// A 16-bit value is > 0 when it is positive, not zero and not NaN (inf_bits: the dtype's
// +infinity, 0x7F80 bfloat16, 0x7C00 float16).
/// All ones where the 16-bit value with bits b is > 0, else 0.
inline uint16_t pos16_mask(uint16_t b, uint16_t inf_bits) {
  return static_cast<uint16_t>(-static_cast<int>((static_cast<int16_t>(b) > 0) & (b <= inf_bits)));
}

// The masked rows in 16-byte vectors, which every x86-64 has (this file is built for the
// baseline): the compiler does not vectorize the selects by itself.
using v4f = float __attribute__((vector_size(16)));
using v4i = int32_t __attribute__((vector_size(16)));
using v8u = uint16_t __attribute__((vector_size(16)));
using v8s = int16_t __attribute__((vector_size(16)));
template <class V, class T>
inline V vld(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <class V, class T>
inline void vst(T* p, V v) {
  std::memcpy(p, &v, sizeof(V));
}

/// d = y > 0 ? g * inv : 0 over c values (float32).
inline void masked_row_f32(const float* y, const float* g, float inv, float* d, int64_t C) {
  int64_t c = 0;
  for (; c + 4 <= C; c += 4) {
    const v4f gv = vld<v4f>(g + c) * inv;
    const v4i m = vld<v4f>(y + c) > 0.0f;
    vst(d + c, reinterpret_cast<v4f>(reinterpret_cast<v4i>(gv) & m));
  }
  for (; c < C; ++c) d[c] = y[c] > 0.0f ? g[c] * inv : 0.0f;
}

/// d = y > 0 ? r : 0 over c 16-bit values, on the bits.
inline void masked_row_16(const uint16_t* y, const uint16_t* r, uint16_t inf_bits, uint16_t* d, int64_t C) {
  int64_t c = 0;
  for (; c + 8 <= C; c += 8) {
    const v8u yv = vld<v8u>(y + c);
    const v8u m = reinterpret_cast<v8u>((reinterpret_cast<v8s>(yv) > 0) & reinterpret_cast<v8s>(yv <= inf_bits));
    vst(d + c, vld<v8u>(r + c) & m);
  }
  for (; c < C; ++c) d[c] = r[c] & pos16_mask(y[c], inf_bits);
}

/// dx = dy / HW, and 0 where relu_out (the relu's output, dx's shape and dtype) is not > 0.
void gap_backward(Context& ctx, const Tensor& dy, const Tensor& dx, const Tensor* relu_out) {
  const int64_t N = dx.shape[0], HW = dx.shape[1] * dx.shape[2], C = dx.shape[3];
  const float* dyf = f32_in(ctx, kSlotDY, dy);
  // Always ours: a broadcast write of dy/HW. oneDNN's pooling backward with an H x W window
  // took ~2.1x as long at the CIFAR shape [256, 32, 32, 128] (45-48 ms vs 20-23 ms, 2 threads).
  const float inv = 1.0f / static_cast<float>(HW);
  if (dx.dtype != DType::F32) {
    // 16-bit: each image's row dy/HW rounded once, then copied to its HW positions (the same
    // values as rounding the float32 broadcast, without writing and converting it).
    const size_t row = static_cast<size_t>(C) * dtype_size(dx.dtype);
    float* rows = ctx.scratch(kSlotTmp0, static_cast<size_t>(N * C));
    for (int64_t i = 0; i < N * C; ++i) rows[i] = dyf[i] * inv;
    float* r16_buf = ctx.scratch(kSlotTmp1, (static_cast<size_t>(N) * row + 3) / 4);
    convert(rows, DType::F32, r16_buf, dx.dtype, static_cast<size_t>(N * C));
    const char* r16 = reinterpret_cast<const char*>(r16_buf);
    if (relu_out) {  // each row's values where the relu was active (a select on the bits)
      const uint16_t inf_bits = dx.dtype == DType::BF16 ? 0x7F80 : 0x7C00;
      const auto* rb = reinterpret_cast<const uint16_t*>(r16);
      const auto* yb = static_cast<const uint16_t*>(relu_out->data);
      auto* db = static_cast<uint16_t*>(dx.data);
#pragma omp parallel for collapse(2) schedule(static)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < HW; ++i)
          masked_row_16(yb + (n * HW + i) * C, rb + n * C, inf_bits, db + (n * HW + i) * C, C);
      return;
    }
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i)
        std::memcpy(static_cast<char*>(dx.data) + static_cast<size_t>(n * HW + i) * row,
                    r16 + static_cast<size_t>(n) * row, row);
    return;
  }
  float* dxf = f32_out(ctx, kSlotDX, dx);
  const float* yf = relu_out ? static_cast<const float*>(relu_out->data) : nullptr;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < HW; ++i) {
      float* d = dxf + (n * HW + i) * C;
      const float* g = dyf + n * C;
      if (yf) {
        masked_row_f32(yf + (n * HW + i) * C, g, inv, d, C);
      } else {
        for (int64_t c = 0; c < C; ++c) d[c] = g[c] * inv;
      }
    }
  f32_commit(dxf, dx);
}

}  // namespace

void global_avg_pool_backward(Context& ctx, const Tensor& dy, const Tensor& dx) { gap_backward(ctx, dy, dx, nullptr); }

void global_avg_pool_relu_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  gap_backward(ctx, dy, dx, &x);
}

}  // namespace mpx::cpu
