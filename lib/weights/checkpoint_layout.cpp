// SPDX-License-Identifier: MIT
// Moving checkpoint arenas between parameter alignments (checkpoint_layout.h).
#include "weights/checkpoint_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace mpx {

namespace {

int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

/// Offset of every parameter (in m.params() order) in a layout of alignment `align`.
std::vector<int64_t> offsets_for(const Model& m, int64_t align, ArenaLengths* lengths) {
  std::vector<int64_t> out;
  int64_t end_t = 0, end_s = 0;
  for (const ParamInfo& p : m.params()) {
    int64_t& end = p.trainable ? end_t : end_s;
    const int64_t off = align_up(end, align);
    out.push_back(off);
    end = off + p.shape.numel();
  }
  if (lengths) *lengths = {align_up(end_t, align), align_up(end_s, align)};
  return out;
}

std::vector<float> move_arena(const std::vector<float>& from, const Model& m, const std::vector<int64_t>& old_offsets,
                              bool trainable, int64_t new_length) {
  if (from.empty()) return {};
  std::vector<float> to(static_cast<size_t>(new_length), 0.0f);
  const std::vector<ParamInfo>& ps = m.params();
  for (size_t i = 0; i < ps.size(); ++i) {
    if (ps[i].trainable != trainable) continue;
    const auto src = from.begin() + old_offsets[i];
    std::copy(src, src + ps[i].shape.numel(), to.begin() + ps[i].offset);
  }
  return to;
}

}  // namespace

ArenaLengths arena_lengths(const Model& m, int64_t align) {
  ArenaLengths l;
  offsets_for(m, align, &l);
  return l;
}

Checkpoint in_model_layout(const Checkpoint& ck, const Model& m, const std::string& path,
                           const std::string& config_name) {
  const CheckpointHeader& h = ck.header;
  ArenaLengths theirs;
  const std::vector<int64_t> old_offsets = offsets_for(m, h.param_align, &theirs);
  if (h.num_params != theirs.params || h.num_state != theirs.state) {
    throw ConfigError(fmt::format(
        "checkpoint '{}' (config '{}') holds {} parameters and {} state values, but the model of config '{}' has {} "
        "parameters and {} state values: the checkpoint was written for another model",
        path, h.config_name, h.num_params, h.num_state, config_name, theirs.params, theirs.state));
  }
  Checkpoint out = ck;
  const int64_t mine = Model::param_alignment();
  if (h.param_align == mine) return out;
  out.master = move_arena(ck.master, m, old_offsets, true, m.num_params());
  out.state = move_arena(ck.state, m, old_offsets, false, m.num_state());
  for (size_t k = 0; k < ck.opt.size(); ++k) {
    // Each optimizer arena is empty or parallel to master.
    if (!ck.opt[k].empty() && static_cast<int64_t>(ck.opt[k].size()) != h.num_params)
      throw DataError(fmt::format("checkpoint '{}': optimizer arena {} holds {} values, not 0 or {} (damaged file)",
                                  path, k + 1, ck.opt[k].size(), h.num_params));
    out.opt[k] = move_arena(ck.opt[k], m, old_offsets, true, m.num_params());
  }
  out.header.num_params = m.num_params();
  out.header.num_state = m.num_state();
  out.header.param_align = mine;
  return out;
}

}  // namespace mpx
