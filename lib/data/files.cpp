// SPDX-License-Identifier: MIT
// File helpers of the data readers: whole-file reads (plain or gzip) with
// messages that name the file, and the "how to fetch it" hint.
#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
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

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) {
    throw DataError(path + ": cannot open: " + (errno ? std::strerror(errno) : "out of memory"));
  }
  gzbuffer(f, 1 << 18);
  std::vector<uint8_t> out;
  // Plain files: the size on disk is the final size; gzip grows as it goes.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) out.reserve(static_cast<size_t>(st.st_size));
  constexpr size_t kChunk = 1 << 20;
  for (;;) {
    const size_t old = out.size();
    out.resize(old + kChunk);
    const int got = gzread(f, out.data() + old, static_cast<unsigned>(kChunk));
    if (got < 0) {
      int errnum = 0;
      const char* msg = gzerror(f, &errnum);
      const std::string what = errnum == Z_ERRNO ? std::strerror(errno) : (msg ? msg : "unknown zlib error");
      gzclose(f);
      throw DataError(path + ": read failed after " + std::to_string(old) +
                      " (decompressed) bytes: " + what + " (truncated or corrupt gzip file?)");
    }
    out.resize(old + static_cast<size_t>(got));
    if (got == 0) break;
  }
  // zlib reports a gzip stream cut short (Z_BUF_ERROR) only here, not as a failed read.
  int errnum = Z_OK;
  const char* msg = gzerror(f, &errnum);
  if (errnum != Z_OK) {
    const std::string what = msg ? msg : "unknown zlib error";
    gzclose(f);
    throw DataError(path + ": gzip data ran out at decompressed byte offset " + std::to_string(out.size()) + ": " +
                    what + " (truncated download?)");
  }
  gzclose(f);
  return out;
}

}  // namespace mpx::data
