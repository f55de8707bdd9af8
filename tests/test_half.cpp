// SPDX-License-Identifier: MIT
// Tests of lib/core/half: float32 <-> float16 / bfloat16 conversions.
// float16 is checked against the F16C hardware (the reference, bit for bit) and
// against an independent nearest-value search in double; bfloat16 against the
// nearest-value search. The [.exhaustive] cases cover all 2^32 floats (slow, run on demand).
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MPX_TEST_X86 1
#endif

#include "core/half.h"
#include "core/rng.h"
#include "support/skip.h"

using namespace mpx;

namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

bool is_nan32(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }
bool is_nan16(uint16_t h) { return (h & 0x7FFFu) > 0x7C00u; }
bool is_nan_bf16(uint16_t h) { return (h & 0x7FFFu) > 0x7F80u; }

// ---- hardware reference (F16C), compiled for that ISA only here ------------------
#ifdef MPX_TEST_X86
__attribute__((target("avx,f16c"))) void hw_f32_to_f16(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  }
  if (i < n) {
    float in[8] = {};
    uint16_t out[8];
    std::memcpy(in, src + i, (n - i) * sizeof(float));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_cvtps_ph(_mm256_loadu_ps(in), _MM_FROUND_TO_NEAREST_INT));
    std::memcpy(dst + i, out, (n - i) * sizeof(uint16_t));
  }
}
__attribute__((target("avx,f16c"))) void hw_f16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i + 8 <= n; i += 8) {  // n is a multiple of 8 here
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
}
#else
void hw_f32_to_f16(const float*, uint16_t*, size_t) {}
void hw_f16_to_f32(const uint16_t*, float*, size_t) {}
#endif

// ---- independent references: nearest representable value, searched in double --------
double f16_value(uint16_t h) {  // positive finite patterns 0..0x7C00 (0x7C00 -> 65536, "one ulp past max")
  const int e = (h >> 10) & 31;
  const int m = h & 1023;
  return e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
}

uint16_t ref_f32_to_f16(float f) {
  const uint32_t u = bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  if (is_nan32(u)) return static_cast<uint16_t>(sign | 0x7E00u | ((u >> 13) & 0x3FFu));
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return static_cast<uint16_t>(sign | 0x7C00u);
  // Largest pattern lo in [0, 0x7BFF] with value <= a (patterns are monotonic in value).
  uint32_t lo = 0, hi = 0x7BFF;
  while (lo < hi) {
    const uint32_t mid = (lo + hi + 1) / 2;
    if (f16_value(static_cast<uint16_t>(mid)) <= a) lo = mid; else hi = mid - 1;
  }
  const double dlo = a - f16_value(static_cast<uint16_t>(lo));
  const double dhi = f16_value(static_cast<uint16_t>(lo + 1)) - a;
  uint32_t r = lo;
  if (dhi < dlo || (dhi == dlo && (lo & 1u))) r = lo + 1;
  return static_cast<uint16_t>(sign | r);
}

double bf16_value(uint16_t h) {  // positive patterns 0..0x7F80 (0x7F80 -> 2^128, "one ulp past max")
  const int e = (h >> 7) & 255;
  const int m = h & 127;
  return e == 0 ? std::ldexp(m, -133) : std::ldexp(128 + m, e - 134);
}

uint16_t ref_f32_to_bf16(float f) {
  const uint32_t u = bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  if (is_nan32(u)) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  if ((u & 0x7FFFFFFFu) == 0x7F800000u) return static_cast<uint16_t>(sign | 0x7F80u);
  const double a = std::fabs(static_cast<double>(f));
  uint32_t lo = 0, hi = 0x7F7F;
  while (lo < hi) {
    const uint32_t mid = (lo + hi + 1) / 2;
    if (bf16_value(static_cast<uint16_t>(mid)) <= a) lo = mid; else hi = mid - 1;
  }
  const double dlo = a - bf16_value(static_cast<uint16_t>(lo));
  const double dhi = bf16_value(static_cast<uint16_t>(lo + 1)) - a;
  uint32_t r = lo;
  if (dhi < dlo || (dhi == dlo && (lo & 1u))) r = lo + 1;
  return static_cast<uint16_t>(sign | r);
}

