// SPDX-License-Identifier: MIT
// Model tests on the CPU backend: shape inference and its errors, the summary and
// parameter arenas, the precision policy (dtypes per layer, bf16 vs f32 logits,
// activation memory, float16 gradients, underflow without loss scaling),
// determinism, partial batches, dropout/batch-norm modes and the numerics check.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "nn/model.h"
#include "support/gradcheck.h"

using namespace mpx;
using support::conv_layer;
using support::dense_layer;
using support::download_f32;
using support::make_layer;
using support::model_config;
using support::pool_layer;
using support::residual_layer;

namespace {

/// The values of `arena` (master/grads when `trainable`, else state), parameter by parameter,
/// without the alignment gaps between them.
std::vector<float> values(const Model& m, const std::vector<float>& arena, bool trainable = true) {
  std::vector<float> out;
  for (const ParamInfo& p : m.params())
    if (p.trainable == trainable)
      out.insert(out.end(), arena.begin() + p.offset, arena.begin() + p.offset + p.shape.numel());
  return out;
}

LayerConfig named(LayerConfig l, const std::string& name, const std::string& key_path = "", int line = 0) {
  l.name = name;
  l.key_path = key_path;
  l.line = line;
  return l;
}

std::string build_error(std::vector<LayerConfig> layers, Policy policy, int H, int W, int C, int classes) {
  auto be = create_backend("cpu");
  try {
    Model m(model_config(std::move(layers)), policy, *be, H, W, C, classes, 4);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// A uint8 batch [n, H, W, C] on the device.
struct U8Batch {
  Buffer buf;
  Tensor t;
  U8Batch(Backend& be, int64_t n, int H, int W, int C, uint64_t seed) {
    std::vector<uint8_t> v(static_cast<size_t>(n * H * W * C));
    Rng rng(seed);
    for (auto& b : v) b = static_cast<uint8_t>(rng.uniform_int(256));
    buf = be.alloc(v.size(), "test u8 batch");
    t = buf.view(DType::U8, Shape{n, H, W, C});
    be.upload(t, v.data());
  }
};

// A small CNN with every common layer, for the policy tests.
std::vector<LayerConfig> small_cnn(std::optional<LayerDType> last_dtype = std::nullopt) {
  LayerConfig last = dense_layer(10);
  last.dtype = last_dtype;
  return {conv_layer(8, 3, 1, Padding::Same, ActivationName::Relu),
          make_layer(LayerType::BatchNorm),
          pool_layer(LayerType::MaxPool, 2),
          conv_layer(8, 3, 1, Padding::Valid, ActivationName::Relu),
          make_layer(LayerType::Flatten),
          dense_layer(16, ActivationName::Relu),
          last};
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

}  // namespace

// ---- shape inference and errors ----------------------------------------------------

TEST_CASE("dense after conv without flatten is a ConfigError naming the layer", "[nn][shapes]") {
  const std::string e =
      build_error({named(conv_layer(4, 3), "conv_a", "model.layers[0]", 5), named(dense_layer(10), "fc", "model.layers[1]", 6)},
                  Policy::Float32, 8, 8, 1, 10);
  INFO(e);
  CHECK(e.find("'fc' (dense)") != std::string::npos);
  CHECK(e.find("model.layers[1]") != std::string::npos);
  CHECK(e.find("line 6") != std::string::npos);
  CHECK(e.find("[6, 6, 4]") != std::string::npos);
  CHECK(e.find("add a flatten or global_avg_pool layer before it") != std::string::npos);
}

TEST_CASE("the last layer's width must equal num_classes", "[nn][shapes]") {
  const std::string e =
      build_error({make_layer(LayerType::Flatten), named(dense_layer(5), "out", "model.layers[1]", 9)}, Policy::Float32,
                  4, 4, 1, 10);
  INFO(e);
  CHECK(e.find("'out' (dense)") != std::string::npos);
  CHECK(e.find("[5]") != std::string::npos);
  CHECK(e.find("10 classes") != std::string::npos);
  // A conv output as the last layer is not flat either.
  CHECK(!build_error({conv_layer(10, 3)}, Policy::Float32, 4, 4, 1, 10).empty());
}

TEST_CASE("other shape and policy errors", "[nn][shapes]") {
  // softmax only on the last layer
  std::string e = build_error(
      {make_layer(LayerType::Flatten), named(dense_layer(4, ActivationName::Softmax), "hidden"), dense_layer(3)},
      Policy::Float32, 2, 2, 1, 3);
  CHECK(e.find("'hidden'") != std::string::npos);
  CHECK(e.find("softmax") != std::string::npos);
  // conv on a flat input
  e = build_error({make_layer(LayerType::Flatten), named(conv_layer(2, 1), "c")}, Policy::Float32, 2, 2, 1, 3);
  CHECK(e.find("'c' (conv2d)") != std::string::npos);
  // a kernel larger than the input
  e = build_error({named(conv_layer(2, 5), "big"), make_layer(LayerType::Flatten), dense_layer(3)}, Policy::Float32, 3,
                  3, 1, 3);
  CHECK(e.find("'big'") != std::string::npos);
  CHECK(e.find("[3, 3, 1]") != std::string::npos);
  // float16 and bfloat16 may not mix
  LayerConfig bf = named(dense_layer(3), "bf_head");
  bf.dtype = LayerDType::BFloat16;
  e = build_error({make_layer(LayerType::Flatten), bf}, Policy::MixedFloat16, 2, 2, 1, 3);
  CHECK(e.find("'bf_head'") != std::string::npos);
  CHECK(e.find("mix float16 and bfloat16") != std::string::npos);
  // (an unknown dtype or layer type cannot reach the model: both are closed enums of config/enums.h)
}

TEST_CASE("compute_dtype_for resolves policies and overrides", "[nn][policy]") {
  CHECK(compute_dtype_for(Policy::Float32, std::nullopt) == DType::F32);
  CHECK(compute_dtype_for(Policy::MixedFloat16, std::nullopt) == DType::F16);
  CHECK(compute_dtype_for(Policy::MixedBFloat16, std::nullopt) == DType::BF16);
  CHECK(compute_dtype_for(Policy::MixedFloat16, LayerDType::Float32) == DType::F32);
  CHECK(compute_dtype_for(Policy::Float32, LayerDType::MixedFloat16) == DType::F16);
  CHECK(compute_dtype_for(Policy::Float32, LayerDType::Float16) == DType::F16);
  CHECK(compute_dtype_for(Policy::Float32, LayerDType::MixedBFloat16) == DType::BF16);
  CHECK(compute_dtype_for(Policy::Float32, LayerDType::BFloat16) == DType::BF16);
  CHECK_THROWS_AS(compute_dtype_for(Policy::Auto, std::nullopt), Error);
}

// ---- summary and arenas --------------------------------------------------------------

TEST_CASE("summary table and parameter counts match hand-computed numbers", "[nn][summary]") {
  auto be = create_backend("cpu");
  // 28x28x1: conv 3x3x1->32 = 288 + 32 = 320; bn 4*32 = 128 (64 trainable);
  // max_pool -> 13x13x32 = 5408; dense 5408*10 + 10 = 54090.
  Model m(model_config({named(conv_layer(32, 3, 1, Padding::Valid, ActivationName::Relu), "conv"),
                        named(make_layer(LayerType::BatchNorm), "bn"), named(pool_layer(LayerType::MaxPool, 2), "pool"),
                        named(make_layer(LayerType::Flatten), "flat"),
                        named(dense_layer(10, ActivationName::Softmax), "predictions")}),
          Policy::Float32, *be, 28, 28, 1, 10, 8);
  // The arenas hold the values plus the gaps that align each parameter (docs/design.md
  // "Parameter arenas"); the summary counts values.
  CHECK(m.num_params() >= 320 + 64 + 54090);
  CHECK(m.num_state() >= 64);
  const auto infos = m.layer_infos();
  REQUIRE(infos.size() == 5);
  CHECK(infos[0].params == 320);
  CHECK(infos[0].output_shape == Shape({26, 26, 32}));
  CHECK(infos[1].params == 128);
  CHECK(infos[2].output_shape == Shape({13, 13, 32}));
  CHECK(infos[3].output_shape == Shape({5408}));
  CHECK(infos[4].params == 54090);
  const std::string s = m.summary_table();
  INFO(s);
  CHECK(s.find("Layer (type)") != std::string::npos);
  CHECK(s.find("Compute dtype") != std::string::npos);
  CHECK(s.find("conv (conv2d)") != std::string::npos);
  CHECK(s.find("(None, 26, 26, 32)") != std::string::npos);
  CHECK(s.find("54,090") != std::string::npos);
  CHECK(s.find("Total params: 54,538") != std::string::npos);
  CHECK(s.find("Trainable params: 54,474") != std::string::npos);
  CHECK(s.find("Non-trainable params: 64") != std::string::npos);
  CHECK(m.softmax_output());
  CHECK(m.output_dtype() == DType::F32);
  CHECK(m.compute_copy().empty());

  // ParamInfo: Keras names, backend layouts, offsets in model order, each at the next aligned one.
  const auto& p = m.params();
  REQUIRE(p.size() == 8);
  CHECK(p[0].name == "kernel");
  CHECK(p[0].shape == Shape({32, 3, 3, 1}));
  CHECK(p[1].name == "bias");
  CHECK(p[2].name == "gamma");
  CHECK(p[4].name == "moving_mean");
  CHECK_FALSE(p[4].trainable);
  CHECK(p[5].name == "moving_variance");
  CHECK(p[6].shape == Shape({10, 5408}));
  const int64_t a = Model::param_alignment();
  const auto up = [a](int64_t n) { return (n + a - 1) / a * a; };
  int64_t next_t = 0, next_s = 0, values_t = 0;
  for (const auto& q : p) {
    int64_t& next = q.trainable ? next_t : next_s;
    CHECK(q.offset == up(next));
    next = q.offset + q.shape.numel();
    if (q.trainable) values_t += q.shape.numel();
  }
  CHECK(values_t == 320 + 64 + 54090);
  CHECK(up(next_t) == m.num_params());
  CHECK(up(next_s) == m.num_state());
  CHECK(p[1].offset == 384);  // the conv kernel's 288 values, then the gap to 3 * 128
  CHECK(m.master().numel() == m.num_params());
  CHECK(m.grads().numel() == m.num_params());
  CHECK(m.state().numel() == m.num_state());
}

TEST_CASE("residual blocks: nested rows, projection, parameter counts", "[nn][summary]") {
  auto be = create_backend("cpu");
  LayerConfig same =
      named(residual_layer({named(conv_layer(4, 3, 1, Padding::Same, ActivationName::Relu), "r1c")}), "res1");
  LayerConfig proj = named(residual_layer({named(conv_layer(8, 3, 2, Padding::Same), "r2c")}), "res2");
  Model m(
      model_config({named(conv_layer(4, 1), "stem"), same, proj, make_layer(LayerType::GlobalAvgPool), dense_layer(3)}),
      Policy::Float32, *be, 8, 8, 2, 3, 4);
  const auto infos = m.layer_infos();
  // stem, res1, r1c, res2, r2c, res2_projection, gap, dense
  REQUIRE(infos.size() == 8);
  CHECK(infos[1].name == "res1");
  CHECK(infos[1].params == 4 * 9 * 4 + 4);
  CHECK(infos[2].depth == 1);
  CHECK(infos[5].name == "res2_projection");
  CHECK(infos[5].depth == 1);
  CHECK(infos[5].params == 4 * 8);  // 1x1, no bias
  CHECK(infos[5].output_shape == Shape({4, 4, 8}));
  CHECK(infos[3].params == 8 * 9 * 4 + 8 + 32);
  CHECK(infos[3].output_shape == Shape({4, 4, 8}));
  const std::string s = m.summary_table();
  INFO(s);
  CHECK(s.find("   r1c (conv2d)") != std::string::npos);
  CHECK(s.find("   res2_projection (conv2d)") != std::string::npos);
  int64_t top = 0, values = 0;
  for (const auto& i : infos)
    if (i.depth == 0) top += i.params;
  for (const auto& q : m.params()) values += q.shape.numel();
  CHECK(top == values);
}

// ---- precision policy ------------------------------------------------------------

TEST_CASE("mixed_float16 with a float32 output layer: dtypes per layer", "[nn][mixed]") {
  auto be = create_backend("cpu");
  Model m(model_config(small_cnn(LayerDType::Float32)), Policy::MixedFloat16, *be, 8, 8, 3, 10, 4);
  const auto infos = m.layer_infos();
  REQUIRE(infos.size() == 7);
  for (size_t i = 0; i + 1 < infos.size(); ++i) {
    INFO(infos[i].name);
    CHECK(infos[i].compute_dtype == DType::F16);
    CHECK(infos[i].variable_dtype == DType::F32);
  }
  CHECK(infos.back().compute_dtype == DType::F32);
  CHECK(m.output_dtype() == DType::F32);
  CHECK(m.compute_copy().dtype == DType::F16);
  CHECK(m.compute_copy().numel() == m.num_params());
  CHECK(m.master().dtype == DType::F32);
  U8Batch x(*be, 4, 8, 8, 3, 1);
  const Tensor logits = m.forward(x.t, true, 1, 0);
  CHECK(logits.dtype == DType::F32);
  CHECK(logits.shape == Shape({4, 10}));
  CHECK(m.first_nonfinite_forward().empty());
  // All-16-bit model: the logits still come out float32.
  Model h(model_config(small_cnn()), Policy::MixedBFloat16, *be, 8, 8, 3, 10, 4);
  CHECK(h.output_dtype() == DType::BF16);
  CHECK(h.forward(x.t, false).dtype == DType::F32);
}

TEST_CASE("mixed_bfloat16 logits are close to float32's but rounded", "[nn][mixed]") {
  auto be = create_backend("cpu");
  Model f(model_config(small_cnn()), Policy::Float32, *be, 8, 8, 3, 10, 6);
  Model b(model_config(small_cnn()), Policy::MixedBFloat16, *be, 8, 8, 3, 10, 6);
  f.init_params(11);
  b.init_params(11);
  CHECK(download_f32(*be, f.master()) == download_f32(*be, b.master()));  // init does not depend on the policy
  U8Batch x(*be, 6, 8, 8, 3, 2);
  const auto lf = download_f32(*be, f.forward(x.t, false));
  const auto lb = download_f32(*be, b.forward(x.t, false));
  const double scale = max_abs(lf);
  double max_diff = 0;
  for (size_t i = 0; i < lf.size(); ++i) max_diff = std::max(max_diff, static_cast<double>(std::fabs(lf[i] - lb[i])));
  INFO("max |f32 - bf16| = " << max_diff << ", max |logit| = " << scale);
  CHECK(max_diff > 0);                       // rounding happened
  CHECK(max_diff < 0.05 * scale + 0.02);     // bf16 keeps ~3 significant digits through 4 layers
}

TEST_CASE("activation memory under mixed policies is about half of float32's", "[nn][mixed][memory]") {
  auto be = create_backend("cpu");
  Model f(model_config(small_cnn()), Policy::Float32, *be, 16, 16, 3, 10, 32);
  Model h(model_config(small_cnn(LayerDType::Float32)), Policy::MixedFloat16, *be, 16, 16, 3, 10, 32);
  Model b(model_config(small_cnn()), Policy::MixedBFloat16, *be, 16, 16, 3, 10, 32);
  const auto rf = f.memory_report(), rh = h.memory_report(), rb = b.memory_report();
  const double qh = static_cast<double>(rh.activation_bytes) / static_cast<double>(rf.activation_bytes);
  const double qb = static_cast<double>(rb.activation_bytes) / static_cast<double>(rf.activation_bytes);
  INFO("f32 " << rf.activation_bytes << " f16 " << rh.activation_bytes << " bf16 " << rb.activation_bytes);
  CHECK(qh > 0.45);
  CHECK(qh < 0.6);
  CHECK(qb > 0.45);
  CHECK(qb < 0.6);
  CHECK(rf.master_bytes == static_cast<size_t>(f.num_params()) * 4);
  CHECK(rf.grad_bytes == rf.master_bytes);
  CHECK(rf.compute_copy_bytes == 0);
  CHECK(rh.compute_copy_bytes == static_cast<size_t>(h.num_params()) * 2);
  CHECK(rf.state_bytes == static_cast<size_t>(f.num_state()) * 4);
  CHECK(rf.workspace_bytes > 0);
}

TEST_CASE("weight gradients under mixed_float16 match float32 within float16 tolerance", "[nn][mixed]") {
  auto be = create_backend("cpu");
  const int n = 8;
  Model f(model_config(small_cnn()), Policy::Float32, *be, 8, 8, 3, 10, n);
  Model h(model_config(small_cnn()), Policy::MixedFloat16, *be, 8, 8, 3, 10, n);
  f.init_params(3);
  h.init_params(3);
  U8Batch x(*be, n, 8, 8, 3, 4);
  Buffer db = be->alloc(n * 10 * 4, "dlogits");
  const Tensor dl = db.view(DType::F32, Shape{n, 10});
  const auto dlh = support::random_vec(n * 10, 9, -1.0 / n, 1.0 / n);
  be->upload(dl, dlh.data());
  f.forward(x.t, true, 1, 0);
  f.backward(dl);
  h.forward(x.t, true, 1, 0);
  h.backward(dl);
  CHECK(h.first_nonfinite_backward().empty());
  const auto gf = download_f32(*be, f.grads()), gh = download_f32(*be, h.grads());
  for (const ParamInfo& p : f.params()) {
    if (!p.trainable) continue;
    const std::vector<float> a(gf.begin() + p.offset, gf.begin() + p.offset + p.shape.numel());
    const std::vector<float> b(gh.begin() + p.offset, gh.begin() + p.offset + p.shape.numel());
    double diff = 0;
    for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    INFO(p.layer << "/" << p.name << ": max diff " << diff << " max |g| " << max_abs(a));
    // float16 rounds every activation and gradient (eps 2^-11); a few relu decisions flip.
    CHECK(diff <= 3e-2 * max_abs(a) + 1e-6);
  }
}

TEST_CASE("underflow without loss scaling: tiny gradients flush to zero in float16", "[nn][mixed][underflow]") {
  auto be = create_backend("cpu");
  const int n = 4;
  auto layers = [] {
    return std::vector<LayerConfig>{make_layer(LayerType::Flatten), dense_layer(8, ActivationName::Relu),
                                    dense_layer(4)};
  };
  Model f(model_config(layers()), Policy::Float32, *be, 3, 3, 2, 4, n);
  Model h(model_config(layers()), Policy::MixedFloat16, *be, 3, 3, 2, 4, n);
  f.init_params(21);
  h.init_params(21);
  U8Batch x(*be, n, 3, 3, 2, 5);
  // dlogits ~1e-8: below float16's smallest subnormal (2^-24 ~ 6e-8) after rounding.
  std::vector<float> tiny = support::random_vec(n * 4, 17, 0.5e-8, 1.0e-8);
  for (size_t i = 0; i < tiny.size(); i += 2) tiny[i] = -tiny[i];
  Buffer b1 = be->alloc(n * 4 * 4, "dlogits"), b2 = be->alloc(n * 4 * 4, "dlogits scaled");
  const Tensor dl = b1.view(DType::F32, Shape{n, 4}), dls = b2.view(DType::F32, Shape{n, 4});
  const float S = 32768.0f;
  std::vector<float> scaled(tiny);
  for (float& v : scaled) v *= S;
  be->upload(dl, tiny.data());
  be->upload(dls, scaled.data());

  f.forward(x.t, true);
  f.backward(dl);
  const auto g32 = values(f, download_f32(*be, f.grads()));
  h.forward(x.t, true);
  h.backward(dl);
  const auto g16 = values(h, download_f32(*be, h.grads()));
  h.forward(x.t, true);
  h.backward(dls);
  const auto g16s = values(h, download_f32(*be, h.grads()));

  int nonzero32 = 0, zero16 = 0;
  for (size_t i = 0; i < g32.size(); ++i) {
    if (g32[i] == 0.0f) continue;
    ++nonzero32;
    if (g16[i] == 0.0f) ++zero16;
  }
  INFO("float32 nonzero " << nonzero32 << ", of which float16 unscaled zero " << zero16);
  CHECK(max_abs(g32) < 1e-6);
  CHECK(nonzero32 > static_cast<int>(g32.size()) / 2);
  CHECK(zero16 >= 0.9 * nonzero32);
  // Scaled by 2^15 the gradients survive; divided back they match float32.
  const double m32 = max_abs(g32);
  double diff = 0;
  int zero_scaled = 0;
  for (size_t i = 0; i < g32.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(g16s[i]) / S - g32[i]));
    if (g32[i] != 0.0f && g16s[i] == 0.0f) ++zero_scaled;
  }
  INFO("scaled: max diff " << diff << " vs max |g| " << m32 << ", zeros " << zero_scaled);
  CHECK(diff <= 2e-2 * m32);
  CHECK(zero_scaled <= nonzero32 / 20);
}

// ---- determinism, batches, modes -------------------------------------------------

TEST_CASE("same seed gives the same init; forward is deterministic", "[nn][determinism]") {
  auto be = create_backend("cpu");
  Model m(model_config(small_cnn()), Policy::Float32, *be, 8, 8, 3, 10, 4);
  m.init_params(5);
  const auto a = download_f32(*be, m.master());
  m.init_params(6);
  const auto b = download_f32(*be, m.master());
  m.init_params(5);
  CHECK(download_f32(*be, m.master()) == a);
  CHECK(a != b);
  // Glorot limits: conv kernel 3x3x3->8: sqrt(6 / (27 + 72)).
  const double lim = std::sqrt(6.0 / (27 + 72));
  for (int i = 0; i < 8 * 27; ++i) CHECK(std::fabs(a[static_cast<size_t>(i)]) <= lim);
  CHECK(a[8 * 27] == 0.0f);  // first bias
  U8Batch x(*be, 4, 8, 8, 3, 8);
  const auto l1 = download_f32(*be, m.forward(x.t, false));
  const auto l2 = download_f32(*be, m.forward(x.t, false));
  CHECK(l1 == l2);
  const auto t1 = download_f32(*be, m.forward(x.t, true, 3, 1));
  const auto t2 = download_f32(*be, m.forward(x.t, true, 3, 1));
  CHECK(t1 == t2);
}

TEST_CASE("dirac initialization: the first min(K, C) filters are the identity, the rest glorot",
          "[nn][init]") {
  auto be = create_backend("cpu");
  auto layers = [](KernelInit init, int64_t filters) {
    LayerConfig conv = conv_layer(filters, 3, 1, Padding::Same);
    conv.kernel_initializer = init;
    return std::vector<LayerConfig>{conv, make_layer(LayerType::GlobalAvgPool), dense_layer(10)};
  };
  for (int64_t K : {5, 2}) {
    Model d(model_config(layers(KernelInit::Dirac, K)), Policy::Float32, *be, 8, 8, 3, 10, 4);
    Model g(model_config(layers(KernelInit::GlorotUniform, K)), Policy::Float32, *be, 8, 8, 3, 10, 4);
    d.init_params(7);
    g.init_params(7);
    const auto wd = values(d, download_f32(*be, d.master())), wg = values(g, download_f32(*be, g.master()));
    REQUIRE(wd.size() == wg.size());
    const int64_t C = 3, taps = 9;
    for (int64_t f = 0; f < K; ++f)
      for (int64_t r = 0; r < 3; ++r)
        for (int64_t s = 0; s < 3; ++s)
          for (int64_t c = 0; c < C; ++c) {
            const size_t i = static_cast<size_t>(((f * 3 + r) * 3 + s) * C + c);
            INFO("K " << K << " filter " << f << " tap " << r << "," << s << " channel " << c);
            if (f < std::min<int64_t>(K, C))
              CHECK(wd[i] == (r == 1 && s == 1 && c == f ? 1.0f : 0.0f));
            else
              CHECK(wd[i] == wg[i]);  // the same glorot stream as without dirac
          }
    // Everything after the kernel (bias, dense) is initialized as without dirac.
    CHECK(std::equal(wd.begin() + K * taps * C, wd.end(), wg.begin() + K * taps * C));
  }
}

TEST_CASE("a partial batch uses row slices and gives the same rows", "[nn][batch]") {
  auto be = create_backend("cpu");
  Model m(model_config(small_cnn()), Policy::Float32, *be, 8, 8, 3, 10, 5);
  m.init_params(2);
  U8Batch x(*be, 5, 8, 8, 3, 3);
  const auto full = download_f32(*be, m.forward(x.t, false));
  const Tensor part = m.forward(x.t.slice_rows(0, 3), false);
  CHECK(part.shape == Shape({3, 10}));
  const auto p = download_f32(*be, part);
  CHECK(std::vector<float>(full.begin(), full.begin() + 30) == p);
  const size_t before = be->memory_stats().current_bytes;
  Buffer db = be->alloc(3 * 10 * 4, "dlogits");
  const Tensor dl = db.view(DType::F32, Shape{3, 10});
  be->fill(dl, 0.1f);
  // One warm-up step (the backend grows its own scratch once per shape), then the
  // model allocates nothing per step.
  m.forward(x.t.slice_rows(0, 3), true, 1, 1);
  m.backward(dl);
  const size_t with_dl = be->memory_stats().current_bytes;
  m.forward(x.t.slice_rows(0, 3), true, 1, 2);
  m.backward(dl);
  CHECK(be->memory_stats().current_bytes == with_dl);
  CHECK(with_dl > before);
  CHECK_THROWS(m.forward(U8Batch(*be, 6, 8, 8, 3, 1).t, false));  // more than max_batch
}

TEST_CASE("backward overwrites the whole gradient arena", "[nn][grads]") {
  auto be = create_backend("cpu");
  LayerConfig d = make_layer(LayerType::Dropout);
  d.rate = 0.3;
  Model m(model_config({conv_layer(4, 3, 1, Padding::Same, ActivationName::Relu), make_layer(LayerType::BatchNorm),
                        residual_layer({conv_layer(4, 3, 1, Padding::Same), make_layer(LayerType::BatchNorm)}),
                        make_layer(LayerType::GlobalAvgPool), d, dense_layer(3)}),
          Policy::MixedFloat16, *be, 6, 6, 2, 3, 4);
  m.init_params(1);
  // Every parameter's gradient is poisoned; the alignment gaps between them keep the zeros
  // init_params wrote (no op reads or writes them).
  for (const ParamInfo& p : m.params())
    if (p.trainable) be->fill(m.grads().flat_view(p.offset, p.shape), std::nanf(""));
  U8Batch x(*be, 4, 6, 6, 2, 1);
  m.forward(x.t, true, 9, 2);
  Buffer db = be->alloc(4 * 3 * 4, "dlogits");
  const Tensor dl = db.view(DType::F32, Shape{4, 3});
  be->fill(dl, 0.25f);
  m.backward(dl);
  CHECK(be->stats(m.grads()).all_finite());
  CHECK(m.first_nonfinite_backward().empty());
}

TEST_CASE("dropout: masks from (seed, step, layer); identity at inference", "[nn][dropout]") {
  auto be = create_backend("cpu");
  LayerConfig d = make_layer(LayerType::Dropout);
  d.rate = 0.5;
  Model m(model_config({make_layer(LayerType::Flatten), dense_layer(32), d, dense_layer(4)}), Policy::Float32, *be, 2,
          2, 1, 4, 4);
  m.init_params(1);
  U8Batch x(*be, 4, 2, 2, 1, 2);
  const auto a = download_f32(*be, m.forward(x.t, true, 1, 0));
  const auto a2 = download_f32(*be, m.forward(x.t, true, 1, 0));
  const auto b = download_f32(*be, m.forward(x.t, true, 1, 1));
  const auto c = download_f32(*be, m.forward(x.t, true, 2, 0));
  const auto i1 = download_f32(*be, m.forward(x.t, false, 1, 0));
  const auto i2 = download_f32(*be, m.forward(x.t, false, 2, 5));
  CHECK(a == a2);
  CHECK(a != b);
  CHECK(a != c);
  CHECK(i1 == i2);
  CHECK(a != i1);
}

TEST_CASE("batch_norm: training updates the moving statistics, inference uses them", "[nn][batch_norm]") {
  auto be = create_backend("cpu");
  LayerConfig bn = make_layer(LayerType::BatchNorm);
  bn.momentum = 0.5;
  Model m(model_config({conv_layer(3, 1), bn, make_layer(LayerType::Flatten), dense_layer(2)}), Policy::MixedBFloat16,
          *be, 2, 2, 1, 2, 4);
  m.init_params(1);
  REQUIRE(m.num_state() == 2 * Model::param_alignment());  // moving mean and variance, 3 each, aligned
  const auto s0 = download_f32(*be, m.state());
  CHECK(values(m, s0, false) == std::vector<float>{0, 0, 0, 1, 1, 1});
  U8Batch x(*be, 4, 2, 2, 1, 3);
  m.forward(x.t, false);
  CHECK(download_f32(*be, m.state()) == s0);
  m.forward(x.t, true);
  const auto s1 = download_f32(*be, m.state());
  CHECK(s1 != s0);
  CHECK(m.state().dtype == DType::F32);
}

TEST_CASE("first_nonfinite_forward/backward name the layer", "[nn][numerics]") {
  auto be = create_backend("cpu");
  Model m(model_config(
              {named(conv_layer(3, 1), "conv2d_1"), make_layer(LayerType::Flatten), named(dense_layer(2), "head")}),
          Policy::MixedFloat16, *be, 2, 2, 1, 2, 2);
  m.init_params(1);
  U8Batch x(*be, 2, 2, 2, 1, 4);
  m.forward(x.t, true);
  CHECK(m.first_nonfinite_forward().empty());
  // A weight beyond float16's range becomes inf in the compute copy.
  const float huge = 1e6f;
  be->upload(m.master().flat_view(0, Shape{1}), &huge);
  m.refresh_compute_copy();
  m.forward(x.t, true);
  const std::string f = m.first_nonfinite_forward();
  INFO(f);
  CHECK(f.rfind("conv2d_1 (conv2d, float16 output: ", 0) == 0);
  Buffer db = be->alloc(2 * 2 * 4, "dlogits");
  const Tensor dl = db.view(DType::F32, Shape{2, 2});
  be->fill(dl, 1.0f);
  m.backward(dl);
  const std::string b = m.first_nonfinite_backward();
  INFO(b);
  CHECK(b.rfind("head (dense, ", 0) == 0);
}

TEST_CASE("dtype boundaries (float32 layers inside a float16 model) cast both ways", "[nn][mixed]") {
  // A float32 conv between float16 layers, a residual whose branch ends in float32
  // (branch output cast to the block's float16 before the add) and a float16 head.
  auto layers = [] {
    LayerConfig mid = conv_layer(4, 3, 1, Padding::Same, ActivationName::Relu);
    mid.dtype = LayerDType::Float32;
    LayerConfig tail = conv_layer(6, 3, 2, Padding::Same);
    tail.dtype = LayerDType::Float32;
    return std::vector<LayerConfig>{conv_layer(4, 3, 1, Padding::Same, ActivationName::Relu), mid,
                                    residual_layer({conv_layer(6, 3, 1, Padding::Same, ActivationName::Relu), tail}),
                                    make_layer(LayerType::Flatten), dense_layer(3)};
  };
  auto be = create_backend("cpu");
  const int n = 4;
  Model f(model_config(layers()), Policy::Float32, *be, 6, 6, 2, 3, n);
  Model h(model_config(layers()), Policy::MixedFloat16, *be, 6, 6, 2, 3, n);
  const auto infos = h.layer_infos();
  CHECK(infos[1].compute_dtype == DType::F32);
  CHECK(infos[2].compute_dtype == DType::F16);  // the block
  CHECK(infos[4].compute_dtype == DType::F32);  // branch tail
  f.init_params(4);
  h.init_params(4);
  const auto xh = support::random_vec(n * 6 * 6 * 2, 12);
  Buffer xb = be->alloc(xh.size() * 4, "x");
  const Tensor x = xb.view(DType::F32, Shape{n, 6, 6, 2});
  be->upload(x, xh.data());
  Buffer db = be->alloc(n * 3 * 4, "dlogits");
  const Tensor dl = db.view(DType::F32, Shape{n, 3});
  const auto dlh = support::random_vec(n * 3, 13, -0.25, 0.25);
  be->upload(dl, dlh.data());
  const auto lf = download_f32(*be, f.forward_float(x, true));
  f.backward(dl);
  const auto lh = download_f32(*be, h.forward_float(x, true));
  h.backward(dl);
  for (size_t i = 0; i < lf.size(); ++i) CHECK(lh[i] == Approx(lf[i]).margin(2e-2 * max_abs(lf)));
  const auto gf = download_f32(*be, f.grads()), gh = download_f32(*be, h.grads());
  for (const ParamInfo& p : f.params()) {
    const std::vector<float> a(gf.begin() + p.offset, gf.begin() + p.offset + p.shape.numel());
    const std::vector<float> b(gh.begin() + p.offset, gh.begin() + p.offset + p.shape.numel());
    double diff = 0;
    for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    INFO(p.layer << "/" << p.name << ": max diff " << diff << " max |g| " << max_abs(a));
    CHECK(diff <= 3e-2 * max_abs(a) + 1e-6);
  }
  const auto xf = download_f32(*be, f.input_grad()), xg = download_f32(*be, h.input_grad());
  CHECK(h.input_grad().dtype == DType::F32);
  double diff = 0;
  for (size_t i = 0; i < xf.size(); ++i) diff = std::max(diff, static_cast<double>(std::fabs(xf[i] - xg[i])));
  CHECK(diff <= 3e-2 * max_abs(xf));
}

TEST_CASE("a model from YAML: errors carry the file, key path and line", "[nn][shapes][yaml]") {
  const std::string yaml =
      "data: {dataset: synthetic}\n"
      "model:\n"
      "  layers:\n"
      "    - {type: conv2d, filters: 4, kernel: 3}\n"
      "    - {type: dense, units: 10}\n";
  const Config cfg = parse_config(yaml, "bad.yaml");
  auto be = create_backend("cpu");
  try {
    Model m(cfg, Policy::Float32, *be, 8, 8, 1, 10, 4);
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    const std::string s = e.what();
    INFO(s);
    CHECK(s.find("bad.yaml") != std::string::npos);
    CHECK(s.find("model.layers[1]") != std::string::npos);
    CHECK(s.find("line 5") != std::string::npos);
    CHECK(s.find("(dense)") != std::string::npos);
    CHECK(s.find("add a flatten or global_avg_pool layer before it") != std::string::npos);
  }
  const Config ok = parse_config(
      "data: {dataset: synthetic}\n"
      "policy: mixed_float16\n"
      "model:\n"
      "  layers:\n"
      "    - {type: conv2d, filters: 4, kernel: 3, padding: same, activation: relu}\n"
      "    - type: residual\n"
      "      layers:\n"
      "        - {type: conv2d, filters: 4, kernel: 3, padding: same, use_bias: false}\n"
      "        - {type: batch_norm}\n"
      "        - {type: activation, activation: relu}\n"
      "    - {type: global_avg_pool}\n"
      "    - {type: dense, units: 10, activation: softmax, dtype: float32, name: predictions}\n",
      "ok.yaml");
  Model m(ok, ok.policy, *be, 8, 8, 1, 10, 4);
  CHECK(m.output_dtype() == DType::F32);
  CHECK(m.softmax_output());
  CHECK(m.layer_infos().back().name == "predictions");
}

TEST_CASE("depthwise_conv2d: output shape, parameters, shape and config errors", "[nn][shapes][depthwise]") {
  LayerConfig dw = make_layer(LayerType::DepthwiseConv2d);
  dw.name = "dw";
  dw.depth_multiplier = 3;
  dw.kernel_h = 3, dw.kernel_w = 2;
  dw.stride_h = dw.stride_w = 2;
  dw.padding = Padding::Same;
  {
    auto be = create_backend("cpu");
    Model m(model_config({dw, make_layer(LayerType::GlobalAvgPool), dense_layer(5)}), Policy::Float32, *be, 7, 8, 4,
            5, 2);
    const std::vector<LayerInfo> li = m.layer_infos();
    REQUIRE(li[0].type == LayerType::DepthwiseConv2d);
    CHECK(li[0].output_shape == Shape{4, 4, 12});  // ceil(7/2), ceil(8/2), C * M
    CHECK(li[0].params == 12 * 3 * 2 + 12);         // one 3x2 filter per output channel, and the bias
    CHECK(m.params()[0].name == "depthwise_kernel");
    CHECK(m.params()[0].shape == Shape{12, 3, 2, 1});
  }
  // A flat input, a kernel larger than the input (valid padding).
  std::string e = build_error({make_layer(LayerType::Flatten), named(dw, "dw_flat")}, Policy::Float32, 2, 2, 1, 3);
  CHECK(e.find("'dw_flat' (depthwise_conv2d)") != std::string::npos);
  CHECK(e.find("per-sample [H, W, C] input") != std::string::npos);
  LayerConfig big = named(dw, "big");
  big.padding = Padding::Valid;
  big.kernel_h = big.kernel_w = 5;
  e = build_error({big, make_layer(LayerType::Flatten), dense_layer(3)}, Policy::Float32, 3, 3, 2, 3);
  CHECK(e.find("'big'") != std::string::npos);
  CHECK(e.find("input [3, 3, 2] is smaller than the 5x5 kernel") != std::string::npos);
  // The config: depth_multiplier must be >= 1; conv2d's filters do not apply.
  const auto yaml_error = [](const std::string& layer) {
    try {
      parse_config("data: {dataset: synthetic}\nmodel:\n  layers:\n    - " + layer +
                       "\n    - {type: global_avg_pool}\n    - {type: dense, units: 10}\n",
                   "dw.yaml");
    } catch (const ConfigError& err) {
      return std::string(err.what());
    }
    return std::string();
  };
  e = yaml_error("{type: depthwise_conv2d, depth_multiplier: 0}");
  INFO(e);
  CHECK(e.find("depth_multiplier") != std::string::npos);
  CHECK(e.find("dw.yaml") != std::string::npos);
  e = yaml_error("{type: depthwise_conv2d, filters: 8}");
  CHECK(e.find("filters") != std::string::npos);
  CHECK(yaml_error("{type: depthwise_conv2d, kernel: 3, depth_multiplier: 2, padding: same, activation: relu}").empty());
}

TEST_CASE("a float32 dense layer after bfloat16 layers reads their output as it is: the casts' numbers, less memory",
          "[nn][mixed]") {
  // conv (bfloat16) -> flatten -> dense 32 and dense 10 in float32. The first dense layer takes
  // the bfloat16 activations without the input cast and returns its input gradient in bfloat16
  // without the gradient cast (MPX_FOLD_CASTS=0 keeps both casts). Its 32 outputs run oneDNN's
  // float32 inner product on the widened input either way, so every loss and gradient must be
  // the same bits; a 10-output layer in its place runs mpx's few-output loops on the bfloat16
  // input and stays within float32 summation of the cast path.
  const int64_t units = GENERATE(32, 10);
  INFO(units << " outputs");
  auto layers = [&] {
    LayerConfig d = dense_layer(units, ActivationName::Relu);
    d.dtype = LayerDType::Float32;
    LayerConfig head = dense_layer(3);
    head.dtype = LayerDType::Float32;
    return std::vector<LayerConfig>{conv_layer(8, 3, 1, Padding::Same, ActivationName::Relu),
                                    make_layer(LayerType::Flatten), d, head};
  };
  auto be = create_backend("cpu");
  const int n = 5;
  auto run = [&](bool fold, std::vector<float>& loss, std::vector<float>& grads, size_t& workspace) {
    if (!fold) ::setenv("MPX_FOLD_CASTS", "0", 1);
    Model m(model_config(layers()), Policy::MixedBFloat16, *be, 9, 9, 2, 3, n);
    ::unsetenv("MPX_FOLD_CASTS");
    m.init_params(6);
    const auto xh = support::random_vec(n * 9 * 9 * 2, 21);
    Buffer xb = be->alloc(xh.size() * 4, "x");
    const Tensor x = xb.view(DType::F32, Shape{n, 9, 9, 2});
    be->upload(x, xh.data());
    Buffer db = be->alloc(n * 3 * 4, "dlogits");
    const Tensor dl = db.view(DType::F32, Shape{n, 3});
    const auto dlh = support::random_vec(n * 3, 22, -0.25, 0.25);
    be->upload(dl, dlh.data());
    loss = download_f32(*be, m.forward_float(x, true));
    m.backward(dl);
    grads = download_f32(*be, m.grads());
    workspace = m.memory_report().workspace_bytes + m.memory_report().activation_bytes;
  };
  std::vector<float> lf, gf, lc, gc;
  size_t mf = 0, mc = 0;
  run(true, lf, gf, mf);
  run(false, lc, gc, mc);
  // The two casts' buffers: the float32 input [n, 648] and the bfloat16 input gradient.
  CHECK(mc - mf >= static_cast<size_t>(n) * 9 * 9 * 8 * (4 + 2));
  REQUIRE(lf.size() == lc.size());
  REQUIRE(gf.size() == gc.size());
  if (units > 16) {
    CHECK(lf == lc);
    CHECK(gf == gc);
  } else {
    const double ml = max_abs(lc), mg = max_abs(gc);
    for (size_t i = 0; i < lf.size(); ++i) CHECK(lf[i] == Approx(lc[i]).margin(1e-5 * ml));
    for (size_t i = 0; i < gf.size(); ++i) CHECK(gf[i] == Approx(gc[i]).margin(1e-2 * mg));
  }
}
