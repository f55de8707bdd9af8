// SPDX-License-Identifier: MIT
// Test-set evaluation: the loop shared by training (each evaluated epoch),
// `mpx eval --checkpoint` and `mpx eval --weights` (commands/eval.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "data/dataset.h"
#include "dist/communicator.h"
#include "nn/model.h"
#include "train/batch.h"

namespace mpx {

struct EvalResult {
  double loss = 0, accuracy = 0;
  int64_t count = 0;
  std::string policy;
  /// confusion[t * num_classes + p]: records of true class t predicted as p (the argmax of
  /// the logits, the first one on ties).
  int num_classes = 0;
  std::vector<int64_t> confusion;
  /// Per class: the diagonal over the row sum (NaN for a class with no record).
  std::vector<double> per_class_accuracy() const;
};

/// Called after each batch with the records done and the records of this rank's slice.
using EvalProgress = std::function<void(int64_t done, int64_t total)>;

/// @brief Evaluates `model` (inference mode) over the whole of `ds`; loss summed in double.
/// With several ranks each evaluates a contiguous slice of `ds` and the sums are all-reduced.
/// `tta`: the logits of each record are the weighted mean of the logits of its views
/// (docs/fast-cifar.md, "Test-time augmentation"), and the loss and accuracy are those of
/// the mean, computed on the host in float64. `logits_out` (tests): this rank's records'
/// logits (the mean under tta), n x classes float32, in record order.
EvalResult evaluate_model(Backend& be, Model& model, BatchBuffers& bb, const Dataset& ds, Communicator* comm = nullptr,
                          const EvalProgress& progress = nullptr, TtaMode tta = TtaMode::None,
                          std::vector<float>* logits_out = nullptr);

/// One view of test-time augmentation: the image translated by `shift` pixels on both axes
/// (reflected at the edges: output pixel (h, w) is input pixel (h + shift, w + shift)), then
/// mirrored left-right when `flip`, and its weight in the mean.
struct TtaView {
  int shift = 0;
  bool flip = false;
  double weight = 1.0;
};
/// The views of a mode (none: the image itself, weight 1).
std::vector<TtaView> tta_views(TtaMode mode);
/// Writes view v of one H x W x C uint8 image.
void tta_apply(const TtaView& v, const uint8_t* src, int H, int W, int C, uint8_t* dst);

}  // namespace mpx
