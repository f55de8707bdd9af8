// SPDX-License-Identifier: MIT
// YAML text -> YNode (with origins), --set overrides on the tree, and the
// edit distance behind "did you mean ...?".
#include "config/yaml_tree.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace mpx::config_detail {

const YNode* YNode::find(const std::string& key) const {
  for (size_t i = 0; i < keys.size(); ++i)
    if (keys[i] == key) return &children[i];
  return nullptr;
}

YNode* YNode::find(const std::string& key) {
  return const_cast<YNode*>(static_cast<const YNode*>(this)->find(key));
}

std::string where(const std::string& source, const Origin& o) {
  const std::string src = source.empty() ? "<config>" : source;
  if (!o.override_text.empty()) return fmt::format("{}: in --set '{}'", src, o.override_text);
  if (o.line > 0) return fmt::format("{}:{}:{}", src, o.line, o.column);
  return src;
}

// ---- YAML -> tree -------------------------------------------------------------

namespace {

Origin origin_of(const YAML::Mark& m, const std::string& override_text) {
  Origin o;
  if (!override_text.empty()) {
    o.override_text = override_text;
  } else if (m.line >= 0) {
    o.line = m.line + 1;
    o.column = m.column + 1;
  }
  return o;
}

YNode convert(const YAML::Node& n, const std::string& source, const std::string& ov, int depth) {
  YNode out;
  out.origin = origin_of(n.Mark(), ov);
  if (depth > 64) throw ConfigError(fmt::format("{}: YAML nested too deeply", where(source, out.origin)));
  switch (n.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      out.kind = YNode::Kind::Null;
      break;
    case YAML::NodeType::Scalar:
      out.kind = YNode::Kind::Scalar;
      out.scalar = n.Scalar();
      break;
    case YAML::NodeType::Sequence:
      out.kind = YNode::Kind::Seq;
      for (const auto& c : n) out.children.push_back(convert(c, source, ov, depth + 1));
      break;
    case YAML::NodeType::Map:
      out.kind = YNode::Kind::Map;
      for (const auto& kv : n) {
        Origin ko = origin_of(kv.first.Mark(), ov);
        if (!kv.first.IsScalar())
          throw ConfigError(fmt::format("{}: a mapping key must be a plain name", where(source, ko)));
        const std::string key = kv.first.Scalar();
        if (out.find(key) != nullptr)
          throw ConfigError(fmt::format("{}: duplicate key '{}'", where(source, ko), key));
        out.keys.push_back(key);
        out.key_origins.push_back(ko);
        out.children.push_back(convert(kv.second, source, ov, depth + 1));
      }
      break;
  }
  return out;
}

}  // namespace

YNode parse_yaml_tree(const std::string& text, const std::string& source, const std::string& override_text) {
  YAML::Node doc;
  try {
    doc = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    const std::string src = source.empty() ? "<config>" : source;
    if (!override_text.empty())
      throw ConfigError(fmt::format("{}: in --set '{}': invalid YAML value: {}", src, override_text, e.msg));
    if (e.mark.line >= 0)
      throw ConfigError(fmt::format("{}:{}:{}: invalid YAML: {}", src, e.mark.line + 1, e.mark.column + 1, e.msg));
    throw ConfigError(fmt::format("{}: invalid YAML: {}", src, e.msg));
  }
  return convert(doc, source, override_text, 0);
}

// ---- overrides ----------------------------------------------------------------

