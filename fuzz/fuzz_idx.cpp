// SPDX-License-Identifier: MIT
// libFuzzer target: the IDX reader (MNIST / Fashion-MNIST), plain and gzip.
// Input: byte 0 picks the file the rest becomes (even: the test images, odd:
// the test labels); the other file is a valid 3-record one. Contract: a data
// set of consistent size, or a DataError naming the file; memory bounded by
// what the file could hold (its size, or 1032x for gzip: docs/inputs.md).
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/readers.h"
#include "fuzz_support.h"

namespace {

constexpr int kRecords = 3;

std::vector<uint8_t> idx_header(uint32_t magic, std::vector<uint32_t> dims) {
  std::vector<uint8_t> b;
  auto put = [&b](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
  };
  put(magic);
  for (uint32_t d : dims) put(d);
  return b;
}

void write_valid(const std::string& name, bool images) {
  std::vector<uint8_t> b = images ? idx_header(0x803, {kRecords, 28, 28}) : idx_header(0x801, {kRecords});
  b.resize(b.size() + (images ? kRecords * 28 * 28 : kRecords), 7);
  mpx::fuzz::write_scratch(name, b.data(), b.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool fuzz_images = (data[0] & 1) == 0;
  const std::string images = "t10k-images-idx3-ubyte", labels = "t10k-labels-idx1-ubyte";
  write_valid(fuzz_images ? labels : images, !fuzz_images);
  const std::string path = mpx::fuzz::write_scratch(fuzz_images ? images : labels, data + 1, size - 1);
  mpx::fuzz::MemoryMeter meter;
  meter.start();
  try {
    const mpx::Dataset d = mpx::data::load_idx_dataset(mpx::DatasetName::Mnist, mpx::fuzz::scratch_dir(), mpx::Split::Test);
    if (d.size() != kRecords || static_cast<int64_t>(d.images.size()) != d.size() * d.image_bytes())
      mpx::fuzz::broken("accepted a data set of inconsistent size");
  } catch (const mpx::DataError& e) {
    mpx::fuzz::require_names(e.what(), mpx::fuzz::scratch_dir());
  } catch (const std::exception& e) {
    mpx::fuzz::broken(std::string("not a DataError: ") + e.what());
  }
  // Up to three copies of the fuzzed file's content (at most 1032 times its size when
  // gzip: read, grown, the data set) and of the valid file's.
  const uint64_t n = size - 1;
  const bool gzip = n >= 2 && data[1] == 0x1f && data[2] == 0x8b;
  meter.stop_and_check((4u << 20) + 3 * (gzip ? 1032 : 1) * n + 3 * (kRecords * 28 * 28 + 64), "the IDX reader");
  return 0;
}
