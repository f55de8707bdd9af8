// SPDX-License-Identifier: MIT
// lib/io/safetensors + lib/weights/weights: the reader against a file laid out by hand,
// every malformed-header case (named tensor, ConfigError, no out-of-bounds read:
// run under MPX_ENABLE_SANITIZERS), a truncation/bit-flip sweep, and the model
// round trip (export -> import bit-identical) in the keras and pytorch layouts.
#include <catch2/catch.hpp>

#include <cstring>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "config/config.h"
#include "core/error.h"
#include "core/half.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "nn/model.h"
#include "weights/weights.h"

using namespace mpx;

namespace {

std::string le64(uint64_t n) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return s;
}

/// A file from a header text and data bytes, the length prefix computed here.
std::string file_of(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }

/// The message of the ConfigError parsing throws ("" when it parses).
std::string parse_error(const std::string& bytes) {
  try {
    parse_safetensors(bytes, "w.safetensors");
  } catch (const ConfigError& e) {
    CHECK(e.exit_code() == kExitUsage);
    return e.what();
  }
  return "";
}

float f32_at(const StTensor& t, size_t i) {
  float v;
  std::memcpy(&v, t.bytes.data() + 4 * i, 4);
  return v;
}

const char* kNet = R"(name: rt
data: {dataset: synthetic}
model:
  layers:
    - {type: conv2d, filters: 4, kernel: 3, padding: same, name: c1}
    - {type: batch_norm, name: bn1}
    - type: residual
      name: block
      layers:
        - {type: conv2d, filters: 8, kernel: [3, 2], strides: 2, padding: same, use_bias: false}
        - {type: batch_norm}
        - {type: activation, activation: relu}
    - {type: flatten}
    - {type: batch_norm, name: bn_flat}
    - {type: dropout, rate: 0.1}
    - {type: dense, units: 5, activation: relu, name: hidden}
    - {type: dense, units: 10, activation: softmax, name: out}
)";

/// A model of kNet on 6x6x2 inputs with random master weights and random BN statistics.
struct Net {
  Config cfg = parse_config(kNet, "rt.yaml");
  std::unique_ptr<Backend> be = create_backend("cpu");
  Shape input{6, 6, 2};
  Model model{cfg, Policy::Float32, *be, 6, 6, 2, 10, 4};

  explicit Net(uint64_t seed) {
    Rng rng(seed);
    // Random values in every parameter; the arenas' alignment gaps stay zero, as in any model.
    std::vector<float> m(static_cast<size_t>(model.num_params())), s(static_cast<size_t>(model.num_state()));
    for (const ParamInfo& p : model.params())
      for (int64_t i = 0; i < p.shape.numel(); ++i)
        (p.trainable ? m : s)[static_cast<size_t>(p.offset + i)] =
            static_cast<float>(p.trainable ? rng.uniform(-1, 1) : rng.uniform(0.1, 2));
    be->upload(model.master(), m.data());
    be->upload(model.state(), s.data());
  }
  std::vector<float> master() const {
    std::vector<float> v(static_cast<size_t>(model.num_params()));
    be->download(v.data(), model.master());
    return v;
  }
  std::vector<float> state() const {
    std::vector<float> v(static_cast<size_t>(model.num_state()));
    be->download(v.data(), model.state());
    return v;
  }
  const ParamInfo& param(const std::string& layer, const std::string& name) const {
    for (const ParamInfo& p : model.params())
      if (p.layer == layer && p.name == name) return p;
    FAIL("no parameter " << layer << "/" << name);
    return model.params().front();
  }
  StFile exported(WeightsLayout l) const { return export_weights(model, *be, cfg, input, l, {{"config", "rt"}}); }
};

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

