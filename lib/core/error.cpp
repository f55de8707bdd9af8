// SPDX-License-Identifier: MIT
#include "core/error.h"

#include <fmt/format.h>

namespace mpx {

void throw_check_failed(const char* cond, const char* file, int line, const std::string& msg) {
  if (msg.empty()) throw Error(fmt::format("internal check failed: {} ({}:{})", cond, file, line));
  throw Error(fmt::format("internal check failed: {} ({}:{}): {}", cond, file, line, msg));
}

}  // namespace mpx
