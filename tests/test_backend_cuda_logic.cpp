// SPDX-License-Identifier: MIT
// The CUDA backend's decisions that need no GPU, checked on the CPU (docs/gpu.md): the
// shape cuDNN sees (16-bit channel padding, asymmetric spatial padding), which of cuDNN's
// ranked algorithms are usable, the process-wide algorithm cache and its key, the
// cuBLASLt candidate loop, which activations a cuBLASLt epilogue may fuse (the NaN
// contract), and the library-version formatting and warning.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/algo_choice.h"
#include "backend/cuda/conv_geometry.h"
#include "backend/cuda/epilogue_rule.h"
#include "backend/cuda/first_that_runs.h"
#include "backend/versions.h"
#include "core/activation.h"
#include "core/dtype.h"

using namespace mpx;
using namespace mpx::cuda;

TEST_CASE("conv geometry: 16-bit channels padded to a multiple of 8, float32 never", "[cuda-logic][conv]") {
  Conv2dParams p;
  p.R = p.S = 3;
  p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 1;
  for (int64_t C : {1, 3, 7}) {
    const ConvGeo g = conv_geometry(p, Shape{4, 28, 28, C}, Shape{32, 3, 3, C}, DType::BF16);
    CHECK(g.Cp == 8);
    CHECK(g.C == C);
    CHECK(g.channels_padded());
    CHECK(g.padded);  // the input goes through the padded buffer
    CHECK(g.Hp == 28);
    CHECK(g.Wp == 28);
    CHECK(g.P == 28);
    CHECK(g.Q == 28);
  }
  CHECK(conv_geometry(p, Shape{4, 8, 8, 3}, Shape{8, 3, 3, 3}, DType::F16).Cp == 8);
  CHECK(conv_geometry(p, Shape{4, 8, 8, 12}, Shape{8, 3, 3, 12}, DType::F16).Cp == 16);
  const ConvGeo g8 = conv_geometry(p, Shape{4, 8, 8, 16}, Shape{8, 3, 3, 16}, DType::BF16);
  CHECK(g8.Cp == 16);
  CHECK_FALSE(g8.padded);  // symmetric "same" padding, channels a multiple of 8: x as it is
  const ConvGeo g32 = conv_geometry(p, Shape{4, 8, 8, 3}, Shape{8, 3, 3, 3}, DType::F32);
  CHECK(g32.Cp == 3);
  CHECK_FALSE(g32.padded);
}

TEST_CASE("conv geometry: asymmetric 'same' padding is the smaller pad plus an explicit offset", "[cuda-logic][conv]") {
  Conv2dParams p;  // Keras "same", kernel 2, stride 2 on 7x7: total pad 1, top 0, bottom 1
  p.R = p.S = 2;
  p.stride_h = p.stride_w = 2;
  p.pad_top = p.pad_left = 0;
  p.pad_bottom = p.pad_right = 1;
  const ConvGeo g = conv_geometry(p, Shape{2, 7, 7, 3}, Shape{4, 2, 2, 3}, DType::F16);
  CHECK(g.ph == 0);
  CHECK(g.pw == 0);
  CHECK(g.top == 0);
  CHECK(g.left == 0);
  CHECK(g.Hp == 8);
  CHECK(g.Wp == 8);
  CHECK(g.P == 4);
  CHECK(g.Q == 4);
  CHECK(g.Cp == 8);
  // cuDNN's output of the padded input with its symmetric pads is the layer's output
  CHECK((g.Hp + 2 * g.ph - g.R) / g.sh + 1 == g.P);
  CHECK((g.Wp + 2 * g.pw - g.S) / g.sw + 1 == g.Q);
}

namespace {

AlgoCandidate cand(int algo, bool ok, size_t mem, bool det, bool tensor_op) {
  AlgoCandidate c;
  c.algo = algo;
  c.ok = ok;
  c.memory = mem;
  c.deterministic = det;
  c.tensor_op = tensor_op;
  c.math = tensor_op ? 1 : 3;
  return c;
}

std::vector<int> algos(const std::vector<AlgoCandidate>& v) {
  std::vector<int> out;
  for (const auto& c : v) out.push_back(c.algo);
  return out;
}

}  // namespace

