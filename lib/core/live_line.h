// SPDX-License-Identifier: MIT
// The one live status line on a terminal (stderr, redrawn with '\r'): the
// progress of train, compare and eval. The console log sink clears it before it
// prints a line, so no log message ever starts in the middle of it.
#pragma once

#include <string>

namespace mpx::live_line {

/// Replaces the line with `s` (no newline).
void show(const std::string& s);
/// Erases the line if one is shown.
void clear();
/// Whether a line is shown now.
bool shown();

}  // namespace mpx::live_line
