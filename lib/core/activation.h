// SPDX-License-Identifier: MIT
// Activation functions, each defined in this one file: its config name (Keras 3), its
// forward formula, its derivative, and which tensor its backward pass reads (the forward
// input or the forward output). The formulas are written once for the host and the
// device: the CPU backend's loops and the CUDA kernels call the same functions, in
// float32 (16-bit tensors are widened before and rounded once after).
// docs/contributing.md "Adding an activation" is the recipe for a new one.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

// Always inlined: the loops call them with a compile-time kind, and the switch must fold
// away for the loop to vectorize (a call per element is several times slower).
#if defined(__CUDACC__)
#define MPX_ACT_FN __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#define MPX_ACT_FN inline __attribute__((always_inline))
#else
#define MPX_ACT_FN inline
#endif

namespace mpx {

/// Every activation a layer can apply. None is the identity (Keras "linear"). Scale
/// (y = alpha x) has no config name: a dense layer's output_scale becomes it.
enum class ActKind : uint8_t { None, Relu, LeakyRelu, Gelu, GeluTanh, Silu, Scale };

/// The tensor an activation's backward pass reads besides dy.
enum class ActSaved : uint8_t {
  Nothing,  // the identity
  Output,   // the forward output y: exact where y determines act'(x) (relu, leaky_relu with slope >= 0)
  Input,    // the forward input x (the pre-activation): always exact, costs a kept buffer in fused layers
};

/// What activation_grad reads for `k`. Input is always right; Output only where the
/// derivative is an exact function of the (rounded) output.
constexpr ActSaved backward_reads(ActKind k) {
  switch (k) {
    case ActKind::None: return ActSaved::Nothing;
    case ActKind::Relu:
    case ActKind::LeakyRelu: return ActSaved::Output;  // y > 0 iff x > 0 (slope >= 0), also after rounding
    case ActKind::Scale: return ActSaved::Output;      // the derivative is alpha: y is passed, never read
    default: return ActSaved::Input;
  }
}

/// An activation with its parameter. alpha: leaky_relu's negative slope (>= 0), Scale's
/// factor; 0 otherwise.
struct Activation {
  ActKind kind = ActKind::None;
  float alpha = 0.0f;

  constexpr Activation() = default;
  constexpr Activation(ActKind k, float a = 0.0f) : kind(k), alpha(a) {}  // NOLINT: implicit from a kind

  constexpr ActSaved backward_reads() const { return mpx::backward_reads(kind); }
  constexpr bool is_none() const { return kind == ActKind::None; }
  friend constexpr bool operator==(Activation a, Activation b) { return a.kind == b.kind && a.alpha == b.alpha; }
  friend constexpr bool operator!=(Activation a, Activation b) { return !(a == b); }

