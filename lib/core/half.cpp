// SPDX-License-Identifier: MIT
// Portable float32 <-> float16 / bfloat16 conversions (integer bit manipulation,
// independent of the FP environment) and the bulk convert() dispatcher.
#include "core/half.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <cstring>

#include "core/error.h"

namespace mpx {

namespace {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) {
    // NaN: quiet it and keep the top 10 payload bits, as F16C (and CUDA) do.
    return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x03FFu));
  }
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 (and inf) -> inf
  if (a >= 0x38800000u) {
    // Normal float16 (>= 2^-14): rebias the exponent (127 - 15 = 112), round the 13 dropped bits
    // to nearest even; a carry out of the mantissa bumps the exponent, which is what we want.
    uint32_t r = a - 0x38000000u;
    r += 0x0FFFu + ((r >> 13) & 1u);
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  // Subnormal float16 (or zero). Anything <= 2^-25 (half the smallest subnormal, a tie to the
  // even 0) becomes a signed zero; this also covers float subnormals.
  if (a <= 0x33000000u) return sign;
  const uint32_t e = a >> 23;                        // 102 .. 112
  const uint32_t mant = (a & 0x007FFFFFu) | 0x00800000u;  // implicit bit
  const uint32_t shift = 126u - e;                   // 14 .. 24
  uint32_t m = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (m & 1u))) ++m;  // may carry into 0x400: the min normal
  return static_cast<uint16_t>(sign | m);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x03FFu;
  if (e == 0x1Fu) {
    if (m == 0) return bits_f32(sign | 0x7F800000u);
    return bits_f32(sign | 0x7FC00000u | (m << 13));  // NaN: payload kept, quieted (as F16C does)
  }
  if (e != 0) return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0) return bits_f32(sign);
  // Subnormal: normalize the mantissa. Value = m * 2^-24.
  uint32_t shift = 0;
  uint32_t mm = m;
  while ((mm & 0x0400u) == 0) {
    mm <<= 1;
    ++shift;
  }
  // mm has bit 10 set; value = mm * 2^(-24 - shift) = 1.xxx * 2^(-14 - shift)
  const uint32_t exp = 127u - 14u - shift;
  return bits_f32(sign | (exp << 23) | ((mm & 0x03FFu) << 13));
}

