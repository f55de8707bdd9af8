// SPDX-License-Identifier: MIT
// Memory ops of the CPU backend (fill, copy) and the Context: scratch arena,
// oneDNN engine/stream, and the float32 load/store helpers the op files share.
#include <cstdlib>
#include <cstring>

#include "backend/cpu/ops.h"
#include "core/error.h"

namespace mpx::cpu {

// ---- Context -------------------------------------------------------------------

Context::Context(std::function<void(size_t)> on_alloc, std::function<void(size_t)> on_free)
    : on_alloc_(std::move(on_alloc)),
      on_free_(std::move(on_free)),
      engine_(dnnl::engine::kind::cpu, 0),
      stream_(engine_) {}

Context::~Context() {
  plans_.clear();
  on_free_(plan_bytes_);
  for (auto& b : slots_) {
    if (b.p) {
      std::free(b.p);
      on_free_(b.n * sizeof(float));
    }
  }
}

float* Context::scratch(Slot slot, size_t n) {
  Block& b = slots_[static_cast<size_t>(slot)];
  if (n <= b.n) return b.p;
  if (b.p) {
    std::free(b.p);
    on_free_(b.n * sizeof(float));
    b.p = nullptr;
    b.n = 0;
  }
  const size_t cap = (n + 15) / 16 * 16;  // 64-byte multiple
  b.p = static_cast<float*>(std::aligned_alloc(64, cap * sizeof(float)));
  if (!b.p) throw OutOfMemoryError("out of host memory for " + std::to_string(cap * 4) + " bytes of CPU scratch");
  b.n = cap;
  on_alloc_(cap * sizeof(float));
  return b.p;
}

// ---- float32 views ---------------------------------------------------------------

void parallel_convert(const void* src, DType st, void* dst, DType dt, int64_t n) {
  constexpr int64_t kChunk = 1 << 16;
  const int64_t nc = (n + kChunk - 1) / kChunk;
  const size_t ss = dtype_size(st), ds = dtype_size(dt);
#pragma omp parallel for schedule(static) if (nc > 1)
  for (int64_t c = 0; c < nc; ++c) {
    const int64_t off = c * kChunk, m = std::min(kChunk, n - off);
    convert(static_cast<const char*>(src) + static_cast<size_t>(off) * ss, st,
            static_cast<char*>(dst) + static_cast<size_t>(off) * ds, dt, static_cast<size_t>(m));
  }
}

const float* f32_in(Context& ctx, Slot slot, const Tensor& t) {
  if (t.dtype == DType::F32) return t.as<const float>();
  float* buf = ctx.scratch(slot, static_cast<size_t>(t.numel()));
  parallel_convert(t.data, t.dtype, buf, DType::F32, t.numel());
  return buf;
}

float* f32_out(Context& ctx, Slot slot, const Tensor& t) {
  if (t.dtype == DType::F32) return t.as<float>();
  return ctx.scratch(slot, static_cast<size_t>(t.numel()));
}

void f32_commit(const float* f, const Tensor& t) {
  if (t.dtype == DType::F32) return;
  parallel_convert(f, DType::F32, t.data, t.dtype, t.numel());
}

// ---- ops ---------------------------------------------------------------------------

namespace {
template <typename T>
void fill_as(const Tensor& t, T v) {
  T* p = t.as<T>();
  const int64_t n = t.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) p[i] = v;
}
}  // namespace

void fill(Context& /*ctx*/, const Tensor& dst, float value) {
  switch (dst.dtype) {
    case DType::F32: fill_as<float>(dst, value); break;
    case DType::F16: fill_as<uint16_t>(dst, f32_to_f16(value)); break;
    case DType::BF16: fill_as<uint16_t>(dst, f32_to_bf16(value)); break;
    case DType::I32: fill_as<int32_t>(dst, static_cast<int32_t>(value)); break;
    case DType::U8: fill_as<uint8_t>(dst, static_cast<uint8_t>(value)); break;
  }
}

void copy(Context& /*ctx*/, const Tensor& dst, const Tensor& src) {
  const size_t bytes = dst.bytes();
  constexpr size_t kChunk = 1 << 20;
  const int64_t nc = static_cast<int64_t>((bytes + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static) if (nc > 1)
  for (int64_t c = 0; c < nc; ++c) {
    const size_t off = static_cast<size_t>(c) * kChunk;
    std::memmove(static_cast<char*>(dst.data) + off, static_cast<const char*>(src.data) + off,
                 std::min(kChunk, bytes - off));
  }
}

}  // namespace mpx::cpu
