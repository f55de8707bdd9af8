// SPDX-License-Identifier: MIT
// Helpers of the NCCL communicator's start and waits that need no GPU
// (docs/distributed.md "Failures"): a broadcast that carries the root's status with
// its value, so a failure on the root never leaves the other ranks waiting in a
// collective that will not come; and a wait that polls with a time limit.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "dist/communicator.h"

namespace mpx {

/**
 * @brief Runs make() on rank `root` and broadcasts its result together with whether it
 * succeeded. When make() throws on the root, every rank throws: the root its own error,
 * the others mpx::Error with the root's message and exit code, `what` naming the phase.
 * Every rank must call it (a collective). T must be trivially copyable (e.g. ncclUniqueId).
 */
template <typename T>
T broadcast_with_status(Communicator& comm, int root, const std::string& what, const std::function<T()>& make) {
  static_assert(std::is_trivially_copyable_v<T>, "broadcast_with_status sends raw bytes");
  struct Packet {
    int32_t ok = 0;
    int32_t exit_code = 0;
    char message[504] = {};
    T value{};
  } packet;
  if (comm.rank() == root) {
    try {
      packet.value = make();
      packet.ok = 1;
    } catch (const Error& e) {
      packet.exit_code = e.exit_code();
      std::strncpy(packet.message, e.what(), sizeof(packet.message) - 1);
      comm.broadcast(&packet, sizeof(packet), root);  // the others learn of it, then all throw
      throw;
    }
  }
  comm.broadcast(&packet, sizeof(packet), root);
  if (!packet.ok)
    throw Error(what + ": rank " + std::to_string(root) + " failed: " + std::string(packet.message),
                packet.exit_code != 0 ? packet.exit_code : kExitInternal);
  return packet.value;
}

/// One look at an operation being waited for.
enum class PollResult { Done, Pending };

/**
 * @brief Calls poll() until it answers Done (poll() throws for an error it sees, e.g. a
 * NCCL asynchronous error), sleeping `interval_us` between looks. After `timeout_s`
 * seconds calls on_timeout() (e.g. ncclCommAbort) and throws Error naming `what`,
 * the limit and `limit_name` (the setting that raises it).
 */
void poll_with_timeout(const std::function<PollResult()>& poll, double timeout_s, const std::string& what,
                       const std::string& limit_name, const std::function<void()>& on_timeout = {},
                       int interval_us = 200);

/// Seconds a NCCL start or blocking all-reduce may take before the job is ended:
/// MPX_NCCL_TIMEOUT_S (default 300, 1..86400; docs/environment.md).
double nccl_timeout_seconds();

}  // namespace mpx
