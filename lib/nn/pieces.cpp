// SPDX-License-Identifier: MIT
// The forward in pieces of the batch (docs/cpu-performance.md, "Pieces of the batch"): which
// runs of a Sequence's steps take it, and running one; the Layer defaults for layers that do not.
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "core/env.h"
#include "nn/sequence.h"

namespace mpx::nn {

Tensor Layer::forward_rows(Context&, const Tensor&, int64_t, int64_t) {
  throw std::logic_error(name() + ": forward_rows on a layer that does not forward by rows");
}

Tensor Layer::forward_rows_done(const Tensor&) {
  throw std::logic_error(name() + ": forward_rows_done on a layer that does not forward by rows");
}

void Sequence::plan_pieces(const Context& c) {
  // The new last step, when it asks for pieces, and the steps before it that forward by rows
  // with no cast between them (the run's first step may have a cast: it runs on the whole
  // batch before the pieces). A run needs a layer that writes what the last one reads, not
  // reshapes alone, and MPX_CPU_FUSE=0 turns every plan-time fusion off, this one too.
  const size_t last = steps_.size() - 1;
  const int64_t rows = steps_[last].layer->input_piece_rows(c);
  if (rows <= 0 || !steps_[last].in_cast.empty() || !fuse_) return;
  const size_t floor = pieces_.empty() ? 0 : pieces_.back().last + 1;  // runs do not overlap
  size_t first = last;
  while (first > floor && steps_[first].in_cast.empty() && steps_[first - 1].layer->forwards_by_rows(c)) --first;
  // Reaching back to the run before, whose last layer may run in pieces too: one longer run.
  if (first == floor && floor > 0 && steps_[first].in_cast.empty() &&
      steps_[floor - 1].layer->forwards_by_rows(c)) {
    PieceRun& before = pieces_.back();
    before.last = last;
    before.rows = std::min(before.rows, rows);
    return;
  }
  bool writes = false;
  for (size_t i = first; i < last; ++i) writes = writes || !steps_[i].layer->passes_relu_through();
  if (writes) pieces_.push_back(PieceRun{first, last, rows});
}

std::vector<std::string> Sequence::piece_runs(bool fused) const {
  std::vector<std::string> out;
  for (const PieceRun& r : pieces_) {
    if (fused && std::find(conv_pool_.begin(), conv_pool_.end(), r.first) != conv_pool_.end()) continue;
    std::string names;
    for (size_t i = r.first; i <= r.last; ++i) names += (i > r.first ? " -> " : "") + steps_[i].layer->name();
    out.push_back(fmt::format("{} in pieces of {} rows", names, r.rows));
  }
  return out;
}

Tensor Sequence::forward_in_pieces(Context& c, const PieceRun& run, const Tensor& x) {
  // Each piece through every layer of the run, then the whole batch's views.
  const int64_t n = x.shape[0];
  for (int64_t b = 0; b < n; b += run.rows) {
    Tensor p = x.slice_rows(b, std::min(run.rows, n - b));
    for (size_t j = run.first; j <= run.last; ++j) p = steps_[j].layer->forward_rows(c, p, b, n);
  }
  Tensor h = x;
  for (size_t j = run.first; j <= run.last; ++j) {
    h = steps_[j].layer->forward_rows_done(h);
    steps_[j].layer->last_out = h;
  }
  return h;
}

}  // namespace mpx::nn
