// SPDX-License-Identifier: MIT
// A strict reader of the HTML that `mpx report` writes, for the tests: every
// element must be closed in order (or be a void element, or self-closed), and
// attributes are quoted; <script> and <style> are raw text. It gives the
// element tree with attributes (entities decoded) so a test can walk it.
#pragma once

#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <string>
#include <vector>

namespace support {

struct HtmlElement {
  std::string name;
  std::map<std::string, std::string> attrs;
  int parent = -1;
  std::vector<int> children;
  std::string text;  // the text directly inside (entities decoded)
  std::string attr(const std::string& k) const {
    const auto it = attrs.find(k);
    return it == attrs.end() ? std::string() : it->second;
  }
  bool has_class(const std::string& c) const {
    const std::string v = " " + attr("class") + " ";
    return v.find(" " + c + " ") != std::string::npos;
  }
};

inline std::string html_unescape(const std::string& s) {
  static const std::map<std::string, std::string> ent = {
      {"amp", "&"}, {"lt", "<"}, {"gt", ">"}, {"quot", "\""}, {"#39", "'"}};
  std::string o;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '&') {
      const size_t semi = s.find(';', i);
      REQUIRE(semi != std::string::npos);
      const auto it = ent.find(s.substr(i + 1, semi - i - 1));
      INFO("entity " << s.substr(i, semi - i + 1));
      REQUIRE(it != ent.end());
      o += it->second;
      i = semi;
    } else {
      o += s[i];
    }
  }
  return o;
}

struct HtmlDoc {
  std::vector<HtmlElement> els;  // els[0] is the document root
  /// Indices of the elements under `root` (depth first) that satisfy `pred`.
  template <class Pred>
  std::vector<int> find(int root, Pred pred) const {
    std::vector<int> out, stack{root};
    while (!stack.empty()) {
      const int i = stack.back();
      stack.pop_back();
      if (i != root && pred(els[static_cast<size_t>(i)])) out.push_back(i);
      const auto& ch = els[static_cast<size_t>(i)].children;
      for (auto it = ch.rbegin(); it != ch.rend(); ++it) stack.push_back(*it);
    }
    return out;
  }
  const HtmlElement& at(int i) const { return els[static_cast<size_t>(i)]; }
};

inline HtmlDoc parse_html(const std::string& s) {
  static const std::set<std::string> kVoid = {"meta", "br", "img", "input", "link", "hr"};
  HtmlDoc d;
  d.els.push_back({"#document", {}, -1, {}, {}});
  int cur = 0;
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] != '<') {
      const size_t lt = s.find('<', i);
      const std::string txt = s.substr(i, lt == std::string::npos ? std::string::npos : lt - i);
      d.els[static_cast<size_t>(cur)].text += html_unescape(txt);
      if (lt == std::string::npos) break;
      i = lt;
      continue;
    }
    if (s.compare(i, 4, "<!--") == 0) {
      i = s.find("-->", i);
      REQUIRE(i != std::string::npos);
      i += 3;
      continue;
    }
    if (s.compare(i, 2, "<!") == 0) {  // <!DOCTYPE html>
      i = s.find('>', i) + 1;
      continue;
    }
    const size_t gt = s.find('>', i);
    REQUIRE(gt != std::string::npos);
    std::string tag = s.substr(i + 1, gt - i - 1);
    i = gt + 1;
    if (tag[0] == '/') {
      INFO("closing </" << tag.substr(1) << "> while <" << d.els[static_cast<size_t>(cur)].name << "> is open");
      REQUIRE(tag.substr(1) == d.els[static_cast<size_t>(cur)].name);
      cur = d.els[static_cast<size_t>(cur)].parent;
      continue;
    }
    const bool self_closed = tag.back() == '/';
    if (self_closed) tag.pop_back();
    HtmlElement e;
    size_t k = 0;
    while (k < tag.size() && !isspace(static_cast<unsigned char>(tag[k]))) ++k;
    e.name = tag.substr(0, k);
    while (k < tag.size()) {
      while (k < tag.size() && isspace(static_cast<unsigned char>(tag[k]))) ++k;
      if (k >= tag.size()) break;
      const size_t eq = tag.find('=', k);
      INFO("tag <" << tag << ">");
      REQUIRE(eq != std::string::npos);
      REQUIRE(tag[eq + 1] == '"');
      const size_t end = tag.find('"', eq + 2);
      REQUIRE(end != std::string::npos);
      const std::string key = tag.substr(k, eq - k);
      REQUIRE(e.attrs.count(key) == 0);
      e.attrs[key] = html_unescape(tag.substr(eq + 2, end - eq - 2));
      k = end + 1;
    }
    e.parent = cur;
    const int idx = static_cast<int>(d.els.size());
    d.els[static_cast<size_t>(cur)].children.push_back(idx);
    d.els.push_back(e);
    if (e.name == "script" || e.name == "style") {  // raw text up to the closing tag
      const size_t close = s.find("</" + e.name + ">", i);
      REQUIRE(close != std::string::npos);
      d.els.back().text = s.substr(i, close - i);
      i = close + e.name.size() + 3;
      continue;
    }
    if (!self_closed && !kVoid.count(e.name)) cur = idx;
  }
  INFO("unclosed <" << d.els[static_cast<size_t>(cur)].name << ">");
  REQUIRE(cur == 0);
  return d;
}

}  // namespace support