namespace {

struct Segment {
  std::string key;
  std::vector<size_t> indices;
};

[[noreturn]] void bad_override(const std::string& source, const std::string& ov, const std::string& why) {
  throw ConfigError(fmt::format("{}: in --set '{}': {}", source.empty() ? "<config>" : source, ov, why));
}

std::vector<Segment> parse_path(const std::string& path, const std::string& source, const std::string& ov) {
  std::vector<Segment> segs;
  size_t i = 0;
  const auto malformed = [&](const std::string& why) {
    bad_override(source, ov, fmt::format("malformed key path '{}': {} (expected e.g. model.layers[0].filters=64)",
                                         path, why));
  };
  while (true) {
    Segment s;
    while (i < path.size() && path[i] != '.' && path[i] != '[') s.key += path[i++];
    if (s.key.empty()) malformed("empty key");
    while (i < path.size() && path[i] == '[') {
      const size_t close = path.find(']', i);
      if (close == std::string::npos) malformed("missing ']'");
      const std::string num = path.substr(i + 1, close - i - 1);
      if (num.empty() || num.size() > 9 || !std::all_of(num.begin(), num.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
        malformed(fmt::format("index '{}' is not a non-negative integer", num));
      s.indices.push_back(std::stoul(num));
      i = close + 1;
    }
    segs.push_back(std::move(s));
    if (i == path.size()) break;
    if (path[i] != '.') malformed(fmt::format("unexpected '{}'", path[i]));
    ++i;
  }
  return segs;
}

const char* kind_name(const YNode& n) {
  switch (n.kind) {
    case YNode::Kind::Null: return "empty";
    case YNode::Kind::Scalar: return "a scalar";
    case YNode::Kind::Map: return "a mapping";
    case YNode::Kind::Seq: return "a list";
  }
  return "?";
}

}  // namespace

void apply_override(YNode& root, const std::string& ov, const std::string& source) {
  const size_t eq = ov.find('=');
  if (eq == std::string::npos) bad_override(source, ov, "expected key.path=value");
  std::string path = ov.substr(0, eq);
  while (!path.empty() && std::isspace(static_cast<unsigned char>(path.back()))) path.pop_back();
  while (!path.empty() && std::isspace(static_cast<unsigned char>(path.front()))) path.erase(path.begin());
  if (path.empty()) bad_override(source, ov, "expected key.path=value (the key path is empty)");
  const std::vector<Segment> segs = parse_path(path, source, ov);
  YNode value = parse_yaml_tree(ov.substr(eq + 1), source, ov);

  Origin here;
  here.override_text = ov;
  YNode* cur = &root;
  std::string walked;
  for (size_t s = 0; s < segs.size(); ++s) {
    const Segment& seg = segs[s];
    if (cur->is_null()) {  // an absent or empty section becomes a mapping
      cur->kind = YNode::Kind::Map;
      cur->origin = here;
    }
    if (!cur->is_map())
      bad_override(source, ov, fmt::format("'{}' is {}, not a mapping, so it has no key '{}'",
                                           walked.empty() ? "the top level" : walked, kind_name(*cur), seg.key));
    walked += (walked.empty() ? "" : ".") + seg.key;
    YNode* child = cur->find(seg.key);
    if (child == nullptr) {
      cur->keys.push_back(seg.key);
      cur->key_origins.push_back(here);
      cur->children.emplace_back();
      cur->children.back().origin = here;
      child = &cur->children.back();
    }
    cur = child;
    for (size_t idx : seg.indices) {
      if (!cur->is_seq())
        bad_override(source, ov, fmt::format("'{}' is {}, not a list, so it cannot be indexed with [{}]", walked,
                                             kind_name(*cur), idx));
      if (idx >= cur->children.size())
        bad_override(source, ov, fmt::format("index {} out of range: '{}' has {} element{}", idx, walked,
                                             cur->children.size(), cur->children.size() == 1 ? "" : "s"));
      walked += fmt::format("[{}]", idx);
      cur = &cur->children[idx];
    }
  }
  *cur = std::move(value);
}

// ---- suggestions --------------------------------------------------------------

int edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1, 0));
  for (size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const int cost = std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                               std::tolower(static_cast<unsigned char>(b[j - 1]))
                           ? 0
                           : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[n][m];
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  int best_d = 1 << 30;
  for (const auto& c : candidates) {
    const int d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  // Close enough to be a typo: at most 2 edits, or a third of the longer word.
  const int limit = std::max<int>(2, static_cast<int>(std::max(word.size(), best.size())) / 3);
  if (best.empty() || best_d > limit || best_d >= static_cast<int>(word.size())) return "";
  return best;
}

}  // namespace mpx::config_detail
