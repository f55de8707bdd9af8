// SPDX-License-Identifier: MIT
// Hostile inputs through the mpx binary (docs/inputs.md): each is refused with
// its exit code (2 config, 3 data) and the file named.
#include <zlib.h>

#include <catch2/catch.hpp>
#include <string>

#include "support/cli.h"

using support::run_mpx;
using support::TempDir;
using support::write_file;

namespace {

const char* kConfig =
    "name: limits\n"
    "device: cpu\n"
    "data: {dataset: mnist, path: data, batch_size: 4}\n"
    "train: {epochs: 1}\n"
    "model:\n"
    "  layers:\n"
    "    - {type: flatten}\n"
    "    - {type: dense, units: 10, activation: softmax}\n";

std::string be32(uint32_t v) {
  return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                     static_cast<char>(v)};
}

}  // namespace

TEST_CASE("cli input limits: config bombs and endless files are exit 2 naming the file", "[cli][limits]") {
  TempDir t("mpx_test_cli_limits");
  std::string bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i <= 8; ++i) {
    bomb += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int k = 0; k < 9; ++k) bomb += (k ? ", *a" : "*a") + std::to_string(i - 1);
    bomb += "]\n";
  }
  write_file(t.path / "bomb.yaml", bomb + kConfig);
  write_file(t.path / "ok.yaml", kConfig);
  write_file(t.path / "latin1.yaml", std::string("name: caf\xE9\n") + (kConfig + 13));

  support::Run r = run_mpx("validate --config bomb.yaml", t.path);
  CHECK(r.code == 2);
  CHECK(r.err.find("bomb.yaml:") != std::string::npos);
  CHECK(r.err.find("more than 100000 nodes") != std::string::npos);

  r = run_mpx("validate --config /dev/zero", t.path);
  CHECK(r.code == 2);
  CHECK(r.err.find("/dev/zero: the config file is larger than the limit") != std::string::npos);

  r = run_mpx("validate --config latin1.yaml", t.path);
  CHECK(r.code == 2);
  CHECK(r.err.find("latin1.yaml:1:7: name: the value is not valid UTF-8: byte 0xE9") != std::string::npos);

  r = run_mpx("validate --config ok.yaml --set optimizer.learning_rate=1e-320", t.path);
  CHECK(r.code == 2);
  CHECK(r.err.find("does not fit a float32") != std::string::npos);
}

TEST_CASE("cli input limits: a gzip bomb in the data folder is exit 3 naming the file and offset", "[cli][limits]") {
  TempDir t("mpx_test_cli_limits");
  std::filesystem::create_directory(t.path / "data");
  write_file(t.path / "c.yaml", kConfig);
  // A valid images file of 8 images of 28x28, and a labels file: 8 labels, then 256 MiB of zeros, gzipped.
  std::string img = be32(0x803) + be32(8) + be32(28) + be32(28) + std::string(8 * 784, '\x10');
  write_file(t.path / "data" / "train-images-idx3-ubyte", img);
  write_file(t.path / "data" / "t10k-images-idx3-ubyte", img);
  const std::string lbl = be32(0x801) + be32(8) + std::string(8, '\x01');
  write_file(t.path / "data" / "t10k-labels-idx1-ubyte", lbl);
  const std::string gz = (t.path / "data" / "train-labels-idx1-ubyte.gz").string();
  gzFile f = gzopen(gz.c_str(), "wb9");
  REQUIRE(f != nullptr);
  gzwrite(f, lbl.data(), static_cast<unsigned>(lbl.size()));
  const std::string zeros(1 << 20, '\0');
  for (int i = 0; i < 256; ++i) gzwrite(f, zeros.data(), static_cast<unsigned>(zeros.size()));
  REQUIRE(gzclose(f) == Z_OK);

  const support::Run r = run_mpx("train --config c.yaml --run-dir run --no-progress", t.path);
  CHECK(r.code == 3);
  CHECK(r.err.find("data/train-labels-idx1-ubyte.gz: more data than the header promises") != std::string::npos);
  CHECK(r.err.find("past byte offset 16") != std::string::npos);
}
