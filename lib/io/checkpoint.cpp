// SPDX-License-Identifier: MIT
// Checkpoint writer and verifying reader (format in checkpoint.h).
#include "io/checkpoint.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_file.h"
#include "io/run_dir.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace mpx {

namespace {

constexpr char kMagic[8] = {'M', 'P', 'X', 'C', 'K', 'P', 'T', '\0'};

uint32_t crc32_of(const void* data, size_t bytes) {
  uLong c = crc32(0L, Z_NULL, 0);
  const auto* p = static_cast<const Bytef*>(data);
  while (bytes > 0) {
    const uInt n = static_cast<uInt>(std::min<size_t>(bytes, 1u << 30));
    c = crc32(c, p, n);
    p += n;
    bytes -= n;
  }
  return static_cast<uint32_t>(c);
}

void put_u32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t get_u32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

json finite_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }
double number_or_inf(const json& j) {
  return j.is_null() ? std::numeric_limits<double>::infinity() : j.get<double>();
}

json header_to_json(const CheckpointHeader& h) {
  json j;
  j["config_name"] = h.config_name;
  j["policy"] = h.policy;
  j["device"] = h.device;
  j["optimizer"] = h.optimizer;
  j["dataset"] = h.dataset;
  j["seed"] = h.seed;
  j["batch_size"] = h.batch_size;
  j["world_size"] = h.world_size;
  j["num_params"] = h.num_params;
  j["num_state"] = h.num_state;
  if (h.param_align != 1) j["param_align"] = h.param_align;  // absent: packed (version 1)
  j["epoch"] = h.epoch;
  j["step_in_epoch"] = h.step_in_epoch;
  j["global_step"] = h.global_step;
  j["applied_updates"] = h.applied_updates;
  j["scaler"] = {{"scale", h.scaler.scale},
                 {"good_steps", h.scaler.good_steps},
                 {"skipped_total", h.scaler.skipped_total},
                 {"consecutive_skips", h.scaler.consecutive_skips},
                 {"last_skip_reason", skip_reason_name(h.scaler.last_skip_reason)}};
  j["schedule"] = {{"plateau_lr", h.schedule.plateau_lr},
                   {"best", finite_or_null(h.schedule.best)},
                   {"wait", h.schedule.wait},
                   {"cooldown_counter", h.schedule.cooldown_counter}};
  j["best_test_accuracy"] = h.best_test_accuracy;
  j["last_test_accuracy"] = h.last_test_accuracy;
  j["last_test_loss"] = finite_or_null(h.last_test_loss);
  j["epoch_loss_sum"] = finite_or_null(h.epoch_loss_sum);
  j["epoch_correct"] = h.epoch_correct;
  j["epoch_count"] = h.epoch_count;
  j["epoch_skipped"] = h.epoch_skipped;
  j["wall_seconds"] = h.wall_seconds;
  j["final_train_loss"] = finite_or_null(h.final_train_loss);
  j["final_train_accuracy"] = h.final_train_accuracy;
  j["start_loss"] = finite_or_null(h.start_loss);
  j["validation"] = {{"best_accuracy", h.best_val_accuracy},    {"last_accuracy", h.last_val_accuracy},
                     {"last_loss", finite_or_null(h.last_val_loss)}, {"es_best", finite_or_null(h.es_best)},
                     {"es_has_best", h.es_has_best},             {"es_wait", h.es_wait},
                     {"early_stopped", h.early_stopped},         {"stopped_early_epoch", h.stopped_early_epoch}};
  j["plateau_guard"] = {{"best_epoch_train_loss", finite_or_null(h.best_epoch_train_loss)},
                        {"epochs_without_improvement", h.epochs_without_improvement}};
  j["target"] = {{"met", h.target_met},
                 {"epoch", h.target_epoch},
                 {"step", h.target_step},
                 {"seconds", h.target_seconds},
                 {"first_step_wall", h.first_step_wall}};
  j["params"] = h.params;
  return j;
}

