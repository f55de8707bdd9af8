// SPDX-License-Identifier: MIT
// Catch2 entry point shared by every test executable. Installs a spdlog sink
// that turns an unexpected warning or error into a test failure (tiny-cuda-nn's
// tcnn_test_setup); a test that expects warnings uses support::ExpectLogs. Exits 77
// (CTest: skipped) when every test case that ran was skipped (support/skip.h).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <mutex>

#include "support/log_capture.h"
#include "support/skip.h"

namespace support {

std::vector<std::string>& captured_logs() {
  static std::vector<std::string> logs;
  return logs;
}
int& expect_logs_depth() {
  static int depth = 0;
  return depth;
}

namespace {
class FailOnWarnSink : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    std::string text(msg.payload.data(), msg.payload.size());
    if (msg.level >= spdlog::level::warn) {
      if (expect_logs_depth() > 0) {
        captured_logs().push_back(text);
      } else {
        FAIL("unexpected log at level " << spdlog::level::to_string_view(msg.level).data() << ": " << text);
      }
    }
  }
  void flush_() override {}
};
}  // namespace
}  // namespace support

int main(int argc, char* argv[]) {
  auto sink = std::make_shared<support::FailOnWarnSink>();
  auto logger = std::make_shared<spdlog::logger>("mpx_test", sink);
  logger->set_level(spdlog::level::info);
  spdlog::set_default_logger(logger);
  return support::exit_code_with_skips(Catch::Session().run(argc, argv));
}
