// SPDX-License-Identifier: MIT
// A small owned copy of a parsed YAML document that remembers where every
// node and key came from (file line/column, or the --set override that made
// it), so that overrides can be applied before validation and every error can
// still point at its origin. Internal to lib/config.
#pragma once

#include <string>
#include <vector>

namespace mpx::config_detail {

/// Where a node or key came from: a 1-based line/column of the file, or the
/// text of the --set override that created it (then line/column are 0).
struct Origin {
  int line = 0, column = 0;
  std::string override_text;  // "" = the file
};

struct YNode {
  enum class Kind { Null, Scalar, Map, Seq };
  Kind kind = Kind::Null;
  std::string scalar;
  Origin origin;
  /// Map: keys[i] names children[i] (document order). Seq: children only.
  std::vector<std::string> keys;
  std::vector<Origin> key_origins;
  std::vector<YNode> children;

  bool is_null() const { return kind == Kind::Null; }
  bool is_map() const { return kind == Kind::Map; }
  bool is_seq() const { return kind == Kind::Seq; }
  bool is_scalar() const { return kind == Kind::Scalar; }
  /// Map lookup; nullptr when absent.
  const YNode* find(const std::string& key) const;
  YNode* find(const std::string& key);
};

/// "src:line:col" or "src: in --set 'a.b=c'" (src "<config>" when empty).
std::string where(const std::string& source, const Origin& o);

/// Parses YAML text into a tree; malformed YAML or duplicate keys throw
/// ConfigError with the source and yaml-cpp's line/column. `override_text`
/// non-empty marks every node as coming from that --set.
YNode parse_yaml_tree(const std::string& text, const std::string& source,
                      const std::string& override_text = "");

/// Applies one "key.path=value" override (value parsed as YAML). Creates
/// missing mapping keys (validation judges them later); a malformed override
/// or an index out of range throws ConfigError naming the override.
void apply_override(YNode& root, const std::string& override_text, const std::string& source);

/// Optimal-string-alignment edit distance (a transposition costs 1).
int edit_distance(const std::string& a, const std::string& b);
/// The closest of `candidates` to `word`, or "" when none is close enough.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace mpx::config_detail
