// SPDX-License-Identifier: MIT
// YAML tree -> validated Config. Every section is read by a MapReader that
// first rejects unknown keys (with the closest valid one), then reads each key
// with a typed getter that checks type and range and names file, key path,
// line and column on failure.
#include "config/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>

#include "config/yaml_tree.h"
#include "core/activation.h"
#include "core/error.h"

namespace mpx {

using config_detail::Origin;
using config_detail::YNode;

const char* policy_name(Policy p) {
  switch (p) {
    case Policy::Float32: return "float32";
    case Policy::MixedFloat16: return "mixed_float16";
    case Policy::MixedBFloat16: return "mixed_bfloat16";
    case Policy::Auto: return "auto";
  }
  return "?";
}

const char* loss_scale_mode_name(LossScaleMode m) {
  switch (m) {
    case LossScaleMode::Dynamic: return "dynamic";
    case LossScaleMode::Fixed: return "fixed";
    case LossScaleMode::None: return "none";
  }
  return "?";
}

std::optional<Policy> parse_policy(const std::string& s) {
  if (s == "float32") return Policy::Float32;
  if (s == "mixed_float16") return Policy::MixedFloat16;
  if (s == "mixed_bfloat16") return Policy::MixedBFloat16;
  if (s == "auto") return Policy::Auto;
  return std::nullopt;
}

std::optional<LossScaleMode> parse_loss_scale_mode(const std::string& s) {
  if (s == "dynamic") return LossScaleMode::Dynamic;
  if (s == "fixed") return LossScaleMode::Fixed;
  if (s == "none") return LossScaleMode::None;
  return std::nullopt;
}

const std::vector<std::string>& layer_types() {
  static const std::vector<std::string> t = {"conv2d",  "dense",   "activation", "max_pool",   "avg_pool",
                                             "global_avg_pool", "flatten", "dropout", "batch_norm", "residual"};
  return t;
}

const std::vector<std::string>& layer_keys(const std::string& type) {
  static const std::vector<std::string> none;
  static const std::vector<std::string> conv = {"type",    "name",    "dtype",    "filters",    "kernel",
                                                "strides", "stride",  "padding",  "use_bias",   "activation",
                                                "negative_slope"};
  static const std::vector<std::string> dense = {"type",     "name",       "dtype",         "units",
                                                 "use_bias", "activation", "negative_slope"};
  static const std::vector<std::string> act = {"type", "name", "dtype", "activation", "negative_slope"};
  static const std::vector<std::string> pool = {"type",    "name",   "dtype",  "pool_size",
                                                "size",    "strides", "stride", "padding"};
  static const std::vector<std::string> plain = {"type", "name", "dtype"};
  static const std::vector<std::string> dropout = {"type", "name", "dtype", "rate"};
  static const std::vector<std::string> bn = {"type", "name", "dtype", "momentum", "epsilon"};
  static const std::vector<std::string> res = {"type", "name", "dtype", "layers"};
  if (type == "conv2d") return conv;
  if (type == "dense") return dense;
  if (type == "activation") return act;
  if (type == "max_pool" || type == "avg_pool") return pool;
  if (type == "global_avg_pool" || type == "flatten") return plain;
  if (type == "dropout") return dropout;
  if (type == "batch_norm") return bn;
  if (type == "residual") return res;
  return none;
}

namespace {

// ---- messages -----------------------------------------------------------------

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

std::string describe(const YNode& n) {
  switch (n.kind) {
    case YNode::Kind::Null: return "an empty value";
    case YNode::Kind::Scalar: return "'" + n.scalar + "'";
    case YNode::Kind::Map: return "a mapping";
    case YNode::Kind::Seq: return "a list";
  }
  return "?";
}


/// One YAML mapping being read: unknown keys are rejected up front.
struct MapView {
  const YNode* node;  // a Map, or nullptr for an absent/empty section
  std::string path;   // "" at the top level, else "data", "model.layers[2]"
  std::string what;   // "the top level", "the data section", "a conv2d layer"
  Origin origin;      // of the section itself (for missing required keys)

