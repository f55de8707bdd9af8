// SPDX-License-Identifier: MIT
// MNIST and Fashion-MNIST: the IDX format (big-endian header: magic, then one
// 32-bit size per dimension, then the uint8 payload), plain or gzip-compressed.
// Every header field is checked against the file size, as llm.c's dataloader does.
#include <cstring>

#include "core/error.h"
#include "data/readers.h"

namespace mpx::data {

namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // ubyte, 3 dimensions (N, rows, cols)
constexpr uint32_t kLabelsMagic = 0x00000801;  // ubyte, 1 dimension (N)
constexpr uint32_t kMaxSide = 4096;

uint32_t be32(const std::vector<uint8_t>& b, size_t off) {
  return (uint32_t(b[off]) << 24) | (uint32_t(b[off + 1]) << 16) | (uint32_t(b[off + 2]) << 8) | uint32_t(b[off + 3]);
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// Header of `ndim` dimensions: returns the sizes, after checking the magic and that the header itself is there.
std::vector<uint32_t> read_header(const std::vector<uint8_t>& b, const std::string& file, uint32_t magic,
                                  const char* what) {
  if (b.size() < 4) {
    throw DataError(file + ": data ran out at byte offset " + std::to_string(b.size()) +
                    " inside the 4-byte IDX magic number (truncated or empty file)");
  }
  const uint32_t got = be32(b, 0);
  if (got != magic) {
    std::string why;
    if (b[0] == 0x1f && b[1] == 0x8b) {
      why = " (the content is still gzip-compressed: compressed twice?)";
    } else if ((got >> 8) == 0x08 && (got & 0xff) != (magic & 0xff)) {
      why = " (an IDX file of " + std::to_string(got & 0xff) + " dimensions; expected " +
            std::to_string(magic & 0xff) + ": images and labels swapped?)";
    } else if ((got >> 8) != 0x08) {
      why = " (not an IDX file of unsigned bytes)";
    }
    throw DataError(file + ": bad magic number " + hex32(got) + " at byte offset 0, expected " + hex32(magic) +
                    " (" + what + ")" + why);
  }
  const size_t ndim = magic & 0xff;
  const size_t header = 4 + 4 * ndim;
  if (b.size() < header) {
    throw DataError(file + ": data ran out at byte offset " + std::to_string(b.size()) + " inside the " +
                    std::to_string(header) + "-byte IDX header (truncated file)");
  }
  std::vector<uint32_t> dims(ndim);
  for (size_t i = 0; i < ndim; ++i) dims[i] = be32(b, 4 + 4 * i);
  return dims;
}

// The payload must be exactly `payload` bytes after `header`.
void check_size(const std::vector<uint8_t>& b, const std::string& file, size_t header, uint64_t payload,
                uint64_t record_bytes, const std::string& promise) {
  const uint64_t expected = header + payload;
  if (b.size() < expected) {
    const uint64_t have = b.size() - header;
    throw DataError(file + ": truncated: the header promises " + promise + " (" + std::to_string(expected) +
                    " bytes in all) but the data ran out at byte offset " + std::to_string(b.size()) + " (record " +
                    std::to_string(have / record_bytes) + " incomplete)");
  }
  if (b.size() > expected) {
    throw DataError(file + ": " + std::to_string(b.size() - expected) +
                    " unexpected trailing bytes from byte offset " + std::to_string(expected) +
                    " (the header promises " + promise + ", " + std::to_string(expected) + " bytes in all)");
  }
}

// "<folder>/<name>" or "<folder>/<name>.gz", whichever exists (the plain file first).
std::string find_idx(DatasetName dataset, const std::string& folder, const std::string& name) {
  const std::string plain = join_path(folder, name);
  if (file_exists(plain)) return plain;
  if (file_exists(plain + ".gz")) return plain + ".gz";
  std::string where = plain + "(.gz) not found";
  if (!dir_exists(folder)) where += " (folder " + folder + " does not exist)";
  throw DataError(where + "; " + fetch_hint(dataset, folder));
}

}  // namespace

void parse_idx_images(const std::vector<uint8_t>& b, const std::string& file, int64_t& n, int& rows, int& cols,
                      std::vector<uint8_t>& images) {
  const auto dims = read_header(b, file, kImagesMagic, "IDX images: ubyte, 3 dimensions");
  if (dims[1] == 0 || dims[2] == 0 || dims[1] > kMaxSide || dims[2] > kMaxSide) {
    throw DataError(file + ": implausible image size " + std::to_string(dims[1]) + "x" + std::to_string(dims[2]) +
                    " in the header (byte offset 8)");
  }
  const uint64_t per = uint64_t(dims[1]) * dims[2];
  check_size(b, file, 16, uint64_t(dims[0]) * per, per,
             std::to_string(dims[0]) + " images of " + std::to_string(dims[1]) + "x" + std::to_string(dims[2]));
  n = dims[0];
  rows = static_cast<int>(dims[1]);
  cols = static_cast<int>(dims[2]);
  images.assign(b.begin() + 16, b.end());
}

void parse_idx_labels(const std::vector<uint8_t>& b, const std::string& file, int64_t& n,
                      std::vector<int32_t>& labels) {
  const auto dims = read_header(b, file, kLabelsMagic, "IDX labels: ubyte, 1 dimension");
  check_size(b, file, 8, dims[0], 1, std::to_string(dims[0]) + " labels");
  n = dims[0];
  labels.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t v = b[8 + i];
    if (v > 9) {
      throw DataError(file + ": label " + std::to_string(v) + " of record " + std::to_string(i) + " (byte offset " +
                      std::to_string(8 + i) + ") is outside [0, 9]");
    }
    labels[i] = v;
  }
}

Dataset load_idx_dataset(DatasetName dataset, const std::string& folder, Split split) {
  const std::string prefix = split == Split::Train ? "train" : "t10k";
  const std::string img_file = find_idx(dataset, folder, prefix + "-images-idx3-ubyte");
  const std::string lbl_file = find_idx(dataset, folder, prefix + "-labels-idx1-ubyte");

  Dataset ds;
  ds.name = enum_name(dataset);
  ds.C = 1;
  ds.num_classes = 10;
  int64_t n_img = 0, n_lbl = 0;
  {
    const auto bytes = read_file_bytes(img_file);
    parse_idx_images(bytes, img_file, n_img, ds.H, ds.W, ds.images);
  }
  {
    const auto bytes = read_file_bytes(lbl_file);
    parse_idx_labels(bytes, lbl_file, n_lbl, ds.labels);
  }
  if (n_img != n_lbl) {
    throw DataError(img_file + " holds " + std::to_string(n_img) + " images but " + lbl_file + " holds " +
                    std::to_string(n_lbl) + " labels; the two files must come from the same release (" +
                    fetch_hint(dataset, folder) + ")");
  }
  return ds;
}

}  // namespace mpx::data
