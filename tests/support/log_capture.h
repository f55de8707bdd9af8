// SPDX-License-Identifier: MIT
// Lets a test expect warnings: while an ExpectLogs is alive, warn/error lines
// are collected (see support/main.cpp) instead of failing the test.
#pragma once

#include <string>
#include <vector>

namespace support {

std::vector<std::string>& captured_logs();
int& expect_logs_depth();

struct ExpectLogs {
  ExpectLogs() { ++expect_logs_depth(); captured_logs().clear(); }
  ~ExpectLogs() { --expect_logs_depth(); }
  const std::vector<std::string>& lines() const { return captured_logs(); }
  bool contains(const std::string& needle) const {
    for (const auto& l : captured_logs()) if (l.find(needle) != std::string::npos) return true;
    return false;
  }
};

}  // namespace support