TEST_CASE("usable candidates: cuDNN's order kept; failures, over-budget, TF32 and (when asked) nondeterminism dropped",
          "[cuda-logic][conv]") {
  const std::vector<AlgoCandidate> ranked{cand(6, true, 100, false, true),   // fastest, nondeterministic
                                          cand(1, false, 0, true, true),     // failed
                                          cand(7, true, 1 << 30, true, true),  // over budget
                                          cand(0, true, 0, true, false),
                                          cand(2, true, 64, true, true)};
  CHECK(algos(usable_candidates(ranked, false, 1 << 20, false)) == std::vector<int>{6, 0, 2});
  CHECK(algos(usable_candidates(ranked, false, 1 << 20, true)) == std::vector<int>{0, 2});
  CHECK(algos(usable_candidates(ranked, true, 1 << 20, false)) == std::vector<int>{0});  // no TF32 for float32
  CHECK(algos(usable_candidates(ranked, false, size_t{2} << 30, true)) == std::vector<int>{7, 0, 2});
  CHECK(usable_candidates(ranked, false, 0, true).size() == 1);  // only the zero-workspace one
  CHECK(usable_candidates({}, false, 1 << 20, false).empty());
}

TEST_CASE("algo cache: one choice per key for the whole process, settings are part of the key",
          "[cuda-logic][conv]") {
  AlgoCache cache;
  const int64_t op[] = {101, 1, 32, 28, 28, 8, 16, 3, 3};
  AlgoSettings heuristic{false, false, size_t{512} << 20};
  AlgoSettings det = heuristic;
  det.deterministic = true;
  AlgoSettings search = heuristic;
  search.search = true;
  int calls = 0;
  auto make = [&](int algo) {
    return [&calls, algo] {
      ++calls;
      return AlgoChoice{algo, 1, 4096, false};
    };
  };
  bool made = false;
  CHECK(cache.get(algo_key(0, op, 9, heuristic), make(6), &made).algo == 6);
  CHECK(made);
  // the same key again (another backend of the process): the first choice, make() not called
  CHECK(cache.get(algo_key(0, op, 9, heuristic), make(1), &made).algo == 6);
  CHECK_FALSE(made);
  CHECK(calls == 1);
  CHECK(cache.get(algo_key(0, op, 9, det), make(1)).algo == 1);
  CHECK(cache.get(algo_key(0, op, 9, search), make(2)).algo == 2);
  CHECK(cache.get(algo_key(1, op, 9, heuristic), make(3)).algo == 3);  // another device
  const int64_t other[] = {101, 1, 32, 28, 28, 8, 16, 3, 5};
  CHECK(cache.get(algo_key(0, other, 9, heuristic), make(4)).algo == 4);
  CHECK(cache.size() == 5);
  CHECK(calls == 5);
  // a make() that throws caches nothing
  const int64_t bad[] = {999};
  CHECK_THROWS(cache.get(algo_key(0, bad, 1, heuristic), [&]() -> AlgoChoice { throw std::runtime_error("x"); }));
  CHECK(cache.size() == 5);
  CHECK(cache.get(algo_key(0, bad, 1, heuristic), make(9)).algo == 9);
  // AlgoCache::process() is one object
  CHECK(&AlgoCache::process() == &AlgoCache::process());
}

TEST_CASE("algo cache: concurrent lookups of one key make it once", "[cuda-logic][conv]") {
  AlgoCache cache;
  const int64_t op[] = {102, 2};
  std::atomic<int> calls{0};
  std::vector<std::thread> ts;
  std::vector<int> got(8, -1);
  for (int i = 0; i < 8; ++i)
    ts.emplace_back([&, i] {
      got[static_cast<size_t>(i)] = cache.get(algo_key(0, op, 2, AlgoSettings{}), [&] {
                                             ++calls;
                                             return AlgoChoice{i + 10, 0, 0, true};
                                           }).algo;
    });
  for (auto& t : ts) t.join();
  CHECK(calls == 1);
  for (int a : got) CHECK(a == got[0]);
}

