// SPDX-License-Identifier: MIT
// libFuzzer target: the CIFAR-10 binary reader. Input: the bytes of
// test_batch.bin (plain or gzip). Contract: a data set of whole 3073-byte
// records, 1 to 10000 of them, or a DataError naming the file; memory bounded by
// the file's size (1032x for gzip, as deflate expands at most that much).
#include <cstdint>
#include <string>

#include "core/error.h"
#include "data/readers.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mpx::fuzz::write_scratch("test_batch.bin", data, size);
  mpx::fuzz::MemoryMeter meter;
  meter.start();
  try {
    const mpx::Dataset d = mpx::data::load_cifar10(mpx::fuzz::scratch_dir(), mpx::Split::Test);
    // A plain file is its records; gzip content is checked by the record count it yields.
    const bool gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
    const uint64_t records = static_cast<uint64_t>(d.size());
    if ((!gzip && records * 3073 != size) || records == 0 || records > 10000 || d.H != 32 || d.W != 32 || d.C != 3 ||
        d.images.size() != records * 3072)
      mpx::fuzz::broken("accepted a data set that is not the file's records");
    for (int32_t label : d.labels)
      if (label < 0 || label > 9) mpx::fuzz::broken("accepted a label outside 0..9");
  } catch (const mpx::DataError& e) {
    mpx::fuzz::require_names(e.what(), path);
  } catch (const std::exception& e) {
    mpx::fuzz::broken(std::string("not a DataError: ") + e.what());
  }
  const bool gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  meter.stop_and_check((4u << 20) + (gzip ? 1032 * 3 : 3) * uint64_t{size}, "the CIFAR-10 reader");
  return 0;
}
