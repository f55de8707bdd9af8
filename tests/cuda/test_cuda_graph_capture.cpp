// SPDX-License-Identifier: MIT
// GraphCapture on the GPU (backend/graph_capture.h, docs/gpu.md "CUDA graphs"): an
// error thrown while ops are captured leaves no capture open behind it; the stream
// runs ops, and captures again, afterwards.
#include <catch2/catch.hpp>

#include <vector>

#include "backend/graph_capture.h"
#include "core/error.h"
#include "cuda/cuda_compare.h"
#include "support/skip.h"

using namespace cudatest;

TEST_CASE("cuda: GraphCapture ends a capture that an op's error left open, and the stream works afterwards",
          "[cuda][graph]") {
  Backend& g = *be().gpu;
  if (!g.supports_graphs()) MPX_SKIP("this build has no CUDA graphs (MPX_CUDA_SYNC_DEBUG)");
  Buffer b = g.alloc(sizeof(float) * 1024, "guarded capture");
  const Tensor t = b.view(DType::F32, Shape{1024});
  const Tensor half(b.data(), DType::F32, Shape{512});
  {
    GraphCapture capture(g);
    REQUIRE(capture.open());
    g.fill(t, 1.0f);  // captured
    // The shape check throws before the op reaches the stream: the capture is still open here.
    CHECK_THROWS_AS(g.add(t, half, t), Error);
  }  // the guard ends the capture
  CHECK_THROWS_WITH(g.graph_end_capture(), Catch::Contains("without a capture in progress"));
  g.fill(t, 3.0f);
  std::vector<float> back(1024);
  g.download(back.data(), t);
  CHECK(back == std::vector<float>(1024, 3.0f));
  // A new capture after the abandoned one works and replays.
  int id = -1;
  {
    GraphCapture capture(g);
    REQUIRE(capture.open());
    g.fill(t, 5.0f);
    id = capture.end();
  }
  g.fill(t, 0.0f);
  g.graph_launch(id);
  g.download(back.data(), t);
  CHECK(back == std::vector<float>(1024, 5.0f));
}
