// SPDX-License-Identifier: MIT
// Output files: atomic replacement of regular files (temporary file in the same
// folder, fsync, rename, fsync the folder), special files written in place or
// refused, and the temporary files a write leaves when a process ends
// (docs/inputs.md, "Output files").
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace mpx {

/// ".<name>.tmp.<digits>": write_file_atomic's temporary name.
bool is_atomic_temp_name(const std::string& name);

/// @brief Removes the temporary files that write_file_atomic leaves behind when a
/// process is killed mid-write (".<name>.tmp.<pid>" in `dir` and dir/checkpoints).
/// Call it only while holding the RunDirLock: then no other process is writing
/// one. Returns the names removed (for the log); failures to remove are ignored.
std::vector<std::string> remove_orphan_temp_files(const std::string& dir);

/// How write_file_atomic writes a path (docs/inputs.md, "Output files").
enum class OutputKind {
  Replace,  // a new path or a regular file: temporary file and rename
  Stream,   // a FIFO, a character device, standard output ("-", /dev/stdout): written in place
  Refused,  // a folder, a block device, a socket, a path that cannot be looked up
};
OutputKind output_kind(const std::string& path);

/**
 * @brief Writes `path`: a new path or a regular file atomically, anything else
 * in place or not at all (OutputKind); every output of mpx goes through here.
 * A regular file: `write` fills a temporary file in the same
 * folder, which is flushed, fsync'ed and renamed over `path`; then the folder
 * is fsync'ed. A reader sees the old file or the new one, never a mix.
 * A symbolic link to a regular file is itself replaced (never the file it points to).
 * A FIFO, a character device (/dev/null, /dev/full) or standard output ("-",
 * /dev/stdout) is written front to back as a stream, never replaced; a FIFO that
 * no process reads is refused at once. A folder, block device or socket is refused.
 * Throws IoError (exit 6) naming the file on any failure (the temporary file is removed).
 */
void write_file_atomic(const std::string& path, const std::function<void(std::FILE*)>& write);
void write_file_atomic(const std::string& path, const std::string& contents);

/// Opens `path` for writing (appending, or truncated) as fopen() would, but without ever
/// blocking: a FIFO that no process reads is ENXIO at once (nullptr, errno set); a block
/// device is EINVAL. For the files written as they go (metrics.jsonl, train.log).
std::FILE* open_for_writing(const std::string& path, bool append);
/// The reason for a message when open_for_writing failed with `err`.
std::string open_for_writing_error(int err);

/// Removes the temporary files of the atomic writes in progress: for a process that is
/// about to end at once (a stop signal, docs/design.md "Signals"). Never blocks.
void remove_temp_files_in_progress();

}  // namespace mpx
