// SPDX-License-Identifier: MIT
// The environment switch reader (core/env.h): one truthiness rule, and a bad
// value is a ConfigError (exit 2) naming the variable, never a silent default.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "core/env.h"
#include "core/error.h"

using namespace mpx;

namespace {

struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* v) : name(n) {
    if (v) ::setenv(n, v, 1);
    else ::unsetenv(n);
  }
  ~ScopedEnv() { ::unsetenv(name); }
};

}  // namespace

TEST_CASE("env_flag: one truthiness rule for every switch", "[core][env]") {
  const char* n = "MPX_TEST_SWITCH";
  {
    ScopedEnv e(n, nullptr);
    CHECK(env_flag(n) == false);
    CHECK(env_flag(n, true) == true);
  }
  {
    ScopedEnv e(n, "");
    CHECK(env_flag(n, true) == true);  // empty = unset
  }
  for (const char* yes : {"1", "true", "TRUE", "yes", "On"}) {
    ScopedEnv e(n, yes);
    CHECK(env_flag(n) == true);
  }
  for (const char* no : {"0", "false", "No", "off"}) {
    ScopedEnv e(n, no);
    CHECK(env_flag(n, true) == false);
  }
  for (const char* bad : {"2", "maybe", " 1", "yes please"}) {
    ScopedEnv e(n, bad);
    try {
      (void)env_flag(n);
      FAIL("no error for " << bad);
    } catch (const ConfigError& err) {
      const std::string msg = err.what();
      CHECK(msg.find("MPX_TEST_SWITCH='" + std::string(bad) + "'") != std::string::npos);
      CHECK(msg.find("1/true/yes/on") != std::string::npos);
      CHECK(err.exit_code() == kExitUsage);
    }
  }
}

TEST_CASE("env_int: range-checked integers", "[core][env]") {
  const char* n = "MPX_TEST_INT";
  {
    ScopedEnv e(n, nullptr);
    CHECK(env_int(n, 7, 0, 10) == 7);
  }
  {
    ScopedEnv e(n, "10");
    CHECK(env_int(n, 7, 0, 10) == 10);
  }
  for (const char* bad : {"11", "-1", "3x", "x", " 3", "99999999999999999999"}) {
    ScopedEnv e(n, bad);
    CHECK_THROWS_AS(env_int(n, 7, 0, 10), ConfigError);
  }
  ScopedEnv e(n, "abc");
  CHECK(env_string(n) == "abc");
}