// ---- input sets ------------------------------------------------------------------------
std::vector<float> edge_values() {
  std::vector<float> v = {
      0.0f, 1.0f, 65504.0f, 65519.99f, 65520.0f, 65536.0f, 65519.0f, 65505.0f, 6e-8f, 5.96e-8f,
      5.9604645e-8f, 2.98e-8f, 2.9802322e-8f /* 2^-25: tie -> 0 */, 2.9802326e-8f, 8.940697e-8f /* 1.5*2^-24 */,
      6.1035156e-5f, 6.0975552e-5f /* max subnormal */, 6.1e-5f,
      std::nextafter(6.1035156e-5f, 0.0f), 6.1035156e-5f - 2.9802322e-8f /* tie max subnormal / min normal */,
      1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 1.0f + 1.0f / 4096, 2047.0f, 2049.0f, 2051.0f, 4097.0f,
      std::numeric_limits<float>::infinity(), FLT_MAX, FLT_MIN, std::numeric_limits<float>::denorm_min(),
      1e-40f, 1e-45f, 3e-39f, 1e-10f, 1e10f, 3.1415927f, 0.1f, 1.0f / 3, 2.0f / 3,
      // bfloat16 ties and overflow
      from_bits(0x3F808000u), from_bits(0x3F818000u), from_bits(0x3F808001u), from_bits(0x7F7F8000u),
      from_bits(0x7F7F7FFFu), from_bits(0x00008000u), from_bits(0x00018000u), from_bits(0x0000FFFFu),
  };
  // NaNs with various payloads (quiet and signaling, payload high / only low bits).
  for (uint32_t p : {0x400000u, 0x000001u, 0x001FFFu, 0x002000u, 0x3FFFFFu, 0x7FFFFFu, 0x200000u, 0x000100u,
                     0x00FFFFu, 0x010000u, 0x555555u, 0x2AAAAAu}) {
    v.push_back(from_bits(0x7F800000u | p));
  }
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) v.push_back(from_bits(bits(v[i]) ^ 0x80000000u));  // both signs
  return v;
}

std::vector<float> sweep_values() {
  std::vector<float> v;
  v.reserve(size_t{1} << 20);
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) v.push_back(from_bits(static_cast<uint32_t>(u)));
  return v;
}

std::vector<float> random_values(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = rng.next_u64();
    if (i % 2 == 0) {
      v[i] = from_bits(static_cast<uint32_t>(r));  // any bit pattern
    } else {
      // Values in and around the float16 range, where the rounding decisions are.
      const int e = static_cast<int>((r >> 32) % 50) - 30;  // 2^-30 .. 2^19
      v[i] = static_cast<float>(std::ldexp(rng.normal(), e));
    }
  }
  return v;
}

// Same sign, both NaN; and (F16C keeps the top payload bits and sets the quiet bit) equal bits.
void check_f16_equal(float f, uint16_t got, uint16_t want) {
  if (got == want) return;
  INFO("input bits 0x" << std::hex << bits(f) << " got 0x" << got << " want 0x" << want);
  CHECK(got == want);
}

}  // namespace

// ---- known values ------------------------------------------------------------------------

