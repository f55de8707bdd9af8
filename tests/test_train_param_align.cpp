// SPDX-License-Identifier: MIT
// Parameter alignment (docs/design.md "Parameter arenas"): every parameter of every
// arena starts 256-byte aligned on the CPU backend under each policy, the gaps hold
// zeros, and checkpoints of the packed layout (format version 1) still load, moved
// parameter by parameter into the aligned one.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "nn/model.h"
#include "support/gradcheck.h"
#include "support/run_files.h"
#include "support/scratch.h"
#include "support/train_options.h"
#include "train/train_state.h"
#include "train/trainer.h"
#include "weights/checkpoint_layout.h"

using namespace mpx;
using support::conv_layer;
using support::dense_layer;
using support::download_f32;
using support::make_layer;
using support::model_config;

namespace {

// Odd sizes everywhere: 3x3x3 -> 5 conv (135 + 5), batch norm of 5, dense 5 -> 7 -> 3.
Config odd_model() {
  return model_config({conv_layer(5, 3, 1, Padding::Same, ActivationName::Relu), make_layer(LayerType::BatchNorm),
                       make_layer(LayerType::GlobalAvgPool), dense_layer(7, ActivationName::Relu), dense_layer(3)});
}

uintptr_t addr(const Tensor& t, int64_t offset) {
  return reinterpret_cast<uintptr_t>(static_cast<const char*>(t.data) + offset * static_cast<int64_t>(dtype_size(t.dtype)));
}

/// The packed (version 1) arena of `aligned`, in m.params() order.
std::vector<float> packed(const Model& m, const std::vector<float>& aligned, bool trainable) {
  std::vector<float> out;
  for (const ParamInfo& p : m.params())
    if (p.trainable == trainable)
      out.insert(out.end(), aligned.begin() + p.offset, aligned.begin() + p.offset + p.shape.numel());
  return out;
}

}  // namespace

TEST_CASE("every parameter of every arena starts 256-byte aligned, gaps are zeros", "[param_align]") {
  for (Policy policy : {Policy::Float32, Policy::MixedFloat16, Policy::MixedBFloat16}) {
    INFO("policy " << policy_name(policy));
    auto be = create_backend("cpu");
    Model m(odd_model(), policy, *be, 6, 6, 3, 3, 2);
    m.init_params(3);
    CHECK(Model::param_alignment() * 2 % 256 == 0);
    int64_t trainable = 0, state = 0;
    for (const ParamInfo& p : m.params()) {
      INFO(p.layer << "/" << p.name);
      CHECK(p.offset % Model::param_alignment() == 0);
      if (p.trainable) {
        trainable += p.shape.numel();
        CHECK(addr(m.master(), p.offset) % 256 == 0);
        CHECK(addr(m.grads(), p.offset) % 256 == 0);
        if (!m.compute_copy().empty()) CHECK(addr(m.compute_copy(), p.offset) % 256 == 0);
      } else {
        state += p.shape.numel();
        CHECK(addr(m.state(), p.offset) % 256 == 0);
      }
    }
    CHECK(m.compute_copy().empty() == (policy == Policy::Float32));
    // The arenas are longer than the values by the gaps, and the gaps are zeros.
    CHECK(m.num_params() % Model::param_alignment() == 0);
    CHECK(m.num_params() > trainable);
    CHECK(m.num_state() >= state);
    const std::vector<float> master = download_f32(*be, m.master());
    std::vector<bool> used(master.size(), false);
    for (const ParamInfo& p : m.params())
      if (p.trainable)
        for (int64_t i = 0; i < p.shape.numel(); ++i) used[static_cast<size_t>(p.offset + i)] = true;
    int64_t gaps = 0, nonzero_gaps = 0;
    for (size_t i = 0; i < master.size(); ++i)
      if (!used[i]) ++gaps, nonzero_gaps += master[i] != 0.0f;
    CHECK(gaps == m.num_params() - trainable);
    CHECK(nonzero_gaps == 0);
    // The summary counts values, not gaps: conv 135 + 5, BN 5 + 5 (+ 10 state), dense 35 + 7, 21 + 3.
    CHECK(trainable == 135 + 5 + 10 + 42 + 24);
    CHECK(m.summary_table().find("Trainable params: 216") != std::string::npos);
    // The gradient ranges of the layers cover the arena, in pieces that start aligned.
    int64_t covered = 0;
    for (const GradRange& r : m.grad_ready_ranges()) {
      CHECK(r.offset % Model::param_alignment() == 0);
      covered += r.count;
    }
    CHECK(covered == m.num_params());
  }
}

