// SPDX-License-Identifier: MIT
// What a sweep script relies on, through the binary: --resume continues the run
// as it was configured (its own config.yaml; a different config is refused
// naming the keys unless --allow-changes), a finite blow-up of the loss ends as
// diverged (exit 4), and a run directory evaluates from any folder (paths in
// config.yaml are absolute; relative ones in a config file follow the file);
// mpx eval --json and summary.json give per-class accuracy and the confusion
// matrix, checked against one computed from mpx inspect's logits, and the HTML
// report draws it.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <vector>
#include <string>

#include "config/config.h"
#include "data/dataset.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "support/cli.h"
#include "support/html_scan.h"
#include "support/skip.h"

namespace fs = std::filesystem;
using nlohmann::json;
using support::read_file;
using support::run_mpx;
using support::TempDir;
using support::write_file;

namespace {

const char* kYaml =
    "name: runs\n"
    "device: cpu\n"
    "data: {dataset: synthetic, batch_size: 8, synthetic_train: 32, synthetic_test: 16}\n"
    "model:\n"
    "  layers:\n"
    "    - {type: flatten}\n"
    "    - {type: dense, units: 16, activation: relu}\n"
    "    - {type: dense, units: 10, activation: softmax}\n"
    "schedule: {name: cosine}\n"
    "train: {epochs: 1, log_every: 2}\n";

json summary(const fs::path& run) {
  INFO("reading " << run / "summary.json");
  REQUIRE(fs::exists(run / "summary.json"));
  return json::parse(read_file(run / "summary.json"));
}

}  // namespace

TEST_CASE("cli runs: --resume uses the run's own config; other values are refused naming the keys",
          "[cli][resume]") {
  TempDir t;
  write_file(t.path / "c.yaml", kYaml);
  REQUIRE(run_mpx("train --no-progress --config c.yaml --run-dir run", t.path).code == 0);

  // More epochs would change the cosine schedule's curve: refused, the key and both values named.
  const auto more = run_mpx("train --no-progress --resume run --set train.epochs=3", t.path);
  CHECK(more.code == 2);
  CHECK(more.err.find("the config differs from the run's own run/config.yaml in train.epochs (1 in the run, 3 "
                      "now)") != std::string::npos);
  CHECK(more.err.find("--allow-changes train.epochs") != std::string::npos);

  // --config beside --resume: a result-neutral change (log cadence) passes, others are listed.
  write_file(t.path / "other.yaml", std::string(kYaml) + "optimizer: {learning_rate: 0.01}\n");
  const auto other =
      run_mpx("train --no-progress --resume run --config other.yaml --set train.log_every=1 --set seed=3", t.path);
  CHECK(other.code == 2);
  CHECK(other.err.find("in seed (42 in the run, 3 now), optimizer.learning_rate (0.001 in the run, 0.01 now)") !=
        std::string::npos);
  CHECK(other.err.find("train.log_every (") == std::string::npos);  // not among the refused keys
  CHECK(other.err.find("resume: train.log_every changes from 2 to 1") != std::string::npos);
  CHECK(summary(t.path / "run")["epochs"] == 1);  // nothing was touched

  // Accepted with --allow-changes (a section allows its keys): the run goes on to 3 epochs.
  const auto allowed = run_mpx("train --no-progress --resume run --set train.epochs=3 --allow-changes train", t.path);
  CHECK(allowed.code == 0);
  CHECK(allowed.err.find("resume: train.epochs changes from 1 to 3 (--allow-changes)") != std::string::npos);
  CHECK(summary(t.path / "run")["epochs"] == 3);
  CHECK(read_file(t.path / "run" / "config.yaml").find("epochs: 3") != std::string::npos);

  // --config with the run's values but a result-neutral key changed: accepted, and said.
  std::string three = kYaml;
  const std::string train_line = "train: {epochs: 1, log_every: 2}";
  three.replace(three.find(train_line), train_line.size(), "train: {epochs: 3, log_every: 5}");
  write_file(t.path / "three.yaml", three);
  const auto neutral = run_mpx("train --no-progress --resume run --config three.yaml", t.path);
  CHECK(neutral.code == 0);
  CHECK(neutral.err.find("resume: train.log_every changes from 2 to 5") != std::string::npos);

  // A checkpoint file elsewhere has no run config beside it: --config is required.
  fs::copy_file(t.path / "run" / "checkpoints" / "last.ckpt", t.path / "loose.ckpt");
  const auto loose = run_mpx("train --no-progress --resume loose.ckpt --run-dir run2", t.path);
  CHECK(loose.code == 2);
  CHECK(loose.err.find("no config.yaml of the run beside it; give the run's config with --config") !=
        std::string::npos);
  // --allow-changes without --resume is a usage error.
  CHECK(run_mpx("train --no-progress --config c.yaml --allow-changes train.epochs --run-dir run3", t.path).code == 2);
}

