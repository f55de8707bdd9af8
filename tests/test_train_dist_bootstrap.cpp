// SPDX-License-Identifier: MIT
// The NCCL start's helpers that need no GPU (dist/bootstrap.h): the root's status
// travels with the value it broadcasts, so a failure there ends every rank instead of
// leaving the others waiting; the polled wait ends with an error at its time limit.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "core/error.h"
#include "dist/bootstrap.h"

using namespace mpx;

namespace {

struct Id {
  unsigned char bytes[128];
};

/// Rank `me` of a two-rank job whose broadcast copies in what rank 0 sent (`wire`), recorded
/// by a fake rank 0 that ran first.
class FakeComm final : public Communicator {
 public:
  FakeComm(int me, std::vector<unsigned char>* wire) : me_(me), wire_(wire) {}
  std::string kind() const override { return "fake"; }
  int rank() const override { return me_; }
  int world_size() const override { return 2; }
  int local_rank() const override { return me_; }
  void all_reduce_sum(float*, size_t) override {}
  void all_reduce_sum(double*, size_t) override {}
  void broadcast(void* data, size_t bytes, int root) override {
    ++broadcasts;
    REQUIRE(root == 0);
    if (me_ == 0) {
      wire_->assign(static_cast<unsigned char*>(data), static_cast<unsigned char*>(data) + bytes);
    } else {
      REQUIRE(wire_->size() == bytes);
      std::memcpy(data, wire_->data(), bytes);
    }
  }
  void barrier() override {}
  [[noreturn]] void abort(int) override { std::abort(); }
  int broadcasts = 0;

 private:
  int me_;
  std::vector<unsigned char>* wire_;
};

Id make_id() {
  Id id{};
  for (int i = 0; i < 128; ++i) id.bytes[i] = static_cast<unsigned char>(i * 7 + 1);
  return id;
}

}  // namespace

TEST_CASE("broadcast_with_status: the value reaches the other rank", "[bootstrap]") {
  std::vector<unsigned char> wire;
  FakeComm r0(0, &wire), r1(1, &wire);
  const Id a = broadcast_with_status<Id>(r0, 0, "start", make_id);
  const Id b = broadcast_with_status<Id>(r1, 0, "start", [] () -> Id { throw std::logic_error("only the root makes it"); });
  CHECK(std::memcmp(a.bytes, make_id().bytes, 128) == 0);
  CHECK(std::memcmp(b.bytes, make_id().bytes, 128) == 0);
  CHECK(r0.broadcasts == 1);
  CHECK(r1.broadcasts == 1);
}

TEST_CASE("broadcast_with_status: a failure on the root ends both ranks with its message", "[bootstrap]") {
  std::vector<unsigned char> wire;
  FakeComm r0(0, &wire), r1(1, &wire);
  auto fail = []() -> Id { throw CudaError("NCCL: ncclGetUniqueId: unhandled system error"); };
  CHECK_THROWS_AS(broadcast_with_status<Id>(r0, 0, "NCCL start (ncclGetUniqueId)", fail), CudaError);
  CHECK(r0.broadcasts == 1);  // the root still sent its status: the other rank is not left waiting
  try {
    broadcast_with_status<Id>(r1, 0, "NCCL start (ncclGetUniqueId)", make_id);
    FAIL("rank 1 did not throw");
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK(m.find("NCCL start (ncclGetUniqueId): rank 0 failed") != std::string::npos);
    CHECK(m.find("unhandled system error") != std::string::npos);
    CHECK(e.exit_code() == CudaError("x").exit_code());
  }
}

TEST_CASE("poll_with_timeout: returns once done, passes errors through, ends at its limit", "[bootstrap]") {
  int looks = 0;
  poll_with_timeout([&] { return ++looks < 4 ? PollResult::Pending : PollResult::Done; }, 10.0, "x", "LIMIT");
  CHECK(looks == 4);

  CHECK_THROWS_WITH(poll_with_timeout([]() -> PollResult { throw Error("NCCL: remote process exited"); }, 10.0, "x",
                                      "LIMIT"),
                    "NCCL: remote process exited");

  bool aborted = false;
  CHECK_THROWS_WITH(
      poll_with_timeout([] { return PollResult::Pending; }, 0.05, "the NCCL all-reduce of 10 floats",
                        "MPX_NCCL_TIMEOUT_S", [&] { aborted = true; }),
      Catch::Contains("the NCCL all-reduce of 10 floats did not finish within 0.05 s") &&
          Catch::Contains("MPX_NCCL_TIMEOUT_S"));
  CHECK(aborted);
}

TEST_CASE("nccl_timeout_seconds: default and a bad value", "[bootstrap]") {
  unsetenv("MPX_NCCL_TIMEOUT_S");
  CHECK(nccl_timeout_seconds() == 300.0);
  setenv("MPX_NCCL_TIMEOUT_S", "20", 1);
  CHECK(nccl_timeout_seconds() == 20.0);
  setenv("MPX_NCCL_TIMEOUT_S", "soon", 1);
  CHECK_THROWS_AS(nccl_timeout_seconds(), ConfigError);
  unsetenv("MPX_NCCL_TIMEOUT_S");
}