TEST_CASE("a packed checkpoint (format version 1) loads into the aligned arenas", "[param_align][checkpoint]") {
  auto be = create_backend("cpu");
  Model src(odd_model(), Policy::MixedBFloat16, *be, 6, 6, 3, 3, 2);
  src.init_params(11);
  // Distinct non-zero moving statistics, so the state arena's moves are checked too.
  std::vector<float> st(static_cast<size_t>(src.num_state()), 0.0f);
  for (const ParamInfo& p : src.params())
    if (!p.trainable)
      for (int64_t i = 0; i < p.shape.numel(); ++i) st[static_cast<size_t>(p.offset + i)] = 1.5f + static_cast<float>(i);
  be->upload(src.state(), st.data());
  const std::vector<float> master = download_f32(*be, src.master());

  Checkpoint v1;
  v1.header.config_name = "odd";
  v1.header.policy = "mixed_bfloat16";
  v1.header.device = "cpu";
  v1.header.optimizer = "adam";
  v1.header.dataset = "synthetic";
  v1.header.batch_size = 2;
  v1.header.param_align = 1;
  v1.master = packed(src, master, true);
  v1.state = packed(src, st, false);
  std::vector<float> m1(v1.master.size()), m2;
  for (size_t i = 0; i < m1.size(); ++i) m1[i] = 0.001f * static_cast<float>(i + 1);
  v1.opt = {m1, m2};  // Adam's m, and an empty second arena
  v1.header.num_params = static_cast<int64_t>(v1.master.size());
  v1.header.num_state = static_cast<int64_t>(v1.state.size());
  v1.header.params = model_signature(src);
  support::ScratchDir dir;
  const std::string path = dir.file("v1.ckpt");
  save_checkpoint(path, v1);
  {
    std::ifstream f(path, std::ios::binary);
    std::string head(16, '\0');
    f.read(head.data(), 16);
    uint32_t version = 0;
    std::memcpy(&version, head.data() + 8, 4);
    CHECK(version == 1);  // what versions before the alignment wrote
  }
  const Checkpoint back = load_checkpoint(path);
  CHECK(back.header.param_align == 1);

  Model dst(odd_model(), Policy::MixedBFloat16, *be, 6, 6, 3, 3, 2);
  dst.init_params(99);
  restore_model(*be, dst, back, path, odd_model());
  CHECK(download_f32(*be, dst.master()) == master);
  CHECK(download_f32(*be, dst.state()) == st);

  const Checkpoint moved = in_model_layout(back, dst, path, "odd");
  CHECK(moved.header.param_align == Model::param_alignment());
  CHECK(moved.header.num_params == dst.num_params());
  REQUIRE(moved.opt.size() == 2);
  CHECK(moved.opt[1].empty());
  CHECK(packed(dst, moved.opt[0], true) == m1);  // every value at its parameter's new offset
  const ArenaLengths l = arena_lengths(dst, 1);
  CHECK(l.params == static_cast<int64_t>(m1.size()));

  // Saved again, the checkpoint is version 2 with the alignment in its header, and loads as is.
  save_checkpoint(dir.file("v2.ckpt"), moved);
  const Checkpoint v2 = load_checkpoint(dir.file("v2.ckpt"));
  CHECK(v2.header.param_align == Model::param_alignment());
  CHECK(v2.master == moved.master);
}