TEST_CASE("cli runs: a finite float32 blow-up of the loss is diverged, exit 4, with what to try",
          "[cli][diverged]") {
  TempDir t;
  write_file(t.path / "c.yaml", kYaml);
  const auto r = run_mpx("train --no-progress --config c.yaml --set optimizer.learning_rate=1e4 --run-dir run", t.path);
  CHECK(r.code == 4);
  CHECK(r.err.find("training diverged: the train loss reached") != std::string::npos);
  CHECK(r.err.find("times its starting value") != std::string::npos);
  CHECK(r.err.find("try a lower optimizer.learning_rate (a tenth of 10000)") != std::string::npos);
  const json s = summary(t.path / "run");
  CHECK(s["status"] == "diverged");
  CHECK(s["exit_code"] == 4);
  CHECK(s["policy"] == "float32");
  // Never evaluated: no test figures, null rather than a 0 that reads as a result.
  CHECK(s["final_test_accuracy"].is_null());
  CHECK(s["best_test_accuracy"].is_null());

  // The same run with the check off completes (so the check, not a non-finite loss, stopped it) ...
  const auto off = run_mpx("train --no-progress --config c.yaml --set optimizer.learning_rate=1e4 "
                           "--set train.divergence_factor=0 --run-dir off",
                           t.path);
  CHECK(off.code == 0);
  const json o = summary(t.path / "off");
  CHECK(o["status"] == "completed");
  CHECK(o["final_train_loss"].get<double>() > 100 * 2.3);  // finite, and far past any start
}

TEST_CASE("cli runs: relative paths follow the config file; a run directory evaluates from anywhere",
          "[cli][paths]") {
  const fs::path mnist = fs::path(MPX_SHARED_DATA) / "mnist";
  if (!fs::exists(mnist / "t10k-images-idx3-ubyte.gz") && !fs::exists(mnist / "t10k-images-idx3-ubyte"))
    MPX_SKIP("no MNIST under " + mnist.string());
  TempDir t;
  fs::create_directories(t.path / "project" / "configs");
  fs::create_directories(t.path / "elsewhere");
  fs::create_directory_symlink(mnist, t.path / "project" / "mnist");
  write_file(t.path / "project" / "configs" / "m.yaml",
             "name: paths\n"
             "device: cpu\n"
             "data: {dataset: mnist, path: ../mnist, batch_size: 16, train_limit: 64, test_limit: 32}\n"
             "model:\n"
             "  layers:\n"
             "    - {type: flatten}\n"
             "    - {type: dense, units: 10, activation: softmax}\n"
             "train: {epochs: 1}\n");
  // Trained from another folder: ../mnist is next to configs/, not next to the current folder.
  const auto r = run_mpx("train --no-progress --config ../project/configs/m.yaml --run-dir run", t.path / "elsewhere");
  REQUIRE(r.code == 0);
  const std::string saved = read_file(t.path / "elsewhere" / "run" / "config.yaml");
  const std::string want = "path: " + (t.path / "project" / "mnist").lexically_normal().string() + "\n";
  CHECK(saved.find(want) != std::string::npos);

  // The run directory evaluates from any folder (its config.yaml holds absolute paths).
  const auto e = run_mpx("eval --json --checkpoint " + (t.path / "elsewhere" / "run").string(), t.path);
  REQUIRE(e.code == 0);
  const json j = json::parse(e.out);
  CHECK(j["count"] == 32);
  CHECK(j["accuracy"].get<double>() == Approx(summary(t.path / "elsewhere" / "run")["final_test_accuracy"].get<double>()));

  // --set paths are relative to the current folder: from t.path, ../mnist is not there (exit 3).
  const auto missing =
      run_mpx("train --no-progress --config project/configs/m.yaml --set data.path=../mnist --run-dir r2", t.path);
  CHECK(missing.code == 3);
  CHECK(missing.err.find((t.path.parent_path() / "mnist").lexically_normal().string()) != std::string::npos);
}

