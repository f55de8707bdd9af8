// SPDX-License-Identifier: MIT
// TensorBoard event files of `mpx train` (docs/report.md): read back with the
// tests' own reader (both CRCs of every record checked), every metrics.jsonl
// record is there as scalars with its step and the same float32 values, under
// Keras' tags; a resumed run adds a file whose steps continue; the config key
// turns the files off.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>

#include "config/config.h"
#include "io/event_file.h"
#include "support/event_reader.h"
#include "support/run_files.h"
#include "support/train_options.h"
#include "train/trainer.h"

using namespace mpx;
using nlohmann::json;
using support::options;
using support::TbEvent;
namespace fs = std::filesystem;

namespace {

// mixed_float16 with a loss scale far too large: the first steps overflow and are skipped.
const char* kYaml = R"(name: tb
seed: 5
device: cpu
policy: mixed_float16
loss_scale: {mode: dynamic, initial: 2.68435456e+8, growth_interval: 4}
data: {dataset: synthetic, batch_size: 8, synthetic_train: 64, synthetic_test: 16}
optimizer: {name: adam, learning_rate: 1.0e-3}
schedule: {name: cosine}
train: {epochs: 2, log_every: 3}
model:
  layers:
    - {type: conv2d, filters: 4, kernel: 3, activation: relu}
    - {type: flatten}
    - {type: dense, units: 10, activation: softmax, dtype: float32}
)";

/// The scalar events of a run's train/ or validation/ folder, file after file in the order
/// they were written (the version event of each file dropped after checking it).
std::vector<TbEvent> scalar_events(const fs::path& dir, size_t* files = nullptr) {
  std::vector<std::vector<TbEvent>> per_file;
  for (const auto& f : support::event_files(dir)) {
    auto ev = support::read_event_file(f);
    REQUIRE(!ev.empty());
    CHECK(ev[0].file_version == "brain.Event:2");
    CHECK(ev[0].values.empty());
    per_file.push_back(std::move(ev));
  }
  std::sort(per_file.begin(), per_file.end(),
            [](const auto& a, const auto& b) { return a[0].wall_time < b[0].wall_time; });
  if (files) *files = per_file.size();
  std::vector<TbEvent> out;
  for (const auto& ev : per_file) out.insert(out.end(), ev.begin() + 1, ev.end());
  return out;
}

/// metrics.jsonl's number as the event file must hold it: float32, NaN for null.
float as_float(const json& rec, const char* key) {
  const json& v = rec.at(key);
  return v.is_null() ? std::nanf("") : static_cast<float>(v.get<double>());
}

void check_value(const TbEvent& e, const std::string& tag, float want) {
  const float got = e.get(tag);
  INFO(tag << " at step " << e.step << ": " << got << " vs " << want);
  if (std::isnan(want)) CHECK(std::isnan(got));
  else CHECK(got == want);
}

/// Every record of metrics.jsonl against the events, one to one and in order.
void check_against_metrics(const fs::path& run) {
  const auto records = support::read_jsonl(run / "metrics.jsonl");
  const auto train = scalar_events(run / "tensorboard" / "train");
  const auto val = scalar_events(run / "tensorboard" / "validation");
  size_t t = 0, v = 0;
  for (const auto& rec : records) {
    const std::string kind = rec.at("kind");
    REQUIRE(t < train.size());
    const TbEvent& e = train[t++];
    if (kind == "step") {
      CHECK(e.step == rec.at("step").get<int64_t>());
      CHECK(e.values.size() == 7);
      check_value(e, "batch_loss", as_float(rec, "loss"));
      check_value(e, "batch_accuracy", as_float(rec, "accuracy"));
      check_value(e, "batch_learning_rate", as_float(rec, "learning_rate"));
      check_value(e, "batch_loss_scale", as_float(rec, "loss_scale"));
      check_value(e, "batch_skipped_steps", as_float(rec, "skipped_steps"));
      check_value(e, "batch_images_per_sec", as_float(rec, "images_per_sec"));
      check_value(e, "batch_memory_bytes", as_float(rec, "memory_bytes"));
      continue;
    }
    REQUIRE(kind == "epoch");
    const int64_t epoch_index = rec.at("epoch").get<int64_t>() - 1;
    CHECK(e.step == epoch_index);
    CHECK(e.values.size() == 6);
    check_value(e, "epoch_loss", as_float(rec, "train_loss"));
    check_value(e, "epoch_accuracy", as_float(rec, "train_accuracy"));
    check_value(e, "epoch_learning_rate", as_float(rec, "learning_rate"));
    check_value(e, "epoch_loss_scale", as_float(rec, "loss_scale"));
    check_value(e, "epoch_skipped_steps", as_float(rec, "skipped_steps"));
    check_value(e, "epoch_images_per_sec", as_float(rec, "images_per_sec"));
    REQUIRE(!rec.at("test_accuracy").is_null());  // eval_every 1
    REQUIRE(v + 2 <= val.size());
    const TbEvent& ve = val[v++];
    CHECK(ve.step == epoch_index);
    check_value(ve, "epoch_loss", as_float(rec, "test_loss"));
    check_value(ve, "epoch_accuracy", as_float(rec, "test_accuracy"));
    const TbEvent& vi = val[v++];
    CHECK(vi.step == rec.at("step").get<int64_t>());
    check_value(vi, "evaluation_loss_vs_iterations", as_float(rec, "test_loss"));
    check_value(vi, "evaluation_accuracy_vs_iterations", as_float(rec, "test_accuracy"));
  }
  CHECK(t == train.size());  // nothing more than the records
  CHECK(v == val.size());
}

}  // namespace