CheckpointHeader header_from_json(const json& j) {
  CheckpointHeader h;
  h.config_name = j.at("config_name").get<std::string>();
  h.policy = j.at("policy").get<std::string>();
  h.device = j.at("device").get<std::string>();
  h.optimizer = j.at("optimizer").get<std::string>();
  h.dataset = j.at("dataset").get<std::string>();
  h.seed = j.at("seed").get<uint64_t>();
  h.batch_size = j.at("batch_size").get<int64_t>();
  h.world_size = j.value("world_size", int64_t{1});  // absent before data-parallel runs
  h.num_params = j.at("num_params").get<int64_t>();
  h.num_state = j.at("num_state").get<int64_t>();
  h.param_align = j.value("param_align", int64_t{1});
  h.epoch = j.at("epoch").get<int64_t>();
  h.step_in_epoch = j.at("step_in_epoch").get<int64_t>();
  h.global_step = j.at("global_step").get<int64_t>();
  h.applied_updates = j.at("applied_updates").get<int64_t>();
  const json& s = j.at("scaler");
  h.scaler.scale = s.at("scale").get<double>();
  h.scaler.good_steps = s.at("good_steps").get<int64_t>();
  h.scaler.skipped_total = s.at("skipped_total").get<int64_t>();
  h.scaler.consecutive_skips = s.at("consecutive_skips").get<int64_t>();
  h.scaler.last_skip_reason = parse_skip_reason(s.at("last_skip_reason").get<std::string>());
  const json& sc = j.at("schedule");
  h.schedule.plateau_lr = sc.at("plateau_lr").get<double>();
  h.schedule.best = number_or_inf(sc.at("best"));
  h.schedule.wait = sc.at("wait").get<int64_t>();
  h.schedule.cooldown_counter = sc.at("cooldown_counter").get<int64_t>();
  h.best_test_accuracy = j.at("best_test_accuracy").get<double>();
  h.last_test_accuracy = j.at("last_test_accuracy").get<double>();
  h.last_test_loss = j.at("last_test_loss").is_null() ? 0.0 : j.at("last_test_loss").get<double>();
  h.epoch_loss_sum = number_or_inf(j.at("epoch_loss_sum"));
  h.epoch_correct = j.at("epoch_correct").get<int64_t>();
  h.epoch_count = j.at("epoch_count").get<int64_t>();
  h.epoch_skipped = j.at("epoch_skipped").get<int64_t>();
  if (j.contains("params")) h.params = j.at("params").get<std::vector<std::string>>();
  h.wall_seconds = j.at("wall_seconds").get<double>();
  h.final_train_loss = number_or_inf(j.at("final_train_loss"));
  h.final_train_accuracy = j.at("final_train_accuracy").get<double>();
  if (j.contains("start_loss") && j.at("start_loss").is_number()) h.start_loss = j.at("start_loss").get<double>();
  if (j.contains("validation") && j.at("validation").is_object()) {
    const json& v = j.at("validation");
    const auto num = [&](const char* k) { return v.contains(k) && v.at(k).is_number() ? v.at(k).get<double>() : 0.0; };
    h.best_val_accuracy = num("best_accuracy");
    h.last_val_accuracy = num("last_accuracy");
    h.last_val_loss = num("last_loss");
    h.es_best = num("es_best");
    h.es_wait = static_cast<int64_t>(num("es_wait"));
    h.stopped_early_epoch = static_cast<int64_t>(num("stopped_early_epoch"));
    h.es_has_best = v.value("es_has_best", false);
    h.early_stopped = v.value("early_stopped", false);
  }
  if (j.contains("target") && j.at("target").is_object()) {
    const json& t = j.at("target");
    const auto num = [&](const char* k, double d) { return t.contains(k) && t.at(k).is_number() ? t.at(k).get<double>() : d; };
    h.target_met = t.value("met", false);
    h.target_epoch = static_cast<int64_t>(num("epoch", 0));
    h.target_step = static_cast<int64_t>(num("step", 0));
    h.target_seconds = num("seconds", 0);
    h.first_step_wall = num("first_step_wall", -1);
  }
  if (j.contains("plateau_guard") && j.at("plateau_guard").is_object()) {
    const json& g = j.at("plateau_guard");
    if (g.contains("best_epoch_train_loss") && g.at("best_epoch_train_loss").is_number())
      h.best_epoch_train_loss = g.at("best_epoch_train_loss").get<double>();
    h.epochs_without_improvement = g.value("epochs_without_improvement", int64_t{0});
  }
  return h;
}