TEST_CASE("cli runs: per-class accuracy and the confusion matrix, against one from mpx inspect's logits",
          "[cli][classes]") {
  TempDir t;
  write_file(t.path / "c.yaml", kYaml);
  REQUIRE(run_mpx("train --no-progress --config c.yaml --run-dir run", t.path).code == 0);
  const auto e = run_mpx("eval --json --checkpoint run", t.path);
  REQUIRE(e.code == 0);
  const json j = json::parse(e.out);
  REQUIRE(j["confusion_matrix"].is_array());
  REQUIRE(j["confusion_matrix"].size() == 10);

  // A second implementation: the argmax of the inference-mode logits mpx inspect dumps for the
  // whole test split (16 records), against the labels the data set reader gives.
  REQUIRE(run_mpx("inspect --config run/config.yaml --checkpoint run --batch 16 --out d.safetensors", t.path).code ==
          0);
  const mpx::StFile dump = mpx::read_safetensors((t.path / "d.safetensors").string());
  const mpx::StTensor* logits = dump.find("eval/logits");
  REQUIRE(logits != nullptr);
  const std::vector<float> v = mpx::st_to_float32(*logits, "d.safetensors");
  REQUIRE(v.size() == 160);
  const mpx::Config cfg = mpx::load_config((t.path / "run" / "config.yaml").string());
  const mpx::Dataset test = mpx::load_dataset(cfg.data, mpx::Split::Test, cfg.seed);
  REQUIRE(test.size() == 16);
  std::vector<std::vector<int64_t>> want(10, std::vector<int64_t>(10, 0));
  for (size_t r = 0; r < 16; ++r) {
    size_t best = 0;
    for (size_t k = 1; k < 10; ++k)
      if (v[r * 10 + k] > v[r * 10 + best]) best = k;
    ++want[static_cast<size_t>(test.labels[r])][best];
  }
  int64_t diagonal = 0;
  for (size_t k = 0; k < 10; ++k) {
    INFO("class " << k);
    CHECK(j["confusion_matrix"][k].get<std::vector<int64_t>>() == want[k]);
    diagonal += want[k][k];
    int64_t row = 0;
    for (int64_t x : want[k]) row += x;
    if (row == 0) CHECK(j["per_class_accuracy"][k].is_null());
    else CHECK(j["per_class_accuracy"][k].get<double>() == Approx(static_cast<double>(want[k][k]) / row));
  }
  CHECK(j["accuracy"].get<double>() == Approx(static_cast<double>(diagonal) / 16));
  // summary.json holds the last evaluation's (the same weights), and the report draws it.
  const json s = summary(t.path / "run");
  CHECK(s["confusion_matrix"] == j["confusion_matrix"]);
  CHECK(s["per_class_accuracy"] == j["per_class_accuracy"]);
  REQUIRE(run_mpx("report run --out r.html", t.path).code == 0);
  const auto doc = support::parse_html(read_file(t.path / "r.html"));
  const auto tables =
      doc.find(0, [](const support::HtmlElement& el) { return el.name == "table" && el.has_class("confusion"); });
  REQUIRE(tables.size() == 1);
  const auto cells = doc.find(tables[0], [](const support::HtmlElement& el) { return el.name == "td" && !el.has_class("acc"); });
  REQUIRE(cells.size() == 100);
  for (size_t i = 0; i < 100; ++i) CHECK(doc.at(cells[i]).attr("data-v") == std::to_string(want[i / 10][i % 10]));
}

