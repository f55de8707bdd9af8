// SPDX-License-Identifier: MIT
// File helpers of the data readers: bounded reads (plain or gzip) with
// messages that name the file and the byte offset, and the "how to fetch it"
// hint. Nothing here reads or inflates more than its caller allows: the
// readers decide from a file's header how much content it may hold
// (docs/inputs.md lists the limits).
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "core/input_file.h"
#include "data/readers.h"

namespace mpx::data {

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool dir_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

std::string fetch_hint(DatasetName dataset, const std::string& folder) {
  const std::string script = fetch_script(dataset);
  // The scripts write to data/<dataset> by default; another folder is their argument.
  const std::string arg = folder == default_data_path(dataset) ? "" : " " + folder;
  return "fetch it with " + script + arg + " (offline: MPX_DATA_MIRROR=/path/to/copy " + script + arg + ")";
}

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

/// Reads the content of one file front to back: plain bytes, or gzip members
/// (RFC 1952: a gzip file is one or more members, as `gzip -d` reads it)
/// inflated as they are read. Anything after the last member that is not
/// another member is an error, as is a member cut short.
class ContentReader {
 public:
  explicit ContentReader(const std::string& path) : path_(path) {
    // A FIFO or device would block fopen() or never end (docs/inputs.md, "Files that are not
    // regular files"): judged by stat(), which opens nothing.
    struct stat lst {};
    if (::stat(path.c_str(), &lst) == 0 && !S_ISREG(lst.st_mode))
      throw DataError(path + ": cannot read: it is " + file_kind_name(lst.st_mode) + ", not a regular file");
    f_.reset(std::fopen(path.c_str(), "rb"));
    if (!f_) throw DataError(path + ": cannot open: " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fileno(f_.get()), &st) == 0 && S_ISREG(st.st_mode)) disk_size_ = static_cast<uint64_t>(st.st_size);
    fill();
    gzip_ = avail_ >= 2 && in_[0] == 0x1f && in_[1] == 0x8b;
    if (gzip_) {
      zs_ = std::make_unique<z_stream>();
      std::memset(zs_.get(), 0, sizeof(z_stream));
      if (inflateInit2(zs_.get(), 16 + MAX_WBITS) != Z_OK) throw DataError(path + ": cannot start gzip decoding");
    }
  }
  ~ContentReader() {
    if (zs_) inflateEnd(zs_.get());
  }
  ContentReader(const ContentReader&) = delete;
  ContentReader& operator=(const ContentReader&) = delete;

  bool gzip() const { return gzip_; }
  uint64_t disk_size() const { return disk_size_; }

  /// Up to `n` bytes of content; fewer only at the end.
  size_t read(uint8_t* dst, size_t n) {
    size_t got = 0;
    while (got < n && !done_) {
      const size_t k = gzip_ ? inflate_some(dst + got, n - got) : copy_some(dst + got, n - got);
      got += k;
      content_ += k;
    }
    return got;
  }

 private:
  /// Moves unread input to the front of the buffer and reads more after it.
  void fill() {
    if (eof_) return;
    if (pos_ > 0 && avail_ > 0) std::memmove(in_.data(), in_.data() + pos_, avail_);
    pos_ = 0;
    const size_t want = in_.size() - avail_;
    const size_t r = std::fread(in_.data() + avail_, 1, want, f_.get());
    if (r < want) {
      if (std::ferror(f_.get()))
        throw DataError(path_ + ": read failed at byte offset " + std::to_string(consumed_ + avail_) + ": " +
                        std::strerror(errno));
      eof_ = true;
    }
    avail_ += r;
  }

  void take(size_t k) {
    pos_ += k;
    avail_ -= k;
    consumed_ += k;
  }

  size_t copy_some(uint8_t* dst, size_t n) {
    if (avail_ == 0) fill();
    if (avail_ == 0) {
      done_ = true;
      return 0;
    }
    const size_t k = std::min(n, avail_);
    std::memcpy(dst, in_.data() + pos_, k);
    take(k);
    return k;
  }

