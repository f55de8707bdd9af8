// SPDX-License-Identifier: MIT
// The forward in pieces of the batch (docs/cpu-performance.md, "Pieces of the batch"): the
// first layers' convolutions (and flatten, max pooling) that feed a float32 dense layer with few
// outputs and a long input, or a float32 max pooling, run piece after piece with it. A model's outputs, loss gradients and input gradient are the same bits with
// the pieces on and off (MPX_CPU_PIECES=off), for a batch of whole pieces, one with a partial
// last piece and one smaller than a piece; the run is planned only where the rule allows it
// (a float32 input of at least 8,192 features and at most 16 outputs, or a float32 max pooling
// on the tiled kernels; convolutions of the first layers' shapes; no cast inside the run)
// and names its layers (MPX_CPU_PIECES=on: a 16-bit input too); the CPU backend's rule
// answers as documented.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "nn/model.h"
#include "support/gradcheck.h"

using namespace mpx;
using support::conv_layer;
using support::dense_layer;
using support::make_layer;

namespace {

struct Pieces {
  explicit Pieces(const char* v) { v ? setenv("MPX_CPU_PIECES", v, 1) : unsetenv("MPX_CPU_PIECES"); }
  ~Pieces() { unsetenv("MPX_CPU_PIECES"); }
};

// The seed MNIST net's first layer: 28x28x1 -> 26x26x32, 21,632 features for the dense layer.
constexpr int kH = 28, kW = 28, kC = 1, kClasses = 10, kMaxBatch = 37;

struct Result {
  std::vector<std::string> runs;
  std::vector<std::vector<float>> outputs;  // every layer's, in execution order
  std::vector<float> grads, input_grad;
};

Result run(const std::vector<LayerConfig>& layers, Policy policy, const char* pieces, int64_t n) {
  Pieces p(pieces);
  Result r;
  auto be = create_backend("cpu");
  Model m(support::model_config(layers), policy, *be, kH, kW, kC, kClasses, kMaxBatch);
  m.init_params(5);
  // Every layer's output is read below: written in the training forward too, so that a
  // convolution and the max pooling after it run in pieces rather than in one op.
  m.keep_layer_outputs(true);
  r.runs = m.piece_runs();
  const std::vector<float> xh = support::random_vec(static_cast<size_t>(n * kH * kW * kC), 3, -2.0, 2.0);
  const std::vector<float> ph = support::random_vec(static_cast<size_t>(n * kClasses), 4);
  Buffer xb = be->alloc(xh.size() * 4, "test input"), pb = be->alloc(ph.size() * 4, "test projection");
  const Tensor x = xb.view(DType::F32, Shape{n, kH, kW, kC}), proj = pb.view(DType::F32, Shape{n, kClasses});
  be->upload(x, xh.data());
  be->upload(proj, ph.data());
  m.forward_float(x, true, 7, 3);
  for (const LayerTensors& t : m.layer_tensors()) r.outputs.push_back(support::download_f32(*be, t.output));
  m.backward(proj);
  r.grads = support::download_f32(*be, m.grads());
  r.input_grad = support::download_f32(*be, m.input_grad());
  return r;
}

void same_bits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  INFO(what);
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

void same_results(const Result& a, const Result& b) {
  REQUIRE(a.outputs.size() == b.outputs.size());
  for (size_t i = 0; i < a.outputs.size(); ++i) same_bits(a.outputs[i], b.outputs[i], "output " + std::to_string(i));
  same_bits(a.grads, b.grads, "weight gradients");
  same_bits(a.input_grad, b.input_grad, "input gradient");
}

LayerConfig named(LayerConfig l, const char* name) {
  l.name = name;
  return l;
}
LayerConfig with_dtype(LayerConfig l, LayerDType t) {
  l.dtype = t;
  return l;
}
LayerConfig relu_conv(int64_t filters, int kernel = 3) {
  return conv_layer(filters, kernel, 1, Padding::Valid, ActivationName::Relu);
}

}  // namespace

