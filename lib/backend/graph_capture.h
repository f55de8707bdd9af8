// SPDX-License-Identifier: MIT
// GraphCapture: the scope of one CUDA graph capture (docs/gpu.md "CUDA graphs").
// An error thrown while ops are being captured (a cuDNN, cuBLASLt or launch
// failure, a refused allocation) would otherwise leave the stream capturing, and
// every later op would fail with a misleading "not allowed while capturing"; the
// guard's destructor ends such a capture, drops its partial graph and clears the
// error state, so the exception that caused it is the one reported.
#pragma once

#include "backend/backend.h"
#include "core/error.h"

namespace mpx {

/// The guard over any backend-like `B` with graph_begin_capture() -> bool,
/// graph_end_capture() -> int and graph_abort_capture() noexcept (a template so the
/// logic is testable without a GPU; use GraphCapture).
template <typename B>
class BasicGraphCapture {
 public:
  /// Begins a capture where `be` can capture graphs; open() says whether it did.
  explicit BasicGraphCapture(B& be) : be_(be), open_(be.graph_begin_capture()) {}
  /// Abandons a capture still open (an exception is unwinding, or end() was never called).
  ~BasicGraphCapture() {
    if (open_) be_.graph_abort_capture();
  }
  BasicGraphCapture(const BasicGraphCapture&) = delete;
  BasicGraphCapture& operator=(const BasicGraphCapture&) = delete;

  bool open() const { return open_; }
  /// Ends the capture and returns the graph's id (Backend::graph_launch). The capture is
  /// closed even when this throws.
  int end() {
    MPX_CHECK_MSG(open_, "GraphCapture::end: no capture is open");
    open_ = false;
    return be_.graph_end_capture();
  }

 private:
  B& be_;
  bool open_;
};

using GraphCapture = BasicGraphCapture<Backend>;

}  // namespace mpx