  const YNode* get(const std::string& key) const {
    if (node == nullptr) return nullptr;
    const YNode* c = node->find(key);
    return c;
  }
  std::string child_path(const std::string& key) const { return path.empty() ? key : path + "." + key; }
};

class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const Origin& o, const std::string& key_path, const std::string& msg) const {
    throw ConfigError(fmt::format("{}: {}: {}", config_detail::where(source_, o), key_path, msg));
  }

  /// A section: a mapping, or absent/empty (no keys). Rejects keys not in `allowed`.
  MapView section(const YNode* n, const std::string& path, const std::string& what,
                  const std::vector<std::string>& allowed, const Origin& parent_origin) const {
    MapView v{nullptr, path, what, parent_origin};
    if (n == nullptr) return v;
    v.origin = n->origin;
    if (n->is_null()) return v;
    if (!n->is_map())
      fail(n->origin, path.empty() ? "config" : path, fmt::format("expected a mapping, got {}", describe(*n)));
    v.node = n;
    for (size_t i = 0; i < n->keys.size(); ++i) {
      const std::string& k = n->keys[i];
      if (std::find(allowed.begin(), allowed.end(), k) != allowed.end()) continue;
      const std::string guess = config_detail::closest_match(k, allowed);
      std::string msg = fmt::format("unknown key in {}", what);
      if (!guess.empty()) msg += fmt::format("; did you mean '{}'?", guess);
      msg += fmt::format(" (valid keys: {})", join(allowed));
      fail(n->key_origins[i], v.child_path(k), msg);
    }
    return v;
  }

  const YNode& require(const MapView& m, const std::string& key, const std::string& hint) const {
    const YNode* n = m.get(key);
    if (n == nullptr || n->is_null()) {
      const Origin& o = n ? n->origin : m.origin;
      fail(o, m.child_path(key), fmt::format("required key is missing ({})", hint));
    }
    return *n;
  }

  // ---- typed values -----------------------------------------------------------