uint16_t f32_to_bf16(float f) {
  const uint32_t x = f32_bits(f);
  // Round to nearest even on the upper half; the carry overflows to inf correctly.
  const uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  // NaN: truncate and set the quiet bit, so a payload only in the low bits stays NaN.
  // Written as a select (no branch) so the bulk loop auto-vectorizes.
  const uint32_t nan = (x >> 16) | 0x0040u;
  return static_cast<uint16_t>((x & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

float round_to(DType t, float f) {
  switch (t) {
    case DType::F32:
      return f;
    case DType::F16:
      return f16_to_f32(f32_to_f16(f));
    case DType::BF16:
      return bf16_to_f32(f32_to_bf16(f));
    default:
      break;
  }
  MPX_CHECK_MSG(false, std::string("round_to: not a float dtype: ") + dtype_name(t));
  return f;
}

// ---- bulk ---------------------------------------------------------------------

namespace {

void check_float_pair(DType src_t, DType dst_t) {
  MPX_CHECK_MSG(is_float(src_t) && is_float(dst_t),
                std::string("convert: only float32/float16/bfloat16 are supported, got ") +
                    dtype_name(src_t) + " -> " + dtype_name(dst_t));
}

// Scalar kernels over a range. Plain loops over inlineable functions: no per-element indirect calls.
void portable_range(const void* src, DType src_t, void* dst, DType dst_t, size_t begin, size_t end) {
  if (src_t == DType::F32) {
    const float* s = static_cast<const float*>(src);
    uint16_t* d = static_cast<uint16_t*>(dst);
    if (dst_t == DType::F16) {
      for (size_t i = begin; i < end; ++i) d[i] = f32_to_f16(s[i]);
    } else {
      for (size_t i = begin; i < end; ++i) d[i] = f32_to_bf16(s[i]);
    }
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(src);
  if (dst_t == DType::F32) {
    float* d = static_cast<float*>(dst);
    if (src_t == DType::F16) {
      for (size_t i = begin; i < end; ++i) d[i] = f16_to_f32(s[i]);
    } else {
      for (size_t i = begin; i < end; ++i) d[i] = bf16_to_f32(s[i]);
    }
    return;
  }
  // 16-bit -> other 16-bit: widening is exact, so this is a single rounding.
  uint16_t* d = static_cast<uint16_t*>(dst);
  if (src_t == DType::F16) {
    for (size_t i = begin; i < end; ++i) d[i] = f32_to_bf16(f16_to_f32(s[i]));
  } else {
    for (size_t i = begin; i < end; ++i) d[i] = f32_to_f16(bf16_to_f32(s[i]));
  }
}

}  // namespace

// half_f16c.cpp; call only when the CPU has the ISA.
namespace detail {
void f32_to_f16_f16c(const float* src, uint16_t* dst, size_t n);
void f16_to_f32_f16c(const uint16_t* src, float* dst, size_t n);
void f32_to_bf16_avx2(const float* src, uint16_t* dst, size_t n);
void bf16_to_f32_avx2(const uint16_t* src, float* dst, size_t n);
}  // namespace detail

namespace {

struct CpuCaps {
  bool f16c = false;
  bool avx2 = false;
};

CpuCaps detect_caps() {
  CpuCaps c;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool avx = __builtin_cpu_supports("avx");  // includes the OS (XSAVE) check
  // F16C is CPUID leaf 1, ECX bit 29 (asked directly: clang's __builtin_cpu_supports
  // does not know the name).
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  c.f16c = avx && __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
  c.avx2 = avx && __builtin_cpu_supports("avx2");
#endif
  return c;
}

const CpuCaps& caps() {
  static const CpuCaps c = detect_caps();
  return c;
}

// Vectorized kernels over [begin, end), falling back to the scalar loops per pair.
void fast_range(const void* src, DType src_t, void* dst, DType dst_t, size_t begin, size_t end) {
  const CpuCaps& c = caps();
  const size_t n = end - begin;
  if (src_t == DType::F32 && dst_t == DType::F16 && c.f16c) {
    detail::f32_to_f16_f16c(static_cast<const float*>(src) + begin, static_cast<uint16_t*>(dst) + begin, n);
  } else if (src_t == DType::F16 && dst_t == DType::F32 && c.f16c) {
    detail::f16_to_f32_f16c(static_cast<const uint16_t*>(src) + begin, static_cast<float*>(dst) + begin, n);
  } else if (src_t == DType::F32 && dst_t == DType::BF16 && c.avx2) {
    detail::f32_to_bf16_avx2(static_cast<const float*>(src) + begin, static_cast<uint16_t*>(dst) + begin, n);
  } else if (src_t == DType::BF16 && dst_t == DType::F32 && c.avx2) {
    detail::bf16_to_f32_avx2(static_cast<const uint16_t*>(src) + begin, static_cast<float*>(dst) + begin, n);
  } else if (is_16bit(src_t) && is_16bit(dst_t) && c.f16c && c.avx2) {
    // 16-bit -> other 16-bit through a float32 buffer on the stack (widening is exact).
    constexpr size_t kBlock = 2048;
    float buf[kBlock];
    const uint16_t* s = static_cast<const uint16_t*>(src);
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (size_t i = begin; i < end; i += kBlock) {
      const size_t m = end - i < kBlock ? end - i : kBlock;
      if (src_t == DType::F16) {
        detail::f16_to_f32_f16c(s + i, buf, m);
        detail::f32_to_bf16_avx2(buf, d + i, m);
      } else {
        detail::bf16_to_f32_avx2(s + i, buf, m);
        detail::f32_to_f16_f16c(buf, d + i, m);
      }
    }
  } else {
    portable_range(src, src_t, dst, dst_t, begin, end);
  }
}

// Memory-bound work: split large arrays into chunks over OpenMP threads, small ones run inline.
constexpr size_t kChunk = size_t{1} << 16;
constexpr size_t kParallelMin = size_t{1} << 17;

template <typename Kernel>
void run_chunked(const void* src, DType src_t, void* dst, DType dst_t, size_t n, Kernel kernel) {
  if (n < kParallelMin) {
    kernel(src, src_t, dst, dst_t, 0, n);
    return;
  }
  const long long chunks = static_cast<long long>((n + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (long long c = 0; c < chunks; ++c) {
    const size_t begin = static_cast<size_t>(c) * kChunk;
    const size_t end = begin + kChunk < n ? begin + kChunk : n;
    kernel(src, src_t, dst, dst_t, begin, end);
  }
}

}  // namespace

void convert_portable(const void* src, DType src_t, void* dst, DType dst_t, size_t n) {
  check_float_pair(src_t, dst_t);
  if (n == 0) return;
  if (src_t == dst_t) {
    std::memcpy(dst, src, n * dtype_size(src_t));
    return;
  }
  run_chunked(src, src_t, dst, dst_t, n, portable_range);
}

void convert(const void* src, DType src_t, void* dst, DType dst_t, size_t n) {
  check_float_pair(src_t, dst_t);
  if (n == 0) return;
  if (src_t == dst_t) {
    std::memcpy(dst, src, n * dtype_size(src_t));
    return;
  }
  run_chunked(src, src_t, dst, dst_t, n, fast_range);
}

bool have_f16c() { return caps().f16c; }

}  // namespace mpx
