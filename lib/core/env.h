// SPDX-License-Identifier: MIT
// The one reader of mpx's environment switches (docs/environment.md): one
// truthiness rule, and a bad value is a ConfigError (exit 2) naming the
// variable and what it accepts, never a silent default.
#pragma once

#include <cstdint>
#include <string>

namespace mpx {

/// The variable's value, "" when unset.
std::string env_string(const char* name);

/// A switch: unset or "" -> `fallback`; 1/true/yes/on -> true; 0/false/no/off -> false
/// (any case). Anything else throws ConfigError.
bool env_flag(const char* name, bool fallback = false);

/// An integer in [lo, hi]: unset or "" -> `fallback`; anything else that is not such an
/// integer throws ConfigError.
int64_t env_int(const char* name, int64_t fallback, int64_t lo, int64_t hi);

}  // namespace mpx