  int64_t as_int(const YNode& n, const std::string& path, int64_t lo, int64_t hi) const {
    const std::string range = int_range(lo, hi);
    if (!n.is_scalar()) fail(n.origin, path, fmt::format("expected {}, got {}", range, describe(n)));
    const std::string& s = n.scalar;
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || end != s.c_str() + s.size() || std::isspace(static_cast<unsigned char>(s[0])))
      fail(n.origin, path, fmt::format("expected an integer, got '{}'", s));
    if (errno == ERANGE || v < lo || v > hi) fail(n.origin, path, fmt::format("expected {}, got {}", range, s));
    return v;
  }

  uint64_t as_uint64(const YNode& n, const std::string& path) const {
    const char* range = "an integer in [0, 18446744073709551615]";
    if (!n.is_scalar()) fail(n.origin, path, fmt::format("expected {}, got {}", range, describe(n)));
    const std::string& s = n.scalar;
    errno = 0;
    char* end = nullptr;
    if (s.empty() || !(std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '+' || s[0] == '-'))
      fail(n.origin, path, fmt::format("expected an integer, got '{}'", s));
    if (s[0] == '-') {
      (void)std::strtoll(s.c_str(), &end, 10);
      if (end != s.c_str() + s.size()) fail(n.origin, path, fmt::format("expected an integer, got '{}'", s));
      fail(n.origin, path, fmt::format("expected {}, got {}", range, s));
    }
    const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
    if (end != s.c_str() + s.size()) fail(n.origin, path, fmt::format("expected an integer, got '{}'", s));
    if (errno == ERANGE) fail(n.origin, path, fmt::format("expected {}, got {}", range, s));
    return v;
  }

  struct Range {
    double lo = -std::numeric_limits<double>::infinity(), hi = std::numeric_limits<double>::infinity();
    bool lo_open = false, hi_open = false;
  };
  static Range gt(double lo) { return {lo, std::numeric_limits<double>::infinity(), true, false}; }
  static Range ge(double lo) { return {lo, std::numeric_limits<double>::infinity(), false, false}; }
  static Range closed(double lo, double hi) { return {lo, hi, false, false}; }
  static Range half_open(double lo, double hi) { return {lo, hi, false, true}; }
  static Range open(double lo, double hi) { return {lo, hi, true, true}; }

  double as_double(const YNode& n, const std::string& path, Range r) const {
    const std::string range = double_range(r);
    if (!n.is_scalar()) fail(n.origin, path, fmt::format("expected {}, got {}", range, describe(n)));
    const std::string& s = n.scalar;
    char* end = nullptr;
    // YAML spells the special values .inf/-.inf/.nan; they parse, then fail the range check.
    std::string lower = s;
    for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (lower == ".inf" || lower == "+.inf" || lower == "-.inf" || lower == ".nan")
      fail(n.origin, path, fmt::format("expected {}, got {}", range, s));
    const double v = std::strtod(s.c_str(), &end);
    const bool hexish = s.find_first_of("xXpP") != std::string::npos;
    if (s.empty() || end != s.c_str() + s.size() || std::isspace(static_cast<unsigned char>(s[0])) || hexish)
      fail(n.origin, path, fmt::format("expected a number, got '{}'", s));
    const bool below = r.lo_open ? !(v > r.lo) : !(v >= r.lo);
    const bool above = r.hi_open ? !(v < r.hi) : !(v <= r.hi);
    if (!std::isfinite(v) || below || above) fail(n.origin, path, fmt::format("expected {}, got {}", range, s));
    return v;
  }

  bool as_bool(const YNode& n, const std::string& path) const {
    if (n.is_scalar()) {
      std::string s = n.scalar;
      for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (s == "true" || s == "yes" || s == "on") return true;
      if (s == "false" || s == "no" || s == "off") return false;
    }
    fail(n.origin, path, fmt::format("expected true or false, got {}", describe(n)));
  }

  std::string as_string(const YNode& n, const std::string& path) const {
    if (!n.is_scalar() || n.scalar.empty())
      fail(n.origin, path, fmt::format("expected a non-empty string, got {}", describe(n)));
    return n.scalar;
  }

  std::string as_enum(const YNode& n, const std::string& path, const std::vector<std::string>& allowed) const {
    if (n.is_scalar() && std::find(allowed.begin(), allowed.end(), n.scalar) != allowed.end()) return n.scalar;
    std::string msg = fmt::format("expected one of {}, got {}", join(allowed, " | "), describe(n));
    if (n.is_scalar()) {
      const std::string guess = config_detail::closest_match(n.scalar, allowed);
      if (!guess.empty()) msg += fmt::format("; did you mean '{}'?", guess);
    }
    fail(n.origin, path, msg);
  }

  /// An int, or [h, w] of ints, each in [lo, hi].
  std::pair<int, int> as_pair(const YNode& n, const std::string& path, int64_t lo, int64_t hi) const {
    if (n.is_seq()) {
      if (n.children.size() != 2)
        fail(n.origin, path, fmt::format("expected an integer or a list [h, w], got a list of {} elements",
                                         n.children.size()));
      return {static_cast<int>(as_int(n.children[0], path + "[0]", lo, hi)),
              static_cast<int>(as_int(n.children[1], path + "[1]", lo, hi))};
    }
    if (!n.is_scalar())
      fail(n.origin, path, fmt::format("expected {} or a list [h, w], got {}", int_range(lo, hi), describe(n)));
    const int v = static_cast<int>(as_int(n, path, lo, hi));
    return {v, v};
  }

  std::vector<double> as_double_list(const YNode& n, const std::string& path, Range r) const {
    if (!n.is_seq()) fail(n.origin, path, fmt::format("expected a list of numbers, got {}", describe(n)));
    std::vector<double> out;
    for (size_t i = 0; i < n.children.size(); ++i)
      out.push_back(as_double(n.children[i], fmt::format("{}[{}]", path, i), r));
    return out;
  }

  static std::string int_range(int64_t lo, int64_t hi) {
    constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
    if (lo == 1 && hi >= kMax) return "a positive integer";
    if (hi >= kMax) return fmt::format("an integer >= {}", lo);
    return fmt::format("an integer in [{}, {}]", lo, hi);
  }

  static std::string double_range(const Range& r) {
    const bool lo_inf = std::isinf(r.lo), hi_inf = std::isinf(r.hi);
    if (lo_inf && hi_inf) return "a number";
    if (hi_inf) return fmt::format("a number {} {}", r.lo_open ? ">" : ">=", fmt_double_short(r.lo));
    if (lo_inf) return fmt::format("a number {} {}", r.hi_open ? "<" : "<=", fmt_double_short(r.hi));
    return fmt::format("a number in {}{}, {}{}", r.lo_open ? "(" : "[", fmt_double_short(r.lo),
                       fmt_double_short(r.hi), r.hi_open ? ")" : "]");
  }
  static std::string fmt_double_short(double v) { return fmt::format("{}", v); }

  const std::string& source() const { return source_; }

 private:
  std::string source_;
};

constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

// Helpers that read an optional key into a field when present.
template <class F>
void with(const MapView& m, const std::string& key, F&& f) {
  if (const YNode* n = m.get(key)) f(*n, m.child_path(key));
}

// ---- sections -------------------------------------------------------------------

void read_loss_scale(const Reader& r, const MapView& m, LossScaleConfig& c) {
  with(m, "mode", [&](const YNode& n, const std::string& p) {
    c.mode = *parse_loss_scale_mode(r.as_enum(n, p, {"dynamic", "fixed", "none"}));
    c.mode_explicit = true;
  });
  with(m, "initial", [&](const YNode& n, const std::string& p) { c.initial = r.as_double(n, p, Reader::gt(0)); });
  with(m, "growth_interval",
       [&](const YNode& n, const std::string& p) { c.growth_interval = r.as_int(n, p, 1, kI64Max); });
  with(m, "growth_factor",
       [&](const YNode& n, const std::string& p) { c.growth_factor = r.as_double(n, p, Reader::gt(1)); });
  with(m, "backoff_factor",
       [&](const YNode& n, const std::string& p) { c.backoff_factor = r.as_double(n, p, Reader::open(0, 1)); });
  with(m, "min_scale", [&](const YNode& n, const std::string& p) { c.min_scale = r.as_double(n, p, Reader::gt(0)); });
  with(m, "max_consecutive_skips",
       [&](const YNode& n, const std::string& p) { c.max_consecutive_skips = r.as_int(n, p, 1, kI64Max); });
}

void read_data(const Reader& r, const MapView& m, DataConfig& c) {
  const YNode& ds = r.require(m, "dataset", "one of mnist | fashion_mnist | cifar10 | synthetic");
  c.dataset = r.as_enum(ds, m.child_path("dataset"), {"mnist", "fashion_mnist", "cifar10", "synthetic"});
  c.path = "data/" + c.dataset;
  with(m, "path", [&](const YNode& n, const std::string& p) { c.path = r.as_string(n, p); });
  with(m, "batch_size", [&](const YNode& n, const std::string& p) { c.batch_size = r.as_int(n, p, 1, kIntMax); });
  with(m, "train_limit", [&](const YNode& n, const std::string& p) { c.train_limit = r.as_int(n, p, 0, kI64Max); });
  with(m, "test_limit", [&](const YNode& n, const std::string& p) { c.test_limit = r.as_int(n, p, 0, kI64Max); });
  with(m, "drop_last", [&](const YNode& n, const std::string& p) { c.drop_last = r.as_bool(n, p); });
  with(m, "shuffle", [&](const YNode& n, const std::string& p) { c.shuffle = r.as_bool(n, p); });
  with(m, "synthetic_train",
       [&](const YNode& n, const std::string& p) { c.synthetic_train = r.as_int(n, p, 1, kIntMax); });
  with(m, "synthetic_test",
       [&](const YNode& n, const std::string& p) { c.synthetic_test = r.as_int(n, p, 1, kIntMax); });
  with(m, "normalize", [&](const YNode& n, const std::string& p) {
    const MapView nm = r.section(&n, p, "data.normalize", {"mean", "std"}, n.origin);
    with(nm, "mean", [&](const YNode& v, const std::string& vp) { c.mean = r.as_double_list(v, vp, Reader::Range{}); });
    with(nm, "std", [&](const YNode& v, const std::string& vp) { c.std = r.as_double_list(v, vp, Reader::gt(0)); });
    if (c.mean.size() != c.std.size())
      r.fail(n.origin, p,
             fmt::format("mean and std must have the same length (one value per channel), got {} and {}",
                         c.mean.size(), c.std.size()));
  });
  with(m, "augment", [&](const YNode& n, const std::string& p) {
    const MapView am = r.section(&n, p, "data.augment", {"random_crop_padding", "horizontal_flip"}, n.origin);
    with(am, "random_crop_padding", [&](const YNode& v, const std::string& vp) {
      c.augment.random_crop_padding = static_cast<int>(r.as_int(v, vp, 0, 1024));
    });
    with(am, "horizontal_flip",
         [&](const YNode& v, const std::string& vp) { c.augment.horizontal_flip = r.as_bool(v, vp); });
  });
}