struct SectionRef {
  const char* name;
  const std::vector<float>* data;
};

}  // namespace

void save_checkpoint(const std::string& path, const Checkpoint& c) {
  MPX_CHECK(static_cast<int64_t>(c.master.size()) == c.header.num_params);
  MPX_CHECK(static_cast<int64_t>(c.state.size()) == c.header.num_state);
  std::vector<std::string> names = {"master", "state"};
  std::vector<SectionRef> sections = {{nullptr, &c.master}, {nullptr, &c.state}};
  for (size_t i = 0; i < c.opt.size(); ++i) {
    names.push_back("opt" + std::to_string(i + 1));
    sections.push_back({nullptr, &c.opt[i]});
  }
  if (!c.avg_master.empty() || !c.avg_state.empty()) {
    MPX_CHECK(c.avg_master.size() == c.master.size() && c.avg_state.size() == c.state.size());
    names.insert(names.end(), {"avg_master", "avg_state"});
    sections.push_back({nullptr, &c.avg_master});
    sections.push_back({nullptr, &c.avg_state});
  }
  for (size_t i = 0; i < sections.size(); ++i) sections[i].name = names[i].c_str();

  // The header holds every section's offset, which depends on the header's own
  // length: lay it out with placeholder offsets, then fix them (the width of the
  // offsets can change the length, so iterate until it is stable).
  json j = header_to_json(c.header);
  j["format"] = "mpx checkpoint";
  std::string text;
  uint64_t base = 0;
  for (int iter = 0; iter < 4; ++iter) {
    json secs = json::array();
    uint64_t off = base;
    for (const auto& s : sections) {
      secs.push_back({{"name", s.name},
                      {"offset", off},
                      {"count", s.data->size()},
                      {"crc32", crc32_of(s.data->data(), s.data->size() * sizeof(float))}});
      off += s.data->size() * sizeof(float);
    }
    j["sections"] = secs;
    text = j.dump();
    const uint64_t want = 20 + text.size();
    if (want == base) break;
    base = want;
  }
  MPX_CHECK(base == 20 + text.size());

  std::string head(kMagic, sizeof kMagic);
  put_u32(head, c.header.param_align == 1 ? 1u : kCheckpointVersion);
  put_u32(head, static_cast<uint32_t>(text.size()));
  head += text;
  put_u32(head, crc32_of(text.data(), text.size()));

  write_file_atomic(path, [&](std::FILE* f) {
    auto put = [&](const void* p, size_t n) {
      if (n > 0 && std::fwrite(p, 1, n, f) != n)
        throw IoError("cannot write checkpoint '" + path + "': " + std::strerror(errno));
    };
    put(head.data(), head.size());
    for (const auto& s : sections) put(s.data->data(), s.data->size() * sizeof(float));
  });
}

