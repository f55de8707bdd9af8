// SPDX-License-Identifier: MIT
// Every docs link points at something that exists: a reference in a source comment
// (`docs/design.md "Parameter arenas"`, also with a comma before the quote or broken over
// two comment lines, or `docs/x.md#anchor`) names a file of docs/ and, where it names a
// section, a heading of that file (or a heading less its closing remark in parentheses); a
// link between the pages (`](x.md#anchor)`) names a heading's GitHub anchor. The scanner is
// tested on a made-up tree first, then run over lib/, app/, tests/, bench/, scripts/, fuzz/
// and docs/.
#include <catch2/catch.hpp>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

/// The headings of one docs page: their text and their GitHub anchors.
struct Page {
  std::set<std::string> titles, anchors;
};

/// GitHub's anchor of a heading: lower case, punctuation other than '-' and '_' dropped,
/// spaces to '-'.
std::string anchor_of(const std::string& title) {
  std::string a;
  for (unsigned char ch : title) {
    if (std::isalnum(ch) || ch == '-' || ch == '_')
      a += static_cast<char>(std::tolower(ch));
    else if (ch == ' ')
      a += '-';
  }
  return a;
}

Page parse_page(const std::string& text) {
  Page p;
  std::istringstream in(text);
  std::string line;
  bool fence = false;
  while (std::getline(in, line)) {
    if (line.rfind("```", 0) == 0) fence = !fence;
    if (fence || line.empty() || line[0] != '#') continue;
    size_t i = line.find_first_not_of('#');
    if (i == std::string::npos || line[i] != ' ') continue;
    std::string title = line.substr(i + 1);
    while (!title.empty() && (title.back() == ' ' || title.back() == '\r')) title.pop_back();
    std::string plain;  // `code` in a heading: its anchor and quoted name drop the backticks
    for (char ch : title)
      if (ch != '`') plain += ch;
    p.titles.insert(plain);
    p.anchors.insert(anchor_of(plain));
    // A comment may leave out a closing remark in parentheses: "Run directories" names
    // "Run directories (`mpx report`, exit 3)".
    const size_t paren = plain.find(" (");
    if (paren != std::string::npos && plain.back() == ')') p.titles.insert(plain.substr(0, paren));
  }
  return p;
}

/// A comment's section name may run over lines: "Winograd\n// convolution" is "Winograd convolution".
std::string join_comment_lines(const std::string& s) {
  static const std::regex cont(R"(\s*\n\s*(?://+|#+|\*+)?\s*)");
  return std::regex_replace(s, cont, " ");
}

/// The broken references in one source text (`where` names it), each as "where: what".
std::vector<std::string> broken_in_source(const std::string& where, const std::string& text,
                                          const std::map<std::string, Page>& docs) {
  std::vector<std::string> bad;
  // docs/x.md, then optionally '#anchor', or a quoted section after a space or a comma (on
  // this line or the next comment line; a quote right after ".md" closes a string literal).
  static const std::regex ref(R"re(docs/([A-Za-z0-9_-]+\.md)(?:#([A-Za-z0-9_-]+)|)re"
                               R"re((?:,?[ \t]*\n[ \t]*(?://+|#+|\*+)[ \t]*|,?[ \t]+|,))re"
                               R"re("([^"\n]{1,120}(?:\n[^"\n]{0,120})?)")?)re");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), ref); it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    const std::string file = m[1].str();
    const auto page = docs.find(file);
    const std::string what = m[0].str();
    if (page == docs.end()) {
      bad.push_back(where + ": " + what + " (no docs/" + file + ")");
    } else if (m[2].matched && !page->second.anchors.count(m[2].str())) {
      bad.push_back(where + ": " + what + " (no heading with that anchor in docs/" + file + ")");
    } else if (m[3].matched && !page->second.titles.count(join_comment_lines(m[3].str()))) {
      bad.push_back(where + ": " + join_comment_lines(what) + " (no such heading in docs/" + file + ")");
    }
  }
  return bad;
}