TEST_CASE("half: known values") {
  CHECK(f32_to_f16(1.0f) == 0x3C00);
  CHECK(f32_to_f16(-2.0f) == 0xC000);
  CHECK(f32_to_f16(65504.0f) == 0x7BFF);
  CHECK(f32_to_f16(65519.99f) == 0x7BFF);
  CHECK(f32_to_f16(65520.0f) == 0x7C00);
  CHECK(f32_to_f16(-65520.0f) == 0xFC00);
  CHECK(f32_to_f16(FLT_MAX) == 0x7C00);
  CHECK(f32_to_f16(5.9604645e-8f) == 0x0001);
  CHECK(f32_to_f16(2.9802322e-8f) == 0x0000);  // 2^-25: tie -> even (zero)
  CHECK(f32_to_f16(2.9802326e-8f) == 0x0001);  // just above the tie
  CHECK(f32_to_f16(-1e-30f) == 0x8000);        // underflow keeps the sign
  CHECK(f32_to_f16(6.1035156e-5f) == 0x0400);
  CHECK(f32_to_f16(6.1035156e-5f - 2.9802322e-8f) == 0x0400);  // tie between 0x3FF and 0x400 -> even
  CHECK(f32_to_f16(1.0f + 1.0f / 2048) == 0x3C00);            // tie -> even
  CHECK(f32_to_f16(1.0f + 3.0f / 2048) == 0x3C02);            // tie -> even (up)
  CHECK(f32_to_f16(std::numeric_limits<float>::infinity()) == 0x7C00);
  CHECK(is_nan16(f32_to_f16(std::numeric_limits<float>::quiet_NaN())));
  CHECK(f32_to_f16(from_bits(0x7F800001u)) == 0x7E00);  // low-payload signaling NaN stays NaN
  CHECK(f32_to_f16(from_bits(0xFF800001u)) == 0xFE00);

  CHECK(f16_to_f32(0x0001) == 5.9604645e-8f);
  CHECK(f16_to_f32(0x03FF) == 6.0975552e-5f);
  CHECK(f16_to_f32(0x0400) == 6.1035156e-5f);
  CHECK(f16_to_f32(0x7BFF) == 65504.0f);
  CHECK(f16_to_f32(0x3C00) == 1.0f);
  CHECK(bits(f16_to_f32(0x8000)) == 0x80000000u);
  CHECK(f16_to_f32(0xFC00) == -std::numeric_limits<float>::infinity());
  CHECK(bits(f16_to_f32(0x7E01)) == 0x7FC02000u);

  CHECK(f32_to_bf16(1.0f) == 0x3F80);
  CHECK(f32_to_bf16(from_bits(0x3F808000u)) == 0x3F80);  // tie -> even (down)
  CHECK(f32_to_bf16(from_bits(0x3F818000u)) == 0x3F82);  // tie -> even (up)
  CHECK(f32_to_bf16(FLT_MAX) == 0x7F80);                 // rounds past the max -> inf
  CHECK(f32_to_bf16(from_bits(0x7F800001u)) == 0x7FC0);  // NaN with low payload stays NaN
  CHECK(f32_to_bf16(from_bits(0xFF812345u)) == 0xFFC1);
  CHECK(bf16_to_f32(0x3F80) == 1.0f);

  CHECK(round_to(DType::F32, 0.1f) == 0.1f);
  CHECK(round_to(DType::F16, 0.1f) == 0.0999755859375f);
  CHECK(round_to(DType::BF16, 0.1f) == 0.10009765625f);
  CHECK(round_to(DType::F16, 1e5f) == std::numeric_limits<float>::infinity());
  CHECK(round_to(DType::F16, 1e-8f) == 0.0f);
  CHECK(std::isnan(round_to(DType::BF16, std::numeric_limits<float>::quiet_NaN())));
  CHECK_THROWS(round_to(DType::I32, 1.0f));
}

// ---- 16-bit round trips --------------------------------------------------------------------