Checkpoint load_checkpoint(const std::string& path) {
  // Read piece by piece, each piece's size checked against the file size
  // before it is allocated: a damaged length field cannot ask for more memory
  // than the file holds.
  // A FIFO or device would block the open below or stream without a size (docs/inputs.md,
  // "Files that are not regular files"): judged by stat(), which opens nothing.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw DataError(fmt::format("cannot read checkpoint '{}': it is {}, not a regular file", path,
                                file_kind_name(st.st_mode)));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError("cannot open checkpoint '" + path + "': " + std::strerror(errno));
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) throw DataError("cannot read checkpoint '" + path + "': " + ec.message());
  auto corrupt = [&](uint64_t offset, const std::string& what) {
    return DataError(fmt::format("checkpoint '{}' is corrupt at byte offset {}: {} (the file is damaged; "
                                 "use another checkpoint, e.g. best.ckpt, or start a new run)",
                                 path, offset, what));
  };
  auto truncated = [&](uint64_t need, const std::string& what) {
    return DataError(fmt::format("checkpoint '{}' is truncated: it ends at byte offset {} but {} needs {} bytes "
                                 "(an interrupted copy? use another checkpoint, e.g. best.ckpt)",
                                 path, size, what, need));
  };
  auto read_at = [&](uint64_t offset, void* dst, uint64_t n) {
    in.seekg(static_cast<std::streamoff>(offset));
    if (n > 0 && !in.read(static_cast<char*>(dst), static_cast<std::streamsize>(n)))
      throw DataError(fmt::format("cannot read checkpoint '{}' at byte offset {}: {}", path, offset,
                                  errno ? std::strerror(errno) : "the file changed while it was read"));
  };
  if (size < 16) throw truncated(16, "the fixed header");
  unsigned char fixed[16];
  read_at(0, fixed, 16);
  if (std::memcmp(fixed, kMagic, sizeof kMagic) != 0) throw corrupt(0, "no MPXCKPT magic (not an mpx checkpoint)");
  const uint32_t version = get_u32(fixed + 8);
  if (version < 1 || version > kCheckpointVersion)
    throw corrupt(8, fmt::format("format version {} (this mpx reads versions 1 to {})", version, kCheckpointVersion));
  const uint64_t hlen = get_u32(fixed + 12);
  if (size < 20 + hlen) throw truncated(20 + hlen, fmt::format("the header (length {} at byte offset 12)", hlen));
  std::string text(hlen, '\0');
  read_at(16, text.data(), hlen);
  unsigned char crc_bytes[4];
  read_at(16 + hlen, crc_bytes, 4);
  const uint32_t stored_crc = get_u32(crc_bytes);
  if (crc32_of(text.data(), text.size()) != stored_crc)
    throw corrupt(16, fmt::format("the header (bytes 16..{}) fails its CRC32 check", 16 + hlen));

  Checkpoint c;
  json j;
  try {
    j = json::parse(text);
    c.header = header_from_json(j);
  } catch (const json::exception& e) {
    throw corrupt(16, std::string("unreadable header: ") + e.what());
  }
  {
    // Values no writer produces: a damaged or hand-made header that still passes its CRC.
    const CheckpointHeader& h = c.header;
    const char* bad = nullptr;
    if (h.epoch < 0 || h.step_in_epoch < 0 || h.global_step < 0) bad = "a negative epoch or step";
    else if (h.applied_updates < 0 || h.applied_updates > h.global_step) bad = "applied_updates outside [0, global_step]";
    else if (!(h.scaler.scale > 0) || !std::isfinite(h.scaler.scale)) bad = "a loss scale that is not a positive number";
    else if (h.batch_size <= 0 || h.world_size <= 0) bad = "a batch size or world size below 1";
    else if (h.num_params < 0 || h.num_state < 0) bad = "a negative parameter count";
    else if (h.param_align < 1 || h.param_align > 4096) bad = "a param_align outside [1, 4096]";
    else if ((version == 1) != (h.param_align == 1)) bad = "a param_align that does not match the format version";
    else if (h.epoch_count < 0 || h.epoch_correct < 0 || h.epoch_skipped < 0) bad = "negative epoch sums";
    if (bad) throw corrupt(16, fmt::format("the header holds {}", bad));
  }
  if (!j.contains("sections")) throw corrupt(16, "the header does not list the sections (master, state, opt1..optN)");
  const json& secs = j.at("sections");
  if (!secs.is_array() || secs.size() < 2 || secs.size() > 64)
    throw corrupt(16, "the header does not list the sections (master, state, opt1..optN)");
  // train.lookahead's two sections come last, after the optimizer's.
  const auto last_name = [&](size_t back) {
    const json& s = secs[secs.size() - back];
    return s.is_object() && s.contains("name") && s.at("name").is_string() ? s.at("name").get<std::string>() : "";
  };
  const bool avg = secs.size() >= 4 && last_name(2) == "avg_master" && last_name(1) == "avg_state";
  c.opt.resize(secs.size() - 2 - (avg ? 2 : 0));
  std::vector<std::vector<float>*> dst = {&c.master, &c.state};
  std::vector<std::string> names = {"master", "state"};
  for (size_t i = 0; i < c.opt.size(); ++i) {
    dst.push_back(&c.opt[i]);
    names.push_back("opt" + std::to_string(i + 1));
  }
  if (avg) {
    dst.insert(dst.end(), {&c.avg_master, &c.avg_state});
    names.insert(names.end(), {"avg_master", "avg_state"});
  }
  // The section table first, all of it checked against the file size; then the data.
  std::vector<uint64_t> counts(dst.size());
  std::vector<uint32_t> crcs(dst.size());
  uint64_t off = 20 + hlen;
  for (size_t i = 0; i < dst.size(); ++i) {
    const json& s = secs[i];
    uint64_t count = 0, soff = 0;
    try {
      if (s.at("name").get<std::string>() != names[i]) throw corrupt(16, "unexpected section order");
      count = s.at("count").get<uint64_t>();
      soff = s.at("offset").get<uint64_t>();
      crcs[i] = s.at("crc32").get<uint32_t>();
    } catch (const json::exception& e) {
      throw corrupt(16, std::string("unreadable section table: ") + e.what());
    }
    if (soff != off) throw corrupt(16, fmt::format("section '{}' at offset {}, expected {}", names[i], soff, off));
    if (count > size / sizeof(float) || off + count * sizeof(float) > size) {
      const uint64_t room = (std::numeric_limits<uint64_t>::max() - off) / sizeof(float);
      throw truncated(count <= room ? off + count * sizeof(float) : std::numeric_limits<uint64_t>::max(),
                      fmt::format("section '{}' (offset {}, {} float32)", names[i], off, count));
    }
    counts[i] = count;
    off += count * sizeof(float);
  }
  if (off != size) throw corrupt(off, fmt::format("{} unexpected bytes after the last section", size - off));
  off = 20 + hlen;
  for (size_t i = 0; i < dst.size(); ++i) {
    const uint64_t nbytes = counts[i] * sizeof(float);
    dst[i]->resize(counts[i]);
    read_at(off, dst[i]->data(), nbytes);
    if (crc32_of(dst[i]->data(), nbytes) != crcs[i])
      throw corrupt(off, fmt::format("section '{}' (bytes {}..{}) fails its CRC32 check", names[i], off, off + nbytes));
    off += nbytes;
  }
  if (static_cast<int64_t>(c.master.size()) != c.header.num_params ||
      static_cast<int64_t>(c.state.size()) != c.header.num_state ||
      (avg && (c.avg_master.size() != c.master.size() || c.avg_state.size() != c.state.size())))
    throw corrupt(16, "section sizes disagree with num_params/num_state");
  return c;
}

std::string resolve_checkpoint_path(const std::string& arg) {
  std::error_code ec;
  const fs::path p(arg);
  if (fs::is_regular_file(p, ec)) return p.string();
  if (fs::is_directory(p, ec)) {
    if (fs::is_regular_file(p / "checkpoints" / "last.ckpt", ec)) return (p / "checkpoints" / "last.ckpt").string();
    if (fs::is_regular_file(p / "last.ckpt", ec)) return (p / "last.ckpt").string();
    throw ConfigError("--resume '" + arg + "': the folder holds no checkpoints/last.ckpt (is it a run directory? "
                      "one killed before its first checkpoint starts again with --run-dir " + arg + " --overwrite)");
  }
  struct stat st {};
  if (::stat(arg.c_str(), &st) == 0)  // exists, but is neither: a FIFO, a device (never opened)
    throw DataError("--resume '" + arg + "': it is " + file_kind_name(st.st_mode) +
                    ", not a checkpoint file or a run directory");
  throw ConfigError("--resume '" + arg + "': no such file or run directory");
}

}  // namespace mpx
