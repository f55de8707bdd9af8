// SPDX-License-Identifier: MIT
// `mpx inspect`: one instrumented forward/backward pass, a table and a
// safetensors dump (inspect.h).
#include "commands/inspect.h"

#include <fmt/format.h>
#include <mpx/config.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>

#include "core/error.h"
#include "data/dataset.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "nn/model.h"
#include "train/session.h"
#include "weights/weights.h"

namespace mpx {

namespace {

std::vector<int64_t> dims(const Shape& s) {
  std::vector<int64_t> v;
  for (int i = 0; i < s.rank; ++i) v.push_back(s[i]);
  return v;
}

/// Raw host copy of a device tensor (any dtype), as a safetensors tensor.
StTensor dump_tensor(Backend& be, const std::string& name, const Tensor& t) {
  std::vector<uint8_t> host(t.bytes());
  if (!host.empty()) be.download(host.data(), t);
  return make_st_tensor(name, t.dtype, dims(t.shape), host.data());
}

std::string nonfinite_text(const InspectRow& r, const char* what) {
  return fmt::format("{} ({}): {} {}: {} inf, {} NaN", r.layer, r.type, dtype_name(r.dtype), what, r.stats.n_inf,
                     r.stats.n_nan);
}

}  // namespace

// ---- inspect --------------------------------------------------------------------

InspectResult inspect(const Config& cfg, const InspectOptions& opts) {
  if (opts.batch <= 0) throw ConfigError(fmt::format("inspect: --batch must be positive, got {}", opts.batch));
  if (!opts.weights.empty() && !opts.checkpoint.empty())
    throw ConfigError("inspect: give --weights or --checkpoint, not both");
  Session session(cfg);
  session.start_backend();
  Backend& be = session.backend();
  const LossScaleMode mode = session.loss_scale_mode();
  const double S = mode == LossScaleMode::None ? 1.0 : cfg.loss_scale.initial;
  session.load_data(DataNeed::Test);
  const Dataset& ds = session.test_data();
  if (ds.size() == 0) throw DataError("inspect: the test split is empty");
  const int64_t n = std::min<int64_t>(opts.batch, ds.size());
  const Shape input = session.input_shape();
  std::unique_ptr<Model> model_ptr = session.make_model(n);
  Model& model = *model_ptr;
  model.keep_layer_outputs(true);  // every layer's output goes into the dump

  InspectResult r;
  r.policy = policy_name(session.policy());
  r.device = session.device().device;
  r.n = n;
  r.loss_scale = S;
  r.weights_from = session.init_weights(model, opts.weights, opts.checkpoint);

  const int K = ds.num_classes;
  Buffer xb = be.alloc(static_cast<size_t>(n * ds.image_bytes()), "inspect images");
  Buffer yb = be.alloc(static_cast<size_t>(n) * 4, "inspect labels");
  Buffer sb = be.alloc(16, "inspect loss");
  Buffer db = be.alloc(static_cast<size_t>(n * K) * 4, "inspect logit gradients");
  const Tensor x = xb.view(DType::U8, Shape{n, ds.H, ds.W, ds.C});
  const Tensor y = yb.view(DType::I32, Shape{n});
  const Tensor loss_t(sb.data(), DType::F32, Shape{1});
  const Tensor correct_t(static_cast<char*>(sb.data()) + 4, DType::F32, Shape{1});
  const Tensor dl = db.view(DType::F32, Shape{n, K});
  be.upload(x, ds.images.data());
  be.upload(y, ds.labels.data());

  StFile dump;
  dump.metadata = {{"config", cfg.name},
                   {"policy", r.policy},
                   {"mpx_version", MPX_VERSION},
                   {"batch", std::to_string(n)},
                   {"loss_scale", fmt::format("{}", S)},
                   {"weights", r.weights_from},
                   {"contents",
                    "<layer>/output: activation in its compute dtype; <layer>/input_grad: d(S*loss)/d(layer input) "
                    "as the layer's backward pass produced it; grads/<layer>/<param>: float32 weight gradients "
                    "d(S*loss)/dw in keras layout; eval/logits: inference-mode logits; logits: training-mode logits"}};

  // Inference-mode logits (moving statistics, no dropout), for cross-checks with other frameworks.
  dump.tensors.push_back(dump_tensor(be, "eval/logits", model.forward(x, false)));

  // The instrumented training-mode pass.
  const Tensor logits = model.forward(x, true, cfg.seed, 0);
  be.softmax_cross_entropy(logits, y, static_cast<float>(S), loss_t, correct_t, dl);
  float loss_sum = 0;
  be.download(&loss_sum, loss_t);
  r.loss = static_cast<double>(loss_sum) / static_cast<double>(n);
  model.backward(dl);

  const std::vector<LayerTensors> lt = model.layer_tensors();
  for (const LayerTensors& l : lt) {
    if (l.output.empty()) continue;
    r.forward.push_back({l.name, l.type, "output", l.depth, l.output.dtype, l.output.shape, be.stats(l.output)});
    dump.tensors.push_back(dump_tensor(be, l.name + "/output", l.output));
  }
  for (auto it = lt.rbegin(); it != lt.rend(); ++it) {
    if (it->input_grad.empty()) continue;
    r.backward.push_back(
        {it->name, it->type, "input_grad", it->depth, it->input_grad.dtype, it->input_grad.shape, be.stats(it->input_grad)});
    dump.tensors.push_back(dump_tensor(be, it->name + "/input_grad", it->input_grad));
  }

  // Weight gradients (still scaled by S), keras layout, backward order.
  const std::vector<WeightSlot> slots = weight_slots(model, cfg, input, WeightsLayout::Keras);
  std::vector<float> grads(static_cast<size_t>(model.num_params()));
  if (!grads.empty()) be.download(grads.data(), model.grads());
  std::map<std::string, std::string> type_of;
  std::map<std::string, int> depth_of;
  for (const LayerTensors& l : lt) type_of[l.name] = l.type, depth_of[l.name] = l.depth;
  for (auto it = slots.rbegin(); it != slots.rend(); ++it) {
    const ParamInfo& p = model.params()[it->param];
    if (!p.trainable) continue;
    const Tensor g = model.grads().flat_view(p.offset, p.shape);
    Shape file_shape;  // as in the dump (keras layout)
    file_shape.rank = static_cast<int>(it->shape.size());
    for (int d = 0; d < file_shape.rank; ++d) file_shape[d] = it->shape[static_cast<size_t>(d)];
    r.weight_grads.push_back(
        {p.layer, type_of[p.layer], p.name, depth_of[p.layer], DType::F32, file_shape, be.stats(g)});
    const auto cnt = static_cast<size_t>(p.shape.numel());
    std::vector<float> v(cnt);
    for (size_t i = 0; i < cnt; ++i)
      v[i] = grads[static_cast<size_t>(p.offset) + (it->perm.empty() ? i : static_cast<size_t>(it->perm[i]))];
    dump.tensors.push_back(make_st_tensor("grads/" + it->name, DType::F32, it->shape, v.data()));
  }
  dump.tensors.push_back(dump_tensor(be, "logits", logits));
  dump.tensors.push_back(dump_tensor(be, "labels", y));
  const float loss_f = static_cast<float>(r.loss), scale_f = static_cast<float>(S);
  dump.tensors.push_back(make_st_tensor("loss", DType::F32, {}, &loss_f));
  dump.tensors.push_back(make_st_tensor("loss_scale", DType::F32, {}, &scale_f));

  for (const InspectRow& row : r.forward)
    if (!row.stats.all_finite()) {
      r.first_nonfinite = nonfinite_text(row, "output");
      break;
    }
  if (r.first_nonfinite.empty()) {
    // Backward order: a layer's weight gradients and input gradient come from its own backward pass.
    for (const LayerTensors& l : std::vector<LayerTensors>(lt.rbegin(), lt.rend())) {
      for (const InspectRow& w : r.weight_grads)
        if (w.layer == l.name && !w.stats.all_finite()) {
          r.first_nonfinite = fmt::format("{} ({}): {} gradient: {} inf, {} NaN", w.layer, w.type, w.tensor,
                                          w.stats.n_inf, w.stats.n_nan);
          break;
        }
      if (!r.first_nonfinite.empty()) break;
      for (const InspectRow& b : r.backward)
        if (b.layer == l.name && !b.stats.all_finite()) {
          r.first_nonfinite = nonfinite_text(b, "input gradient");
          break;
        }
      if (!r.first_nonfinite.empty()) break;
    }
  }
  dump.metadata["first_nonfinite"] = r.first_nonfinite;
  if (!opts.out.empty()) write_safetensors(opts.out, dump);
  return r;
}

// ---- the table ------------------------------------------------------------------

std::string format_inspect(const InspectResult& r) {
  using Row = std::array<std::string, 10>;
  const Row head{"layer", "tensor", "dtype", "shape", "min", "max", "mean|x|", "#inf", "#NaN", "#zero"};
  auto cells = [](const InspectRow& x) {
    const TensorStats& s = x.stats;
    const bool any = s.count > s.n_inf + s.n_nan;
    return Row{std::string(static_cast<size_t>(2 * x.depth), ' ') + x.layer + " (" + x.type + ")",
               x.tensor,
               dtype_name(x.dtype),
               x.shape.str(),
               any ? fmt::format("{:.4g}", s.min) : "-",
               any ? fmt::format("{:.4g}", s.max) : "-",
               any ? fmt::format("{:.4g}", s.mean_abs) : "-",
               std::to_string(s.n_inf),
               std::to_string(s.n_nan),
               fmt::format("{} ({:.0f}%)", s.n_zero,
                           s.count ? 100.0 * static_cast<double>(s.n_zero) / static_cast<double>(s.count) : 0.0)};
  };
  std::vector<std::pair<std::string, std::vector<Row>>> sections = {
      {"forward: layer outputs, in execution order", {}},
      {fmt::format("backward: input gradients d(S*loss)/dx, from the loss back (S = {})", r.loss_scale), {}},
      {fmt::format("weight gradients d(S*loss)/dw, float32 (S = {})", r.loss_scale), {}}};
  for (const auto& x : r.forward) sections[0].second.push_back(cells(x));
  for (const auto& x : r.backward) sections[1].second.push_back(cells(x));
  for (const auto& x : r.weight_grads) sections[2].second.push_back(cells(x));
  std::array<size_t, 10> w{};
  for (size_t k = 0; k < w.size(); ++k) w[k] = head[k].size();
  for (const auto& sec : sections)
    for (const Row& row : sec.second)
      for (size_t k = 0; k < w.size(); ++k) w[k] = std::max(w[k], row[k].size());
  auto line = [&](const Row& row) {
    std::string l;
    for (size_t k = 0; k < row.size(); ++k) {
      const bool left = k < 4;
      l += (k ? "  " : " ") + (left ? fmt::format("{:<{}}", row[k], w[k]) : fmt::format("{:>{}}", row[k], w[k]));
    }
    while (!l.empty() && l.back() == ' ') l.pop_back();
    return l + "\n";
  };
  std::string s = fmt::format("inspect: {} test images, policy {}, device {}, weights: {}\n", r.n, r.policy,
                              r.device, r.weights_from);
  for (const auto& sec : sections) {
    s += "\n" + sec.first + "\n" + line(head);
    for (const Row& row : sec.second) s += line(row);
  }
  s += fmt::format("\nloss {:.6g} (mean over {} images), loss scale {}\n", r.loss, r.n, r.loss_scale);
  s += r.first_nonfinite.empty() ? std::string("every activation and gradient is finite\n")
                                 : "first non-finite: " + r.first_nonfinite + "\n";
  return s;
}

}  // namespace mpx