TEST_CASE("a packed checkpoint of another model is refused, naming both counts", "[param_align][checkpoint]") {
  auto be = create_backend("cpu");
  Model m(odd_model(), Policy::Float32, *be, 6, 6, 3, 3, 2);
  Checkpoint ck;
  ck.header.param_align = 1;
  ck.header.num_params = 215;  // one value short
  ck.header.num_state = 10;
  ck.master.assign(215, 0.0f);
  ck.state.assign(10, 0.0f);
  CHECK_THROWS_WITH(in_model_layout(ck, m, "x.ckpt", "odd"),
                    Catch::Contains("holds 215 parameters") && Catch::Contains("has 216 parameters"));
}

TEST_CASE("--resume from a packed checkpoint (format version 1) continues exactly as from the aligned one",
          "[param_align][checkpoint][resume]") {
  const std::string yaml =
      "name: align\nseed: 3\ndevice: cpu\npolicy: mixed_bfloat16\n"
      "data: {dataset: synthetic, batch_size: 16, synthetic_train: 64, synthetic_test: 16}\n"
      "optimizer: {name: adam}\ntrain: {epochs: 2}\n"
      "model:\n  layers:\n"
      "    - {type: conv2d, filters: 5, kernel: 3, activation: relu}\n"
      "    - {type: batch_norm}\n"
      "    - {type: global_avg_pool}\n"
      "    - {type: dense, units: 10, activation: softmax, dtype: float32}\n";
  const std::filesystem::path d = support::temp_dir("mpx_test_param_align", "resume");
  const Config first = parse_config(yaml, "align.yaml", {"train.max_steps=3"});
  REQUIRE(train(first, support::options(d / "a")).status == "completed");
  const std::string v2_path = (d / "a" / "checkpoints" / "last.ckpt").string();
  const Checkpoint v2 = load_checkpoint(v2_path);
  REQUIRE(v2.header.param_align == Model::param_alignment());
  REQUIRE(v2.opt.size() == 2);

  // The same checkpoint as a version 1 writer would have written it: every arena packed.
  auto be = create_backend("cpu");
  const Config full = parse_config(yaml, "align.yaml");
  Model m(full, Policy::MixedBFloat16, *be, 28, 28, 1, 10, 16);
  Checkpoint v1 = v2;
  v1.master = packed(m, v2.master, true);
  v1.state = packed(m, v2.state, false);
  for (auto& o : v1.opt) o = packed(m, o, true);
  v1.header.param_align = 1;
  v1.header.num_params = static_cast<int64_t>(v1.master.size());
  v1.header.num_state = static_cast<int64_t>(v1.state.size());
  CHECK(v1.header.num_params < v2.header.num_params);
  const std::string v1_path = (d / "v1.ckpt").string();
  save_checkpoint(v1_path, v1);

  const TrainResult from2 = train(full, support::options(d / "b", v2_path));
  const TrainResult from1 = train(full, support::options(d / "c", v1_path));
  REQUIRE(from2.status == "completed");
  REQUIRE(from1.status == "completed");
  CHECK(from1.steps == from2.steps);
  CHECK(from1.final_train_loss == from2.final_train_loss);
  CHECK(from1.final_test_accuracy == from2.final_test_accuracy);
  const Checkpoint end2 = load_checkpoint((d / "b" / "checkpoints" / "last.ckpt").string());
  const Checkpoint end1 = load_checkpoint((d / "c" / "checkpoints" / "last.ckpt").string());
  CHECK(end1.master == end2.master);
  CHECK(end1.state == end2.state);
  CHECK(end1.opt == end2.opt);
  CHECK(end1.header.param_align == Model::param_alignment());  // saved again as version 2
  std::filesystem::remove_all(d);
}