// core/activation.h's names, and softmax (fused into the loss; the last layer only).
const std::vector<std::string> kActivations = [] {
  std::vector<std::string> v = activation_names();
  v.emplace_back("softmax");
  return v;
}();
const std::vector<std::string> kPaddings = {"same", "valid"};
const std::vector<std::string> kLayerDtypes = {"float32", "mixed_float16", "mixed_bfloat16", "float16", "bfloat16"};

void read_layers(const Reader& r, const YNode& seq, const std::string& path, std::vector<LayerConfig>& out);

/// `a` or its alias `b` (both present is an error); nullptr when neither.
const YNode* either(const Reader& r, const MapView& m, const std::string& a, const std::string& b, std::string& path) {
  const YNode* na = m.get(a);
  const YNode* nb = m.get(b);
  if (na && nb) r.fail(nb->origin, m.child_path(b), fmt::format("'{}' and '{}' are the same key; give only one", a, b));
  path = m.child_path(na ? a : b);
  return na ? na : nb;
}

LayerConfig read_layer(const Reader& r, const YNode& n, const std::string& path) {
  LayerConfig L;
  L.key_path = path;
  L.line = n.origin.line;
  L.column = n.origin.column;
  if (!n.is_map())
    r.fail(n.origin, path,
           fmt::format("expected a layer (a mapping with a 'type' key, e.g. {{type: dense, units: 10}}), got {}",
                       describe(n)));
  const YNode* tn = n.find("type");
  if (tn == nullptr || tn->is_null())
    r.fail(n.origin, path + ".type",
           fmt::format("required key is missing (one of {})", join(layer_types(), " | ")));
  L.type = r.as_enum(*tn, path + ".type", layer_types());
  const MapView m = r.section(&n, path, "a " + L.type + " layer", layer_keys(L.type), n.origin);

  with(m, "name", [&](const YNode& v, const std::string& p) { L.name = r.as_string(v, p); });
  with(m, "dtype", [&](const YNode& v, const std::string& p) { L.dtype = r.as_enum(v, p, kLayerDtypes); });
  with(m, "use_bias", [&](const YNode& v, const std::string& p) { L.use_bias = r.as_bool(v, p); });
  with(m, "activation", [&](const YNode& v, const std::string& p) { L.activation = r.as_enum(v, p, kActivations); });
  with(m, "negative_slope", [&](const YNode& v, const std::string& p) {
    if (L.activation != "leaky_relu")
      r.fail(v.origin, p, fmt::format("negative_slope applies to activation leaky_relu only, not to {}", L.activation));
    L.negative_slope = r.as_double(v, p, Reader::ge(0));
  });
  with(m, "padding", [&](const YNode& v, const std::string& p) { L.padding = r.as_enum(v, p, kPaddings); });

  std::string sp;
  if (L.type == "conv2d") {
    L.filters = r.as_int(r.require(m, "filters", "a positive integer"), m.child_path("filters"), 1, kIntMax);
    with(m, "kernel", [&](const YNode& v, const std::string& p) {
      std::tie(L.kernel_h, L.kernel_w) = r.as_pair(v, p, 1, 1024);
    });
    if (const YNode* s = either(r, m, "strides", "stride", sp)) std::tie(L.stride_h, L.stride_w) = r.as_pair(*s, sp, 1, 1024);
  } else if (L.type == "dense") {
    L.units = r.as_int(r.require(m, "units", "a positive integer"), m.child_path("units"), 1, kIntMax);
  } else if (L.type == "max_pool" || L.type == "avg_pool") {
    if (const YNode* s = either(r, m, "pool_size", "size", sp)) std::tie(L.pool_h, L.pool_w) = r.as_pair(*s, sp, 1, 1024);
    // Strides default to the pool size (Keras); resolved here so the Config is explicit.
    L.pool_stride_h = L.pool_h;
    L.pool_stride_w = L.pool_w;
    if (const YNode* s = either(r, m, "strides", "stride", sp))
      std::tie(L.pool_stride_h, L.pool_stride_w) = r.as_pair(*s, sp, 1, 1024);
  } else if (L.type == "dropout") {
    with(m, "rate", [&](const YNode& v, const std::string& p) { L.rate = r.as_double(v, p, Reader::half_open(0, 1)); });
  } else if (L.type == "batch_norm") {
    with(m, "momentum",
         [&](const YNode& v, const std::string& p) { L.momentum = r.as_double(v, p, Reader::closed(0, 1)); });
    with(m, "epsilon", [&](const YNode& v, const std::string& p) { L.epsilon = r.as_double(v, p, Reader::gt(0)); });
  } else if (L.type == "residual") {
    const YNode& inner = r.require(m, "layers", "a non-empty list of layers");
    read_layers(r, inner, m.child_path("layers"), L.layers);
  }
  return L;
}

