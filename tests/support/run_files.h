// SPDX-License-Identifier: MIT
// Shared by the trainer tests: fresh temporary run directories and readers of the run
// files (summary.json, metrics.jsonl, train.log) and bit-exact comparison of arenas.
#pragma once

#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace support {

/// An empty directory <tmp>/<prefix>_<name>_<pid>.
inline std::filesystem::path temp_dir(const std::string& prefix, const std::string& name) {
  std::filesystem::path d =
      std::filesystem::temp_directory_path() / (prefix + "_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

inline nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

inline std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& p) {
  std::ifstream in(p);
  REQUIRE(in.good());
  std::vector<nlohmann::json> v;
  std::string line;
  while (std::getline(in, line)) v.push_back(nlohmann::json::parse(line));
  return v;
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace support