TEST_CASE("half: all float16 patterns round-trip through float32") {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = f16_to_f32(h);
    const uint16_t back = f32_to_f16(f);
    if (is_nan16(h)) {
      REQUIRE(std::isnan(f));
      REQUIRE(is_nan16(back));
      REQUIRE((back | 0x0200) == (h | 0x0200));  // same sign and payload, quiet bit set
    } else {
      REQUIRE(back == h);
      // The float32 value is the exact value of the pattern (independent decode).
      const double want = f16_value(h & 0x7FFF) * ((h & 0x8000) ? -1.0 : 1.0);
      if ((h & 0x7FFF) == 0x7C00) {
        REQUIRE(std::isinf(f));
      } else {
        REQUIRE(static_cast<double>(f) == want);
      }
      REQUIRE(std::signbit(f) == ((h & 0x8000) != 0));
    }
  }
}

TEST_CASE("half: f16->f32 matches F16C for all float16 patterns") {
  if (!have_f16c()) MPX_SKIP("this CPU has no F16C to compare against");
  std::vector<uint16_t> h(65536);
  for (uint32_t i = 0; i < 65536; ++i) h[i] = static_cast<uint16_t>(i);
  std::vector<float> hw(65536), fast(65536);
  hw_f16_to_f32(h.data(), hw.data(), h.size());
  convert(h.data(), DType::F16, fast.data(), DType::F32, h.size());
  size_t bad = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    if (bits(f16_to_f32(h[i])) != bits(hw[i]) || bits(fast[i]) != bits(hw[i])) ++bad;
  }
  CHECK(bad == 0);
}

TEST_CASE("half: all bfloat16 patterns round-trip through float32") {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = bf16_to_f32(h);
    const uint16_t back = f32_to_bf16(f);
    if (is_nan_bf16(h)) {
      REQUIRE(std::isnan(f));
      REQUIRE(is_nan_bf16(back));
      REQUIRE((back | 0x0040) == (h | 0x0040));
    } else {
      REQUIRE(back == h);
    }
  }
}

// ---- float32 -> float16 ---------------------------------------------------------------------

namespace {
void check_f16_against_hw_and_ref(const std::vector<float>& in) {
  std::vector<uint16_t> hw(in.size());
  const bool hw_ok = have_f16c();
  if (hw_ok) hw_f32_to_f16(in.data(), hw.data(), in.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < in.size() && mismatches < 20; ++i) {
    const uint16_t p = f32_to_f16(in[i]);
    const uint16_t r = ref_f32_to_f16(in[i]);
    if (p != r || (hw_ok && p != hw[i])) {
      ++mismatches;
      check_f16_equal(in[i], p, r);
      if (hw_ok) check_f16_equal(in[i], p, hw[i]);
    }
  }
  CHECK(mismatches == 0);
}
}  // namespace

TEST_CASE("half: f32->f16 edge values match F16C and the reference") {
  INFO("F16C available: " << have_f16c());
  check_f16_against_hw_and_ref(edge_values());
}

TEST_CASE("half: f32->f16 strided sweep of all float32 patterns matches F16C and the reference") {
  INFO("F16C available: " << have_f16c());
  check_f16_against_hw_and_ref(sweep_values());
}

TEST_CASE("half: f32->f16 on 1M random floats matches F16C and the reference") {
  INFO("F16C available: " << have_f16c());
  check_f16_against_hw_and_ref(random_values(size_t{1} << 20, 1234));
}

TEST_CASE("half: f32->f16 exhaustive over all 2^32 floats vs F16C", "[.][exhaustive]") {
  if (!have_f16c()) MPX_SKIP("this CPU has no F16C to compare against");
  constexpr size_t kBlock = size_t{1} << 20;
  std::vector<float> in(kBlock);
  std::vector<uint16_t> hw(kBlock), fast(kBlock);
  size_t mismatches = 0;
  for (uint64_t base = 0; base < (uint64_t{1} << 32); base += kBlock) {
    for (size_t i = 0; i < kBlock; ++i) in[i] = from_bits(static_cast<uint32_t>(base + i));
    hw_f32_to_f16(in.data(), hw.data(), kBlock);
    convert(in.data(), DType::F32, fast.data(), DType::F16, kBlock);
    for (size_t i = 0; i < kBlock; ++i) {
      const uint16_t p = f32_to_f16(in[i]);
      if (p != hw[i] || fast[i] != hw[i]) {
        if (++mismatches < 20) check_f16_equal(in[i], p, hw[i]);
      }
    }
  }
  CHECK(mismatches == 0);
}