void read_layers(const Reader& r, const YNode& seq, const std::string& path, std::vector<LayerConfig>& out) {
  if (!seq.is_seq() || seq.children.empty())
    r.fail(seq.origin, path, fmt::format("expected a non-empty list of layers, got {}",
                                         seq.is_seq() ? "an empty list" : describe(seq)));
  for (size_t i = 0; i < seq.children.size(); ++i)
    out.push_back(read_layer(r, seq.children[i], fmt::format("{}[{}]", path, i)));
}

// Keras-style default names (conv2d, conv2d_1, ...), unique over the whole
// model including nested layers; explicit names must be unique.
void collect_names(const Reader& r, const std::vector<LayerConfig>& layers,
                   std::map<std::string, const LayerConfig*>& taken) {
  for (const auto& L : layers) {
    if (!L.name.empty()) {
      auto [it, fresh] = taken.emplace(L.name, &L);
      if (!fresh) {
        Origin o;
        o.line = L.line;
        o.column = L.column;
        r.fail(o, L.key_path + ".name",
               fmt::format("duplicate layer name '{}' (also used by {})", L.name, it->second->key_path));
      }
    }
    collect_names(r, L.layers, taken);
  }
}

void assign_names(std::vector<LayerConfig>& layers, std::map<std::string, const LayerConfig*>& taken,
                  std::map<std::string, int>& counters) {
  for (auto& L : layers) {
    if (L.name.empty()) {
      int& k = counters[L.type];
      std::string candidate;
      do {
        candidate = k == 0 ? L.type : fmt::format("{}_{}", L.type, k);
        ++k;
      } while (taken.count(candidate));
      L.name = candidate;
      taken.emplace(candidate, &L);
    }
    assign_names(L.layers, taken, counters);
  }
}

void read_model(const Reader& r, const MapView& m, ModelConfig& c) {
  with(m, "input_shape", [&](const YNode& n, const std::string& p) {
    if (!n.is_seq() || (n.children.size() != 3 && !n.children.empty()))
      r.fail(n.origin, p, fmt::format("expected a list [H, W, C] of 3 positive integers, got {}",
                                      n.is_seq() ? fmt::format("a list of {} elements", n.children.size())
                                                 : describe(n)));
    c.input_shape.clear();
    for (size_t i = 0; i < n.children.size(); ++i)
      c.input_shape.push_back(r.as_int(n.children[i], fmt::format("{}[{}]", p, i), 1, 1 << 16));
  });
  const YNode& layers = r.require(m, "layers", "a non-empty list of layers");
  read_layers(r, layers, m.child_path("layers"), c.layers);
  std::map<std::string, const LayerConfig*> taken;
  collect_names(r, c.layers, taken);
  std::map<std::string, int> counters;
  assign_names(c.layers, taken, counters);
}