TEST_CASE("cli runs: the log says where train.max_steps stops; the result line once; epochs counted alike",
          "[cli][wording]") {
  TempDir t;
  write_file(t.path / "c.yaml", kYaml);
  const auto r = run_mpx("train --no-progress --config c.yaml --set train.max_steps=3 --run-dir run", t.path);
  REQUIRE(r.code == 0);
  CHECK(r.err.find("4 steps/epoch, 1 epoch; stopping after 3 steps (train.max_steps)") != std::string::npos);
  CHECK(r.out.find("completed: 3 steps (0 full epochs), test accuracy") != std::string::npos);
  const std::string both = r.out + r.err;
  size_t n = 0;
  for (size_t at = both.find("completed: "); at != std::string::npos; at = both.find("completed: ", at + 1)) ++n;
  CHECK(n == 1);  // train.log has its own copy
  CHECK(read_file(t.path / "run" / "train.log").find("completed: 3 steps (0 full epochs)") != std::string::npos);
  CHECK(r.err.find("saved run/checkpoints/last.ckpt (in epoch 1 after its step 3, global step 3)") !=
        std::string::npos);
  const auto whole = run_mpx("train --no-progress --config c.yaml --run-dir whole", t.path);
  REQUIRE(whole.code == 0);
  CHECK(whole.err.find("epoch 1/1 done") != std::string::npos);
  CHECK(whole.err.find("saved whole/checkpoints/last.ckpt (after epoch 1, global step 4)") != std::string::npos);
  CHECK(whole.err.find("policy float32 (from the config or --set)") != std::string::npos);
}

