// SPDX-License-Identifier: MIT
// A small owned copy of a parsed YAML document that remembers where every
// node and key came from (file line/column, or the --set override that made
// it), so that overrides can be applied before validation and every error can
// still point at its origin. Internal to lib/config.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace mpx::config_detail {

// Limits on what a config may make mpx read and build (docs/inputs.md).
/// A config file larger than this is refused before it is parsed.
constexpr size_t kMaxConfigBytes = size_t{1} << 20;
/// Nodes one YAML text (a file or one --set value) may expand to, aliases
/// expanded: a real config has a few hundred; an alias bomb has billions.
constexpr size_t kMaxYamlNodes = 100000;
/// Mappings and lists nested deeper than this are refused.
constexpr int kMaxYamlDepth = 64;
/// Values echoed in error messages are cut to this many bytes, then "...".
constexpr size_t kMaxEcho = 80;

/// `s` cut to at most `max` bytes (at a UTF-8 character boundary) with "..."
/// appended when cut, for echoing user input in messages.
std::string clip(const std::string& s, size_t max = kMaxEcho);
/// The byte offset of the first byte of `s` that is not part of well-formed
/// UTF-8 (overlong forms, surrogates and code points above U+10FFFF count as
/// malformed), or std::string::npos when all of it is.
size_t utf8_error_at(const std::string& s);

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

/// Parses YAML text into a tree; malformed YAML, duplicate keys, a second
/// document, text that is not UTF-8, more than kMaxYamlNodes nodes or text
/// longer than kMaxConfigBytes throw ConfigError with the source and the
/// line/column. `override_text` non-empty marks every node as coming from that --set.
/// `nodes` (optional) counts the nodes built across several calls (a file and
/// its --set values share one kMaxYamlNodes budget).
YNode parse_yaml_tree(const std::string& text, const std::string& source,
                      const std::string& override_text = "", size_t* nodes = nullptr);

/// Applies one "key.path=value" override (value parsed as YAML). Creates
/// missing mapping keys (validation judges them later); a malformed override
/// or an index out of range throws ConfigError naming the override. `nodes`:
/// as for parse_yaml_tree.
void apply_override(YNode& root, const std::string& override_text, const std::string& source,
                    size_t* nodes = nullptr);

/// Optimal-string-alignment edit distance (a transposition costs 1).
int edit_distance(const std::string& a, const std::string& b);
/// The closest of `candidates` to `word`, or "" when none is close enough.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace mpx::config_detail