void read_optimizer(const Reader& r, const MapView& m, OptimizerConfig& c) {
  with(m, "name", [&](const YNode& n, const std::string& p) { c.name = r.as_enum(n, p, {"sgd", "adam", "adamw"}); });
  with(m, "learning_rate",
       [&](const YNode& n, const std::string& p) { c.learning_rate = r.as_double(n, p, Reader::gt(0)); });
  with(m, "scale_lr_by_batch", [&](const YNode& n, const std::string& p) { c.scale_lr_by_batch = r.as_bool(n, p); });
  with(m, "momentum",
       [&](const YNode& n, const std::string& p) { c.momentum = r.as_double(n, p, Reader::closed(0, 1)); });
  with(m, "nesterov", [&](const YNode& n, const std::string& p) { c.nesterov = r.as_bool(n, p); });
  with(m, "beta1", [&](const YNode& n, const std::string& p) { c.beta1 = r.as_double(n, p, Reader::half_open(0, 1)); });
  with(m, "beta2", [&](const YNode& n, const std::string& p) { c.beta2 = r.as_double(n, p, Reader::half_open(0, 1)); });
  with(m, "epsilon", [&](const YNode& n, const std::string& p) { c.epsilon = r.as_double(n, p, Reader::gt(0)); });
  with(m, "weight_decay",
       [&](const YNode& n, const std::string& p) { c.weight_decay = r.as_double(n, p, Reader::ge(0)); });
}

void read_schedule(const Reader& r, const MapView& m, ScheduleConfig& c) {
  with(m, "name", [&](const YNode& n, const std::string& p) {
    c.name = r.as_enum(n, p, {"constant", "step", "cosine", "reduce_on_plateau"});
  });
  with(m, "warmup_epochs",
       [&](const YNode& n, const std::string& p) { c.warmup_epochs = r.as_double(n, p, Reader::ge(0)); });
  with(m, "step_epochs", [&](const YNode& n, const std::string& p) { c.step_epochs = r.as_int(n, p, 1, kI64Max); });
  with(m, "gamma", [&](const YNode& n, const std::string& p) { c.gamma = r.as_double(n, p, Reader::gt(0)); });
  with(m, "min_lr", [&](const YNode& n, const std::string& p) { c.min_lr = r.as_double(n, p, Reader::ge(0)); });
  with(m, "factor", [&](const YNode& n, const std::string& p) { c.factor = r.as_double(n, p, Reader::open(0, 1)); });
  with(m, "patience", [&](const YNode& n, const std::string& p) { c.patience = r.as_int(n, p, 0, kI64Max); });
  with(m, "min_delta", [&](const YNode& n, const std::string& p) { c.min_delta = r.as_double(n, p, Reader::ge(0)); });
  with(m, "cooldown", [&](const YNode& n, const std::string& p) { c.cooldown = r.as_int(n, p, 0, kI64Max); });
}

void read_train(const Reader& r, const MapView& m, TrainConfig& c) {
  with(m, "epochs", [&](const YNode& n, const std::string& p) { c.epochs = r.as_int(n, p, 1, kI64Max); });
  with(m, "log_every", [&](const YNode& n, const std::string& p) { c.log_every = r.as_int(n, p, 1, kI64Max); });
  with(m, "eval_every", [&](const YNode& n, const std::string& p) { c.eval_every = r.as_int(n, p, 1, kI64Max); });
  with(m, "eval_policy",
       [&](const YNode& n, const std::string& p) { c.eval_policy = r.as_enum(n, p, {"same", "float32"}); });
  with(m, "checkpoint_every",
       [&](const YNode& n, const std::string& p) { c.checkpoint_every = r.as_int(n, p, 1, kI64Max); });
  with(m, "max_steps", [&](const YNode& n, const std::string& p) { c.max_steps = r.as_int(n, p, 0, kI64Max); });
  with(m, "sync", [&](const YNode& n, const std::string& p) { c.sync = r.as_enum(n, p, {"auto", "step", "log"}); });
  with(m, "cuda_graph", [&](const YNode& n, const std::string& p) { c.cuda_graph = r.as_bool(n, p); });
}

std::string read_device(const Reader& r, const YNode& n, const std::string& p) {
  const char* expected = "expected one of auto | cpu | cuda | cuda:N (N a device index)";
  if (!n.is_scalar()) r.fail(n.origin, p, fmt::format("{}, got {}", expected, describe(n)));
  const std::string& s = n.scalar;
  if (s == "auto" || s == "cpu" || s == "cuda") return s;
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5 && s.size() <= 9 &&
      std::all_of(s.begin() + 5, s.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); }))
    return s;
  r.fail(n.origin, p, fmt::format("{}, got '{}'", expected, s));
}