TEST_CASE("cuBLASLt candidate loop: the first that runs is kept; the shape is named only when none runs",
          "[cuda-logic][dense]") {
  const std::vector<int> cands{11, 22, 33};
  std::vector<std::string> failures;
  std::vector<int> tried;
  auto i = first_that_runs(cands, [&](int c) {
    tried.push_back(c);
    return c == 22 || c == 33 ? std::string() : "CUBLAS_STATUS_NOT_SUPPORTED";
  }, failures);
  REQUIRE(i.has_value());
  CHECK(*i == 1);
  CHECK(tried == std::vector<int>{11, 22});  // stops at the first that runs
  CHECK(failures == std::vector<std::string>{"CUBLAS_STATUS_NOT_SUPPORTED"});

  failures.clear();
  i = first_that_runs(cands, [](int c) { return "status " + std::to_string(c); }, failures);
  CHECK_FALSE(i.has_value());
  const std::string what = "cuBLASLt: no algorithm for matmul (bfloat16 -> float32, m=10, n=256, k=84)";
  CHECK(none_ran_message(what, failures) ==
        what + ": none of the 3 algorithms the heuristic offered ran (1: status 11; 2: status 22; 3: status 33)");
  failures.clear();
  CHECK_FALSE(first_that_runs(std::vector<int>{}, [](int) { return std::string(); }, failures).has_value());
  CHECK(none_ran_message(what, failures) == what + ": the heuristic offered no algorithm");
}

TEST_CASE("cuBLASLt epilogue fallback: any failure with the epilogue retries the plain product",
          "[cuda-logic][dense]") {
  int plan_storage = 0;
  std::vector<bool> tried;
  // The heuristic fails outright with the epilogue (a status other than NOT_SUPPORTED, which
  // once threw before the fallback); the plain product then plans.
  bool fused = true;
  auto a = epilogue_or_plain<int>(true, [&](bool with) {
    tried.push_back(with);
    PlanAttempt<int> r;
    if (with) r.heuristic_error = "cublasLtMatmulAlgoGetHeuristic: CUBLAS_STATUS_INVALID_VALUE";
    else r.plan = &plan_storage;
    return r;
  }, fused);
  CHECK(tried == std::vector<bool>{true, false});
  CHECK(a.plan == &plan_storage);
  CHECK_FALSE(fused);

  // Candidates offered with the epilogue but none ran: the same retry.
  tried.clear();
  a = epilogue_or_plain<int>(true, [&](bool with) {
    tried.push_back(with);
    PlanAttempt<int> r;
    if (with) r.failures = {"cublasLtMatmul: CUBLAS_STATUS_EXECUTION_FAILED"};
    else r.plan = &plan_storage;
    return r;
  }, fused);
  CHECK(tried == std::vector<bool>{true, false});
  CHECK_FALSE(fused);

  // The epilogue plans: no second attempt, fused.
  tried.clear();
  a = epilogue_or_plain<int>(true, [&](bool with) {
    tried.push_back(with);
    PlanAttempt<int> r;
    r.plan = &plan_storage;
    return r;
  }, fused);
  CHECK(tried == std::vector<bool>{true});
  CHECK(fused);

  // No epilogue wanted: one attempt; when it fails, the refusal names the heuristic's status.
  tried.clear();
  a = epilogue_or_plain<int>(false, [&](bool with) {
    tried.push_back(with);
    PlanAttempt<int> r;
    r.heuristic_error = "cublasLtMatmulAlgoGetHeuristic: CUBLAS_STATUS_INVALID_VALUE";
    return r;
  }, fused);
  CHECK(tried == std::vector<bool>{false});
  CHECK(a.plan == nullptr);
  CHECK(none_ran_message("cuBLASLt: no algorithm for matmul", a.failures, a.heuristic_error) ==
        "cuBLASLt: no algorithm for matmul: the heuristic failed (cublasLtMatmulAlgoGetHeuristic: "
        "CUBLAS_STATUS_INVALID_VALUE)");
}