  static const Activation None;
  static const Activation Relu;
};
inline constexpr Activation Activation::None{ActKind::None};
inline constexpr Activation Activation::Relu{ActKind::Relu};

/// Keras 3's default negative slope of the leaky_relu activation function
/// (keras.activations.leaky_relu; the Keras 2 LeakyReLU layer defaulted to alpha = 0.3).
constexpr float kLeakyReluDefaultSlope = 0.2f;

// ---- names ----------------------------------------------------------------------------

/// Config names (Keras 3 spellings; several may map to one kind): X(Enumerator, "name", ActKind).
/// The config's ActivationName enum is made from this list (config/enums.h), with softmax
/// added there: it is fused into the float32 loss, never applied by a layer (nn/sequence.cpp).
// clang-format off
#define MPX_ACTIVATION_ROWS(X)                                                               \
  X(Linear, "linear", None) X(Relu, "relu", Relu) X(LeakyRelu, "leaky_relu", LeakyRelu)      \
  X(Gelu, "gelu", Gelu)             /* Keras gelu(approximate=False): x Phi(x), the erf form */ \
  X(GeluTanh, "gelu_tanh", GeluTanh) /* Keras gelu(approximate=True): the tanh approximation */ \
  X(Silu, "silu", Silu) X(Swish, "swish", Silu) /* Keras: swish is silu's alias */
// clang-format on

struct ActivationEntry {
  const char* name;
  ActKind kind;
};
#define MPX_ACTIVATION_ENTRY_(E, name, kind) ActivationEntry{name, ActKind::kind},
inline constexpr ActivationEntry kActivationNames[] = {MPX_ACTIVATION_ROWS(MPX_ACTIVATION_ENTRY_)};
#undef MPX_ACTIVATION_ENTRY_

/// The kind of a config name; "" is linear; nullopt when unknown.
inline std::optional<ActKind> activation_kind(std::string_view name) {
  if (name.empty()) return ActKind::None;
  for (const ActivationEntry& a : kActivationNames)
    if (name == a.name) return a.kind;
  return std::nullopt;
}
/// The first config name of `k` ("linear" for None).
inline const char* activation_name(ActKind k) {
  for (const ActivationEntry& a : kActivationNames)
    if (a.kind == k) return a.name;
  return "?";
}
/// Every config name, in table order (the config's allowed values, with softmax added there).
inline std::vector<std::string> activation_names() {
  std::vector<std::string> v;
  for (const ActivationEntry& a : kActivationNames) v.emplace_back(a.name);
  return v;
}

// ---- the math (float32, host and device) ------------------------------------------------

namespace act_detail {
constexpr float kSqrtHalf = 0.70710678118654752440f;     // 1/sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;   // 1/sqrt(2 pi)
constexpr float kSqrt2OverPi = 0.79788456080286535588f;  // sqrt(2/pi)
constexpr float kGeluTanhCubic = 0.044715f;

// exp and erfc written as straight-line float32 arithmetic, the same on the host and the
// device: the CPU loops vectorize them (glibc's expf/erfcf are calls, several times slower
// per element), and both backends evaluate one formula. Their polynomials are Horner steps
// written as fused multiply-adds (fma_f), so every build gives the same bits with half the
// operations and half the dependency chain of a multiply and an add
// (docs/cpu-performance.md, "Fused multiply-adds in the activation formulas").

/// a * b + c rounded once. Spelled out, never left to the compiler's contraction (the CPU
/// loops are built with -ffp-contract=off): vfmadd in the AVX2 and AVX-512 builds (their
/// targets include FMA), glibc's fmaf in the baseline build (correctly rounded, so the same
/// bits, at a call per operation), __fmaf_rn on the device.
MPX_ACT_FN float fma_f(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}

/// 2^n for n in [-126, 127]. Other n (from an input the caller masks afterwards, e.g. NaN)
/// give some float, computed without undefined behaviour: the shift is on the unsigned bits.
MPX_ACT_FN float pow2i(int32_t n) {
  const uint32_t bits = static_cast<uint32_t>(n + 127) << 23;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

/// e^x within about 1 ulp (at most 1.003 over [-87, 88] against double): e^x = 2^n e^r
/// with n = round(x / ln 2) (the 1.5 * 2^23 trick), r = x - n ln 2 in two parts
/// (Cody-Waite), e^r by Cephes' expf polynomial, and 2^n as two factors so that every n in
/// [-151, 129] is exact: inf above 88.72, subnormals below
/// -87.34, 0 below -103.97, NaN stays NaN (the clamps keep it: comparisons with NaN are false).
MPX_ACT_FN float exp_f(float x) {
  const float x1 = x > 89.0f ? 89.0f : x;
  const float xc = x1 < -104.0f ? -104.0f : x1;
  const float n = fma_f(xc, 1.44269504088896341f, 12582912.0f) - 12582912.0f;
  const float r = fma_f(n, 2.12194440e-4f, fma_f(n, -0.693359375f, xc));
  float p = 1.9875691500e-4f;
  p = fma_f(p, r, 1.3981999507e-3f);
  p = fma_f(p, r, 8.3334519073e-3f);
  p = fma_f(p, r, 4.1665795894e-2f);
  p = fma_f(p, r, 1.6666665459e-1f);
  p = fma_f(p, r, 5.0000001201e-1f);
  p = fma_f(p, r * r, r) + 1.0f;
  // NaN (n == n fails) converts as 0: float-to-int of NaN is undefined behaviour; p is NaN anyway.
  const int32_t ni = n == n ? static_cast<int32_t>(n) : 0, n1 = ni >> 1;
  return p * pow2i(n1) * pow2i(ni - n1);
}

/// erfc(|x| / sqrt 2), and in e the factor e^(-x^2 / 2) that it shares with the normal
/// density (GELU's derivative needs both, from one exp): erfc(z) = t Q(t) e^(-z^2), z = |x| /
/// sqrt 2, t = 2 / (2 + z), where Q(t) = e^(z^2) erfc(z) / t is smooth on t in (0, 1] (it tends
/// to 1 / (2 sqrt(pi)) as z grows) and Q is mpx's polynomial fit of degree 10 to it, relative
/// error 1e-7 in these float32 Horner steps (docs/cpu-performance.md, "GELU from one exp"). The
/// square is -x/2 times x (one rounding). erfc(inf) = 0 with e = 0; NaN stays NaN.
MPX_ACT_FN float erfc_half_abs(float x, float& e) {
  const float t = 2.0f / (2.0f + fabsf(x) * kSqrtHalf);
  float q = 0.042353976517915726f;
  q = fma_f(q, t, -0.23086397349834442f);
  q = fma_f(q, t, 0.4861910343170166f);
  q = fma_f(q, t, -0.4469902813434601f);
  q = fma_f(q, t, 0.12709754705429077f);
  q = fma_f(q, t, -0.05723557621240616f);
  q = fma_f(q, t, 0.09300129115581512f);
  q = fma_f(q, t, 0.1753767430782318f);
  q = fma_f(q, t, 0.24688059091567993f);
  q = fma_f(q, t, 0.2820938527584076f);
  q = fma_f(q, t, 0.282094806432724f);
  e = exp_f((-0.5f * x) * x);
  return t * q * e;
}

/// Phi(x), the normal distribution function, from erfc_half_abs's value ec: ec / 2 below
/// zero, 1 - ec / 2 from zero up (no cancellation in the negative tail).
MPX_ACT_FN float normal_cdf(float x, float ec) { return 0.5f * (x < 0.0f ? ec : 2.0f - ec); }

/// sigmoid(v) = 1 / (1 + e^-v) and sigmoid(-v) = 1 - sigmoid(v) without the cancellation
/// of 1 - s, from one exp of -|v| (which never overflows) and one division.
MPX_ACT_FN void sigmoid_pair(float v, float& s, float& s_neg) {
  const float a = exp_f(-fabsf(v));
  const float q = 1.0f / (1.0f + a), aq = a * q;
  s = v < 0.0f ? aq : q;
  s_neg = v < 0.0f ? q : aq;
}
}  // namespace act_detail

/// y = act(x). NaN stays NaN (check_numerics must see it); formulas chosen to stay
/// accurate in the negative tails (no 1 + erf or 1 + tanh cancellation).
MPX_ACT_FN float activation_value(Activation a, float x) {
  using namespace act_detail;
  switch (a.kind) {
    case ActKind::None: return x;
    case ActKind::Relu: return x < 0.0f ? 0.0f : x;
    case ActKind::LeakyRelu: return x < 0.0f ? a.alpha * x : x;
    case ActKind::Scale: return a.alpha * x;
    case ActKind::Gelu: {  // x Phi(x)
      float e;
      return x * normal_cdf(x, erfc_half_abs(x, e));
    }
    case ActKind::GeluTanh: {  // 0.5 x (1 + tanh(u)) = x / (1 + e^-2u)
      const float u = kSqrt2OverPi * (x + kGeluTanhCubic * x * x * x);
      return x / (1.0f + exp_f(-2.0f * u));
    }
    case ActKind::Silu: return x / (1.0f + exp_f(-x));  // x sigmoid(x)
  }
  return x;
}

/// dx = dy * act'(x), where `saved` is the tensor backward_reads(a.kind) names: the output y
/// for relu / leaky_relu (relu: a dead unit gives +0 even for a non-finite dy), the input x
/// for the others.
MPX_ACT_FN float activation_grad(Activation a, float saved, float dy) {
  using namespace act_detail;
  switch (a.kind) {
    case ActKind::None: return dy;
    case ActKind::Relu: return saved > 0.0f ? dy : 0.0f;
    case ActKind::LeakyRelu: return saved > 0.0f ? dy : a.alpha * dy;
    case ActKind::Scale: return a.alpha * dy;
    case ActKind::Gelu: {  // Phi(x) + x phi(x), phi(x) = e^(-x^2/2) / sqrt(2 pi): one exp for both
      const float x = saved;
      float e;
      const float ec = erfc_half_abs(x, e);
      return dy * (normal_cdf(x, ec) + x * (kInvSqrt2Pi * e));
    }
    case ActKind::GeluTanh: {  // s + 2 x s (1 - s) u', s = sigmoid(2u)
      const float x = saved, x2 = x * x;
      const float u = kSqrt2OverPi * (x + kGeluTanhCubic * x2 * x);
      float s, s_neg;
      sigmoid_pair(2.0f * u, s, s_neg);
      const float t = s * s_neg;
      const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluTanhCubic * x2);
      return dy * (s + (t == 0.0f ? 0.0f : 2.0f * x * t * du));  // t == 0: saturated (du may be inf)
    }
    case ActKind::Silu: {  // s + x s (1 - s), s = sigmoid(x), 1 - s = sigmoid(-x) without cancellation
      const float x = saved;
      float s, s_neg;
      sigmoid_pair(x, s, s_neg);
      return dy * (s + x * s * s_neg);
    }
  }
  return dy;
}

/// Calls f(std::integral_constant<ActKind, K>{}) for K = k, so that a loop can be compiled
/// once per activation (the switch in activation_value/grad folds away). Host only.
template <typename F>
decltype(auto) with_activation_kind(ActKind k, F&& f) {
  switch (k) {
    case ActKind::Relu: return f(std::integral_constant<ActKind, ActKind::Relu>{});
    case ActKind::LeakyRelu: return f(std::integral_constant<ActKind, ActKind::LeakyRelu>{});
    case ActKind::Gelu: return f(std::integral_constant<ActKind, ActKind::Gelu>{});
    case ActKind::GeluTanh: return f(std::integral_constant<ActKind, ActKind::GeluTanh>{});
    case ActKind::Silu: return f(std::integral_constant<ActKind, ActKind::Silu>{});
    case ActKind::Scale: return f(std::integral_constant<ActKind, ActKind::Scale>{});
    case ActKind::None: break;
  }
  return f(std::integral_constant<ActKind, ActKind::None>{});
}

}  // namespace mpx
