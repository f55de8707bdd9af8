// SPDX-License-Identifier: MIT
// The plan-time fusions of a Sequence around a convolution: its training forward in one op with
// the max pooling after it (docs/cpu-performance.md, "The first convolution's forward with max
// pooling"), and its weight gradients in the backward op of the layer after it ("Max pooling's
// backward in the first convolution's weight gradient", "The first convolution's weight gradient
// in the dense walk").
#include <fmt/format.h>

#include <stdexcept>

#include "nn/sequence.h"

namespace mpx::nn {

Tensor Layer::forward_with_conv(Context&, const Tensor&, Layer&) {
  throw std::logic_error(name() + ": forward_with_conv on a layer that does not take a convolution's forward");
}

void Sequence::plan_conv_pool(const Context& c) {
  // The new last step and the one before it, with no cast between them; MPX_CPU_FUSE=0 turns
  // this off as every plan-time fusion.
  const size_t last = steps_.size() - 1;
  if (last == 0 || !fuse_ || !steps_[last].in_cast.empty()) return;
  const Layer& conv = *steps_[last - 1].layer;
  if (conv.conv_forward_window() && steps_[last].layer->takes_conv_forward(c, conv)) conv_pool_.push_back(last - 1);
}

std::vector<std::string> Sequence::conv_pool_runs() const {
  std::vector<std::string> out;
  for (const size_t i : conv_pool_)
    out.push_back(fmt::format("{} -> {} in one op", steps_[i].layer->name(), steps_[i + 1].layer->name()));
  return out;
}

size_t Sequence::conv_grads_taker(size_t first) const {
  if (!fuse_ || first + 1 >= steps_.size() || !steps_[first].layer->gives_conv_weight_grads()) return 0;
  const Step& next = steps_[first + 1];
  if (!next.in_cast.empty()) return 0;
  if (next.layer->takes_conv_weight_grads()) return first + 1;  // a max pooling
  if (first + 2 >= steps_.size() || !next.layer->passes_relu_through()) return 0;
  const Step& dense = steps_[first + 2];  // a dense layer after a reshape
  return dense.in_cast.empty() && dense.layer->takes_conv_weight_grads() ? first + 2 : 0;
}

}  // namespace mpx::nn
