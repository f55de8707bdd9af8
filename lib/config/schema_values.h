// SPDX-License-Identifier: MIT
// The value types of the schema (integer in a range, number in a range, enum,
// [h, w] pair, list of layers, ...) and schema::key(), which binds one to a
// field of Config or LayerConfig. Only config/schema_table.cpp includes this.
#pragma once

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "config/schema.h"

/// The field a key reads and writes: MPX_F(data.batch_size); MPX_HW(kernel_h, kernel_w) for an [h, w] pair.
#define MPX_F(member) [](auto& o) -> decltype(auto) { return (o.member); }
#define MPX_HW(h, w) [](auto& o) { return std::tie(o.h, o.w); }
/// A key whose YAML path is its member's path: MPX_KEY(data.batch_size, Int(1, kIntMax), "help")
/// is k("data.batch_size", MPX_F(data.batch_size), Int(1, kIntMax), "help"), `k` the table's key<Owner>.
#define MPX_KEY(member, ...) k(#member, MPX_F(member), __VA_ARGS__)

namespace mpx::schema {

using config_detail::Range;

template <class Owner, class Acc, class Type>
class Field final : public Value<Owner> {
 public:
  Field(Acc acc, Type type) : acc_(acc), type_(std::move(type)) {}
  void read(const Reader& r, const YNode& n, const std::string& path, Owner& o) const override {
    type_.read(r, n, path, acc_(o));
  }
  void write(YAML::Emitter& out, const Owner& o) const override { type_.write(out, get(o)); }
  bool is_set(const Owner& o) const override { return type_.is_set(get(o)); }
  bool equal(const Owner& a, const Owner& b) const override { return type_.equal(get(a), get(b)); }
  std::string show(const Owner& o) const override {
    YAML::Emitter e;
    e << YAML::Flow;
    if (type_.is_set(get(o))) type_.write(e, get(o));
    return e.c_str();
  }
  std::string expected() const override { return type_.expected(); }
  void vary(Owner& o, int salt) const override {
    Owner initial{};
    type_.vary(acc_(o), acc_(initial), salt);
  }

