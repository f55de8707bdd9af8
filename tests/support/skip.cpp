// SPDX-License-Identifier: MIT
// MPX_SKIP's bookkeeping (support/skip.h): a Catch2 listener counts the test cases that
// ran and those that recorded a skip.
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include "support/skip.h"

#include <catch2/catch.hpp>

#include <cstdio>

namespace support {
namespace {

struct SkipCount {
  int ran = 0, skipped = 0;
  bool current = false;
};

SkipCount& count() {
  static SkipCount c;
  return c;
}

class SkipListener : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    TestEventListenerBase::testCaseStarting(info);
    ++count().ran;
    count().current = false;
  }
  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    if (count().current) ++count().skipped;
    TestEventListenerBase::testCaseEnded(stats);
  }
};

CATCH_REGISTER_LISTENER(SkipListener)

}  // namespace

void record_skip(const std::string& reason) {
  count().current = true;
  std::printf("SKIPPED: %s: %s\n", Catch::getResultCapture().getCurrentTestName().c_str(), reason.c_str());
  std::fflush(stdout);
}

int exit_code_with_skips(int rc) {
  const SkipCount& c = count();
  if (c.skipped == 0) return rc;
  std::printf("%d of %d test cases skipped\n", c.skipped, c.ran);
  return (rc == 0 && c.skipped == c.ran) ? 77 : rc;
}

}  // namespace support
