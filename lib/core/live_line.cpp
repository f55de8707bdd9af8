// SPDX-License-Identifier: MIT
// The live status line (live_line.h).
#include "core/live_line.h"

#include <atomic>
#include <cstdio>

namespace mpx::live_line {

namespace {
std::atomic<bool> g_shown{false};
}

void show(const std::string& s) {
  std::fprintf(stderr, "\r\033[K%s", s.c_str());
  std::fflush(stderr);
  g_shown = true;
}

void clear() {
  if (!g_shown.exchange(false)) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
}

bool shown() { return g_shown; }

}  // namespace mpx::live_line
