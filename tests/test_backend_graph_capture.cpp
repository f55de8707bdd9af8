// SPDX-License-Identifier: MIT
// GraphCapture (backend/graph_capture.h): a capture that an exception leaves is ended
// by the guard, a capture ended normally is not aborted, and a backend without graphs
// opens none. On a recording fake; the CUDA twin is "[graph]" in tests/cuda.
#include <catch2/catch.hpp>

#include <stdexcept>

#include "backend/graph_capture.h"

namespace {

struct FakeGraphs {
  bool can_capture = true;
  bool capturing = false;
  int begun = 0, ended = 0, aborted = 0;
  bool graph_begin_capture() {
    if (!can_capture) return false;
    capturing = true;
    ++begun;
    return true;
  }
  int graph_end_capture() {
    capturing = false;
    return ended++;
  }
  void graph_abort_capture() noexcept {
    capturing = false;
    ++aborted;
  }
};

using Capture = mpx::BasicGraphCapture<FakeGraphs>;

}  // namespace

TEST_CASE("GraphCapture ends the capture when an op throws inside it", "[graph_capture]") {
  FakeGraphs fake;
  try {
    Capture c(fake);
    REQUIRE(c.open());
    REQUIRE(fake.capturing);
    throw std::runtime_error("cuDNN: CUDNN_STATUS_EXECUTION_FAILED");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "cuDNN: CUDNN_STATUS_EXECUTION_FAILED");  // the original error survives
  }
  CHECK_FALSE(fake.capturing);
  CHECK(fake.begun == 1);
  CHECK(fake.aborted == 1);
  CHECK(fake.ended == 0);
}

TEST_CASE("GraphCapture::end keeps the graph and aborts nothing", "[graph_capture]") {
  FakeGraphs fake;
  int id = -1;
  {
    Capture c(fake);
    REQUIRE(c.open());
    id = c.end();
    CHECK_FALSE(c.open());
    CHECK_THROWS_WITH(c.end(), Catch::Contains("no capture is open"));
  }
  CHECK(id == 0);
  CHECK(fake.ended == 1);
  CHECK(fake.aborted == 0);
}

TEST_CASE("GraphCapture opens nothing where the backend has no graphs", "[graph_capture]") {
  FakeGraphs fake;
  fake.can_capture = false;
  {
    Capture c(fake);
    CHECK_FALSE(c.open());
  }
  CHECK(fake.begun == 0);
  CHECK(fake.aborted == 0);
}

TEST_CASE("GraphCapture on the CPU backend is never open", "[graph_capture]") {
  auto be = mpx::create_backend("cpu");
  mpx::GraphCapture c(*be);
  CHECK_FALSE(c.open());
}
