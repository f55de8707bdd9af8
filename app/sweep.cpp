// SPDX-License-Identifier: MIT
// `mpx sweep`: a grid (or seeded random samples of it) over config values, one
// `mpx train` per point in its own run directory named by the point's values;
// points already done are skipped, so a killed sweep continues where it stopped;
// -j N runs N at a time with the CPU threads split; one exit code for the whole
// sweep; the table of runs at the end (README, "Sweeps").
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <yaml-cpp/yaml.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "commands.h"
#include "config/config.h"
#include "config/config_diff.h"
#include "core/error.h"
#include "io/run_dir.h"
#include "report/table.h"
#include "train/trainer.h"

extern char** environ;

namespace fs = std::filesystem;

namespace mpx::app {

namespace {

/// Points a sweep may have: far more than any machine trains, few enough to list.
constexpr size_t kMaxPoints = 10000;

struct SweepArgs {
  std::string config;
  std::vector<std::string> sets, grid;
  std::string file;
  int64_t random = 0;
  uint64_t seed = 0;
  bool seed_given = false;
  std::string dir;
  int jobs = 1;
  bool overwrite = false;
  std::string format = "text";
  std::string sort;
  bool descending = false;
  std::vector<std::string> columns;
};

struct Axis {
  std::string key;
  std::vector<std::string> values;  // YAML text, as --set takes it
};

/// Splits "a,b,[1,2],c" at the commas outside brackets and quotes.
std::vector<std::string> split_values(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  char quote = 0;
  for (char ch : s) {
    if (quote) {
      if (ch == quote) quote = 0;
    } else if (ch == '"' || ch == '\'') {
      quote = ch;
    } else if (ch == '[' || ch == '{') {
      ++depth;
    } else if (ch == ']' || ch == '}') {
      --depth;
    } else if (ch == ',' && depth == 0) {
      out.push_back(cur);
      cur.clear();
      continue;
    }
    cur += ch;
  }
  out.push_back(cur);
  return out;
}

Axis parse_grid_option(const std::string& g) {
  const auto eq = g.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError(fmt::format("--grid '{}': expected KEY=V1,V2,... (e.g. --grid optimizer.learning_rate=1e-3,3e-3)", g));
  Axis a{g.substr(0, eq), split_values(g.substr(eq + 1))};
  for (const std::string& v : a.values)
    if (v.empty()) throw ConfigError(fmt::format("--grid '{}': an empty value (two commas in a row?)", g));
  return a;
}

std::string yaml_text(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  YAML::Emitter out;
  out << YAML::Flow << n;
  return out.c_str();
}

/// The sweep file (README, "Sweeps"): grid (key -> list of values), random, seed.
void read_sweep_file(const std::string& path, SweepArgs& a, std::vector<Axis>& axes) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("{}: cannot read the sweep file: {}", path, e.what()));
  }
  if (!root.IsMap()) throw ConfigError(fmt::format("{}: expected a mapping with grid: (and random:, seed:)", path));
  for (const auto& kv : root) {
    const std::string k = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    try {
      if (k == "grid") {
        if (!v.IsMap() || v.size() == 0)
          throw ConfigError(fmt::format("{}: grid: expected a mapping of config keys to lists of values", path));
        for (const auto& g : v) {
          Axis axis{g.first.Scalar(), {}};
          if (g.second.IsSequence()) {
            for (const auto& x : g.second) axis.values.push_back(yaml_text(x));
          } else {
            axis.values.push_back(yaml_text(g.second));
          }
          if (axis.values.empty())
            throw ConfigError(fmt::format("{}: grid.{}: expected a non-empty list of values", path, axis.key));
          axes.push_back(axis);
        }
      } else if (k == "random") {
        if (a.random == 0) a.random = v.as<int64_t>();
      } else if (k == "seed") {
        if (!a.seed_given) a.seed = v.as<uint64_t>();
      } else {
        throw ConfigError(fmt::format("{}: unknown key '{}' (a sweep file has grid, random and seed)", path, k));
      }
    } catch (const YAML::Exception& e) {
      throw ConfigError(fmt::format("{}: {}: {}", path, k, e.what()));
    }
  }
}

/// A file-name-safe form of a value: letters, digits and . + - kept, the rest '_'.
std::string safe(const std::string& s) {
  std::string out;
  for (char ch : s) out += std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '+' || ch == '-' ? ch : '_';
  return out;
}

struct Point {
  std::vector<std::string> sets;  // KEY=VALUE per axis
  std::string name, dir;
  // Outcome.
  std::string action;  // "run", "resume", "overwrite", "skip", "refused"
  int code = -1;
  std::string message;
};

