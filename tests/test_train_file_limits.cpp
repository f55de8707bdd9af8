// SPDX-License-Identifier: MIT
// The checkpoint and safetensors readers against files whose length fields or
// sizes lie (docs/inputs.md): every size is checked against the file before a
// byte is allocated for it, so a 16 GiB sparse file or a header length of 4 GiB
// is an error at once (checkpoints: DataError, exit 3; weights: ConfigError,
// exit 2), naming the file.
#include <zlib.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "support/cli.h"

using namespace mpx;
namespace fs = std::filesystem;

namespace {

Checkpoint small_checkpoint() {
  Checkpoint c;
  c.header.config_name = "limits";
  c.header.policy = "float32";
  c.header.device = "cpu";
  c.header.optimizer = "sgd";
  c.header.dataset = "synthetic";
  c.header.batch_size = 8;
  c.header.num_params = 100;
  c.header.num_state = 2;
  c.header.scaler.scale = 1.0;
  c.master.assign(100, 0.5f);
  c.state = {1.0f, 2.0f};
  c.opt.assign(1, std::vector<float>(100, 0.25f));
  return c;
}

void put_u32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

/// A checkpoint file from a (CRC-valid) header text and the data after it.
std::string checkpoint_bytes(const std::string& text, const std::string& data) {
  std::string s("MPXCKPT\0", 8);
  put_u32(s, 1);  // version 1: packed arenas, no param_align in the header
  put_u32(s, static_cast<uint32_t>(text.size()));
  s += text;
  put_u32(s, static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(text.data()),
                                         static_cast<uInt>(text.size()))));
  return s + data;
}

std::string ckpt_error(const std::string& path) {
  try {
    (void)load_checkpoint(path);
  } catch (const DataError& e) {
    CHECK(e.exit_code() == kExitData);
    return e.what();
  }
  FAIL("no DataError");
  return "";
}

std::string weights_error(const std::string& path) {
  try {
    (void)read_safetensors(path);
  } catch (const ConfigError& e) {
    CHECK(e.exit_code() == kExitUsage);
    return e.what();
  }
  FAIL("no ConfigError");
  return "";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

const uint64_t k16G = uint64_t{16} << 30;

}  // namespace

TEST_CASE("file limits: a checkpoint padded to 16 GiB is refused from its size, not read", "[train][limits]") {
  support::TempDir d("mpx_test_file_limits");
  const std::string path = (d.path / "last.ckpt").string();
  save_checkpoint(path, small_checkpoint());
  const uint64_t size = fs::file_size(path);
  fs::resize_file(path, k16G);  // sparse: no disk space
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = ckpt_error(path);
  CHECK(seconds_since(t0) < 5.0);
  CHECK(msg == "checkpoint '" + path + "' is corrupt at byte offset " + std::to_string(size) + ": " +
                   std::to_string(k16G - size) +
                   " unexpected bytes after the last section (the file is damaged; use another checkpoint, e.g. "
                   "best.ckpt, or start a new run)");
  // The intact file still loads, section by section.
  fs::resize_file(path, size);
  const Checkpoint c = load_checkpoint(path);
  CHECK(c.master == small_checkpoint().master);
  CHECK(c.opt == small_checkpoint().opt);
  CHECK(c.state == small_checkpoint().state);
}

