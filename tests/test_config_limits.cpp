// SPDX-License-Identifier: MIT
// lib/config against hostile or broken input (docs/inputs.md): alias bombs,
// huge and endless files, a second document, text that is not UTF-8, numbers
// that do not fit a float32, huge values echoed in messages, absurd epochs.
// Every case is a ConfigError (exit 2) naming the file and the place.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "config/config.h"
#include "config/yaml_tree.h"
#include "core/error.h"

using namespace mpx;
namespace fs = std::filesystem;

namespace {

const char* kMinimal =
    "data:\n"
    "  dataset: mnist\n"
    "model:\n"
    "  layers:\n"
    "    - {type: dense, units: 10}\n";

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(text, "x.yaml", overrides);
  } catch (const ConfigError& e) {
    CHECK(e.exit_code() == kExitUsage);
    return e.what();
  }
  return "";
}

std::string load_error(const std::string& path, const std::vector<std::string>& overrides = {}) {
  try {
    load_config(path, overrides);
  } catch (const ConfigError& e) {
    CHECK(e.exit_code() == kExitUsage);
    return e.what();
  }
  return "";
}

/// Nine anchors, each a list of nine aliases of the one before: 9^9 nodes
/// once expanded, from about 450 bytes.
std::string alias_bomb() {
  std::string s = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i <= 8; ++i) {
    s += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int k = 0; k < 9; ++k) s += (k ? ", *a" : "*a") + std::to_string(i - 1);
    s += "]\n";
  }
  return s;
}