std::vector<Point> make_points(const std::vector<Axis>& axes, const SweepArgs& a) {
  size_t total = 1;
  for (const Axis& x : axes) {
    total *= x.values.size();
    if (total > kMaxPoints)
      throw ConfigError(fmt::format("the grid has more than {} points; sample it with --random N", kMaxPoints));
  }
  // Labels: the key's last part, or the whole key where two axes share it.
  std::vector<std::string> labels;
  for (const Axis& x : axes) {
    const auto dot = x.key.find_last_of('.');
    labels.push_back(dot == std::string::npos ? x.key : x.key.substr(dot + 1));
  }
  for (size_t i = 0; i < axes.size(); ++i)
    if (std::count(labels.begin(), labels.end(), labels[i]) > 1) labels[i] = axes[i].key;
  std::vector<size_t> chosen(total);
  for (size_t i = 0; i < total; ++i) chosen[i] = i;
  if (a.random > 0 && static_cast<size_t>(a.random) < total) {
    std::mt19937_64 rng(a.seed);
    for (size_t i = 0; i < static_cast<size_t>(a.random); ++i) {
      std::uniform_int_distribution<size_t> pick(i, total - 1);
      std::swap(chosen[i], chosen[pick(rng)]);
    }
    chosen.resize(static_cast<size_t>(a.random));
    std::sort(chosen.begin(), chosen.end());
  }
  std::vector<Point> points;
  std::map<std::string, std::string> taken;
  for (size_t index : chosen) {
    Point p;
    size_t rest = index;
    std::vector<size_t> pick(axes.size());
    for (size_t i = axes.size(); i-- > 0;) {
      pick[i] = rest % axes[i].values.size();
      rest /= axes[i].values.size();
    }
    for (size_t i = 0; i < axes.size(); ++i) {
      const std::string& v = axes[i].values[pick[i]];
      p.sets.push_back(axes[i].key + "=" + v);
      p.name += (i ? "," : "") + safe(labels[i]) + "=" + safe(v);
    }
    p.dir = (fs::path(a.dir) / p.name).string();
    const std::string what = fmt::format("{}", fmt::join(p.sets, " "));
    if (auto [it, fresh] = taken.emplace(p.name, what); !fresh)
      throw ConfigError(fmt::format("the points '{}' and '{}' would share the run directory '{}': give values that "
                                    "differ in letters, digits or . + -",
                                    it->second, what, p.dir));
    points.push_back(std::move(p));
  }
  return points;
}

/// The first difference that matters between a run's config.yaml and the point's config
/// ("" when none): the keys resume_neutral_key() allows are not counted, nor the policy and
/// loss-scale mode the run resolved from `auto` / unset.
std::string config_mismatch(const Config& run, const Config& point) {
  for (const ConfigDifference& d : config_differences(run, point)) {
    if (resume_neutral_key(d.key)) continue;
    if ((d.key == "policy" && d.b == "auto") || (d.key == "loss_scale.mode" && d.b == "~")) continue;
    return fmt::format("{} ({} in the run, {} in the sweep)", d.key, d.a, d.b);
  }
  return "";
}

/// What to do with a point's run directory (the run-directory rule is train's: README).
void plan_point(Point& p, const Config& point_cfg, bool overwrite) {
  const RunDirInfo info = inspect_run_dir(p.dir);
  if (info.kind != RunDirKind::MpxRun) {
    p.action = "run";  // new or empty; a foreign folder or a file is refused by train itself
    return;
  }
  if (overwrite) {
    p.action = "overwrite";
    return;
  }
  if (fs::exists(fs::path(p.dir) / "config.yaml")) {
    std::string mismatch;
    try {
      mismatch = config_mismatch(load_config((fs::path(p.dir) / "config.yaml").string()), point_cfg);
    } catch (const Error& e) {
      mismatch = std::string("its config.yaml does not load: ") + e.what();
    }
    if (!mismatch.empty()) {
      p.action = "refused";
      p.code = kExitUsage;
      p.message = fmt::format("the run directory '{}' holds a run of another config: {}; rerun the sweep with "
                              "--overwrite to replace it, or give another --dir",
                              p.dir, mismatch);
      return;
    }
  }
  if (info.status == "completed" || info.status == "diverged") {
    p.action = "skip";  // done: a rerun would be the same run
    p.code = info.status == "completed" ? kExitOk : kExitDiverged;
    return;
  }
  // Interrupted, killed (no summary), or failed: continue from its checkpoint, else start over.
  const bool ckpt = fs::exists(fs::path(p.dir) / "checkpoints" / "last.ckpt");
  p.action = ckpt && info.status != "failed" ? "resume" : "overwrite";
}