TEST_CASE("file limits: checkpoint length fields larger than the file are refused before allocating",
          "[train][limits]") {
  support::TempDir d("mpx_test_file_limits");
  const std::string path = (d.path / "last.ckpt").string();
  save_checkpoint(path, small_checkpoint());
  std::string bytes = support::read_file(path);

  // The header length field (offset 12) says 4 GiB - 1.
  std::string b = bytes;
  b[12] = b[13] = b[14] = b[15] = '\xff';
  support::write_file(path, b);
  CHECK(ckpt_error(path) == "checkpoint '" + path + "' is truncated: it ends at byte offset " +
                                std::to_string(b.size()) +
                                " but the header (length 4294967295 at byte offset 12) needs 4294967315 bytes (an "
                                "interrupted copy? use another checkpoint, e.g. best.ckpt)");

  // A CRC-valid header whose section claims 2^60 floats: truncated, nothing allocated.
  uint32_t hlen = 0;
  for (int i = 3; i >= 0; --i) hlen = hlen << 8 | static_cast<uint8_t>(bytes[12 + i]);
  nlohmann::json j = nlohmann::json::parse(bytes.substr(16, hlen));
  const std::string data = bytes.substr(20 + hlen);
  const uint64_t base = 20 + hlen;
  for (uint64_t count : {uint64_t{1} << 60, uint64_t{1} << 40, uint64_t{1} << 20, ~uint64_t{0}}) {
    INFO("count " << count);
    nlohmann::json h = j;
    h["sections"][0]["count"] = count;
    const std::string text = h.dump();
    REQUIRE(text.size() == hlen + std::to_string(count).size() - 3);  // "100" replaced
    // Offsets are absolute: shift them by the header's change in length.
    const int64_t shift = static_cast<int64_t>(text.size()) - static_cast<int64_t>(hlen);
    for (auto& s : h["sections"]) s["offset"] = s["offset"].get<uint64_t>() + static_cast<uint64_t>(shift);
    const std::string text2 = h.dump();
    REQUIRE(text2.size() == text.size());
    support::write_file(path, checkpoint_bytes(text2, data));
    const auto t0 = std::chrono::steady_clock::now();
    const std::string msg = ckpt_error(path);
    CHECK(seconds_since(t0) < 5.0);
    CHECK_THAT(msg, Catch::StartsWith("checkpoint '" + path + "' is truncated"));
    CHECK_THAT(msg, Catch::Contains("section 'master' (offset " + std::to_string(base + shift) + ", " +
                                    std::to_string(count) + " float32)"));
  }
}

TEST_CASE("file limits: a weights file is judged by its header before its data is read", "[train][limits]") {
  support::TempDir d("mpx_test_file_limits");
  const std::string path = (d.path / "w.safetensors").string();
  StFile f;
  const std::vector<float> v(4, 1.5f);
  f.tensors.push_back(make_st_tensor("w", DType::F32, {4}, v.data()));
  write_safetensors(path, f);
  const uint64_t size = fs::file_size(path);
  CHECK(read_safetensors(path).tensors.at(0).bytes == f.tensors.at(0).bytes);
  const std::string good = support::read_file(path);

  // 16 GiB of holes after a header that describes 16 bytes: refused at once.
  fs::resize_file(path, k16G);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = weights_error(path);
  CHECK(seconds_since(t0) < 5.0);
  CHECK_THAT(msg, Catch::StartsWith(path + ": not a valid safetensors file: tensor 'w': the data section has " +
                                    std::to_string(k16G - size + 16) + " bytes but the tensors end at byte 16"));

  // A header length of 2^62 in a small file, and one over the 100 MiB limit in a sparse file.
  std::string b = good;
  b.replace(0, 8, std::string("\0\0\0\0\0\0\0\x40", 8));
  support::write_file(path, b);
  CHECK_THAT(weights_error(path), Catch::Contains("the header length 4611686018427387904 is larger than the rest of "
                                                  "the file (" + std::to_string(size - 8) + " bytes)"));
  b.replace(0, 8, std::string("\0\0\0\x10\0\0\0\0", 8));  // 256 MiB
  support::write_file(path, b);
  fs::resize_file(path, k16G);
  CHECK_THAT(weights_error(path), Catch::Contains("the header length 268435456 exceeds the limit of 104857600 bytes"));

  // Not a regular file: refused without reading.
  if (fs::exists("/dev/zero"))
    CHECK(weights_error("/dev/zero") == "/dev/zero: cannot read weights file: not a regular file");
  CHECK_THAT(weights_error((d.path / "missing.safetensors").string()), Catch::Contains("cannot open weights file"));
}
