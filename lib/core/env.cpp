// SPDX-License-Identifier: MIT
// Environment switches (env.h).
#include "core/env.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "core/error.h"

namespace mpx {

std::string env_string(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool env_flag(const char* name, bool fallback) {
  std::string v = env_string(name);
  if (v.empty()) return fallback;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  throw ConfigError(fmt::format("environment variable {}='{}': expected 1/true/yes/on or 0/false/no/off "
                                "(or unset it)",
                                name, env_string(name)));
}

int64_t env_int(const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const std::string v = env_string(name);
  if (v.empty()) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (end != v.c_str() + v.size() || errno == ERANGE || n < lo || n > hi || std::isspace(static_cast<unsigned char>(v[0])))
    throw ConfigError(fmt::format("environment variable {}='{}': expected an integer in [{}, {}] (or unset it)", name,
                                  v, lo, hi));
  return n;
}

}  // namespace mpx