int threads_available() {
  if (const char* env = std::getenv("OMP_NUM_THREADS"); env != nullptr && std::atoi(env) > 0) return std::atoi(env);
  return std::max(1u, std::thread::hardware_concurrency());
}

pid_t launch(const Point& p, const SweepArgs& a, int threads) {
  std::vector<std::string> args = {"mpx", "-q", "train", "--no-progress"};
  if (!a.config.empty()) args.insert(args.end(), {"--config", a.config});
  for (const std::string& s : a.sets) args.insert(args.end(), {"--set", s});
  for (const std::string& s : p.sets) args.insert(args.end(), {"--set", s});
  if (p.action == "resume") {
    args.insert(args.end(), {"--resume", p.dir});
  } else {
    args.insert(args.end(), {"--run-dir", p.dir});
    if (p.action == "overwrite") args.emplace_back("--overwrite");
  }
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e)
    if (std::string(*e).rfind("OMP_NUM_THREADS=", 0) != 0) env_strings.emplace_back(*e);
  env_strings.push_back("OMP_NUM_THREADS=" + std::to_string(threads));
  std::vector<char*> argv, envp;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::cout.flush();
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(fmt::format("cannot start a training for '{}': fork failed", p.dir));
  if (pid == 0) {
    // A process group of its own: a Ctrl-C reaches the sweep only, which asks each training
    // once to stop (a second SIGINT would end a training without its checkpoint).
    ::setpgid(0, 0);
    const int devnull = ::open("/dev/null", O_WRONLY);
    if (devnull >= 0) ::dup2(devnull, STDOUT_FILENO);  // the result is in summary.json; errors stay on stderr
    ::execve("/proc/self/exe", argv.data(), envp.data());
    std::fprintf(stderr, "error: cannot run /proc/self/exe for the sweep\n");
    ::_exit(kExitInternal);
  }
  return pid;
}

void run_sweep(SweepArgs a) {
  std::vector<Axis> axes;
  for (const std::string& g : a.grid) axes.push_back(parse_grid_option(g));
  if (!a.file.empty()) read_sweep_file(a.file, a, axes);
  if (axes.empty()) throw ConfigError("mpx sweep: nothing to sweep; give --grid KEY=V1,V2,... or --file SWEEP.yaml");
  std::set<std::string> keys;
  for (const Axis& x : axes)
    if (!keys.insert(x.key).second) throw ConfigError(fmt::format("mpx sweep: the key '{}' is swept twice", x.key));
  if (a.random < 0) throw ConfigError("--random must be >= 0");
  if (a.jobs < 1) throw ConfigError("-j must be >= 1");

  const Config base = load_config(a.config, a.sets);
  if (a.dir.empty()) a.dir = "runs/" + base.name + "-sweep";
  std::vector<Point> points = make_points(axes, a);
  // Every point's config is checked before anything runs: a bad value fails the sweep at once.
  for (Point& p : points) {
    std::vector<std::string> sets = a.sets;
    sets.insert(sets.end(), p.sets.begin(), p.sets.end());
    const Config cfg = load_config(a.config, sets);
    plan_point(p, cfg, a.overwrite);
  }
  std::error_code ec;
  fs::create_directories(a.dir, ec);
  if (ec) throw IoError(fmt::format("cannot create the sweep folder '{}': {}", a.dir, ec.message()));

  const int jobs = std::min<int>(a.jobs, static_cast<int>(points.size()));
  const int threads = std::max(1, threads_available() / std::max(1, jobs));
  const auto todo = std::count_if(points.begin(), points.end(),
                                  [](const Point& p) { return p.action != "skip" && p.action != "refused"; });
  spdlog::info("sweep: {} point{} in {}, {} to train, {} at a time with {} thread{} each", points.size(),
               points.size() == 1 ? "" : "s", a.dir, todo, jobs, threads, threads == 1 ? "" : "s");

  std::map<pid_t, size_t> running;
  std::map<pid_t, std::chrono::steady_clock::time_point> started;
  size_t next = 0;
  bool stopping = false;
  const size_t n = points.size();
  auto label = [&](size_t i) { return fmt::format("[{}/{}] {}", i + 1, n, points[i].name); };
  while (true) {
    if (!stopping && stop_requested().load()) {
      stopping = true;
      spdlog::info("sweep: stopping: the running trainings save a checkpoint; rerun the sweep to continue");
      for (const auto& [pid, i] : running) ::kill(pid, SIGINT);
    }
    while (!stopping && running.size() < static_cast<size_t>(jobs) && next < n) {
      Point& p = points[next];
      if (p.action == "skip") {
        spdlog::info("{}: already {}, skipped", label(next), p.code == kExitOk ? "completed" : "diverged");
      } else if (p.action == "refused") {
        spdlog::error("{}: {}", label(next), p.message);
      } else {
        const pid_t pid = launch(p, a, threads);
        running[pid] = next;
        started[pid] = std::chrono::steady_clock::now();
        spdlog::info("{}: {}", label(next),
                     p.action == "resume" ? "resuming from its checkpoint"
                     : p.action == "overwrite" ? "starting over (its previous run did not complete)"
                                               : "training");
      }
      ++next;
    }
    if (running.empty() && (stopping || next >= n)) break;
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    const auto it = running.find(pid);
    if (it == running.end()) continue;
    Point& p = points[it->second];
    p.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started[pid]).count();
    std::string status_text = p.code == kExitOk ? "completed" : fmt::format("exit code {}", p.code);
    spdlog::info("{}: {} in {:.1f} s", label(it->second), status_text, secs);
    running.erase(it);
  }
  for (size_t i = next; i < n; ++i) points[i].code = kExitInterrupted;  // never started

  // The table of every point that has a run directory, in the sweep's order.
  std::vector<std::string> dirs;
  for (const Point& p : points)
    if (fs::is_directory(p.dir)) dirs.push_back(p.dir);
  const report::Loaded loaded = report::load_runs(dirs);
  if (!loaded.runs.empty()) {
    const report::TableFormat f = a.format == "csv"        ? report::TableFormat::Csv
                                  : a.format == "json"     ? report::TableFormat::Json
                                  : a.format == "markdown" ? report::TableFormat::Markdown
                                                           : report::TableFormat::Text;
    report::Table t = report::run_table(loaded.runs);
    if (!a.sort.empty()) report::sort_rows(t, a.sort, a.descending);
    if (!a.columns.empty()) report::select_columns(t, a.columns);
    else if (f == report::TableFormat::Text || f == report::TableFormat::Markdown) report::cap_config_columns(t, 8);
    std::cout << report::format_table(t, f);
    std::cout.flush();
  }
  int worst = kExitOk, completed = 0;
  for (const Point& p : points) {
    worst = std::max(worst, p.code);
    completed += p.code == kExitOk;
  }
  spdlog::info("sweep: {} of {} point{} completed{}", completed, n, n == 1 ? "" : "s",
               worst == kExitOk ? "" : fmt::format("; exit code {} (the highest of the points)", worst));
  command_exit_code() = worst;
}

}  // namespace

