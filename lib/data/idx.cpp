// SPDX-License-Identifier: MIT
// MNIST and Fashion-MNIST: the IDX format (big-endian header: magic, then one
// 32-bit size per dimension, then the uint8 payload), plain or gzip-compressed.
// Every header field is checked against the file size, as llm.c's dataloader
// does, before the data is read (docs/inputs.md).
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

// The content (`size` bytes) must be exactly `payload` bytes after `header`.
void check_size(uint64_t size, const std::string& file, size_t header, uint64_t payload, uint64_t record_bytes,
                const std::string& promise) {
  const uint64_t expected = header + payload;
  if (size < expected) {
    const uint64_t have = size - header;
    throw DataError(file + ": truncated: the header promises " + promise + " (" + std::to_string(expected) +
                    " bytes in all) but the data ran out at byte offset " + std::to_string(size) + " (record " +
                    std::to_string(have / record_bytes) + " incomplete)");
  }
  if (size > expected) {
    throw DataError(file + ": " + std::to_string(size - expected) + " unexpected trailing bytes from byte offset " +
                    std::to_string(expected) + " (the header promises " + promise + ", " + std::to_string(expected) +
                    " bytes in all)");
  }
}

/// What an IDX header promises: records of `record` bytes after `header` bytes.
struct Promise {
  size_t header = 0;
  uint64_t payload = 0, record = 1;
  std::string text;  // "60000 images of 28x28"
};

Promise images_promise(const std::vector<uint32_t>& dims, const std::string& file) {
  if (dims[1] == 0 || dims[2] == 0 || dims[1] > kMaxSide || dims[2] > kMaxSide) {
    throw DataError(file + ": implausible image size " + std::to_string(dims[1]) + "x" + std::to_string(dims[2]) +
                    " in the header (byte offset 8)");
  }
  Promise p;
  p.header = 16;
  p.record = uint64_t(dims[1]) * dims[2];
  p.payload = uint64_t(dims[0]) * p.record;
  p.text = std::to_string(dims[0]) + " images of " + std::to_string(dims[1]) + "x" + std::to_string(dims[2]);
  return p;
}

Promise labels_promise(const std::vector<uint32_t>& dims) {
  Promise p;
  p.header = 8;
  p.payload = dims[0];
  p.text = std::to_string(dims[0]) + " labels";
  return p;
}

// Reads an IDX file bounded by its header: the header first (magic and sizes
// checked), then the size it promises is compared with the file size (plain)
// or with what the compressed size can hold (gzip), and only then the data is
// read, never past the promised end (a gzip bomb stops inflating there).
std::vector<uint8_t> read_idx_file(const std::string& file, uint32_t magic, const char* what) {
  const size_t header = 4 + 4 * (magic & 0xff);
  const FileContent head = read_file_prefix(file, header);
  const auto dims = read_header(head.bytes, file, magic, what);
  const Promise p = magic == kImagesMagic ? images_promise(dims, file) : labels_promise(dims);
  const uint64_t expected = p.header + p.payload;
  if (expected > kMaxDataFileBytes) {
    throw DataError(file + ": the header (byte offset 4) promises " + p.text + ", " + std::to_string(expected) +
                    " bytes in all, more than the limit of " + std::to_string(kMaxDataFileBytes) +
                    " bytes (4 GiB) per data file (a damaged header?)");
  }
  if (!head.gzip) {
    check_size(head.disk_size, file, p.header, p.payload, p.record, p.text);
  } else if (expected > kMaxGzipRatio * head.disk_size + 4096) {
    throw DataError(file + ": the header (byte offset 4) promises " + p.text + ", " + std::to_string(expected) +
                    " bytes in all, but a gzip file of " + std::to_string(head.disk_size) +
                    " bytes cannot expand to that much (a damaged header or a truncated download?)");
  }
  FileContent c = read_file_prefix(file, expected);
  if (c.more) {
    throw DataError(file + ": more data than the header promises: the " + (c.gzip ? "decompressed " : "") +
                    "content goes on past byte offset " + std::to_string(expected) + ", where the " + p.text +
                    " end (reading stopped there" + (c.gzip ? "; a gzip bomb, or a header that does not match" : "") +
                    ")");
  }
  check_size(c.bytes.size(), file, p.header, p.payload, p.record, p.text);
  return std::move(c.bytes);
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
  const Promise p = images_promise(dims, file);
  check_size(b.size(), file, p.header, p.payload, p.record, p.text);
  n = dims[0];
  rows = static_cast<int>(dims[1]);
  cols = static_cast<int>(dims[2]);
  images.assign(b.begin() + 16, b.end());
}

void parse_idx_labels(const std::vector<uint8_t>& b, const std::string& file, int64_t& n,
                      std::vector<int32_t>& labels) {
  const auto dims = read_header(b, file, kLabelsMagic, "IDX labels: ubyte, 1 dimension");
  const Promise p = labels_promise(dims);
  check_size(b.size(), file, p.header, p.payload, p.record, p.text);
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
    const auto bytes = read_idx_file(img_file, kImagesMagic, "IDX images: ubyte, 3 dimensions");
    parse_idx_images(bytes, img_file, n_img, ds.H, ds.W, ds.images);
  }
  {
    const auto bytes = read_idx_file(lbl_file, kLabelsMagic, "IDX labels: ubyte, 1 dimension");
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
