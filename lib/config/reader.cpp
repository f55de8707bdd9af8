// SPDX-License-Identifier: MIT
// Typed reads of YAML nodes (config/reader.h) and their messages.
#include "config/reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "core/error.h"

namespace mpx::config_detail {

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

std::string describe(const YNode& n) {
  switch (n.kind) {
    case YNode::Kind::Null: return "an empty value";
    case YNode::Kind::Scalar: return "'" + clip(n.scalar) + "'";
    case YNode::Kind::Map: return "a mapping";
    case YNode::Kind::Seq: return "a list";
  }
  return "?";
}

std::string int_range(int64_t lo, int64_t hi) {
  if (lo == 1 && hi >= kIntMax) return "a positive integer";
  if (hi >= kIntMax) return fmt::format("an integer >= {}", lo);
  return fmt::format("an integer in [{}, {}]", lo, hi);
}

std::string double_range(const Range& r) {
  const bool lo_inf = std::isinf(r.lo), hi_inf = std::isinf(r.hi);
  if (lo_inf && hi_inf) return "a number";
  if (hi_inf) return fmt::format("a number {} {}", r.lo_open ? ">" : ">=", r.lo);
  if (lo_inf) return fmt::format("a number {} {}", r.hi_open ? "<" : "<=", r.hi);
  return fmt::format("a number in {}{}, {}{}", r.lo_open ? "(" : "[", r.lo, r.hi, r.hi_open ? ")" : "]");
}

void Reader::fail(const Origin& o, const std::string& key_path, const std::string& msg) const {
  throw ConfigError(fmt::format("{}: {}: {}", where(source_, o), key_path, msg));
}

MapView Reader::section(const YNode* n, const std::string& path, const std::string& what,
                        const std::vector<std::string>& allowed, const Origin& parent_origin) const {
  MapView v{nullptr, path, parent_origin};
  if (n == nullptr) return v;
  v.origin = n->origin;
  if (n->is_null()) return v;
  if (!n->is_map())
    fail(n->origin, path.empty() ? "config" : path, fmt::format("expected a mapping, got {}", describe(*n)));
  v.node = n;
  for (size_t i = 0; i < n->keys.size(); ++i) {
    const std::string& k = n->keys[i];
    if (std::find(allowed.begin(), allowed.end(), k) != allowed.end()) continue;
    const std::string guess = closest_match(k, allowed);
    std::string msg = fmt::format("unknown key in {}", what);
    if (!guess.empty()) msg += fmt::format("; did you mean '{}'?", guess);
    msg += fmt::format(" (valid keys: {})", join(allowed));
    fail(n->key_origins[i], v.child_path(clip(k)), msg);
  }
  return v;
}

const YNode& Reader::require(const MapView& m, const std::string& key, const std::string& hint) const {
  const YNode* n = m.get(key);
  if (n == nullptr || n->is_null()) {
    const Origin& o = n ? n->origin : m.origin;
    fail(o, m.child_path(key), fmt::format("required key is missing ({})", hint));
  }
  return *n;
}

int64_t Reader::as_int(const YNode& n, const std::string& path, int64_t lo, int64_t hi) const {
  const std::string range = int_range(lo, hi);
  if (!n.is_scalar()) fail(n.origin, path, fmt::format("expected {}, got {}", range, describe(n)));
  const std::string& s = n.scalar;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || end != s.c_str() + s.size() || std::isspace(static_cast<unsigned char>(s[0])))
    fail(n.origin, path, fmt::format("expected an integer, got '{}'", clip(s)));
  if (errno == ERANGE || v < lo || v > hi) fail(n.origin, path, fmt::format("expected {}, got {}", range, clip(s)));
  return v;
}

uint64_t Reader::as_uint64(const YNode& n, const std::string& path) const {
  const char* range = "an integer in [0, 18446744073709551615]";
  if (!n.is_scalar()) fail(n.origin, path, fmt::format("expected {}, got {}", range, describe(n)));
  const std::string& s = n.scalar;
  errno = 0;
  char* end = nullptr;
  if (s.empty() || !(std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '+' || s[0] == '-'))
    fail(n.origin, path, fmt::format("expected an integer, got '{}'", clip(s)));
  if (s[0] == '-') {
    (void)std::strtoll(s.c_str(), &end, 10);
    if (end != s.c_str() + s.size()) fail(n.origin, path, fmt::format("expected an integer, got '{}'", clip(s)));
    fail(n.origin, path, fmt::format("expected {}, got {}", range, clip(s)));
  }
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (end != s.c_str() + s.size()) fail(n.origin, path, fmt::format("expected an integer, got '{}'", clip(s)));
  if (errno == ERANGE) fail(n.origin, path, fmt::format("expected {}, got {}", range, clip(s)));
  return v;
}

