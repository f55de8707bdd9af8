// SPDX-License-Identifier: MIT
// The polled wait with a time limit (bootstrap.h).
#include "dist/bootstrap.h"

#include <fmt/format.h>

#include <chrono>
#include <thread>

#include "core/env.h"

namespace mpx {

void poll_with_timeout(const std::function<PollResult()>& poll, double timeout_s, const std::string& what,
                       const std::string& limit_name, const std::function<void()>& on_timeout, int interval_us) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  while (poll() == PollResult::Pending) {
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    if (waited > timeout_s) {
      if (on_timeout) on_timeout();
      throw Error(fmt::format("{} did not finish within {:g} s (another rank may have failed or stopped); raise "
                              "{} if it only needs longer",
                              what, timeout_s, limit_name));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(interval_us));
  }
}

double nccl_timeout_seconds() { return static_cast<double>(env_int("MPX_NCCL_TIMEOUT_S", 300, 1, 86400)); }

}  // namespace mpx