struct TempFile {
  std::string path;
  explicit TempFile(const std::string& content) {
    std::string tmpl = (fs::temp_directory_path() / "mpx_test_config_XXXXXX").string();
    const int fd = mkstemp(tmpl.data());
    REQUIRE(fd >= 0);
    ::close(fd);
    path = tmpl;
    std::ofstream(path, std::ios::binary) << content;
  }
  ~TempFile() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("config limits: an alias bomb stops at the node limit, in a file and in --set", "[config][limits]") {
  const std::string bomb = alias_bomb();
  CHECK(bomb.size() < 500);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = error_of(bomb + kMinimal);
  CHECK_THAT(msg, Catch::StartsWith("x.yaml:"));
  CHECK_THAT(msg, Catch::Contains("expands to more than 100000 nodes"));
  CHECK(seconds_since(t0) < 10.0);

  // The same bomb as one --set value, and many small --set values that share one budget.
  const std::string inline_bomb =
      "x=[&a [1,1,1,1,1,1,1,1,1,1], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], "
      "&d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d], &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]]";
  const std::string ov = error_of(kMinimal, {inline_bomb});
  CHECK_THAT(ov, Catch::StartsWith("x.yaml: in --set 'x=[&a"));
  CHECK_THAT(ov, Catch::Contains("expands to more than 100000 nodes"));
  const std::string ten_thousand =
      "x=[&a [1,1,1,1,1,1,1,1,1,1], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], "
      "&d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]]";
  std::vector<std::string> many(20, ten_thousand);
  CHECK_THAT(error_of(kMinimal, many), Catch::Contains("expands to more than 100000 nodes"));

  // Aliases themselves are fine in a config of sane size.
  CHECK(error_of(std::string("defaults: &d {type: dense, units: 10}\n") +
                 "data: {dataset: mnist}\nmodel: {layers: [*d]}\n") ==
        "x.yaml:1:1: defaults: unknown key in the top level (valid keys: name, seed, device, policy, loss_scale, "
        "data, model, optimizer, schedule, train, debug, weights, dist, cpu, cuda)");
}

TEST_CASE("config limits: files over 1 MiB and endless files are refused, bounded", "[config][limits]") {
  // A regular file is judged by its size before it is read.
  const std::string big_text = std::string(kMinimal) + "# " + std::string(config_detail::kMaxConfigBytes, 'x') + "\n";
  TempFile big(big_text);
  const std::string msg = load_error(big.path);
  CHECK_THAT(msg, Catch::StartsWith(big.path + ": the config file is larger than the limit of 1048576 bytes"));
  CHECK_THAT(msg, Catch::Contains("it has " + std::to_string(big_text.size()) + " bytes"));
  // Exactly at the limit is fine (the size check is not off by one).
  std::string at_limit = std::string(kMinimal) + "#";
  at_limit += std::string(config_detail::kMaxConfigBytes - at_limit.size() - 1, 'x') + "\n";
  REQUIRE(at_limit.size() == config_detail::kMaxConfigBytes);
  TempFile ok(at_limit);
  CHECK(load_error(ok.path).empty());

  // /dev/zero never ends: read one byte past the limit, then refused.
  if (fs::exists("/dev/zero")) {
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THAT(load_error("/dev/zero"),
               Catch::StartsWith("/dev/zero: the config file is larger than the limit of 1048576 bytes (1 MiB);"));
    CHECK(seconds_since(t0) < 10.0);
  }
  // Text handed to parse_config directly has the same limit.
  CHECK_THAT(error_of(std::string(kMinimal) + "#" + std::string(config_detail::kMaxConfigBytes, 'x')),
             Catch::Contains("more than the limit of 1048576 bytes"));
}

TEST_CASE("config limits: a second YAML document is an error naming its line", "[config][limits]") {
  CHECK(error_of(std::string(kMinimal) + "---\nname: other\n") ==
        "x.yaml:6: a second YAML document starts here; a config file holds one document (remove the '---' and what "
        "follows, or merge the two)");
  CHECK_THAT(error_of(std::string(kMinimal) + "---\n"), Catch::StartsWith("x.yaml:"));
  CHECK_THAT(error_of(std::string(kMinimal) + "...\n---\n{}\n"), Catch::Contains("a second YAML document"));
  // A leading '---' and a closing '...' are one document.
  CHECK(error_of(std::string("---\n") + kMinimal + "...\n").empty());
  CHECK_THAT(error_of(kMinimal, {"name=a\n---\nb"}), Catch::Contains("in --set 'name=a"));
  CHECK_THAT(error_of(kMinimal, {"name=a\n---\nb"}), Catch::Contains("second YAML document"));
}

TEST_CASE("config limits: text that is not UTF-8 is refused at the door", "[config][limits]") {
  // Latin-1 e-acute (0xE9) in the run name: it would break every JSON file of the run.
  CHECK(error_of("name: caf\xE9\n" + std::string(kMinimal)) ==
        "x.yaml:1:7: name: the value is not valid UTF-8: byte 0xE9 at byte 3 of it, after 'caf' (save the file as "
        "UTF-8)");
  // In a nested value, and in a key.
  CHECK_THAT(error_of(std::string(kMinimal) + "optimizer: {name: \"\xFF\"}\n"),
             Catch::StartsWith("x.yaml:6:19: optimizer.name: the value is not valid UTF-8: byte 0xFF at byte 0"));
  CHECK_THAT(error_of(std::string(kMinimal) + "tr\xC3\x28in: {}\n"),
             Catch::StartsWith("x.yaml:6:1: config: the key is not valid UTF-8: byte 0xC3 at byte 2"));
  CHECK_THAT(error_of(std::string(kMinimal) + "model2: {layers: [{type: dense, name: \"a\xED\xA0\x80\"}]}\n"),
             Catch::Contains("model2.layers[0].name: the value is not valid UTF-8: byte 0xED at byte 1"));
  // Through --set, in the value and in the key path.
  CHECK_THAT(error_of(kMinimal, {"name=caf\xE9"}),
             Catch::StartsWith("x.yaml: a --set argument is not valid UTF-8: byte 0xE9 at byte 8, after 'name=caf'"));
  CHECK_THAT(error_of(kMinimal, {"na\xE9me=x"}), Catch::Contains("not valid UTF-8: byte 0xE9 at byte 2"));
  // Proper UTF-8 is welcome.
  CHECK(error_of("name: caf\xC3\xA9-\xE6\x97\xA5\xF0\x9F\x98\x80\n" + std::string(kMinimal)).empty());
  CHECK(parse_config("name: caf\xC3\xA9\n" + std::string(kMinimal), "x.yaml").name == "caf\xC3\xA9");
}

TEST_CASE("config limits: the UTF-8 check rejects every malformed form", "[config][limits]") {
  using config_detail::utf8_error_at;
  const auto npos = std::string::npos;
  CHECK(utf8_error_at("") == npos);
  CHECK(utf8_error_at("plain ascii") == npos);
  CHECK(utf8_error_at("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF") == npos);  // U+10FFFF is the last
  CHECK(utf8_error_at("a\x80") == 1);                    // a lone continuation byte
  CHECK(utf8_error_at("\xC0\xAF") == 0);                 // overlong '/'
  CHECK(utf8_error_at("\xC1\xBF") == 0);                 // overlong
  CHECK(utf8_error_at("\xE0\x80\xAF") == 0);             // overlong, 3 bytes
  CHECK(utf8_error_at("\xF0\x80\x80\xAF") == 0);         // overlong, 4 bytes
  CHECK(utf8_error_at("ab\xED\xA0\x80") == 2);           // a UTF-16 surrogate
  CHECK(utf8_error_at("\xF4\x90\x80\x80") == 0);         // above U+10FFFF
  CHECK(utf8_error_at("\xF5\x80\x80\x80") == 0);
  CHECK(utf8_error_at("xy\xE2\x82") == 2);               // cut short
  CHECK(utf8_error_at("\xE2\x28\xA1") == 0);             // bad continuation
  CHECK(utf8_error_at("\xFF") == 0);
}

TEST_CASE("config limits: echoed values are cut to 80 characters", "[config][limits]") {
  const std::string huge(1 << 19, '9');
  const std::string msg = error_of(std::string(kMinimal) + "train: {epochs: " + huge + "}\n");
  CHECK_THAT(msg, Catch::StartsWith("x.yaml:6:17: train.epochs: expected an integer in [1, 1000000], got 99999"));
  CHECK_THAT(msg, Catch::EndsWith(std::string(80, '9') + "..."));
  CHECK(msg.size() < 200);
  // A huge string, key, enum value or --set: every message stays short.
  const std::string word(1 << 19, 'a');
  for (const std::string& m :
       {error_of(std::string(kMinimal) + "optimizer: {name: " + word + "}\n"),
        error_of(std::string(kMinimal) + "device: " + word + "\n"),
        error_of(std::string(kMinimal) + "name: a/" + word + "\n"), error_of(kMinimal, {"train.epochs=" + word}),
        error_of(kMinimal, {word + "=1"}), error_of(kMinimal, {"model.layers[0]." + word + "=1"})}) {
    CHECK(!m.empty());
    CHECK(m.size() < 1000);
    CHECK_THAT(m, Catch::Contains("aaa..."));
  }
  // (yaml-cpp itself refuses a plain key longer than 1024 characters, without echoing it.)
  CHECK(error_of(std::string(kMinimal) + word + ": 1\n").size() < 200);
  // A multi-byte character is never cut in half.
  std::string accents;
  for (int i = 0; i < 100; ++i) accents += "\xC3\xA9";
  CHECK(config_detail::clip(accents) == accents.substr(0, 80) + "...");
  CHECK(config_detail::clip("x" + accents) == "x" + accents.substr(0, 78) + "...");
  CHECK(config_detail::clip("short") == "short");
}

TEST_CASE("config limits: numbers must fit a float32", "[config][limits]") {
  // batch_norm epsilon 1e-300 used to reach an internal check (0 in float32).
  const std::string bn =
      "data: {dataset: mnist}\n"
      "model:\n"
      "  layers:\n"
      "    - {type: batch_norm, epsilon: 1.0e-300}\n"
      "    - {type: dense, units: 10}\n";
  CHECK(error_of(bn) ==
        "x.yaml:4:35: model.layers[0].epsilon: expected a number > 0, got 1.0e-300, which does not fit a float32 "
        "(mpx computes in float32: 0, or a magnitude in [1.17549435e-38, 3.40282347e+38])");
  // learning_rate 1e-320 used to become 0 silently; 1e39 would be inf.
  CHECK_THAT(error_of(kMinimal, {"optimizer.learning_rate=1e-320"}),
             Catch::Contains("optimizer.learning_rate: expected a number > 0, got 1e-320, which does not fit a "
                             "float32"));
  CHECK_THAT(error_of(kMinimal, {"optimizer.learning_rate=1e39"}),
             Catch::Contains("got 1e39, which does not fit a float32"));
  CHECK_THAT(error_of(kMinimal, {"loss_scale.initial=1e300"}), Catch::Contains("does not fit a float32"));
  CHECK_THAT(error_of(kMinimal, {"data.normalize.mean=[-1e-40]", "data.normalize.std=[1]"}),
             Catch::Contains("data.normalize.mean[0]: expected a number, got -1e-40, which does not fit a float32"));
  // The edges: the smallest normal float32 and the largest are fine, and so is 0 where 0 is allowed.
  CHECK(error_of(kMinimal, {"optimizer.learning_rate=1.1754944e-38"}).empty());
  CHECK(error_of(kMinimal, {"loss_scale.initial=3.4e38"}).empty());
  CHECK(error_of(kMinimal, {"optimizer.weight_decay=0"}).empty());
  CHECK(error_of(kMinimal, {"optimizer.learning_rate=1e-30"}).empty());
}

TEST_CASE("config limits: epochs and warm-up are capped at a million", "[config][limits]") {
  CHECK(parse_config(kMinimal, "x.yaml", {"train.epochs=1000000"}).train.epochs == 1000000);
  CHECK_THAT(error_of(kMinimal, {"train.epochs=1000001"}),
             Catch::EndsWith("train.epochs: expected an integer in [1, 1000000], got 1000001"));
  CHECK_THAT(error_of(kMinimal, {"train.epochs=9223372036854775807"}),
             Catch::Contains("expected an integer in [1, 1000000]"));
  CHECK_THAT(error_of(kMinimal, {"schedule.warmup_epochs=1e30"}),
             Catch::EndsWith("schedule.warmup_epochs: expected a number in [0, 1000000], got 1e30"));
  CHECK_THAT(error_of(kMinimal, {"cuda.workspace_mb=17592186044416"}),
             Catch::EndsWith("cuda.workspace_mb: expected an integer in [0, 1048576], got 17592186044416"));
}