double Reader::as_double(const YNode& n, const std::string& path, Range r) const {
  const std::string range = double_range(r);
  if (!n.is_scalar()) fail(n.origin, path, fmt::format("expected {}, got {}", range, describe(n)));
  const std::string& s = n.scalar;
  char* end = nullptr;
  // YAML spells the special values .inf/-.inf/.nan; they parse, then fail the range check.
  std::string lower = s;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (lower == ".inf" || lower == "+.inf" || lower == "-.inf" || lower == ".nan")
    fail(n.origin, path, fmt::format("expected {}, got {}", range, clip(s)));
  const double v = std::strtod(s.c_str(), &end);
  const bool hexish = s.find_first_of("xXpP") != std::string::npos;
  if (s.empty() || end != s.c_str() + s.size() || std::isspace(static_cast<unsigned char>(s[0])) || hexish)
    fail(n.origin, path, fmt::format("expected a number, got '{}'", clip(s)));
  if (!r.within(v)) fail(n.origin, path, fmt::format("expected {}, got {}", range, clip(s)));
  if (!Range::fits_float32(v))
    fail(n.origin, path,
         fmt::format("expected {}, got {}, which does not fit a float32 (mpx computes in float32: 0, or a "
                     "magnitude in [{:.9g}, {:.9g}])",
                     range, clip(s), std::numeric_limits<float>::min(), std::numeric_limits<float>::max()));
  return v;
}

bool Reader::as_bool(const YNode& n, const std::string& path) const {
  if (n.is_scalar()) {
    std::string s = n.scalar;
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (s == "true" || s == "yes" || s == "on") return true;
    if (s == "false" || s == "no" || s == "off") return false;
  }
  fail(n.origin, path, fmt::format("expected true or false, got {}", describe(n)));
}

std::string Reader::as_string(const YNode& n, const std::string& path) const {
  if (!n.is_scalar() || n.scalar.empty())
    fail(n.origin, path, fmt::format("expected a non-empty string, got {}", describe(n)));
  return n.scalar;
}

std::string Reader::as_enum(const YNode& n, const std::string& path, const std::vector<std::string>& allowed) const {
  if (n.is_scalar() && std::find(allowed.begin(), allowed.end(), n.scalar) != allowed.end()) return n.scalar;
  std::string msg = fmt::format("expected one of {}, got {}", join(allowed, " | "), describe(n));
  if (n.is_scalar()) {
    const std::string guess = closest_match(n.scalar, allowed);
    if (!guess.empty()) msg += fmt::format("; did you mean '{}'?", guess);
  }
  fail(n.origin, path, msg);
}

std::pair<int, int> Reader::as_pair(const YNode& n, const std::string& path, int64_t lo, int64_t hi) const {
  if (n.is_seq()) {
    if (n.children.size() != 2)
      fail(n.origin, path,
           fmt::format("expected an integer or a list [h, w], got a list of {} elements", n.children.size()));
    return {static_cast<int>(as_int(n.children[0], path + "[0]", lo, hi)),
            static_cast<int>(as_int(n.children[1], path + "[1]", lo, hi))};
  }
  if (!n.is_scalar())
    fail(n.origin, path, fmt::format("expected {} or a list [h, w], got {}", int_range(lo, hi), describe(n)));
  const int v = static_cast<int>(as_int(n, path, lo, hi));
  return {v, v};
}

std::vector<double> Reader::as_double_list(const YNode& n, const std::string& path, Range r) const {
  if (!n.is_seq()) fail(n.origin, path, fmt::format("expected a list of numbers, got {}", describe(n)));
  std::vector<double> out;
  for (size_t i = 0; i < n.children.size(); ++i)
    out.push_back(as_double(n.children[i], fmt::format("{}[{}]", path, i), r));
  return out;
}

}  // namespace mpx::config_detail
