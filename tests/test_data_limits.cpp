// SPDX-License-Identifier: MIT
// Data readers against hostile or broken files (docs/inputs.md): a gzip bomb,
// a huge sparse IDX file, a header that promises more than the file can hold,
// garbage after a gzip member, oversized CIFAR-10 files. Every case is a
// DataError (exit 3) naming the file, decided before the bulk is read.
#include <unistd.h>
#include <zlib.h>

#include <catch2/catch.hpp>

#include "support/scratch.h"
#include <chrono>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/dataset.h"
#include "data/readers.h"

namespace fs = std::filesystem;
using namespace mpx;

namespace {

using TempDir = support::ScratchDir;

using support::write_bytes;

/// One gzip member holding `b` and then `zeros` zero bytes (compressed: a bomb when zeros is large).
std::vector<uint8_t> gzip_member(const std::vector<uint8_t>& b, uint64_t zeros = 0) {
  z_stream zs{};
  REQUIRE(deflateInit2(&zs, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::vector<uint8_t> out;
  std::vector<uint8_t> buf(1 << 16);
  const std::vector<uint8_t> zero_chunk(1 << 20, 0);
  auto pump = [&](const uint8_t* p, size_t n, int flush) {
    zs.next_in = const_cast<Bytef*>(p);
    zs.avail_in = static_cast<uInt>(n);
    do {
      zs.next_out = buf.data();
      zs.avail_out = static_cast<uInt>(buf.size());
      REQUIRE(deflate(&zs, flush) != Z_STREAM_ERROR);
      out.insert(out.end(), buf.data(), buf.data() + (buf.size() - zs.avail_out));
    } while (zs.avail_out == 0 || (flush == Z_FINISH && zs.avail_in > 0));
  };
  pump(b.data(), b.size(), Z_NO_FLUSH);
  while (zeros > 0) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(zeros, zero_chunk.size()));
    pump(zero_chunk.data(), n, Z_NO_FLUSH);
    zeros -= n;
  }
  pump(nullptr, 0, Z_FINISH);
  deflateEnd(&zs);
  return out;
}

void put_be32(std::vector<uint8_t>& b, uint32_t v) {
  b.push_back(uint8_t(v >> 24));
  b.push_back(uint8_t(v >> 16));
  b.push_back(uint8_t(v >> 8));
  b.push_back(uint8_t(v));
}

std::vector<uint8_t> idx_images_header(uint32_t n, uint32_t rows, uint32_t cols) {
  std::vector<uint8_t> b;
  put_be32(b, 0x803);
  put_be32(b, n);
  put_be32(b, rows);
  put_be32(b, cols);
  return b;
}

std::vector<uint8_t> idx_images(uint32_t n, uint32_t rows, uint32_t cols) {
  std::vector<uint8_t> b = idx_images_header(n, rows, cols);
  for (uint32_t i = 0; i < n * rows * cols; ++i) b.push_back(uint8_t(i * 7 + 3));
  return b;
}

std::vector<uint8_t> idx_labels(uint32_t n) {
  std::vector<uint8_t> b;
  put_be32(b, 0x801);
  put_be32(b, n);
  for (uint32_t i = 0; i < n; ++i) b.push_back(uint8_t(i % 10));
  return b;
}

void write_small_mnist(const TempDir& d) {
  write_bytes(d.file("train-images-idx3-ubyte"), idx_images(12, 4, 5));
  write_bytes(d.file("train-labels-idx1-ubyte"), idx_labels(12));
  write_bytes(d.file("t10k-images-idx3-ubyte"), idx_images(6, 4, 5));
  write_bytes(d.file("t10k-labels-idx1-ubyte"), idx_labels(6));
}

/// A sparse file: `head`, then holes up to `size` bytes (no disk space used).
void write_sparse(const std::string& path, const std::vector<uint8_t>& head, uint64_t size) {
  write_bytes(path, head);
  std::error_code ec;
  fs::resize_file(path, size, ec);
  REQUIRE(!ec);
}

DataConfig cfg_for(DatasetName dataset, const std::string& path) {
  DataConfig c;
  c.dataset = dataset;
  c.path = path;
  return c;
}

std::string error_of(const DataConfig& c, Split s) {
  try {
    (void)load_dataset(c, s, 1);
  } catch (const DataError& e) {
    CHECK(e.exit_code() == kExitData);
    return e.what();
  }
  FAIL("no DataError thrown");
  return "";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("data limits: a gzip bomb stops inflating where the IDX header says the data ends", "[data][limits]") {
  TempDir d;
  write_small_mnist(d);
  fs::remove(d.file("train-labels-idx1-ubyte"));
  // 12 labels as promised, then 64 MiB of zeros: a ~64 KiB file.
  const std::string gz = d.file("train-labels-idx1-ubyte.gz");
  write_bytes(gz, gzip_member(idx_labels(12), uint64_t{64} << 20));
  CHECK(fs::file_size(gz) < (uint64_t{1} << 20));
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = error_of(cfg_for(DatasetName::Mnist, d.path), Split::Train);
  CHECK(seconds_since(t0) < 5.0);
  CHECK_THAT(msg, Catch::StartsWith(gz + ": more data than the header promises"));
  CHECK_THAT(msg, Catch::Contains("past byte offset 20, where the 12 labels end"));
  CHECK_THAT(msg, Catch::Contains("gzip bomb"));
}

TEST_CASE("data limits: a header that promises more than a gzip file can expand to is refused first",
          "[data][limits]") {
  TempDir d;
  write_small_mnist(d);
  fs::remove(d.file("t10k-images-idx3-ubyte"));
  const std::string gz = d.file("t10k-images-idx3-ubyte.gz");
  // 1,000,000 images of 28x28 promised (784 MB) from a file of a few hundred bytes.
  write_bytes(gz, gzip_member(idx_images(6, 4, 5)));
  auto b = gzip_member(idx_images_header(1000000, 28, 28), 1000);
  write_bytes(gz, b);
  const std::string msg = error_of(cfg_for(DatasetName::Mnist, d.path), Split::Test);
  CHECK_THAT(msg, Catch::StartsWith(gz + ": the header (byte offset 4) promises 1000000 images of 28x28, 784000016 "
                                         "bytes in all, but a gzip file of " +
                                    std::to_string(b.size()) + " bytes cannot expand to that much"));
}

TEST_CASE("data limits: a huge sparse IDX file is judged by its size, not read", "[data][limits]") {
  TempDir d;
  write_small_mnist(d);
  const std::string img = d.file("train-images-idx3-ubyte");
  const uint64_t huge = uint64_t{16} << 30;  // 16 GiB of holes

  // A right header and 16 GiB of content: the size disagrees with the header before a byte of data is read.
  write_sparse(img, idx_images_header(12, 4, 5), huge);
  auto t0 = std::chrono::steady_clock::now();
  std::string msg = error_of(cfg_for(DatasetName::Mnist, d.path), Split::Train);
  CHECK(seconds_since(t0) < 5.0);
  CHECK_THAT(msg, Catch::StartsWith(img + ": " + std::to_string(huge - 256) +
                                    " unexpected trailing bytes from byte offset 256"));

  // All zeros: no IDX magic.
  write_sparse(img, {}, huge);
  t0 = std::chrono::steady_clock::now();
  msg = error_of(cfg_for(DatasetName::Mnist, d.path), Split::Train);
  CHECK(seconds_since(t0) < 5.0);
  CHECK_THAT(msg, Catch::StartsWith(img + ": bad magic number 0x00000000 at byte offset 0"));

  // A header whose promise matches the file but exceeds the 4 GiB limit.
  const uint64_t n = 6000000;  // 6e6 * 28 * 28 = 4.7 GB
  write_sparse(img, idx_images_header(static_cast<uint32_t>(n), 28, 28), 16 + n * 784);
  msg = error_of(cfg_for(DatasetName::Mnist, d.path), Split::Train);
  CHECK_THAT(msg, Catch::StartsWith(img + ": the header (byte offset 4) promises 6000000 images of 28x28, 4704000016 "
                                          "bytes in all, more than the limit of 4294967296 bytes (4 GiB)"));

  // A truncated file is found from its size too, before it is read.
  write_sparse(img, idx_images_header(1000000, 28, 28), 1000);
  CHECK_THAT(error_of(cfg_for(DatasetName::Mnist, d.path), Split::Train),
             Catch::Contains("truncated: the header promises 1000000 images of 28x28 (784000016 bytes in all) but "
                             "the data ran out at byte offset 1000"));
}

TEST_CASE("data limits: garbage after a gzip member is an error naming the offset; whole members are read",
          "[data][limits]") {
  TempDir d;
  write_small_mnist(d);
  fs::remove(d.file("t10k-labels-idx1-ubyte"));
  const std::string gz = d.file("t10k-labels-idx1-ubyte.gz");
  const auto member = gzip_member(idx_labels(6));

  auto b = member;
  for (char c : std::string("trailing junk")) b.push_back(static_cast<uint8_t>(c));
  write_bytes(gz, b);
  std::string msg = error_of(cfg_for(DatasetName::Mnist, d.path), Split::Test);
  CHECK_THAT(msg, Catch::StartsWith(gz +
                                    ": unexpected bytes after the end of the gzip data at compressed byte offset " +
                                    std::to_string(member.size()) + " (decompressed byte offset 14)"));

  // Zero padding counts as garbage too; so does a lone byte.
  b = member;
  b.insert(b.end(), 512, 0);
  write_bytes(gz, b);
  CHECK_THAT(error_of(cfg_for(DatasetName::Mnist, d.path), Split::Test),
             Catch::Contains("at compressed byte offset " + std::to_string(member.size())));
  b = member;
  b.push_back(0x1f);
  write_bytes(gz, b);
  CHECK_THAT(error_of(cfg_for(DatasetName::Mnist, d.path), Split::Test),
             Catch::Contains("unexpected bytes after the end of the gzip data"));

  // A file of several gzip members (what `cat a.gz b.gz` makes; gzip -d reads it whole) is one content.
  const auto lbl = idx_labels(6);
  auto two = gzip_member(std::vector<uint8_t>(lbl.begin(), lbl.begin() + 9));
  const auto second = gzip_member(std::vector<uint8_t>(lbl.begin() + 9, lbl.end()));
  two.insert(two.end(), second.begin(), second.end());
  write_bytes(gz, two);
  const Dataset ds = load_dataset(cfg_for(DatasetName::Mnist, d.path), Split::Test, 1);
  CHECK(ds.size() == 6);
  CHECK(ds.labels == std::vector<int32_t>{0, 1, 2, 3, 4, 5});

  // A corrupt deflate stream names the compressed offset.
  b = member;
  b[12] ^= 0xff;
  b[13] ^= 0xff;
  write_bytes(gz, b);
  msg = error_of(cfg_for(DatasetName::Mnist, d.path), Split::Test);
  CHECK_THAT(msg, Catch::StartsWith(gz + ": "));
  CHECK_THAT(msg, Catch::Contains("byte offset"));
}

TEST_CASE("data limits: read_file_prefix never reads or inflates past its limit", "[data][limits]") {
  TempDir d;
  std::vector<uint8_t> content(100000);
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<uint8_t>(i * 13);
  write_bytes(d.file("plain"), content);
  write_bytes(d.file("z.gz"), gzip_member(content));
  for (const char* name : {"plain", "z.gz"}) {
    const auto c = data::read_file_prefix(d.file(name), 1000);
    CHECK(c.bytes == std::vector<uint8_t>(content.begin(), content.begin() + 1000));
    CHECK(c.more);
    CHECK(c.gzip == (std::string(name) == "z.gz"));
    const auto all = data::read_file_prefix(d.file(name), content.size());
    CHECK(all.bytes == content);
    CHECK_FALSE(all.more);
    CHECK(data::read_file_bytes(d.file(name)) == content);
    try {
      (void)data::read_file_bytes(d.file(name), 99999);
      FAIL("no DataError");
    } catch (const DataError& e) {
      CHECK_THAT(e.what(), Catch::StartsWith(d.file(name) + ": more than 99999 bytes of "));
    }
  }
  CHECK(data::read_file_prefix(d.file("plain"), 0).more);
  write_bytes(d.file("empty"), {});
  CHECK(data::read_file_prefix(d.file("empty"), 10).bytes.empty());
  CHECK_FALSE(data::read_file_prefix(d.file("empty"), 10).more);
}

TEST_CASE("data limits: a CIFAR-10 file holds at most 10000 records, judged before reading", "[data][limits]") {
  TempDir d;
  const std::string file = d.file("test_batch.bin");
  const uint64_t rec = 3073;
  // 10001 records of holes (label 0, black images): refused from the size alone.
  write_sparse(file, {}, 10001 * rec);
  std::string msg = error_of(cfg_for(DatasetName::Cifar10, d.path), Split::Test);
  CHECK_THAT(msg, Catch::StartsWith(file + ": its size, 30733073 bytes, is more than 10000 records of 3073 bytes"));
  // 16 GiB: refused as fast.
  write_sparse(file, {}, uint64_t{16} << 30);
  const auto t0 = std::chrono::steady_clock::now();
  msg = error_of(cfg_for(DatasetName::Cifar10, d.path), Split::Test);
  CHECK(seconds_since(t0) < 5.0);
  CHECK_THAT(msg, Catch::Contains("is more than 10000 records"));
  // Exactly 10000 is the official file.
  write_sparse(file, {}, 10000 * rec);
  CHECK(load_dataset(cfg_for(DatasetName::Cifar10, d.path), Split::Test, 1).size() == 10000);
  // gzip content is inflated up to 10000 records and no further.
  write_bytes(file, gzip_member({}, 20000 * rec));
  msg = error_of(cfg_for(DatasetName::Cifar10, d.path), Split::Test);
  CHECK_THAT(msg, Catch::StartsWith(file + ": its decompressed content (reading stopped at byte offset 30730000) is "
                                           "more than 10000 records"));
  // A size that is not whole records is still named with the offset of the partial record.
  write_sparse(file, {}, 2 * rec + 5);
  CHECK_THAT(error_of(cfg_for(DatasetName::Cifar10, d.path), Split::Test),
             Catch::Contains("partial record 2 of 5 bytes at byte offset 6146"));
}