TEST_CASE("tensorboard: CRC-32C of the RFC 3720 test vectors, product and test reader alike", "[train][tensorboard]") {
  const std::string digits = "123456789", zeros(32, '\0'), ones(32, '\xff');
  CHECK(crc32c(digits.data(), digits.size()) == 0xE3069283u);
  CHECK(crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);
  CHECK(crc32c(ones.data(), ones.size()) == 0x62A8AB43u);
  CHECK(support::bitwise_crc32c(digits) == 0xE3069283u);
  CHECK(support::bitwise_crc32c(zeros) == 0x8A9136AAu);
  // A framed record decodes to what was encoded.
  const std::string ev = encode_scalar_event(1.5e9, 1234567, {{"a/b", 0.25f}, {"c", -3.0f}});
  const TbEvent e = support::decode_event(ev);
  CHECK(e.wall_time == 1.5e9);
  CHECK(e.step == 1234567);
  CHECK(e.get("a/b") == 0.25f);
  CHECK(e.get("c") == -3.0f);
  const std::string rec = frame_record(ev);
  CHECK(rec.size() == ev.size() + 16);
}

TEST_CASE("tensorboard: every metrics record as Keras-named scalars; a resumed run continues the steps",
          "[train][tensorboard]") {
  const fs::path d = support::temp_dir("mpx_test_tb", "run");
  const fs::path run = d / "run";
  const Config cfg = parse_config(kYaml, "tb.yaml");
  const TrainResult a = train(cfg, options(run));
  REQUIRE(a.status == "completed");
  REQUIRE(a.skipped_steps > 0);  // the loss-scale curve has something to show
  check_against_metrics(run);

  // Resume for two more epochs into the same folder: a second file per folder, steps continuing.
  const Config more = parse_config(kYaml, "tb.yaml", {"train.epochs=4"});
  const TrainResult b = train(more, options(run, run.string()));
  REQUIRE(b.status == "completed");
  size_t files = 0;
  const auto train_events = scalar_events(run / "tensorboard" / "train", &files);
  CHECK(files == 2);
  int64_t last_batch_step = 0;
  for (const auto& e : train_events)
    if (e.values.front().tag == "batch_loss") {
      CHECK(e.step > last_batch_step);  // strictly increasing across both files
      last_batch_step = e.step;
    }
  CHECK(last_batch_step == b.steps - b.steps % 3);
  check_against_metrics(run);
}

TEST_CASE("tensorboard: train.tensorboard false writes no event files", "[train][tensorboard]") {
  const fs::path d = support::temp_dir("mpx_test_tb", "off");
  const Config cfg = parse_config(kYaml, "tb.yaml", {"train.tensorboard=false", "train.epochs=1"});
  REQUIRE(train(cfg, options(d / "run")).status == "completed");
  CHECK(fs::exists(d / "run" / "metrics.jsonl"));
  CHECK(!fs::exists(d / "run" / "tensorboard"));
}
