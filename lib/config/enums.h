// SPDX-License-Identifier: MIT
// The closed sets of the config (policy, layer type, optimizer, schedule,
// padding, activation, ...). Each is ONE list below: the enum and its
// name <-> value table are both generated from it, and the reader, the YAML
// writer, the error messages and docs/config.md all use that table. Adding a
// value (say an activation) is one line in its list; the code that acts on the
// value (a switch in lib/nn or lib/train) is the only other place to touch.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/activation.h"
#include "core/optimizer_kind.h"

namespace mpx {

template <class E>
struct EnumEntry {
  E value;
  const char* name;
};

/// Specialised by MPX_DEFINE_ENUM: `table` lists {value, "name"} in the order
/// messages and docs show them.
template <class E>
struct EnumTraits {};

template <class E, class = void>
struct HasEnumTable : std::false_type {};
template <class E>
struct HasEnumTable<E, std::void_t<decltype(EnumTraits<E>::table)>> : std::true_type {};

// Rows may carry more columns after the name (core/activation.h's list does); they are ignored here.
#define MPX_ENUM_ID_(id, text, ...) id,
#define MPX_ENUM_ROW_(id, text, ...) {Self::id, text},
#define MPX_DEFINE_ENUM(E, LIST)                                   \
  enum class E { LIST(MPX_ENUM_ID_) };                             \
  template <>                                                      \
  struct EnumTraits<E> {                                           \
    using Self = E;                                                \
    static constexpr EnumEntry<E> table[] = {LIST(MPX_ENUM_ROW_)}; \
  };

// clang-format off
#define MPX_POLICIES(X) \
  X(Float32, "float32") X(MixedFloat16, "mixed_float16") X(MixedBFloat16, "mixed_bfloat16") X(Auto, "auto")
#define MPX_LOSS_SCALE_MODES(X) X(Dynamic, "dynamic") X(Fixed, "fixed") X(None, "none")
#define MPX_DATASETS(X) \
  X(Mnist, "mnist") X(FashionMnist, "fashion_mnist") X(Cifar10, "cifar10") X(Synthetic, "synthetic")
/// A layer's `dtype:`: a policy name, or the bare 16-bit dtype (same meaning; kept as written).
#define MPX_LAYER_DTYPES(X)                                                                       \
  X(Float32, "float32") X(MixedFloat16, "mixed_float16") X(MixedBFloat16, "mixed_bfloat16")       \
  X(Float16, "float16") X(BFloat16, "bfloat16")
#define MPX_PADDINGS(X) X(Same, "same") X(Valid, "valid")
/// core/activation.h's names (one list for the kernels and the config), and softmax.
#define MPX_ACTIVATIONS(X) MPX_ACTIVATION_ROWS(X) X(Softmax, "softmax")
/// core/optimizer_kind.h's names (one list for the fused updates and the config).
#define MPX_OPTIMIZERS(X) MPX_OPTIMIZER_ROWS(X)
#define MPX_SCHEDULES(X) \
  X(Constant, "constant") X(Step, "step") X(Cosine, "cosine") X(ReduceOnPlateau, "reduce_on_plateau") \
  X(Triangular, "triangular")
#define MPX_SYNC_MODES(X) X(Auto, "auto") X(Step, "step") X(Log, "log")
#define MPX_EVAL_POLICIES(X) X(Same, "same") X(Float32, "float32")
#define MPX_OVERLAP_MODES(X) X(Auto, "auto") X(On, "on") X(Off, "off")
#define MPX_CONV_ALGOS(X) X(Heuristic, "heuristic") X(Search, "search")
#define MPX_CPU_WINOGRAD(X) X(Auto, "auto") X(Off, "off") X(On, "on") X(F2, "f2")
#define MPX_PAD_MODES(X) X(Zeros, "zeros") X(Reflect, "reflect")
#define MPX_KERNEL_INITS(X) X(GlorotUniform, "glorot_uniform") X(Dirac, "dirac") X(PatchWhitening, "patch_whitening")
#define MPX_TTA_MODES(X) X(None, "none") X(Mirror, "mirror") X(MirrorTranslate, "mirror_translate")
#define MPX_FLIP_MODES(X) X(Random, "random") X(Alternating, "alternating")
#define MPX_EARLY_STOP_MONITORS(X) X(None, "none") X(ValLoss, "val_loss") X(ValAccuracy, "val_accuracy")
// clang-format on

MPX_DEFINE_ENUM(Policy, MPX_POLICIES)
MPX_DEFINE_ENUM(LossScaleMode, MPX_LOSS_SCALE_MODES)
MPX_DEFINE_ENUM(DatasetName, MPX_DATASETS)
/// A layer's `type:`, one value per row of config/layer_table.inc.
enum class LayerType {
#define MPX_LAYER(id, ...) id,
#include "config/layer_table.inc"
};
template <>
struct EnumTraits<LayerType> {
  using Self = LayerType;
  static constexpr EnumEntry<LayerType> table[] = {
#define MPX_LAYER(id, text, ...) {Self::id, text},
#include "config/layer_table.inc"
  };
};

/// The keys a layer type has in common with other types (the layer table's `shares`).
enum LayerShares : uint32_t {
  kConvWindow = 1u << 0,  // kernel, strides (a convolution's window)
  kPoolWindow = 1u << 1,  // pool_size, strides (a pooling window; strides default to pool_size)
  kPadding = 1u << 2,     // padding
  kBias = 1u << 3,        // use_bias
  kActivation = 1u << 4,  // activation, negative_slope
};

/// The layer table's `shares` of `t`.
constexpr uint32_t layer_shares(LayerType t) {
  switch (t) {
#define MPX_LAYER(id, text, factory, shares) \
  case LayerType::id:                        \
    return shares;
#include "config/layer_table.inc"
  }
  return 0;
}

/// A bit per LayerType (bit static_cast<int>(t)) of the types whose shares include `flags`.
constexpr uint32_t layer_types_sharing(uint32_t flags) {
  uint32_t mask = 0;
  for (const auto& r : EnumTraits<LayerType>::table)
    if ((layer_shares(r.value) & flags) == flags) mask |= 1u << static_cast<int>(r.value);
  return mask;
}
MPX_DEFINE_ENUM(LayerDType, MPX_LAYER_DTYPES)
MPX_DEFINE_ENUM(Padding, MPX_PADDINGS)
/// A layer's `activation:` (lib/backend's Activation is the fused op it becomes).
MPX_DEFINE_ENUM(ActivationName, MPX_ACTIVATIONS)
MPX_DEFINE_ENUM(OptimizerName, MPX_OPTIMIZERS)
MPX_DEFINE_ENUM(ScheduleName, MPX_SCHEDULES)
MPX_DEFINE_ENUM(SyncMode, MPX_SYNC_MODES)
MPX_DEFINE_ENUM(EvalPolicy, MPX_EVAL_POLICIES)
MPX_DEFINE_ENUM(OverlapMode, MPX_OVERLAP_MODES)
MPX_DEFINE_ENUM(ConvAlgo, MPX_CONV_ALGOS)
MPX_DEFINE_ENUM(CpuWinograd, MPX_CPU_WINOGRAD)
/// A conv2d layer's kernel_initializer (docs/fast-cifar.md, "Dirac initialization").
MPX_DEFINE_ENUM(KernelInit, MPX_KERNEL_INITS)
/// data.augment.padding_mode: what the random crop sees outside the image.
MPX_DEFINE_ENUM(PadMode, MPX_PAD_MODES)
/// data.augment.flip_mode: a fresh coin every epoch, or each image's first coin alternated.
MPX_DEFINE_ENUM(FlipMode, MPX_FLIP_MODES)
MPX_DEFINE_ENUM(EarlyStopMonitor, MPX_EARLY_STOP_MONITORS)
/// train.tta: the views every evaluation averages.
MPX_DEFINE_ENUM(TtaMode, MPX_TTA_MODES)

/// The config spelling of `e` ("conv2d", "mixed_float16", ...).
template <class E>
const char* enum_name(E e) {
  for (const auto& r : EnumTraits<E>::table)
    if (r.value == e) return r.name;
  return "?";
}

/// The inverse of enum_name; nullopt for a name not in the table.
template <class E>
std::optional<E> parse_enum(std::string_view s) {
  for (const auto& r : EnumTraits<E>::table)
    if (s == r.name) return r.value;
  return std::nullopt;
}

/// Every name, in table order.
template <class E>
std::vector<std::string> enum_names() {
  std::vector<std::string> out;
  for (const auto& r : EnumTraits<E>::table) out.emplace_back(r.name);
  return out;
}

/// Every value, in table order.
template <class E>
std::vector<E> enum_values() {
  std::vector<E> out;
  for (const auto& r : EnumTraits<E>::table) out.push_back(r.value);
  return out;
}

}  // namespace mpx

/// fmt::format("{}", LayerType::Conv2d) == "conv2d": every config enum formats as its name.
template <class E>
struct fmt::formatter<E, char, std::enable_if_t<mpx::HasEnumTable<E>::value>> : fmt::formatter<fmt::string_view> {
  template <class Ctx>
  auto format(E e, Ctx& ctx) const {
    return fmt::formatter<fmt::string_view>::format(mpx::enum_name(e), ctx);
  }
};
