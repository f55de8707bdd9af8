// SPDX-License-Identifier: MIT
// `mpx eval` of a checkpoint or weights file (eval.h).
#include "commands/eval.h"

#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "train/run_log.h"
#include "train/session.h"

namespace mpx {

namespace {

EvalResult evaluate_from(const Config& cfg, const std::string& weights, const std::string& checkpoint, bool show) {
  Session s(cfg);
  s.start_backend();
  s.load_data(DataNeed::Test);
  const int64_t B = std::max<int64_t>(1, cfg.data.batch_size);
  std::unique_ptr<Model> model = s.make_model(B);
  s.init_weights(*model, weights, checkpoint);
  BatchBuffers bb(s.backend(), B, s.H(), s.W(), s.C(), s.num_classes());
  Progress line(show);
  const auto t0 = Clock::now();
  return evaluate_model(
      s.backend(), *model, bb, s.test_data(), nullptr,
      [&](int64_t done, int64_t total) {
        if (!line.on()) return;  // no formatting without a terminal
        const double secs = seconds_since(t0);
        const double rate = secs > 0 ? static_cast<double>(done) / secs : 0.0;
        line.show(fmt::format("eval {}/{} records, {:.0f} img/s", done, total, rate));
      },
      cfg.train.tta);
}

}  // namespace

EvalResult evaluate_checkpoint(const Config& cfg, const std::string& checkpoint, bool progress) {
  return evaluate_from(cfg, "", checkpoint, progress);
}

EvalResult evaluate_weights(const Config& cfg, const std::string& weights, bool progress) {
  return evaluate_from(cfg, weights, "", progress);
}

}  // namespace mpx