void add_sweep_command(CLI::App& app) {
  auto a = std::make_shared<SweepArgs>();
  auto* cmd = app.add_subcommand(
      "sweep", "Train every point of a grid of config values, each in its own run directory; skips points done");
  cmd->add_option("-c,--config", a->config, "YAML config file of every point")->required()->check(CLI::ExistingFile);
  add_set_option(cmd, a->sets);
  cmd->add_option("--grid", a->grid,
                  "One axis: a config key and its values, e.g. --grid optimizer.learning_rate=1e-3,3e-3 "
                  "(repeatable: the grid is every combination)")
      ->type_name("KEY=V1,V2,...")
      ->allow_extra_args(false);
  cmd->add_option("--file", a->file, "A sweep file: grid: {KEY: [values]}, and optionally random: N, seed: S")
      ->check(CLI::ExistingFile);
  cmd->add_option("--random", a->random, "Train N points of the grid drawn at random (seeded) instead of all");
  cmd->add_option("--seed", a->seed, "The seed of --random")->each([a](const std::string&) { a->seed_given = true; });
  cmd->add_option("--dir", a->dir, "The folder of the sweep's run directories (default: runs/<config name>-sweep)");
  cmd->add_option("-j,--jobs", a->jobs, "Trainings at a time; the CPU threads are split between them");
  cmd->add_flag("--overwrite", a->overwrite, "Train every point again, replacing the runs already there");
  cmd->add_option("--format", a->format, "The format of the table printed at the end")
      ->check(CLI::IsMember({"text", "csv", "json", "markdown"}));
  cmd->add_option("--sort", a->sort, "Sort the table by this column, as mpx report --table --sort");
  cmd->add_flag("--descending", a->descending, "With --sort: largest first");
  cmd->add_option("--columns", a->columns, "Only these columns of the table (comma-separated keys)")->delimiter(',');
  cmd->callback([a] {
    // A stop signal is the sweep's to handle: it asks each running training once to stop at its
    // next step (they save a checkpoint), waits for them, and exits 130 (docs/design.md, "Signals").
    stop_at_step_boundary().store(true);
    run_sweep(*a);
  });
}

}  // namespace mpx::app