// ---- float32 -> bfloat16 ------------------------------------------------------------------

namespace {
void check_bf16_against_ref(const std::vector<float>& in) {
  size_t mismatches = 0;
  for (size_t i = 0; i < in.size() && mismatches < 20; ++i) {
    const uint16_t p = f32_to_bf16(in[i]);
    const uint16_t r = ref_f32_to_bf16(in[i]);
    if (is_nan32(bits(in[i]))) {
      CHECK(is_nan_bf16(p));
      CHECK((p & 0x8000) == ((bits(in[i]) >> 16) & 0x8000));
    }
    if (p != r) {
      ++mismatches;
      INFO("input bits 0x" << std::hex << bits(in[i]) << " got 0x" << p << " want 0x" << r);
      CHECK(p == r);
    }
  }
  CHECK(mismatches == 0);
}
}  // namespace

TEST_CASE("half: f32->bf16 edge values match the reference") { check_bf16_against_ref(edge_values()); }

TEST_CASE("half: f32->bf16 strided sweep of all float32 patterns matches the reference") {
  check_bf16_against_ref(sweep_values());
}

TEST_CASE("half: f32->bf16 on 1M random floats matches the reference") {
  check_bf16_against_ref(random_values(size_t{1} << 20, 5678));
}

TEST_CASE("half: f32->bf16 exhaustive over all 2^32 floats: scalar vs bulk", "[.][exhaustive]") {
  constexpr size_t kBlock = size_t{1} << 20;
  std::vector<float> in(kBlock);
  std::vector<uint16_t> fast(kBlock);
  size_t mismatches = 0;
  for (uint64_t base = 0; base < (uint64_t{1} << 32); base += kBlock) {
    for (size_t i = 0; i < kBlock; ++i) in[i] = from_bits(static_cast<uint32_t>(base + i));
    convert(in.data(), DType::F32, fast.data(), DType::BF16, kBlock);
    for (size_t i = 0; i < kBlock; ++i) {
      if (fast[i] != f32_to_bf16(in[i])) ++mismatches;
    }
  }
  CHECK(mismatches == 0);
}

// ---- bulk convert ---------------------------------------------------------------------------

namespace {

const DType kFloatTypes[] = {DType::F32, DType::F16, DType::BF16};

// Source data of type t: float32 from the random mix plus edge values; 16-bit: random patterns.
std::vector<uint8_t> make_source(DType t, size_t n, uint64_t seed) {
  std::vector<uint8_t> buf(n * dtype_size(t));
  if (t == DType::F32) {
    std::vector<float> v = random_values(n, seed);
    const std::vector<float> e = edge_values();
    for (size_t i = 0; i < n && i < e.size(); ++i) v[(i * 7919) % n] = e[i];
    if (n > 0) std::memcpy(buf.data(), v.data(), buf.size());  // memcpy from an empty vector's null is UB
  } else {
    Rng rng(seed);
    auto* p = reinterpret_cast<uint16_t*>(buf.data());
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint16_t>(rng.next_u64());
  }
  return buf;
}

// Element i of buf (type t) widened to float32 bits, and the scalar conversion to dst_t as bits.
uint32_t scalar_convert(const std::vector<uint8_t>& buf, DType src_t, DType dst_t, size_t i) {
  float f;
  if (src_t == DType::F32) {
    std::memcpy(&f, buf.data() + 4 * i, 4);
  } else {
    uint16_t h;
    std::memcpy(&h, buf.data() + 2 * i, 2);
    f = src_t == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
  }
  switch (dst_t) {
    case DType::F16: return f32_to_f16(f);
    case DType::BF16: return f32_to_bf16(f);
    default: return bits(f);
  }
}

uint32_t element(const std::vector<uint8_t>& buf, DType t, size_t i) {
  if (t == DType::F32) {
    uint32_t u;
    std::memcpy(&u, buf.data() + 4 * i, 4);
    return u;
  }
  uint16_t h;
  std::memcpy(&h, buf.data() + 2 * i, 2);
  return h;
}

}  // namespace

