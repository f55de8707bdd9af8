// SPDX-License-Identifier: MIT
// Helpers for tests that run the built mpx binary (its path is the compile
// definition MPX_BINARY): temporary folders, file I/O, and run_mpx().
#pragma once

#include <catch2/catch.hpp>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace support {

/// A fresh folder under $TMPDIR, removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "mpx_test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path.string(); }
};

/// The whole file as bytes ("" when it cannot be read).
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_file(const std::filesystem::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct Run {
  int code = -1;
  std::string out, err;
};

/// Runs `mpx <args>` with `cwd` as working directory; stdout and stderr are captured
/// and attached to the test's report.
inline Run run_mpx(const std::string& args, const std::filesystem::path& cwd) {
  const std::filesystem::path out = cwd / ".mpx_stdout", err = cwd / ".mpx_stderr";
  const std::string cmd = "cd " + shell_quote(cwd.string()) + " && " + shell_quote(MPX_BINARY) + " " + args +
                          " > " + shell_quote(out.string()) + " 2> " + shell_quote(err.string()) + " < /dev/null";
  const int status = std::system(cmd.c_str());
  Run r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(out);
  r.err = read_file(err);
  UNSCOPED_INFO("mpx " << args << "\nexit " << r.code << "\n--- stdout ---\n" << r.out << "--- stderr ---\n" << r.err);
  return r;
}

}  // namespace support