TEST_CASE("the forward in pieces, before a max pooling: the same bits as the whole batch", "[nn][pieces]") {
  // The MNIST smoke net: conv(relu) -> max_pool 2 -> flatten -> dense(10), float32; the
  // pooling's input in pieces (its dense layer's 5,408 inputs are too few for a run of its own).
  const std::vector<LayerConfig> smoke = {named(relu_conv(32), "conv"),
                                          named(support::pool_layer(LayerType::MaxPool, 2), "pool"),
                                          named(make_layer(LayerType::Flatten), "flat"),
                                          named(dense_layer(kClasses), "logits")};
  for (const int64_t n : {int64_t{32}, int64_t{kMaxBatch}, int64_t{5}}) {
    INFO("batch " << n);
    const Result on = run(smoke, Policy::Float32, nullptr, n), off = run(smoke, Policy::Float32, "off", n);
    REQUIRE(on.runs == std::vector<std::string>{"conv -> pool in pieces of 16 rows"});
    CHECK(off.runs.empty());
    same_results(on, off);
    // mixed_bfloat16: whole batches by the rule; with `on` the bfloat16 dense layer (on the
    // few-output loops) asks too, and the run reaches it; the same bits.
    const Result on16 = run(smoke, Policy::MixedBFloat16, "on", n);
    CHECK(on16.runs == std::vector<std::string>{"conv -> pool -> flat -> logits in pieces of 16 rows"});
    CHECK(run(smoke, Policy::MixedBFloat16, nullptr, n).runs.empty());
    same_results(on16, run(smoke, Policy::MixedBFloat16, "off", n));
  }
}

TEST_CASE("the forward in pieces: the same bits as the whole batch", "[nn][pieces]") {
  // The seed MNIST net: conv(relu) -> flatten -> dense(10), float32.
  const std::vector<LayerConfig> seed = {named(relu_conv(32), "conv"), named(make_layer(LayerType::Flatten), "flat"),
                                         named(dense_layer(kClasses), "logits")};
  for (const int64_t n : {int64_t{32}, int64_t{kMaxBatch}, int64_t{5}}) {
    INFO("batch " << n);
    const Result on = run(seed, Policy::Float32, nullptr, n), off = run(seed, Policy::Float32, "off", n);
    REQUIRE(on.runs == std::vector<std::string>{"conv -> flat -> logits in pieces of 16 rows"});
    CHECK(off.runs.empty());
    same_results(on, off);
    // MPX_CPU_PIECES=on: the seed net under mixed_bfloat16, its float32 classifier reading the
    // conv's bfloat16 output as it is, in pieces too, with the same bits.
    const std::vector<LayerConfig> seed16 = {seed[0], seed[1], with_dtype(seed[2], LayerDType::Float32)};
    const Result on16 = run(seed16, Policy::MixedBFloat16, "on", n),
                 off16 = run(seed16, Policy::MixedBFloat16, "off", n);
    CHECK(on16.runs == on.runs);
    CHECK(run(seed16, Policy::MixedBFloat16, nullptr, n).runs.empty());
    same_results(on16, off16);
    // And against the whole batch the other way: MPX_CPU_FUSE=0 turns every plan-time fusion off.
    setenv("MPX_CPU_FUSE", "0", 1);
    const Result unfused = run(seed, Policy::Float32, nullptr, n);
    unsetenv("MPX_CPU_FUSE");
    CHECK(unfused.runs.empty());
    REQUIRE(unfused.outputs.size() == on.outputs.size());
    for (size_t i = 0; i < on.outputs.size(); ++i)
      same_bits(on.outputs[i], unfused.outputs[i], "output " + std::to_string(i) + " unfused");
  }
}

