// SPDX-License-Identifier: MIT
// Model weights <-> float32 safetensors files, in the names and tensor layouts
// of Keras or PyTorch (`mpx export`, `weights.init_from`, `mpx eval --weights`).
//
// Each parameter's row is the ExportLayout its layer declares with it (nn/model.h); a
// layer with a layout of its own declares its transposes (ExportLayout::Permuted; the
// rows of every layer are in docs/weights.md):
//
//   mpx parameter (ParamInfo)       keras                           pytorch
//   conv kernel [K, R, S, C]        <layer>/kernel [R, S, C, K]      <layer>.weight [K, C, R, S]
//   dense kernel [Cout, Cin]        <layer>/kernel [Cin, Cout]       <layer>.weight [Cout, Cin] (*)
//   bias [K]                        <layer>/bias                     <layer>.bias
//   batch_norm gamma / beta         <layer>/gamma, <layer>/beta      <layer>.weight, <layer>.bias
//   moving_mean / moving_variance   <layer>/moving_mean, ...         <layer>.running_mean, .running_var
//
// (*) mpx (like Keras) flattens NHWC activations in (h, w, c) order, PyTorch
// flattens NCHW in (c, h, w) order: in the pytorch layout the input columns of a
// dense layer fed by a flatten of an [H, W, C] map (and the vectors of a
// batch_norm between them) are reordered, so the file loads into the PyTorch net
// written the usual way (nn.Flatten() on NCHW, then nn.Linear).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "io/safetensors.h"
#include "nn/model.h"

namespace mpx {

enum class WeightsLayout { Keras, PyTorch };
const char* weights_layout_name(WeightsLayout l);  // "keras" | "pytorch"
std::optional<WeightsLayout> parse_weights_layout(const std::string& s);

/// @brief Where one model parameter goes in a file of a given layout.
struct WeightSlot {
  size_t param = 0;             // index into Model::params()
  std::string name;             // tensor name in the file
  std::vector<int64_t> shape;   // tensor shape in the file
  /// file element i holds model element perm[i] (of the parameter); empty = identity.
  std::vector<int64_t> perm;
};

/// @brief The name, shape and element order of every parameter (trainable and
/// batch-norm state) of `m` in `layout`. `input` is the model's per-sample input
/// [H, W, C] (needed for the flatten reordering of the pytorch layout).
std::vector<WeightSlot> weight_slots(const Model& m, const Config& cfg, const Shape& input, WeightsLayout layout);

/// @brief The model's float32 master weights and batch-norm statistics as a
/// safetensors file in `layout`; `metadata` is added to the header (the layout
/// is recorded as "layout").
StFile export_weights(const Model& m, Backend& be, const Config& cfg, const Shape& input, WeightsLayout layout,
                      std::map<std::string, std::string> metadata);

/**
 * @brief Loads a safetensors file (either layout: the "layout" metadata, else
 * guessed from the names) into `m`: every parameter must be present with its
 * shape and a float dtype (F32 as is, F16/BF16 widened); a tensor that is not a
 * parameter of the model is an error too (PyTorch's `num_batches_tracked`
 * counters excepted). The first mismatch is a ConfigError (exit 2) naming the
 * file and the tensor. Refreshes the 16-bit compute copy. Returns the layout read.
 */
WeightsLayout import_weights(Model& m, Backend& be, const Config& cfg, const Shape& input, const std::string& path);
/// The same from an already parsed file; `source` names it in messages.
WeightsLayout import_weights(Model& m, Backend& be, const Config& cfg, const Shape& input, const StFile& f,
                             const std::string& source);



}  // namespace mpx