TEST_CASE("half: bulk convert equals the scalar functions for every dtype pair and odd lengths") {
  INFO("F16C available: " << have_f16c());
  for (DType s : kFloatTypes) {
    for (DType d : kFloatTypes) {
      for (size_t n : {0, 1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 23, 31, 33, 63, 1023, 2049, 4099, 70001}) {
        INFO(dtype_name(s) << " -> " << dtype_name(d) << " n=" << n);
        const std::vector<uint8_t> src = make_source(s, n, 42 + n);
        std::vector<uint8_t> fast(n * dtype_size(d) + 64, 0xAB), port(n * dtype_size(d) + 64, 0xAB);
        convert(src.data(), s, fast.data(), d, n);
        convert_portable(src.data(), s, port.data(), d, n);
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) {
          const uint32_t want = s == d ? element(src, s, i) : scalar_convert(src, s, d, i);
          if (element(fast, d, i) != want || element(port, d, i) != want) ++bad;
        }
        CHECK(bad == 0);
        // Nothing written past the end.
        for (size_t i = n * dtype_size(d); i < fast.size(); ++i) {
          REQUIRE(fast[i] == 0xAB);
          REQUIRE(port[i] == 0xAB);
        }
      }
    }
  }
}

TEST_CASE("half: convert and convert_portable agree on 1M random values for every dtype pair") {
  INFO("F16C available: " << have_f16c());
  const size_t n = (size_t{1} << 20) + 13;  // above the parallel threshold, with a tail
  for (DType s : kFloatTypes) {
    const std::vector<uint8_t> src = make_source(s, n, 99);
    for (DType d : kFloatTypes) {
      INFO(dtype_name(s) << " -> " << dtype_name(d));
      std::vector<uint8_t> fast(n * dtype_size(d)), port(n * dtype_size(d));
      convert(src.data(), s, fast.data(), d, n);
      convert_portable(src.data(), s, port.data(), d, n);
      CHECK(std::memcmp(fast.data(), port.data(), fast.size()) == 0);
    }
  }
}

TEST_CASE("half: convert rejects non-float dtypes") {
  float f = 1.0f;
  int32_t i = 0;
  CHECK_THROWS(convert(&f, DType::F32, &i, DType::I32, 1));
  CHECK_THROWS(convert_portable(&i, DType::I32, &f, DType::F32, 1));
}

#ifdef MPX_TEST_X86
TEST_CASE("half: F16C conversions ignore FTZ/DAZ (oneDNN or -ffast-math may set them)") {
  // float16 subnormal results and inputs must survive flush-to-zero / denormals-are-zero.
  const std::vector<float> in = {5.9604645e-8f, -3e-6f, 6.0975552e-5f, 1e-7f, 1.0f, 1e-40f};
  const std::vector<uint16_t> h_in = {0x0001, 0x83FF, 0x0200, 0x3C00};
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);  // FTZ | DAZ
  std::vector<uint16_t> out(in.size());
  std::vector<float> back(h_in.size());
  convert(in.data(), DType::F32, out.data(), DType::F16, in.size());
  convert(h_in.data(), DType::F16, back.data(), DType::F32, h_in.size());
  _mm_setcsr(saved);
  for (size_t i = 0; i < in.size(); ++i) CHECK(out[i] == f32_to_f16(in[i]));
  for (size_t i = 0; i < h_in.size(); ++i) CHECK(bits(back[i]) == bits(f16_to_f32(h_in[i])));
}
#endif
