// SPDX-License-Identifier: MIT
// Skipping a test case that cannot run here (a data set or a CPU feature is missing),
// so that it is reported and never passes silently. Catch2 v2 has no SKIP(): MPX_SKIP
// prints "SKIPPED: <test case>: <reason>" and returns from the test case; the test
// mains (support/main.cpp, cuda/main.cpp) exit 77, which CTest reads as "skipped"
// (SKIP_RETURN_CODE), when every test case that ran was skipped and nothing failed.
#pragma once

#include <string>

namespace support {

/// Records that the running test case is skipped, and why (printed at once).
void record_skip(const std::string& reason);

/// The exit code of a test executable, from Catch::Session::run's result `rc`: 77 when
/// at least one test case ran, all of them were skipped and none failed; else `rc`.
/// Prints how many test cases were skipped, if any.
int exit_code_with_skips(int rc);

}  // namespace support

/// Skips the current test case; use it in the TEST_CASE body itself (it returns from it).
#define MPX_SKIP(reason)               \
  do {                                 \
    ::support::record_skip(reason);    \
    return;                            \
  } while (0)
