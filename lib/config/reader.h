// SPDX-License-Identifier: MIT
// Typed reads of YAML nodes for the config reader: every getter checks type
// and range and throws ConfigError naming file, key path, line and column.
// Internal to lib/config (the schema's value types call it).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "config/yaml_tree.h"

namespace mpx::config_detail {

constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

/// The values a number key may hold: a range of doubles (open ends exclude the
/// bound) that also fit a float32, as mpx computes in float32: 0, or a
/// magnitude in [FLT_MIN, FLT_MAX] (a subnormal or larger value would turn
/// into 0 or inf, or lose its precision, on the way to the kernels).
struct Range {
  double lo = -std::numeric_limits<double>::infinity(), hi = std::numeric_limits<double>::infinity();
  bool lo_open = false, hi_open = false;

  static Range any() { return {}; }
  static Range gt(double lo) { return {lo, std::numeric_limits<double>::infinity(), true, false}; }
  static Range ge(double lo) { return {lo, std::numeric_limits<double>::infinity(), false, false}; }
  static Range closed(double lo, double hi) { return {lo, hi, false, false}; }
  static Range half_open(double lo, double hi) { return {lo, hi, false, true}; }
  static Range open(double lo, double hi) { return {lo, hi, true, true}; }
  /// Inside the bounds, in double.
  bool within(double v) const {
    const bool below = lo_open ? !(v > lo) : !(v >= lo);
    const bool above = hi_open ? !(v < hi) : !(v <= hi);
    return std::isfinite(v) && !below && !above;
  }
  static bool fits_float32(double v) {
    const double a = std::fabs(v);
    return v == 0 || (a >= std::numeric_limits<float>::min() && a <= std::numeric_limits<float>::max());
  }
  bool contains(double v) const { return within(v) && fits_float32(v); }
};

std::string join(const std::vector<std::string>& v, const char* sep = ", ");
/// "an empty value", "'abc'", "a mapping", "a list".
std::string describe(const YNode& n);
/// "a positive integer", "an integer >= 0", "an integer in [1, 1024]".
std::string int_range(int64_t lo, int64_t hi);
/// "a number > 0", "a number in [0, 1)", "a number".
std::string double_range(const Range& r);

/// One YAML mapping being read.
struct MapView {
  const YNode* node;  // a Map, or nullptr for an absent/empty section
  std::string path;   // "" at the top level, else "data", "model.layers[2]"
  Origin origin;      // of the section itself (for missing required keys)

  const YNode* get(const std::string& key) const { return node ? node->find(key) : nullptr; }
  std::string child_path(const std::string& key) const { return path.empty() ? key : path + "." + key; }
};

class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const Origin& o, const std::string& key_path, const std::string& msg) const;

  /// A section: a mapping, or absent/empty (no keys). Rejects keys not in
  /// `allowed` with the closest valid one and the list; `what` names the
  /// section in that message ("the data section", "a conv2d layer").
  MapView section(const YNode* n, const std::string& path, const std::string& what,
                  const std::vector<std::string>& allowed, const Origin& parent_origin) const;
  /// The key's node; a missing (or null) key is an error that says what is expected (`hint`).
  const YNode& require(const MapView& m, const std::string& key, const std::string& hint) const;

  int64_t as_int(const YNode& n, const std::string& path, int64_t lo, int64_t hi) const;
  uint64_t as_uint64(const YNode& n, const std::string& path) const;
  double as_double(const YNode& n, const std::string& path, Range r) const;
  bool as_bool(const YNode& n, const std::string& path) const;
  /// A non-empty string.
  std::string as_string(const YNode& n, const std::string& path) const;
  /// One of `allowed` (with a "did you mean" suggestion otherwise).
  std::string as_enum(const YNode& n, const std::string& path, const std::vector<std::string>& allowed) const;
  /// An int, or [h, w] of ints, each in [lo, hi].
  std::pair<int, int> as_pair(const YNode& n, const std::string& path, int64_t lo, int64_t hi) const;
  std::vector<double> as_double_list(const YNode& n, const std::string& path, Range r) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
};

}  // namespace mpx::config_detail