  size_t inflate_some(uint8_t* dst, size_t n) {
    if (avail_ == 0) fill();
    z_stream& zs = *zs_;
    zs.next_in = in_.data() + pos_;
    zs.avail_in = static_cast<uInt>(std::min<size_t>(avail_, 1u << 30));
    zs.next_out = dst;
    zs.avail_out = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    const uInt in_before = zs.avail_in;
    const int ret = inflate(&zs, Z_NO_FLUSH);
    const size_t produced = static_cast<size_t>(zs.next_out - dst);
    take(in_before - zs.avail_in);
    if (ret == Z_STREAM_END) {
      member_end(produced);
    } else if (ret == Z_BUF_ERROR || (ret == Z_OK && produced == 0 && in_before == zs.avail_in)) {
      if (avail_ == 0 && eof_)
        throw DataError(path_ + ": gzip data ran out at decompressed byte offset " +
                        std::to_string(content_ + produced) + " (compressed byte offset " +
                        std::to_string(consumed_) + "): the file ends inside a gzip member (truncated download?)");
    } else if (ret != Z_OK) {
      throw DataError(path_ + ": corrupt gzip data at compressed byte offset " + std::to_string(consumed_) +
                      " (decompressed byte offset " + std::to_string(content_ + produced) +
                      "): " + (zs.msg ? zs.msg : "zlib error " + std::to_string(ret)));
    }
    return produced;
  }

  /// After a member (whose last call produced `produced` bytes): the end of
  /// the file, another member, or garbage.
  void member_end(size_t produced) {
    if (avail_ < 2) fill();
    if (avail_ == 0) {
      done_ = true;
      return;
    }
    if (avail_ >= 2 && in_[pos_] == 0x1f && in_[pos_ + 1] == 0x8b) {
      inflateReset(zs_.get());
      return;
    }
    throw DataError(path_ + ": unexpected bytes after the end of the gzip data at compressed byte offset " +
                    std::to_string(consumed_) + " (decompressed byte offset " + std::to_string(content_ + produced) +
                    "); a .gz data file holds whole gzip members and nothing else (a damaged or appended-to file?)");
  }

  std::string path_;
  std::unique_ptr<std::FILE, FileCloser> f_;
  std::vector<uint8_t> in_ = std::vector<uint8_t>(size_t{1} << 18);
  size_t pos_ = 0, avail_ = 0;  // unread input: in_[pos_, pos_ + avail_)
  uint64_t consumed_ = 0;       // input bytes consumed (the compressed offset)
  uint64_t content_ = 0;        // content bytes delivered
  uint64_t disk_size_ = 0;
  bool eof_ = false, done_ = false, gzip_ = false;
  std::unique_ptr<z_stream> zs_;
};

}  // namespace

FileContent read_file_prefix(const std::string& path, uint64_t limit) {
  ContentReader r(path);
  FileContent c;
  c.gzip = r.gzip();
  c.disk_size = r.disk_size();
  // A plain file's size is its content's: reserve it; gzip content grows as it
  // is inflated, never past the limit.
  if (!c.gzip) c.bytes.reserve(static_cast<size_t>(std::min(limit, c.disk_size)));
  constexpr size_t kChunk = size_t{1} << 20;
  while (c.bytes.size() < limit) {
    const size_t old = c.bytes.size();
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kChunk, limit - old));
    c.bytes.resize(old + want);
    const size_t got = r.read(c.bytes.data() + old, want);
    c.bytes.resize(old + got);
    if (got < want) return c;
  }
  uint8_t probe = 0;
  c.more = r.read(&probe, 1) == 1;
  return c;
}

std::vector<uint8_t> read_file_bytes(const std::string& path, uint64_t max_bytes) {
  FileContent c = read_file_prefix(path, max_bytes);
  if (c.more)
    throw DataError(path + ": more than " + std::to_string(max_bytes) + " bytes of " +
                    (c.gzip ? "decompressed " : "") + "content (stopped reading at byte offset " +
                    std::to_string(max_bytes) + "; no data file of mpx is that large)");
  return std::move(c.bytes);
}

}  // namespace mpx::data