 private:
  decltype(auto) get(const Owner& o) const { return acc_(const_cast<Owner&>(o)); }
  Acc acc_;
  Type type_;
};

/// One schema entry: `path` (dotted), the field, its value type, a help line.
template <class Owner, class Acc, class Type>
Key<Owner> key(std::string path, Acc acc, Type type, std::string help) {
  Key<Owner> k;
  k.path = std::move(path);
  k.help = std::move(help);
  k.value = std::make_shared<Field<Owner, Acc, Type>>(acc, std::move(type));
  return k;
}

// ---- value types ---------------------------------------------------------------------
// Each has read(r, node, path, field), write(out, field), expected(), vary(field,
// initial, salt), and (from Plain) is_set and equal.

struct Plain {
  template <class T>
  bool is_set(const T&) const {
    return true;
  }
  template <class T>
  bool equal(const T& a, const T& b) const {
    return a == b;
  }
};

/// A value of [lo, hi] different from `d`, chosen by `salt`.
inline int64_t vary_int(int64_t d, int64_t lo, int64_t hi, int salt) {
  const int64_t step = 1 + salt % 5;
  int64_t v = d < lo ? lo + step - 1 : d + step;
  if (v > hi) v = d - step >= lo ? d - step : lo;
  if (v == d) v = d == lo ? lo + 1 : lo;
  return v;
}

inline double vary_double(double d, const Range& r, int salt) {
  const double k = 1 + salt % 7;
  for (double v : {d + 0.125 * k, d / (1 + k), r.lo + 0.5 / k})
    if (v != d && r.contains(v)) return v;
  return d;
}

template <class E>
E vary_enum(E d, int salt) {
  const std::vector<E> all = enum_values<E>();
  const size_t at = static_cast<size_t>(std::find(all.begin(), all.end(), d) - all.begin());
  return all[(at + 1 + static_cast<size_t>(salt) % (all.size() - 1)) % all.size()];
}

struct Int : Plain {
  int64_t lo, hi;
  Int(int64_t lo_, int64_t hi_) : lo(lo_), hi(hi_) {}
  template <class T>
  void read(const Reader& r, const YNode& n, const std::string& p, T& v) const {
    v = static_cast<T>(r.as_int(n, p, lo, hi));
  }
  template <class T>
  void write(YAML::Emitter& out, const T& v) const {
    out << v;
  }
  std::string expected() const { return config_detail::int_range(lo, hi); }
  template <class T>
  void vary(T& v, const T& d, int salt) const {
    v = static_cast<T>(vary_int(d, lo, hi, salt));
  }
};

struct UInt64 : Plain {
  void read(const Reader& r, const YNode& n, const std::string& p, uint64_t& v) const { v = r.as_uint64(n, p); }
  void write(YAML::Emitter& out, uint64_t v) const { out << v; }
  std::string expected() const { return "an integer in [0, 18446744073709551615]"; }
  void vary(uint64_t& v, uint64_t d, int salt) const { v = d + 1 + static_cast<uint64_t>(salt); }
};

struct Num : Plain {
  Range range;
  explicit Num(Range r) : range(r) {}
  void read(const Reader& r, const YNode& n, const std::string& p, double& v) const { v = r.as_double(n, p, range); }
  void write(YAML::Emitter& out, double v) const { out << yaml_double(v); }
  std::string expected() const { return config_detail::double_range(range); }
  void vary(double& v, double d, int salt) const { v = vary_double(d, range, salt); }
};

struct Bool : Plain {
  void read(const Reader& r, const YNode& n, const std::string& p, bool& v) const { v = r.as_bool(n, p); }
  void write(YAML::Emitter& out, bool v) const { out << v; }
  std::string expected() const { return "true or false"; }
  void vary(bool& v, bool d, int) const { v = !d; }
};

/// A non-empty string; `check` (optional) returns a message for a bad one. "" is unset.
struct Str : Plain {
  std::string (*check)(const std::string&) = nullptr;
  Str() = default;
  explicit Str(std::string (*c)(const std::string&)) : check(c) {}
  void read(const Reader& r, const YNode& n, const std::string& p, std::string& v) const {
    v = r.as_string(n, p);
    if (check)
      if (const std::string msg = check(v); !msg.empty()) r.fail(n.origin, p, msg);
  }
  bool is_set(const std::string& v) const { return !v.empty(); }
  void write(YAML::Emitter& out, const std::string& v) const { out << v; }
  std::string expected() const { return "a non-empty string"; }
  void vary(std::string& v, const std::string&, int salt) const { v = fmt::format("s{}", salt); }
};

/// A string where null (~) means none (the field stays "").
struct OptStr : Plain {
  void read(const Reader& r, const YNode& n, const std::string& p, std::string& v) const {
    if (!n.is_null()) v = r.as_string(n, p);
  }
  void write(YAML::Emitter& out, const std::string& v) const {
    if (v.empty())
      out << YAML::Null;
    else
      out << v;
  }
  std::string expected() const { return "a non-empty string, or ~ for none"; }
  void vary(std::string& v, const std::string&, int salt) const { v = fmt::format("w{}.safetensors", salt); }
};

/// auto | cpu | cuda | cuda:N.
struct Device : Plain {
  void read(const Reader& r, const YNode& n, const std::string& p, std::string& v) const {
    const std::string exp = "expected " + expected();
    if (!n.is_scalar()) r.fail(n.origin, p, fmt::format("{}, got {}", exp, config_detail::describe(n)));
    const std::string& s = n.scalar;
    const bool index =
        s.rfind("cuda:", 0) == 0 && s.size() > 5 && s.size() <= 9 &&
        std::all_of(s.begin() + 5, s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    if (s != "auto" && s != "cpu" && s != "cuda" && !index)
      r.fail(n.origin, p, fmt::format("{}, got '{}'", exp, config_detail::clip(s)));
    v = s;
  }
  void write(YAML::Emitter& out, const std::string& v) const { out << v; }
  std::string expected() const { return "one of auto | cpu | cuda | cuda:N (N a device index)"; }
  void vary(std::string& v, const std::string&, int salt) const { v = fmt::format("cuda:{}", 1 + salt % 7); }
};

template <class E>
struct Enum : Plain {
  void read(const Reader& r, const YNode& n, const std::string& p, E& v) const {
    v = *parse_enum<E>(r.as_enum(n, p, enum_names<E>()));
  }
  void write(YAML::Emitter& out, E v) const { out << enum_name(v); }
  std::string expected() const { return "one of " + config_detail::join(enum_names<E>(), " | "); }
  void vary(E& v, E d, int salt) const { v = vary_enum(d, salt); }
};

/// An enum that may be left unset (std::optional); unset keys are not written.
template <class E>
struct OptEnum : Plain {
  void read(const Reader& r, const YNode& n, const std::string& p, std::optional<E>& v) const {
    v = *parse_enum<E>(r.as_enum(n, p, enum_names<E>()));
  }
  bool is_set(const std::optional<E>& v) const { return v.has_value(); }
  void write(YAML::Emitter& out, const std::optional<E>& v) const { out << enum_name(*v); }
  std::string expected() const { return Enum<E>().expected(); }
  void vary(std::optional<E>& v, const std::optional<E>&, int salt) const {
    v = enum_values<E>()[static_cast<size_t>(salt) % enum_values<E>().size()];
  }
};

/// An enum with a flag that says whether the YAML set it (MPX_HW(value, flag)).
template <class E>
struct FlaggedEnum : Plain {
  void read(const Reader& r, const YNode& n, const std::string& p, std::tuple<E&, bool&> v) const {
    std::get<0>(v) = *parse_enum<E>(r.as_enum(n, p, enum_names<E>()));
    std::get<1>(v) = true;
  }
  bool is_set(std::tuple<E&, bool&> v) const { return std::get<1>(v); }
  void write(YAML::Emitter& out, std::tuple<E&, bool&> v) const { out << enum_name(std::get<0>(v)); }
  std::string expected() const { return Enum<E>().expected(); }
  void vary(std::tuple<E&, bool&> v, std::tuple<E&, bool&> d, int salt) const {
    std::get<0>(v) = vary_enum(std::get<0>(d), salt);
    std::get<1>(v) = true;
  }
};

/// An int or [h, w], each in [lo, hi] (MPX_HW(h, w)); written as an int when h == w.
struct Pair : Plain {
  int64_t lo, hi;
  Pair(int64_t lo_, int64_t hi_) : lo(lo_), hi(hi_) {}
  void read(const Reader& r, const YNode& n, const std::string& p, std::tuple<int&, int&> v) const {
    v = r.as_pair(n, p, lo, hi);
  }
  void write(YAML::Emitter& out, std::tuple<int&, int&> v) const {
    const auto [h, w] = v;
    if (h == w)
      out << h;
    else
      out << YAML::Flow << YAML::BeginSeq << h << w << YAML::EndSeq;
  }
  std::string expected() const { return config_detail::int_range(lo, hi) + " or a list [h, w]"; }
  void vary(std::tuple<int&, int&> v, std::tuple<int&, int&> d, int salt) const {
    std::get<0>(v) = static_cast<int>(vary_int(std::get<0>(d), lo, hi - 1, salt));
    std::get<1>(v) = std::get<0>(v) + 1;
  }
};

/// A list of numbers, each in `range`.
struct Nums : Plain {
  Range range;
  explicit Nums(Range r) : range(r) {}
  void read(const Reader& r, const YNode& n, const std::string& p, std::vector<double>& v) const {
    v = r.as_double_list(n, p, range);
  }
  void write(YAML::Emitter& out, const std::vector<double>& v) const {
    out << YAML::Flow << YAML::BeginSeq;
    for (double x : v) out << yaml_double(x);
    out << YAML::EndSeq;
  }
  std::string expected() const {
    const std::string each = config_detail::double_range(range);
    return each == "a number" ? "a list of numbers" : "a list of numbers, each " + each;
  }
  void vary(std::vector<double>& v, const std::vector<double>&, int salt) const {
    v.clear();
    for (int i = 0; i < 3; ++i) v.push_back(vary_double(0.25 * (i + 1), range, salt + i));
  }
};

/// A list of "pattern=value" strings (ParamRule): a glob over "<layer>/<parameter>" names and
/// a number in `range`.
struct ParamRules : Plain {
  Range range;
  explicit ParamRules(Range r) : range(r) {}
  void read(const Reader& r, const YNode& n, const std::string& p, std::vector<ParamRule>& v) const {
    if (!n.is_seq()) r.fail(n.origin, p, fmt::format("expected {}, got {}", expected(), config_detail::describe(n)));
    v.clear();
    for (size_t i = 0; i < n.children.size(); ++i) {
      const std::string at = fmt::format("{}[{}]", p, i);
      const std::string s = r.as_string(n.children[i], at);
      const size_t eq = s.rfind('=');
      ParamRule rule;
      rule.pattern = s.substr(0, eq == std::string::npos ? 0 : eq);
      const std::string num = eq == std::string::npos ? std::string() : s.substr(eq + 1);
      char* end = nullptr;
      rule.value = num.empty() ? 0.0 : std::strtod(num.c_str(), &end);
      if (eq == std::string::npos || rule.pattern.empty() || num.empty() || end == nullptr || *end != '\0')
        r.fail(n.children[i].origin, at,
               fmt::format("expected \"<layer>/<parameter>=<number>\" (a glob, e.g. \"batch_norm*/beta=64\"), got \"{}\"", s));
      if (!range.contains(rule.value))
        r.fail(n.children[i].origin, at,
               fmt::format("the value {} of \"{}\" is out of range: expected {}", num, s, config_detail::double_range(range)));
      v.push_back(std::move(rule));
    }
  }
  bool is_set(const std::vector<ParamRule>& v) const { return !v.empty(); }
  void write(YAML::Emitter& out, const std::vector<ParamRule>& v) const {
    out << YAML::Flow << YAML::BeginSeq;
    for (const ParamRule& x : v) out << (x.pattern + "=" + yaml_double(x.value));
    out << YAML::EndSeq;
  }
  std::string expected() const {
    return "a list of \"<layer>/<parameter>=<number>\" strings, each number " + config_detail::double_range(range);
  }
  void vary(std::vector<ParamRule>& v, const std::vector<ParamRule>&, int salt) const {
    v = {ParamRule{fmt::format("layer{}/*", salt), vary_double(1.0, range, salt)}};
  }
};

/// [H, W, C] of positive integers, or the empty list.
struct Shape : Plain {
  void read(const Reader& r, const YNode& n, const std::string& p, std::vector<int64_t>& v) const {
    if (!n.is_seq() || (n.children.size() != 3 && !n.children.empty()))
      r.fail(n.origin, p,
             fmt::format(
                 "expected {}, got {}", expected(),
                 n.is_seq() ? fmt::format("a list of {} elements", n.children.size()) : config_detail::describe(n)));
    v.clear();
    for (size_t i = 0; i < n.children.size(); ++i)
      v.push_back(r.as_int(n.children[i], fmt::format("{}[{}]", p, i), 1, 1 << 16));
  }
  void write(YAML::Emitter& out, const std::vector<int64_t>& v) const {
    out << YAML::Flow << YAML::BeginSeq;
    for (int64_t x : v) out << x;
    out << YAML::EndSeq;
  }
  std::string expected() const { return "a list [H, W, C] of 3 positive integers"; }
  void vary(std::vector<int64_t>& v, const std::vector<int64_t>&, int salt) const { v = {8 + salt % 5, 9, 3}; }
};

/// A non-empty list of layers (model.layers, a residual block's layers).
struct Layers {
  void read(const Reader& r, const YNode& n, const std::string& p, std::vector<LayerConfig>& v) const {
    read_layers(r, n, p, v);
  }
  bool is_set(const std::vector<LayerConfig>&) const { return true; }
  bool equal(const std::vector<LayerConfig>& a, const std::vector<LayerConfig>& b) const { return layers_equal(a, b); }
  void write(YAML::Emitter& out, const std::vector<LayerConfig>& v) const { write_layers(out, v); }
  std::string expected() const { return "a non-empty list of layers"; }
  /// One dense layer with a name of its own.
  void vary(std::vector<LayerConfig>& v, const std::vector<LayerConfig>&, int salt) const {
    LayerConfig l;
    l.type = LayerType::Dense;
    l.units = 3 + salt;
    l.name = fmt::format("inner_{}", salt);
    v = {l};
  }
};

}  // namespace mpx::schema