Config build(const YNode& root, const std::string& source) {
  const Reader r(source);
  Config c;
  c.source = source;
  static const std::vector<std::string> top = {"name",  "seed",  "device",    "policy",   "loss_scale", "data",
                                               "model", "optimizer", "schedule", "train", "debug", "weights"};
  const Origin none;
  if (!root.is_null() && !root.is_map())
    r.fail(root.origin, "config", fmt::format("expected a mapping of sections at the top level, got {}", describe(root)));
  const MapView m = r.section(&root, "", "the top level", top, none);

  with(m, "name", [&](const YNode& n, const std::string& p) {
    c.name = r.as_string(n, p);
    if (c.name.find_first_of("/\\") != std::string::npos)
      r.fail(n.origin, p, fmt::format("expected a run name without '/' or '\\', got '{}'", c.name));
  });
  with(m, "seed", [&](const YNode& n, const std::string& p) { c.seed = r.as_uint64(n, p); });
  with(m, "device", [&](const YNode& n, const std::string& p) { c.device = read_device(r, n, p); });
  with(m, "policy", [&](const YNode& n, const std::string& p) {
    c.policy = *parse_policy(r.as_enum(n, p, {"float32", "mixed_float16", "mixed_bfloat16", "auto"}));
  });

  read_loss_scale(r,
                  r.section(m.get("loss_scale"), "loss_scale", "the loss_scale section",
                            {"mode", "initial", "growth_interval", "growth_factor", "backoff_factor", "min_scale",
                             "max_consecutive_skips"},
                            root.origin),
                  c.loss_scale);
  read_data(r,
            r.section(m.get("data"), "data", "the data section",
                      {"dataset", "path", "batch_size", "train_limit", "test_limit", "drop_last", "shuffle",
                       "normalize", "augment", "synthetic_train", "synthetic_test"},
                      root.origin),
            c.data);
  read_model(r, r.section(m.get("model"), "model", "the model section", {"input_shape", "layers"}, root.origin),
             c.model);
  read_optimizer(r,
                 r.section(m.get("optimizer"), "optimizer", "the optimizer section",
                           {"name", "learning_rate", "scale_lr_by_batch", "momentum", "nesterov", "beta1", "beta2",
                            "epsilon", "weight_decay"},
                           root.origin),
                 c.optimizer);
  read_schedule(r,
                r.section(m.get("schedule"), "schedule", "the schedule section",
                          {"name", "warmup_epochs", "step_epochs", "gamma", "min_lr", "factor", "patience",
                           "min_delta", "cooldown"},
                          root.origin),
                c.schedule);
  read_train(r,
             r.section(m.get("train"), "train", "the train section",
                       {"epochs", "log_every", "eval_every", "eval_policy", "checkpoint_every", "max_steps", "sync",
                        "cuda_graph"},
                       root.origin),
             c.train);
  const MapView dm = r.section(m.get("debug"), "debug", "the debug section", {"check_numerics"}, root.origin);
  with(dm, "check_numerics", [&](const YNode& n, const std::string& p) { c.debug.check_numerics = r.as_bool(n, p); });
  const MapView wm = r.section(m.get("weights"), "weights", "the weights section", {"init_from"}, root.origin);
  with(wm, "init_from", [&](const YNode& n, const std::string& p) {
    if (!n.is_null()) c.weights.init_from = r.as_string(n, p);  // null (~) = none, as to_yaml writes it
  });
  return c;
}

}  // namespace

Config parse_config(const std::string& yaml_text, const std::string& source,
                    const std::vector<std::string>& overrides) {
  YNode root = config_detail::parse_yaml_tree(yaml_text, source);
  for (const auto& ov : overrides) config_detail::apply_override(root, ov, source);
  return build(root, source);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError(fmt::format("{}: cannot read config file: it is a directory", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("{}: cannot open config file: {}", path, std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw ConfigError(fmt::format("{}: cannot read config file: {}", path, std::strerror(errno)));
  return parse_config(ss.str(), path, overrides);
}

}  // namespace mpx