TEST_CASE("cuBLASLt epilogues: relu is never fused (max(NaN, 0) = 0), the relu kernel keeps NaN",
          "[cuda-logic][dense][nan]") {
  CHECK_FALSE(cublaslt_fuses_activation(ActKind::Relu));
  CHECK(cublaslt_fuses_activation(ActKind::GeluTanh));
  CHECK_FALSE(cublaslt_fuses_activation(ActKind::Gelu));  // cuBLASLt's GELU is the tanh form
  CHECK_FALSE(cublaslt_fuses_activation(ActKind::Silu));
  CHECK_FALSE(cublaslt_fuses_activation(ActKind::LeakyRelu));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // What the kernel after the matmul computes (core/activation.h, shared with the device code)
  CHECK(std::isnan(activation_value(Activation::Relu, nan)));
  CHECK(std::isnan(activation_value(Activation{ActKind::GeluTanh, 0.0f}, nan)));
  CHECK(activation_value(Activation::Relu, -1.0f) == 0.0f);
}

TEST_CASE("library versions: formatting and the warning for an older loaded cuDNN", "[cuda-logic][versions]") {
  CHECK(format_cudnn_version(91900) == "9.19.0");
  CHECK(format_cudnn_version(90102) == "9.1.2");
  CHECK(format_cudnn_version(8906) == "8.9.6");  // cuDNN 8's encoding
  CHECK(format_cudnn_version(0) == "unknown");
  CHECK(format_library_version(130100) == "13.1.0");
  CHECK(format_library_version(22803) == "2.28.3");  // NCCL_VERSION_CODE
  CHECK(format_cuda_version(13000) == "13.0");
  CHECK(format_cuda_version(12090) == "12.9");
  CHECK(format_cuda_version(0) == "none");

  CHECK(cudnn_version_warning(91900, 91900).empty());
  CHECK(cudnn_version_warning(91900, 92000).empty());  // newer is fine
  CHECK(cudnn_version_warning(91900, 0).empty());      // not loaded: nothing to compare
  const std::string w = cudnn_version_warning(91900, 90100);
  CHECK(w.find("cuDNN 9.1.0 is loaded, older than the cuDNN 9.19.0 mpx was built against") == 0);
  CHECK(w.find("LD_LIBRARY_PATH") != std::string::npos);
  CHECK(!cudnn_version_warning(90100, 8906).empty());  // cuDNN 8 under a cuDNN 9 build

  CudaLibraryVersions v;
  v.driver = 13000, v.runtime = 13000, v.runtime_built = 13000;
  v.cudnn = 91900, v.cudnn_built = 91900, v.cublaslt = 130100, v.cublaslt_built = 130100;
  CHECK(describe_versions(v) ==
        "CUDA driver 13.0, runtime 13.0 (built with 13.0), cuDNN 9.19.0 (built with 9.19.0), cuBLASLt 13.1.0 "
        "(built with 13.1.0), NCCL not built in");
  v.nccl = 22803, v.nccl_built = 22803;
  CHECK(describe_versions(v).find("NCCL 2.28.3 (built with 2.28.3)") != std::string::npos);
}

TEST_CASE("supports_conv2d: the default answers from supports(Conv2d, dtype), with a reason when not",
          "[cuda-logic][conv]") {
  auto cpu = create_backend("cpu");
  Conv2dParams p;
  p.R = p.S = 3;
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    const Support s = cpu->supports_conv2d(p, Shape{4, 8, 8, 3}, Shape{8, 3, 3, 3}, t);
    CHECK(s.ok);
    CHECK(s.reason.empty());
  }
  const Support no = cpu->supports_conv2d(p, Shape{4, 8, 8, 3}, Shape{8, 3, 3, 3}, DType::I32);
  CHECK_FALSE(no.ok);
  CHECK(no.reason == "conv2d has no int32 kernels on cpu");
}
