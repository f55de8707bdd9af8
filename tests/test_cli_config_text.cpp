// SPDX-License-Identifier: MIT
// Config text that is not plain UTF-8 YAML of the schema's types, through the mpx
// binary (docs/inputs.md, "Config files and --set"): control characters in a
// value, explicit YAML tags, UTF-16 and UTF-32 text are each exit 2 naming the key
// or the place, before anything runs.
#include <catch2/catch.hpp>

#include <string>

#include "support/cli.h"

using support::run_mpx;
using support::TempDir;
using support::write_file;

namespace {

const std::string kRest =
    "device: cpu\n"
    "data: {dataset: synthetic, batch_size: 4, synthetic_train: 8, synthetic_test: 8}\n"
    "model:\n"
    "  layers:\n"
    "    - {type: flatten}\n"
    "    - {type: dense, units: 10, activation: softmax}\n";

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// The text in UTF-16 (big- or little-endian), ASCII input only.
std::string utf16(const std::string& s, bool big_endian) {
  std::string o;
  for (char c : s) {
    if (big_endian) o += std::string(1, '\0') + c;
    else o += std::string(1, c) + '\0';
  }
  return o;
}

}  // namespace

TEST_CASE("cli config text: control characters in a value are exit 2 naming the key", "[cli][config]") {
  TempDir t("mpx_cfg_text");
  write_file(t.path / "nul.yaml", "name: n\n" + kRest + "weights: {init_from: \"w\\0.safetensors\"}\n");
  support::Run r = run_mpx("validate --config nul.yaml", t.path);
  CHECK(r.code == 2);
  CHECK(contains(r.err, "nul.yaml:"));
  CHECK(contains(r.err, "weights.init_from: the value holds the control character U+0000 (NUL) at byte 1 of it, "
                        "after 'w'"));

  write_file(t.path / "tab.yaml", "name: \"a\\tb\"\n" + kRest);
  r = run_mpx("validate --config tab.yaml", t.path);
  CHECK(r.code == 2);
  CHECK(contains(r.err, "tab.yaml:1:7: name: the value holds the control character U+0009 (tab)"));

  // A raw control byte in a key, and a C1 control (U+0085) in a value.
  write_file(t.path / "esc.yaml", "name: \"x\\u0085y\"\n" + kRest);
  r = run_mpx("validate --config esc.yaml", t.path);
  CHECK(r.code == 2);
  CHECK(contains(r.err, "name: the value holds the control character U+0085"));

  write_file(t.path / "ok.yaml", "name: caf\xC3\xA9\n" + kRest);  // printable UTF-8 passes
  CHECK(run_mpx("validate --config ok.yaml", t.path).code == 0);
}

TEST_CASE("cli config text: explicit YAML tags are exit 2 naming the key", "[cli][config]") {
  TempDir t("mpx_cfg_tag");
  write_file(t.path / "tag.yaml", "name: n\nseed: !!map 42\n" + kRest);
  support::Run r = run_mpx("validate --config tag.yaml", t.path);
  CHECK(r.code == 2);
  CHECK(contains(r.err, "tag.yaml:2:7: seed: the YAML tag '!!map' is not supported"));

  write_file(t.path / "local.yaml", "name: !custom n\n" + kRest);
  r = run_mpx("validate --config local.yaml", t.path);
  CHECK(r.code == 2);
  CHECK(contains(r.err, "name: the YAML tag '!custom' is not supported"));

  r = run_mpx("validate --config local.yaml --set 'name=!!str x'", t.path);
  CHECK(r.code == 2);

  write_file(t.path / "plain.yaml", "name: n\nseed: 42\n" + kRest);
  CHECK(run_mpx("validate --config plain.yaml", t.path).code == 0);
}

TEST_CASE("cli config text: UTF-16 and UTF-32 files are exit 2, with or without a byte-order mark",
          "[cli][config]") {
  TempDir t("mpx_cfg_utf16");
  const std::string text = "name: u\n" + kRest;
  write_file(t.path / "be.yaml", utf16(text, true));  // no BOM: yaml-cpp alone would read it
  support::Run r = run_mpx("validate --config be.yaml", t.path);
  CHECK(r.code == 2);
  CHECK(contains(r.err, "be.yaml:1:1: the file holds a NUL byte (byte offset 0), so it is not UTF-8 text"));

  write_file(t.path / "le.yaml", utf16(text, false));
  r = run_mpx("validate --config le.yaml", t.path);
  CHECK(r.code == 2);
  CHECK(contains(r.err, "le.yaml:1:2: the file holds a NUL byte (byte offset 1)"));

  write_file(t.path / "bom.yaml", "\xFF\xFE" + utf16(text, false));
  r = run_mpx("validate --config bom.yaml", t.path);
  CHECK(r.code == 2);
  CHECK(contains(r.err, "bom.yaml: the text starts with a UTF-16 byte-order mark"));

  write_file(t.path / "bom8.yaml", "\xEF\xBB\xBF" + text);  // a UTF-8 byte-order mark is UTF-8
  CHECK(run_mpx("validate --config bom8.yaml", t.path).code == 0);
}