TEST_CASE("the forward in pieces: runs start after a cast and stop at layers that do not forward by rows",
          "[nn][pieces]") {
  const LayerConfig pool = support::pool_layer(LayerType::MaxPool, 2);
  LayerConfig dropout = make_layer(LayerType::Dropout);
  dropout.rate = 0.25;
  struct Case {
    std::vector<LayerConfig> layers;
    Policy policy;
    std::vector<std::string> runs;
  };
  const std::vector<Case> cases = {
      // A bfloat16 conv, then a float32 1x1 conv (a cast into it), flatten, dense: the run
      // starts at the float32 conv, whose input is cast for the whole batch first.
      {{named(with_dtype(relu_conv(4), LayerDType::BFloat16), "c16"),
        named(with_dtype(relu_conv(32, 1), LayerDType::Float32), "c32"), named(make_layer(LayerType::Flatten), "f"),
        named(dense_layer(kClasses), "d")},
       Policy::Float32,
       {"c32 -> f -> d in pieces of 16 rows"}},
      // Dropout does not forward by rows: the run is flatten -> dense alone, which writes
      // nothing the dense layer reads, so there is none.
      {{named(relu_conv(32), "c"), named(dropout, "drop"), named(make_layer(LayerType::Flatten), "f"),
        named(dense_layer(kClasses), "d")},
       Policy::Float32,
       {}},
      // A max pooling asks for pieces of its own input, and the dense layer after it (13x13x64 =
      // 10,816 features) makes the run longer.
      {{named(relu_conv(64), "c"), named(pool, "p"), named(make_layer(LayerType::Flatten), "f"),
        named(dense_layer(kClasses), "d")},
       Policy::Float32,
       {"c -> p -> f -> d in pieces of 16 rows"}},
      // A convolution of 8 input channels does not run in pieces (only the first layers' shapes
      // do), so the dense layer's run would be flatten -> dense alone: none.
      {{named(relu_conv(8), "c1"), named(relu_conv(32), "c2"), named(make_layer(LayerType::Flatten), "f"),
        named(dense_layer(kClasses), "d")},
       Policy::Float32,
       {}},
      // The same with a max pooling between (24x24x32 -> 12x12x32 = 4,608 features, too few for
      // the dense layer): the pooling asks, but its writer cannot run in pieces either.
      {{named(relu_conv(8), "c1"), named(relu_conv(32), "c2"), named(pool, "p"),
        named(make_layer(LayerType::Flatten), "f"), named(dense_layer(kClasses), "d")},
       Policy::Float32,
       {}},
      // mixed_bfloat16 with the seed net's float32 classifier: it reads a 16-bit x, no pieces.
      {{named(relu_conv(32), "c"), named(make_layer(LayerType::Flatten), "f"),
        named(with_dtype(dense_layer(kClasses), LayerDType::Float32), "d")},
       Policy::MixedBFloat16,
       {}},
      // A short input: 14x14x8 = 1,568 features, under the rule's 8,192.
      {{named(relu_conv(8, 15), "c"), named(make_layer(LayerType::Flatten), "f"), named(dense_layer(kClasses), "d")},
       Policy::Float32,
       {}},
      // More than 16 outputs.
      {{named(relu_conv(32), "c"), named(make_layer(LayerType::Flatten), "f"), named(dense_layer(17), "d"),
        named(dense_layer(kClasses), "d2")},
       Policy::Float32,
       {}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO("case " << i);
    const Result on = run(cases[i].layers, cases[i].policy, nullptr, kMaxBatch);
    CHECK(on.runs == cases[i].runs);
    if (!on.runs.empty()) same_results(on, run(cases[i].layers, cases[i].policy, "off", kMaxBatch));
  }
}

TEST_CASE("the CPU backend's rule for pieces", "[nn][pieces]") {
  auto be = create_backend("cpu");
  {
    Pieces p(nullptr);
    CHECK(be->dense_input_piece_rows(21632, 10, DType::F32, DType::F32) == 16);
    CHECK(be->dense_input_piece_rows(8192, 16, DType::F32, DType::F32) == 16);
    CHECK(be->dense_input_piece_rows(8191, 10, DType::F32, DType::F32) == 0);
    CHECK(be->dense_input_piece_rows(21632, 17, DType::F32, DType::F32) == 0);
    CHECK(be->dense_input_piece_rows(21632, 10, DType::F32, DType::BF16) == 0);
    CHECK(be->dense_input_piece_rows(21632, 10, DType::F32, DType::F16) == 0);
    CHECK(be->dense_input_piece_rows(0, 10, DType::F32, DType::F32) == 0);
  }
  {
    Pieces p("auto");
    CHECK(be->dense_input_piece_rows(21632, 10, DType::F32, DType::F32) == 16);
  }
  {
    Pieces p("off");
    CHECK(be->dense_input_piece_rows(21632, 10, DType::F32, DType::F32) == 0);
  }
  {
    // on: any x the few-output loops take, the float32 layer's 16-bit x too; still not where
    // another kernel runs (a bfloat16 layer's long-input forward is oneDNN's native one where the
    // CPU has bfloat16 math, and the loops' elsewhere).
    Pieces p("on");
    CHECK(be->dense_input_piece_rows(21632, 10, DType::F32, DType::BF16) == 16);
    CHECK(be->dense_input_piece_rows(21632, 10, DType::F32, DType::F16) == 16);
    CHECK(be->dense_input_piece_rows(21632, 10, DType::F32, DType::F32) == 16);
    CHECK(be->dense_input_piece_rows(5408, 10, DType::F32, DType::F32) == 0);
    CHECK(be->dense_input_piece_rows(21632, 17, DType::F32, DType::BF16) == 0);
  }
  {
    Pieces p("16");
    try {
      (void)be->dense_input_piece_rows(21632, 10, DType::F32, DType::F32);
      FAIL("a bad MPX_CPU_PIECES was accepted");
    } catch (const ConfigError& e) {
      CHECK(std::string(e.what()).find("MPX_CPU_PIECES='16': expected auto, off or on") != std::string::npos);
    }
  }
}