TEST_CASE("cli runs: a validation split chooses the best checkpoint, cuts the learning rate and stops early; the "
          "test split is read at the end only",
          "[cli][validation]") {
  const fs::path mnist = fs::path(MPX_SHARED_DATA) / "mnist";
  if (!fs::exists(mnist / "train-images-idx3-ubyte.gz") && !fs::exists(mnist / "train-images-idx3-ubyte"))
    MPX_SKIP("no MNIST under " + mnist.string());
  TempDir t;
  const std::string base =
      "name: val\n"
      "device: cpu\n"
      "seed: 5\n"
      "data: {dataset: mnist, path: " + mnist.string() + ", batch_size: 32, train_limit: 512, test_limit: 256}\n"
      "model:\n"
      "  layers:\n"
      "    - {type: flatten}\n"
      "    - {type: dense, units: 64, activation: relu}\n"
      "    - {type: dense, units: 10, activation: softmax}\n"
      "optimizer: {learning_rate: 0.003}\n"
      "schedule: {name: reduce_on_plateau, patience: 1, factor: 0.5}\n";
  write_file(t.path / "v.yaml",
             base + "train: {epochs: 10, log_every: 100, early_stopping: {monitor: val_loss, patience: 2, "
                    "restore_best: true}}\n");
  const auto r = run_mpx("train --no-progress --config v.yaml --set data.validation_split=0.25 --run-dir run", t.path);
  REQUIRE(r.code == 0);
  const json s = summary(t.path / "run");
  CHECK(s["validation_records"] == 128);
  CHECK(s["best_test_accuracy"].is_null());  // no test figure during training to take a best of

  std::vector<json> epochs;
  for (const std::string& line : {read_file(t.path / "run" / "metrics.jsonl")}) {
    size_t at = 0;
    for (size_t nl; (nl = line.find('\n', at)) != std::string::npos; at = nl + 1) {
      const json rec = json::parse(line.substr(at, nl - at));
      if (rec["kind"] == "epoch") epochs.push_back(rec);
    }
  }
  REQUIRE(epochs.size() >= 2);
  // Keras' ReduceLROnPlateau (min_delta 1e-4) and EarlyStopping (min_delta 0, patience 2) on the
  // validation loss, replayed from the records: the learning rates and the stop must follow.
  double plateau_best = 1e300, es_best = 1e300, lr = 0.003;
  int64_t plateau_wait = 0, es_wait = 0, es_best_epoch = 0, stopped = 0, best_acc_epoch = 0;
  for (const json& e : epochs) {
    INFO("epoch " << e["epoch"]);
    CHECK(e["test_accuracy"].is_null());  // the test split is not read while training
    CHECK(e["test_loss"].is_null());
    REQUIRE(e["validation_loss"].is_number());
    CHECK(e["learning_rate"].get<double>() == Approx(lr));
    const double loss = e["validation_loss"].get<double>();
    const int64_t epoch = e["epoch"].get<int64_t>();
    if (loss < plateau_best - 1e-4) {
      plateau_best = loss, plateau_wait = 0;
    } else if (++plateau_wait >= 1) {
      lr *= 0.5, plateau_wait = 0;
    }
    ++es_wait;
    if (loss < es_best) {
      es_best = loss, es_wait = 0, es_best_epoch = epoch;
    } else if (es_wait >= 2 && stopped == 0) {
      stopped = epoch;
    }
    if (best_acc_epoch == 0 || e["validation_accuracy"] > epochs[static_cast<size_t>(best_acc_epoch - 1)]["validation_accuracy"])
      best_acc_epoch = epoch;
  }
  REQUIRE(stopped > 0);  // the run overfits its 384 records: the validation loss turns
  CHECK(static_cast<int64_t>(epochs.size()) == stopped);
  CHECK(s["stopped_early_epoch"] == stopped);
  CHECK(s["epochs"] == stopped);
  // best.ckpt holds the monitored figure's best epoch, and the final test figures are its weights'.
  const mpx::Checkpoint best = mpx::load_checkpoint((t.path / "run" / "checkpoints" / "best.ckpt").string());
  CHECK(best.header.epoch == es_best_epoch);
  const auto e = run_mpx("eval --json --checkpoint run/checkpoints/best.ckpt", t.path);
  REQUIRE(e.code == 0);
  CHECK(json::parse(e.out)["accuracy"].get<double>() == Approx(s["final_test_accuracy"].get<double>()));

  // Without early stopping best.ckpt is the best validation accuracy's epoch, also where the test
  // split would have chosen another: the same training one epoch at a time (each --resume
  // continues bit for bit) gives the test accuracy after every epoch. Seed 10 is one where the
  // two choices differ (validation: epoch 4, test: epoch 3).
  write_file(t.path / "p.yaml", base + "train: {epochs: 4, log_every: 100}\n");
  const std::string split = " --set seed=10 --set data.validation_split=128";
  REQUIRE(run_mpx("train --no-progress --config p.yaml" + split + " --run-dir plain", t.path).code == 0);
  std::vector<double> val_acc;
  const std::string text = read_file(t.path / "plain" / "metrics.jsonl");
  size_t at = 0;
  for (size_t nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1) {
    const json rec = json::parse(text.substr(at, nl - at));
    if (rec["kind"] == "epoch") val_acc.push_back(rec["validation_accuracy"].get<double>());
  }
  REQUIRE(val_acc.size() == 4);
  const int64_t val_best = std::max_element(val_acc.begin(), val_acc.end()) - val_acc.begin() + 1;
  CHECK(mpx::load_checkpoint((t.path / "plain" / "checkpoints" / "best.ckpt").string()).header.epoch == val_best);
  CHECK(summary(t.path / "plain")["validation_records"] == 128);
  std::vector<double> test_acc;
  for (int epochs = 1; epochs <= 4; ++epochs) {
    const std::string step = epochs == 1 ? "train --no-progress --config p.yaml" + split + " --set train.epochs=1 --run-dir chain"
                                         : "train --no-progress --resume chain --set train.epochs=" +
                                               std::to_string(epochs) + " --allow-changes train.epochs";
    REQUIRE(run_mpx(step, t.path).code == 0);
    const auto ev = run_mpx("eval --json --checkpoint chain/checkpoints/last.ckpt", t.path);
    REQUIRE(ev.code == 0);
    test_acc.push_back(json::parse(ev.out)["accuracy"].get<double>());
  }
  CHECK(test_acc.back() == summary(t.path / "plain")["final_test_accuracy"].get<double>());  // the same run
  const int64_t test_best = std::max_element(test_acc.begin(), test_acc.end()) - test_acc.begin() + 1;
  INFO("validation accuracy by epoch " << json(val_acc) << ", test accuracy " << json(test_acc));
  CHECK(test_best != val_best);

  // Early stopping without a validation split, and splits that leave nothing: exit 2.
  const auto none = run_mpx("train --no-progress --config v.yaml --run-dir r1", t.path);
  CHECK(none.code == 2);
  CHECK(none.err.find("train.early_stopping watches the validation split, never the test set") != std::string::npos);
  CHECK(run_mpx("train --no-progress --config p.yaml --set data.validation_split=1.5 --run-dir r2", t.path).code == 2);
  const auto all = run_mpx("train --no-progress --config p.yaml --set data.validation_split=512 --run-dir r3", t.path);
  CHECK(all.code == 2);
  CHECK(all.err.find("holds out 512 of the 512 training records") != std::string::npos);
}

