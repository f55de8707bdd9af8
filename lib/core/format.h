// SPDX-License-Identifier: MIT
// Byte counts for people: the units the log, `mpx validate` and `mpx report` share.
#pragma once

#include <cstddef>
#include <string>

namespace mpx {

/// "512 B", "13.6 KiB", "12.3 MiB", "1.50 GiB" (binary units).
std::string format_bytes(size_t bytes);

}  // namespace mpx