/// The broken anchors of the links between docs pages (`](x.md#a)`, `](#a)`) in one page.
std::vector<std::string> broken_in_page(const std::string& page_name, const std::string& text,
                                        const std::map<std::string, Page>& docs) {
  std::vector<std::string> bad;
  static const std::regex link(R"(\]\(([A-Za-z0-9_-]+\.md)?#([A-Za-z0-9_-]+)\))");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), link); it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    const std::string file = m[1].matched ? m[1].str() : page_name;
    const auto page = docs.find(file);
    if (page == docs.end() || !page->second.anchors.count(m[2].str()))
      bad.push_back("docs/" + page_name + ": " + m[0].str() + " (no heading with that anchor in docs/" + file + ")");
  }
  return bad;
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("docs links: the scanner finds broken references and accepts good ones", "[docs]") {
  std::map<std::string, Page> docs;
  docs["design.md"] = parse_page("# Design\n\n## One training step, as data\n\n```\n# not a heading\n```\n"
                                 "### The first layer's `weight` gradient\n## Run directories (`mpx report`, exit 3)\n");
  REQUIRE(docs["design.md"].titles.count("One training step, as data"));
  REQUIRE(docs["design.md"].titles.count("The first layer's weight gradient"));
  REQUIRE_FALSE(docs["design.md"].titles.count("not a heading"));
  REQUIRE(docs["design.md"].anchors.count("the-first-layers-weight-gradient"));
  REQUIRE(docs["design.md"].titles.count("Run directories"));
  REQUIRE(docs["design.md"].anchors.count("run-directories-mpx-report-exit-3"));

  const std::string good =
      "// see docs/design.md \"One training step, as data\" and docs/design.md, \"The first layer's weight\n"
      "// gradient\" and docs/design.md#one-training-step-as-data and docs/design.md alone\n"
      "# docs/design.md\n#   \"Design\"\n";
  CHECK(broken_in_source("good.cpp", good, docs).empty());

  const std::vector<std::string> bad = broken_in_source(
      "bad.cpp",
      "// docs/design.md \"One training step\"\n"           // a heading's prefix is not the heading
      "// docs/design.md#precision-semantics, docs/gone.md\n"  // no such anchor; no such page
      "/// (docs/design.md,\n/// \"Beyond one machine\")\n",   // broken over two comment lines
      docs);
  REQUIRE(bad.size() == 4);
  CHECK(bad[0] == "bad.cpp: docs/design.md \"One training step\" (no such heading in docs/design.md)");
  CHECK(bad[1].find("#precision-semantics") != std::string::npos);
  CHECK(bad[2].find("no docs/gone.md") != std::string::npos);
  CHECK(bad[3].find("\"Beyond one machine\"") != std::string::npos);

  CHECK(broken_in_page("x.md", "[a](design.md#one-training-step-as-data) [b](#design)", docs).size() == 1);
  CHECK(broken_in_page("design.md", "[b](#design) [c](design.md#gone)", docs).size() == 1);
}

TEST_CASE("docs links: every reference in the sources and every anchor between the pages exists", "[docs]") {
  const fs::path root = MPX_SOURCE_DIR;
  std::map<std::string, Page> docs;
  std::map<std::string, std::string> texts;
  for (const auto& e : fs::directory_iterator(root / "docs")) {
    if (e.path().extension() != ".md") continue;
    const std::string name = e.path().filename().string();
    texts[name] = read(e.path());
    docs[name] = parse_page(texts[name]);
  }
  REQUIRE(docs.count("design.md"));

  static const std::set<std::string> kExt = {".h", ".hpp", ".cpp", ".cu", ".cuh", ".inc", ".py",
                                             ".sh", ".cmake", ".txt", ".yaml", ".yml"};
  std::vector<std::string> bad;
  size_t files = 0;
  for (const char* dir : {"lib", "app", "tests", "bench", "scripts", "fuzz", "cmake", "data_scripts"}) {
    if (!fs::exists(root / dir)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      if (!e.is_regular_file() || !kExt.count(e.path().extension().string())) continue;
      if (e.path().filename() == "test_core_docs_links.cpp") continue;  // its made-up examples
      ++files;
      for (auto& b : broken_in_source(fs::relative(e.path(), root).string(), read(e.path()), docs))
        bad.push_back(std::move(b));
    }
  }
  for (const auto& [name, text] : texts)
    for (auto& b : broken_in_page(name, text, docs)) bad.push_back(std::move(b));
  CHECK(files > 100);
  std::string all;
  for (const std::string& b : bad) all += b + "\n";
  INFO(all);
  CHECK(bad.empty());
}
