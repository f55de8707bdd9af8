// SPDX-License-Identifier: MIT
// YAML text -> YNode (with origins), --set overrides on the tree, and the
// edit distance behind "did you mean ...?".
#include "config/yaml_tree.h"

#include <fmt/format.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <sstream>

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
  if (!o.override_text.empty()) return fmt::format("{}: in --set '{}'", src, clip(o.override_text));
  if (o.line > 0) return fmt::format("{}:{}:{}", src, o.line, o.column);
  return src;
}

// ---- text checks ---------------------------------------------------------------

size_t utf8_error_at(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // UTF-16 surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;
    }
    if (i + len > n) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
    i += len;
  }
  return std::string::npos;
}

std::string clip(const std::string& s, size_t max) {
  if (s.size() <= max) return s;
  size_t cut = max;
  // Back up over UTF-8 continuation bytes so a character is never split.
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut) + "...";
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

/// Counts the documents of a YAML text and remembers where the second begins.
/// Events only: an alias is one event, so this pass is linear in the text.
class DocumentCounter : public YAML::EventHandler {
 public:
  int documents = 0;
  YAML::Mark second;
  void OnDocumentStart(const YAML::Mark& m) override {
    if (++documents == 2) second = m;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

/// yaml-cpp's node graph shares aliased nodes; this copy does not, so it
/// counts what it builds and stops at kMaxYamlNodes (an alias bomb expands
/// exponentially: nine anchors of nine aliases each are 9^9 nodes).
class Converter {
 public:
  Converter(const std::string& source, const std::string& ov, size_t& nodes)
      : source_(source), ov_(ov), nodes_(nodes) {}

  YNode convert(const YAML::Node& n, int depth, const std::string& path) {
    YNode out;
    out.origin = origin_of(n.Mark(), ov_);
    if (depth > kMaxYamlDepth)
      throw ConfigError(fmt::format("{}: YAML nested too deeply (more than {} levels)", where(source_, out.origin),
                                    kMaxYamlDepth));
    if (++nodes_ > kMaxYamlNodes)
      throw ConfigError(fmt::format("{}: {}: the YAML expands to more than {} nodes (aliases of aliases?); "
                                    "a config needs far fewer",
                                    where(source_, out.origin), path.empty() ? "config" : path, kMaxYamlNodes));
    check_tag(n.Tag(), out.origin, path);
    switch (n.Type()) {
      case YAML::NodeType::Undefined:
      case YAML::NodeType::Null:
        out.kind = YNode::Kind::Null;
        break;
      case YAML::NodeType::Scalar:
        out.kind = YNode::Kind::Scalar;
        out.scalar = n.Scalar();
        check_utf8(out.scalar, out.origin, path, "value");
        break;
      case YAML::NodeType::Sequence: {
        out.kind = YNode::Kind::Seq;
        out.children.reserve(n.size());  // exact sizes: no doubled capacity across the node budget
        size_t i = 0;
        for (const auto& c : n) out.children.push_back(convert(c, depth + 1, fmt::format("{}[{}]", path, i++)));
        break;
      }
      case YAML::NodeType::Map:
        out.kind = YNode::Kind::Map;
        out.keys.reserve(n.size());
        out.key_origins.reserve(n.size());
        out.children.reserve(n.size());
        for (const auto& kv : n) {
          Origin ko = origin_of(kv.first.Mark(), ov_);
          if (!kv.first.IsScalar())
            throw ConfigError(fmt::format("{}: a mapping key must be a plain name", where(source_, ko)));
          const std::string key = kv.first.Scalar();
          check_tag(kv.first.Tag(), ko, path);
          check_utf8(key, ko, path, "key");
          const std::string child = path.empty() ? clip(key) : path + "." + clip(key);
          if (out.find(key) != nullptr)
            throw ConfigError(fmt::format("{}: duplicate key '{}'", where(source_, ko), clip(key)));
          out.keys.push_back(key);
          out.key_origins.push_back(ko);
          out.children.push_back(convert(kv.second, depth + 1, child));
        }
        break;
    }
    return out;
  }

 private:
  /// An explicit tag ("!!map", "!!str", "!custom") is refused: a key's type comes from the
  /// schema, and a tag that mpx ignored would silently mean something else than written.
  /// yaml-cpp gives "?" (plain) or "!" (quoted) for an untagged node.
  void check_tag(const std::string& tag, const Origin& o, const std::string& path) const {
    if (tag.empty() || tag == "?" || tag == "!") return;
    static const std::string kCore = "tag:yaml.org,2002:";
    const std::string shown = tag.rfind(kCore, 0) == 0 ? "!!" + tag.substr(kCore.size()) : tag;
    throw ConfigError(fmt::format("{}: {}: the YAML tag '{}' is not supported: a config's types come from its "
                                  "keys; remove the tag",
                                  where(source_, o), path.empty() ? "config" : path, clip(shown, 40)));
  }

  void check_utf8(const std::string& s, const Origin& o, const std::string& path, const char* what) const {
    const size_t bad = utf8_error_at(s);
    if (bad == std::string::npos) {
      check_controls(s, o, path, what);
      return;
    }
    const std::string prefix = clip(s.substr(0, bad), 40);
    throw ConfigError(fmt::format("{}: {}: the {} is not valid UTF-8: byte 0x{:02X} at byte {} of it{} "
                                  "(save the file as UTF-8)",
                                  where(source_, o), path.empty() ? "config" : path, what,
                                  static_cast<unsigned>(static_cast<unsigned char>(s[bad])), bad,
                                  prefix.empty() ? std::string() : ", after '" + prefix + "'"));
  }

  /// A NUL, tab, line break or other control character (U+0000-U+001F, U+007F-U+009F) in a
  /// key or value: C strings would cut a path at a NUL, and a message or a log line would
  /// carry the rest. `s` is valid UTF-8 here.
  void check_controls(const std::string& s, const Origin& o, const std::string& path, const char* what) const {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    for (size_t i = 0; i < s.size(); ++i) {
      unsigned cp = p[i];
      if (cp == 0xC2 && i + 1 < s.size() && p[i + 1] <= 0x9F) cp = p[i + 1];  // U+0080-U+009F: C2 80..9F
      else if (cp >= 0x20 && cp != 0x7F) continue;
      const std::string prefix = clip(s.substr(0, i), 40);
      throw ConfigError(fmt::format("{}: {}: the {} holds the control character U+{:04X}{} at byte {} of it{}; "
                                    "keys and values are printable text",
                                    where(source_, o), path.empty() ? "config" : path, what, cp,
                                    cp == 0 ? " (NUL)" : cp == 9 ? " (tab)" : cp == 10 ? " (line feed)" : "", i,
                                    prefix.empty() ? std::string() : ", after '" + prefix + "'"));
    }
  }

  const std::string& source_;
  const std::string& ov_;
  size_t& nodes_;
};

}  // namespace

namespace {

/// The text as a whole must be UTF-8: yaml-cpp would otherwise detect UTF-16 or UTF-32
/// (with or without a byte-order mark) and convert it, so a file that docs/inputs.md
/// refuses would load. Such text holds NUL bytes (every ASCII character has one), as do
/// binary files; a NUL is never part of UTF-8 text.
void check_text_encoding(const std::string& text, const std::string& src, const std::string& at, bool is_override) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  const char* bom = nullptr;
  if (n >= 4 && ((p[0] == 0 && p[1] == 0 && p[2] == 0xFE && p[3] == 0xFF) ||
                 (p[0] == 0xFF && p[1] == 0xFE && p[2] == 0 && p[3] == 0)))
    bom = "UTF-32";
  else if (n >= 2 && ((p[0] == 0xFE && p[1] == 0xFF) || (p[0] == 0xFF && p[1] == 0xFE)))
    bom = "UTF-16";
  if (bom != nullptr)
    throw ConfigError(fmt::format("{}: the text starts with a {} byte-order mark: mpx reads UTF-8 only (save the "
                                  "file as UTF-8)",
                                  at, bom));
  const size_t nul = text.find('\0');
  if (nul == std::string::npos) return;
  if (is_override) throw ConfigError(fmt::format("{}: the value holds a NUL byte at byte {}", at, nul));
  size_t line = 1, col = 1;
  for (size_t i = 0; i < nul; ++i) {
    if (p[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  throw ConfigError(fmt::format("{}:{}:{}: the file holds a NUL byte (byte offset {}), so it is not UTF-8 text: "
                                "a UTF-16 or UTF-32 file, or not a config at all? (save the file as UTF-8)",
                                src, line, col, nul));
}

}  // namespace

YNode parse_yaml_tree(const std::string& text, const std::string& source, const std::string& override_text,
                      size_t* nodes) {
  const std::string src = source.empty() ? "<config>" : source;
  const std::string at = override_text.empty() ? src : fmt::format("{}: in --set '{}'", src, clip(override_text));
  if (text.size() > kMaxConfigBytes)
    throw ConfigError(fmt::format("{}: the YAML text has {} bytes, more than the limit of {} bytes (1 MiB)", at,
                                  text.size(), kMaxConfigBytes));
  check_text_encoding(text, src, at, !override_text.empty());
  YAML::Node doc;
  try {
    std::istringstream in(text);
    YAML::Parser parser(in);
    DocumentCounter counter;
    while (parser.HandleNextDocument(counter)) {
      if (counter.documents >= 2) {
        if (!override_text.empty())
          throw ConfigError(fmt::format("{}: the value holds a second YAML document ('---'); give one value", at));
        throw ConfigError(fmt::format("{}:{}: a second YAML document starts here; a config file holds one "
                                      "document (remove the '---' and what follows, or merge the two)",
                                      src, counter.second.line + 1));
      }
    }
    doc = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    if (!override_text.empty()) throw ConfigError(fmt::format("{}: invalid YAML value: {}", at, e.msg));
    if (e.mark.line >= 0)
      throw ConfigError(fmt::format("{}:{}:{}: invalid YAML: {}", src, e.mark.line + 1, e.mark.column + 1, e.msg));
    throw ConfigError(fmt::format("{}: invalid YAML: {}", src, e.msg));
  }
  size_t local = 0;
  return Converter(source, override_text, nodes != nullptr ? *nodes : local).convert(doc, 0, "");
}

// ---- overrides ----------------------------------------------------------------

namespace {

struct Segment {
  std::string key;
  std::vector<size_t> indices;
};

[[noreturn]] void bad_override(const std::string& source, const std::string& ov, const std::string& why) {
  throw ConfigError(fmt::format("{}: in --set '{}': {}", source.empty() ? "<config>" : source, clip(ov), why));
}

std::vector<Segment> parse_path(const std::string& path, const std::string& source, const std::string& ov) {
  std::vector<Segment> segs;
  size_t i = 0;
  const auto malformed = [&](const std::string& why) {
    bad_override(source, ov, fmt::format("malformed key path '{}': {} (expected e.g. model.layers[0].filters=64)",
                                         clip(path), why));
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

void apply_override(YNode& root, const std::string& ov, const std::string& source, size_t* nodes) {
  if (const size_t bad = utf8_error_at(ov); bad != std::string::npos)
    throw ConfigError(fmt::format("{}: a --set argument is not valid UTF-8: byte 0x{:02X} at byte {}{}",
                                  source.empty() ? "<config>" : source,
                                  static_cast<unsigned>(static_cast<unsigned char>(ov[bad])), bad,
                                  bad == 0 ? std::string() : ", after '" + clip(ov.substr(0, bad), 40) + "'"));
  const size_t eq = ov.find('=');
  if (eq == std::string::npos) bad_override(source, ov, "expected key.path=value");
  std::string path = ov.substr(0, eq);
  while (!path.empty() && std::isspace(static_cast<unsigned char>(path.back()))) path.pop_back();
  while (!path.empty() && std::isspace(static_cast<unsigned char>(path.front()))) path.erase(path.begin());
  if (path.empty()) bad_override(source, ov, "expected key.path=value (the key path is empty)");
  const std::vector<Segment> segs = parse_path(path, source, ov);
  YNode value = parse_yaml_tree(ov.substr(eq + 1), source, ov, nodes);

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
      bad_override(source, ov,
                   fmt::format("'{}' is {}, not a mapping, so it has no key '{}'",
                               walked.empty() ? "the top level" : clip(walked), kind_name(*cur), clip(seg.key)));
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
        bad_override(source, ov, fmt::format("'{}' is {}, not a list, so it cannot be indexed with [{}]", clip(walked),
                                             kind_name(*cur), idx));
      if (idx >= cur->children.size())
        bad_override(source, ov, fmt::format("index {} out of range: '{}' has {} element{}", idx, clip(walked),
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
  if (word.size() > 64) return "";  // no valid name is that long; the distance would cost size^2
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