TEST_CASE("cli runs: train.divergence_patience ends a run whose train loss stopped improving as diverged",
          "[cli][diverged]") {
  TempDir t;
  // A learning rate too small to move the weights, and dropout: the epoch train loss only wanders.
  write_file(t.path / "c.yaml",
             "name: stuck\n"
             "device: cpu\n"
             "data: {dataset: synthetic, batch_size: 8, synthetic_train: 32, synthetic_test: 8}\n"
             "model:\n"
             "  layers:\n"
             "    - {type: flatten}\n"
             "    - {type: dropout, rate: 0.5}\n"
             "    - {type: dense, units: 10, activation: softmax}\n"
             "optimizer: {learning_rate: 1.0e-9}\n"
             "train: {epochs: 30, log_every: 100, divergence_patience: 2}\n");
  const auto r = run_mpx("train --no-progress --config c.yaml --run-dir run", t.path);
  CHECK(r.code == 4);
  CHECK(r.err.find("the train loss has not improved on its best") != std::string::npos);
  CHECK(r.err.find("train.divergence_patience: 0 turns this check off") != std::string::npos);
  CHECK(summary(t.path / "run")["status"] == "diverged");
  // The rule replayed from the epoch records: the run ends at the first epoch that makes two in a row.
  const std::string text = read_file(t.path / "run" / "metrics.jsonl");
  double best = 0;
  int64_t streak = 0, want = 0, last = 0;
  size_t at = 0;
  for (size_t nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1) {
    const json rec = json::parse(text.substr(at, nl - at));
    if (rec["kind"] != "epoch") continue;
    last = rec["epoch"].get<int64_t>();
    const double loss = rec["train_loss"].get<double>();
    if (best <= 0 || loss < best) best = loss, streak = 0;
    else if (++streak >= 2 && want == 0) want = last;
  }
  REQUIRE(want > 0);
  CHECK(last == want);
  CHECK(summary(t.path / "run")["epochs"] == want);
}