/// The import error message for `f` into a fresh Net ("" when it loads).
std::string import_error(const StFile& f) {
  Net n(5);
  try {
    import_weights(n.model, *n.be, n.cfg, n.input, parse_safetensors(serialize_safetensors(f), "w.safetensors"),
                   "w.safetensors");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

StTensor* find_mut(StFile& f, const std::string& name) {
  for (StTensor& t : f.tensors)
    if (t.name == name) return &t;
  FAIL("no tensor " << name);
  return nullptr;
}

}  // namespace

// ---- the format, by hand ------------------------------------------------------------

TEST_CASE("safetensors: a file laid out by hand reads back to the expected values", "[safetensors]") {
  // Header not padded (the reader must not require mpx's padding); tensors listed out of data order.
  const std::string header =
      R"({"b":{"dtype":"F16","shape":[1,2],"data_offsets":[8,12]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("c":{"dtype":"BF16","shape":[],"data_offsets":[12,14]},)"
      R"("__metadata__":{"layout":"keras","note":"by hand"}})";
  std::string data;
  data += std::string("\x00\x00\xc0\x3f", 4);  // 1.5f
  data += std::string("\x00\x00\x00\xc0", 4);  // -2.0f
  data += std::string("\x00\x3c", 2);          // float16 1.0
  data += std::string("\x00\xb8", 2);          // float16 -0.5
  data += std::string("\x49\x40", 2);          // bfloat16 3.140625
  const StFile f = parse_safetensors(file_of(header, data), "hand.safetensors");
  REQUIRE(f.tensors.size() == 3);
  CHECK(f.metadata.at("layout") == "keras");
  CHECK(f.metadata.at("note") == "by hand");
  // Data order.
  CHECK(f.tensors[0].name == "a");
  CHECK(f.tensors[1].name == "b");
  CHECK(f.tensors[2].name == "c");
  const StTensor& a = *f.find("a");
  CHECK(a.dtype == "F32");
  CHECK(a.shape == std::vector<int64_t>{2});
  CHECK(st_to_float32(a, "x") == std::vector<float>{1.5f, -2.0f});
  const StTensor& b = *f.find("b");
  CHECK(b.shape == std::vector<int64_t>{1, 2});
  CHECK(st_to_float32(b, "x") == std::vector<float>{1.0f, -0.5f});
  const StTensor& c = *f.find("c");
  CHECK(c.shape.empty());
  CHECK(c.numel() == 1);
  CHECK(st_to_float32(c, "x") == std::vector<float>{3.140625f});
}

TEST_CASE("safetensors: the writer pads the header to 8 bytes and lays the data out in order", "[safetensors]") {
  StFile f;
  f.metadata["config"] = "x";
  const float a[3] = {1.0f, -0.0f, 1e-45f};
  const uint16_t h[2] = {f32_to_f16(2.0f), f32_to_f16(65504.0f)};
  f.tensors.push_back(make_st_tensor("w/a", DType::F32, {3}, a));
  f.tensors.push_back(make_st_tensor("w/h", DType::F16, {2, 1}, h));
  const std::string bytes = serialize_safetensors(f);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  CHECK(n % 8 == 0);
  CHECK(bytes.size() == 8 + n + 12 + 4);
  const std::string header = bytes.substr(8, n);
  const auto j = nlohmann::json::parse(header);  // trailing spaces are JSON whitespace
  CHECK(j["w/a"]["dtype"] == "F32");
  CHECK(j["w/a"]["data_offsets"] == nlohmann::json::array({0, 12}));
  CHECK(j["w/h"]["data_offsets"] == nlohmann::json::array({12, 16}));
  CHECK(j["w/h"]["shape"] == nlohmann::json::array({2, 1}));
  CHECK(j["__metadata__"]["config"] == "x");
  CHECK(std::memcmp(bytes.data() + 8 + n, a, 12) == 0);
  const StFile g = parse_safetensors(bytes, "x");
  REQUIRE(g.tensors.size() == 2);
  CHECK(g.tensors[0].bytes == f.tensors[0].bytes);
  CHECK(st_to_float32(g.tensors[1], "x") == std::vector<float>{2.0f, 65504.0f});
}

TEST_CASE("safetensors: malformed files are rejected with the tensor named", "[safetensors]") {
  const std::string ok_data(8, '\0');
  auto one = [](const std::string& entry) { return R"({"t":)" + entry + "}"; };

  CHECK_THAT(parse_error("abc"), Catch::Contains("fewer than the 8-byte header length"));
  CHECK_THAT(parse_error(le64(1000) + "{}"), Catch::Contains("header length 1000 is larger than the rest of the file"));
  CHECK_THAT(parse_error(le64(~0ull) + "{}"), Catch::Contains("is larger than the rest of the file"));
  CHECK_THAT(parse_error(file_of("{\"t\": [1,", "")), Catch::Contains("the header is not valid JSON"));
  CHECK_THAT(parse_error(file_of("[1, 2]", "")), Catch::Contains("not a JSON object"));
  CHECK_THAT(parse_error(file_of(R"({"__metadata__": {"a": 1}})", "")), Catch::Contains("not a string"));
  CHECK_THAT(parse_error(file_of(one(R"({"dtype":"F33","shape":[2],"data_offsets":[0,8]})"), ok_data)),
             Catch::Contains("tensor 't': unknown dtype 'F33'"));
  CHECK_THAT(parse_error(file_of(one(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"), ok_data)),
             Catch::Contains("tensor 't': shape [-2] holds -2"));
  CHECK_THAT(parse_error(file_of(one(R"({"dtype":"F32","shape":[2.5],"data_offsets":[0,8]})"), ok_data)),
             Catch::Contains("tensor 't': shape"));
  CHECK_THAT(parse_error(file_of(one(R"({"dtype":"F32","shape":[2]})"), ok_data)),
             Catch::Contains("tensor 't': missing or malformed 'data_offsets'"));
  CHECK_THAT(parse_error(file_of(one(R"({"dtype":"F32","shape":[2],"data_offsets":[8,0]})"), ok_data)),
             Catch::Contains("tensor 't': data_offsets [8, 0] end before they begin"));
  CHECK_THAT(parse_error(file_of(one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"), ok_data)),
             Catch::Contains("tensor 't': data_offsets [0, 8] cover 8 bytes, but F32 [3] needs 12"));
  CHECK_THAT(parse_error(file_of(one(R"({"dtype":"F32","shape":[4294967296,4294967296,4294967296]})"), ok_data)),
             Catch::Contains("tensor 't': shape"));
  CHECK_THAT(parse_error(file_of(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1})"), ok_data)),
             Catch::Contains("tensor 't': unknown key 'x'"));

  SECTION("a truncated data section") {
    const std::string h = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})";
    CHECK(parse_error(file_of(h, std::string(24, '\0'))).empty());
    const std::string msg = parse_error(file_of(h, std::string(20, '\0')));
    CHECK_THAT(msg, Catch::Contains("tensor 'b': data_offsets [8, 24] reach beyond the data section (20 bytes)"));
    CHECK_THAT(msg, Catch::Contains("truncated"));
  }
  SECTION("a header lying about offsets") {
    const std::string overlap = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
    CHECK_THAT(parse_error(file_of(overlap, std::string(12, '\0'))),
               Catch::Contains("tensor 'b': data_offsets [4, 12] overlap those of tensor 'a' [0, 8]"));
    const std::string gap = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
    CHECK_THAT(parse_error(file_of(gap, std::string(12, '\0'))),
               Catch::Contains("tensor 'b': data_offsets [8, 12] leave bytes [4, 8) of the data section unused"));
    const std::string short_cover = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
    CHECK_THAT(parse_error(file_of(short_cover, std::string(12, '\0'))),
               Catch::Contains("tensor 'a': the data section has 12 bytes but the tensors end at byte 4"));
    CHECK_THAT(parse_error(file_of("{}", std::string(4, '\0'))), Catch::Contains("lists no tensors"));
  }
}

TEST_CASE("safetensors: every truncation and many byte flips are rejected or read, never a crash", "[safetensors]") {
  StFile f;
  const float a[4] = {1, 2, 3, 4};
  f.metadata["layout"] = "keras";
  f.tensors.push_back(make_st_tensor("x/kernel", DType::F32, {2, 2}, a));
  f.tensors.push_back(make_st_tensor("x/bias", DType::F32, {2}, a));
  const std::string good = serialize_safetensors(f);
  for (size_t len = 0; len < good.size(); ++len) {
    INFO("truncated to " << len << " bytes");
    CHECK_FALSE(parse_error(good.substr(0, len)).empty());
  }
  Rng rng(7);
  for (int i = 0; i < 3000; ++i) {
    std::string b = good;
    const size_t pos = static_cast<size_t>(rng.uniform_int(b.size()));
    b[pos] = static_cast<char>(rng.uniform_int(256));
    try {
      parse_safetensors(b, "flip");
    } catch (const ConfigError&) {
    }
  }
}

// ---- model weights ------------------------------------------------------------------

TEST_CASE("weights: export -> import is bit-identical in both layouts", "[safetensors][weights]") {
  for (WeightsLayout l : {WeightsLayout::Keras, WeightsLayout::PyTorch}) {
    INFO("layout " << weights_layout_name(l));
    Net a(1);
    const std::string bytes = serialize_safetensors(a.exported(l));
    Net b(2);
    REQUIRE_FALSE(bit_equal(a.master(), b.master()));
    const WeightsLayout got =
        import_weights(b.model, *b.be, b.cfg, b.input, parse_safetensors(bytes, "rt.safetensors"), "rt.safetensors");
    CHECK(got == l);
    CHECK(bit_equal(a.master(), b.master()));
    CHECK(bit_equal(a.state(), b.state()));
    // Every parameter is in the file, as float32.
    const StFile f = parse_safetensors(bytes, "rt");
    CHECK(f.tensors.size() == a.model.params().size());
    for (const StTensor& t : f.tensors) CHECK(t.dtype == "F32");
    CHECK(f.metadata.at("layout") == weights_layout_name(l));
    CHECK(f.metadata.at("config") == "rt");
  }
}

TEST_CASE("weights: keras names and layouts", "[safetensors][weights]") {
  Net n(3);
  const StFile f = n.exported(WeightsLayout::Keras);
  const std::vector<float> m = n.master(), s = n.state();
  // conv kernel [K, R, S, C] = [8, 3, 2, 4] -> HWIO [3, 2, 4, 8]
  const ParamInfo& ck = n.param("conv2d", "kernel");
  const StTensor& t = *f.find("conv2d/kernel");
  CHECK(t.shape == std::vector<int64_t>{3, 2, 4, 8});
  const int64_t k = 5, r = 2, q = 1, c = 3;
  CHECK(f32_at(t, static_cast<size_t>(((r * 2 + q) * 4 + c) * 8 + k)) ==
        m[static_cast<size_t>(ck.offset + ((k * 3 + r) * 2 + q) * 4 + c)]);
  // dense kernel [Cout, Cin] = [5, 72] -> (in, out) [72, 5]
  const ParamInfo& dk = n.param("hidden", "kernel");
  const StTensor& d = *f.find("hidden/kernel");
  CHECK(d.shape == std::vector<int64_t>{72, 5});
  CHECK(f32_at(d, 17 * 5 + 3) == m[static_cast<size_t>(dk.offset + 3 * 72 + 17)]);
  for (const char* name : {"c1/kernel", "c1/bias", "bn1/gamma", "bn1/beta", "bn1/moving_mean", "bn1/moving_variance",
                           "block_projection/kernel", "out/kernel", "out/bias"})
    CHECK(f.find(name) != nullptr);
  const ParamInfo& mv = n.param("bn1", "moving_variance");
  CHECK(f32_at(*f.find("bn1/moving_variance"), 2) == s[static_cast<size_t>(mv.offset + 2)]);
  CHECK(f.find("conv2d/bias") == nullptr);  // use_bias: false
}

TEST_CASE("weights: pytorch names, OIHW, and the flatten reordering", "[safetensors][weights]") {
  Net n(4);
  const StFile f = n.exported(WeightsLayout::PyTorch);
  const std::vector<float> m = n.master(), s = n.state();
  const StTensor& t = *f.find("conv2d.weight");
  CHECK(t.shape == std::vector<int64_t>{8, 4, 3, 2});
  const ParamInfo& ck = n.param("conv2d", "kernel");
  const int64_t k = 6, r = 1, q = 0, c = 2;
  CHECK(f32_at(t, static_cast<size_t>(((k * 4 + c) * 3 + r) * 2 + q)) ==
        m[static_cast<size_t>(ck.offset + ((k * 3 + r) * 2 + q) * 4 + c)]);
  for (const char* name : {"bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var", "c1.bias", "out.weight"})
    CHECK(f.find(name) != nullptr);
  // hidden follows flatten of the [3, 3, 8] block output: file column (c, h, w) = model column (h, w, c).
  const ParamInfo& dk = n.param("hidden", "kernel");
  const StTensor& d = *f.find("hidden.weight");
  CHECK(d.shape == std::vector<int64_t>{5, 72});
  const int64_t o = 2, hh = 1, ww = 2, cc = 5;
  CHECK(f32_at(d, static_cast<size_t>(o * 72 + (cc * 3 + hh) * 3 + ww)) ==
        m[static_cast<size_t>(dk.offset + o * 72 + (hh * 3 + ww) * 8 + cc)]);
  // The flat batch_norm between them is reordered the same way; `out` (after a dense) is not.
  const ParamInfo& rm = n.param("bn_flat", "moving_mean");
  CHECK(f32_at(*f.find("bn_flat.running_mean"), static_cast<size_t>((cc * 3 + hh) * 3 + ww)) ==
        s[static_cast<size_t>(rm.offset + (hh * 3 + ww) * 8 + cc)]);
  const ParamInfo& ok = n.param("out", "kernel");
  CHECK(f32_at(*f.find("out.weight"), 7) == m[static_cast<size_t>(ok.offset + 7)]);
}

TEST_CASE("weights: import names the first mismatch", "[safetensors][weights]") {
  Net n(6);
  const StFile good = n.exported(WeightsLayout::Keras);
  CHECK(import_error(good).empty());

  StFile f = good;
  find_mut(f, "hidden/kernel")->shape = {5, 72};
  CHECK_THAT(import_error(f),
             Catch::Contains("tensor 'hidden/kernel' has shape [5, 72] in the file, the model (config 'rt', keras "
                             "layout) expects [72, 5]"));

  f = good;
  f.tensors.erase(f.tensors.begin() + 3);
  CHECK_THAT(import_error(f), Catch::Contains("tensor '" + good.tensors[3].name + "' (layer"));
  CHECK_THAT(import_error(f), Catch::Contains("is missing"));

  f = good;
  const float extra[2] = {1, 2};
  f.tensors.push_back(make_st_tensor("ghost/kernel", DType::F32, {2}, extra));
  CHECK_THAT(import_error(f), Catch::Contains("tensor 'ghost/kernel' (F32 [2]) is not a parameter of the model"));

  f = good;
  StTensor* b = find_mut(f, "c1/bias");
  b->dtype = "I32";
  CHECK_THAT(import_error(f), Catch::Contains("tensor 'c1/bias' has dtype I32"));

  f = good;
  f.metadata["layout"] = "tensorflow";
  CHECK_THAT(import_error(f), Catch::Contains("layout 'tensorflow' is neither keras nor pytorch"));
}

TEST_CASE("weights: 16-bit files are widened; layout guessed from names; num_batches_tracked ignored",
          "[safetensors][weights]") {
  for (DType half : {DType::F16, DType::BF16}) {
    Net a(8);
    StFile f = a.exported(WeightsLayout::PyTorch);
    f.metadata.clear();  // no layout recorded: the names say pytorch
    std::vector<std::vector<float>> expect;
    for (StTensor& t : f.tensors) {
      std::vector<float> v = st_to_float32(t, "x");
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        h[i] = half == DType::F16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
        v[i] = half == DType::F16 ? f16_to_f32(h[i]) : bf16_to_f32(h[i]);
      }
      t = make_st_tensor(t.name, half, t.shape, h.data());
      expect.push_back(v);
    }
    const int64_t tracked = 100;
    StTensor nbt;
    nbt.name = "bn1.num_batches_tracked";
    nbt.dtype = "I64";
    nbt.bytes.resize(8);
    std::memcpy(nbt.bytes.data(), &tracked, 8);
    f.tensors.push_back(nbt);

    Net b(9);
    CHECK(import_weights(b.model, *b.be, b.cfg, b.input, parse_safetensors(serialize_safetensors(f), "h"), "h") ==
          WeightsLayout::PyTorch);
    const StFile back = b.exported(WeightsLayout::PyTorch);
    REQUIRE(back.tensors.size() == expect.size());
    for (size_t i = 0; i < expect.size(); ++i) {
      INFO(back.tensors[i].name);
      CHECK(st_to_float32(back.tensors[i], "x") == expect[i]);
    }
  }
}
