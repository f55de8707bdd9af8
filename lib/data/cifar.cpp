// SPDX-License-Identifier: MIT
// CIFAR-10, binary version: records of 3073 bytes (label, then 1024 R, 1024 G,
// 1024 B bytes, each plane row-major 32x32), converted here to NHWC. Records are
// counted from the file size, never assumed to be 10,000 per file (but never
// more than the official 10,000 either).
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "data/readers.h"

namespace mpx::data {

namespace {

constexpr int kSide = 32, kPlane = kSide * kSide;
constexpr int64_t kRecord = 1 + 3 * kPlane;  // 3073

/// The official batch files hold 10000 records each; a file may hold fewer
/// (test subsets), never more (docs/inputs.md).
constexpr int64_t kMaxRecords = 10000;

[[noreturn]] void too_many(const std::string& file, const std::string& size) {
  throw DataError(file + ": " + size + " is more than " + std::to_string(kMaxRecords) + " records of " +
                  std::to_string(kRecord) + " bytes (" + std::to_string(kMaxRecords * kRecord) +
                  " bytes), the most a CIFAR-10 batch file holds (not a CIFAR-10 batch file?)");
}

// The size of the content must be whole records, at least one.
void check_record_size(const std::string& file, int64_t size) {
  if (size == 0) throw DataError(file + ": empty file (0 bytes; records are 3073 bytes each)");
  if (size % kRecord != 0) {
    const int64_t full = size / kRecord;
    throw DataError(file + ": size " + std::to_string(size) + " bytes is not a multiple of the 3073-byte record: " +
                    std::to_string(full) + " whole records, then a partial record " + std::to_string(full) +
                    " of " + std::to_string(size - full * kRecord) + " bytes at byte offset " +
                    std::to_string(full * kRecord) + " (truncated file?)");
  }
}

// Appends the records of `file` to `ds` (NHWC). A plain file is judged by its
// size before it is read; gzip content is inflated up to the most records a
// file may hold and no further.
void append_batch_file(const std::string& file, Dataset& ds) {
  const uint64_t max_bytes = static_cast<uint64_t>(kMaxRecords * kRecord);
  const FileContent head = read_file_prefix(file, 2);
  if (!head.gzip) {
    if (head.disk_size > max_bytes) too_many(file, "its size, " + std::to_string(head.disk_size) + " bytes,");
    check_record_size(file, static_cast<int64_t>(head.disk_size));
  }
  const FileContent c = read_file_prefix(file, max_bytes);
  if (c.more) too_many(file, "its decompressed content (reading stopped at byte offset " +
                                 std::to_string(max_bytes) + ")");
  const auto& b = c.bytes;
  const int64_t size = static_cast<int64_t>(b.size());
  check_record_size(file, size);
  const int64_t n = size / kRecord;
  const int64_t base = ds.size();
  ds.labels.resize(static_cast<size_t>(base + n));
  ds.images.resize(static_cast<size_t>((base + n) * kPlane * 3));
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* rec = b.data() + r * kRecord;
    if (rec[0] > 9) {
      throw DataError(file + ": label " + std::to_string(rec[0]) + " of record " + std::to_string(r) +
                      " (byte offset " + std::to_string(r * kRecord) + ") is outside [0, 9]");
    }
    ds.labels[base + r] = rec[0];
    const uint8_t* R = rec + 1;
    const uint8_t* G = R + kPlane;
    const uint8_t* B = G + kPlane;
    uint8_t* dst = ds.images.data() + (base + r) * kPlane * 3;  // (H, W, C)
    for (int p = 0; p < kPlane; ++p) {
      dst[3 * p + 0] = R[p];
      dst[3 * p + 1] = G[p];
      dst[3 * p + 2] = B[p];
    }
  }
}

std::string missing(const std::string& folder, const std::string& name) {
  std::string msg = join_path(folder, name) + " not found";
  if (!dir_exists(folder)) msg += " (folder " + folder + " does not exist)";
  return msg + "; " + fetch_hint(DatasetName::Cifar10, folder);
}

}  // namespace

Dataset load_cifar10(const std::string& folder_in, Split split) {
  // The official tarball unpacks into cifar-10-batches-bin/; accept that layout too.
  std::string folder = folder_in;
  const std::string nested = join_path(folder_in, "cifar-10-batches-bin");
  if (!file_exists(join_path(folder, "data_batch_1.bin")) && !file_exists(join_path(folder, "test_batch.bin")) &&
      dir_exists(nested)) {
    folder = nested;
  }

  Dataset ds;
  ds.name = enum_name(DatasetName::Cifar10);
  ds.H = kSide;
  ds.W = kSide;
  ds.C = 3;
  ds.num_classes = 10;
  if (split == Split::Test) {
    const std::string file = join_path(folder, "test_batch.bin");
    if (!file_exists(file)) throw DataError(missing(folder_in, "test_batch.bin"));
    append_batch_file(file, ds);
    return ds;
  }

  const std::string first = join_path(folder, "data_batch_1.bin");
  if (!file_exists(first)) throw DataError(missing(folder_in, "data_batch_1.bin"));
  std::string used;
  int files = 0;
  for (int i = 1; i <= 5; ++i) {
    const std::string file = join_path(folder, "data_batch_" + std::to_string(i) + ".bin");
    if (!file_exists(file)) continue;
    append_batch_file(file, ds);
    used += (files ? ", " : "") + std::to_string(i);
    ++files;
  }
  spdlog::info("cifar10: {} training records in {} of 5 batch files (data_batch_{{{}}}.bin) in {}{}", ds.size(),
               files, used, folder, files < 5 ? "; the full training set is 5 files, 50000 records" : "");
  return ds;
}

}  // namespace mpx::data
