// SPDX-License-Identifier: MIT
// Parameter <-> safetensors mapping in the Keras and PyTorch layouts (table in
// weights.h): names, transposes and the flatten column reordering.
#include "weights/weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"

namespace mpx {

const char* weights_layout_name(WeightsLayout l) { return l == WeightsLayout::Keras ? "keras" : "pytorch"; }

std::optional<WeightsLayout> parse_weights_layout(const std::string& s) {
  if (s == "keras") return WeightsLayout::Keras;
  if (s == "pytorch") return WeightsLayout::PyTorch;
  return std::nullopt;
}

namespace {

std::vector<int64_t> dims(const Shape& s) {
  std::vector<int64_t> v;
  for (int i = 0; i < s.rank; ++i) v.push_back(s[i]);
  return v;
}

/// Records, for every dense and batch_norm layer fed (through elementwise layers
/// only) by a flatten of an [H, W, C] map with H*W > 1, that map's shape.
void find_flatten_origins(const std::vector<LayerConfig>& layers, Shape cur, std::optional<Shape> origin,
                          const std::map<std::string, Shape>& out_shapes, std::map<std::string, Shape>& rec,
                          std::optional<Shape>* origin_after = nullptr) {
  for (const LayerConfig& L : layers) {
    const auto it = out_shapes.find(L.name);
    if (it == out_shapes.end()) break;  // not built (cannot happen for a built model)
    const Shape out = it->second;
    using T = LayerType;
    const T t = L.type;
    if (t == T::Flatten) {
      if (cur.rank == 3) origin = cur[0] * cur[1] > 1 ? std::optional<Shape>(cur) : std::nullopt;
    } else if (t == T::Dense) {
      if (origin) rec[L.name] = *origin;
      origin.reset();
    } else if (t == T::BatchNorm) {
      if (origin && cur.rank == 1) rec[L.name] = *origin;
    } else if (t == T::Residual) {
      std::optional<Shape> inner;
      find_flatten_origins(L.layers, cur, origin, out_shapes, rec, &inner);
      // The sum keeps the order only when the branch did not reorder (no dense inside).
      if (!(out == cur && inner == origin)) origin.reset();
    } else if (t != T::Dropout && t != T::Activation) {
      origin.reset();
    }
    cur = out;
  }
  if (origin_after) *origin_after = origin;
}

/// The file tensor of a parameter of shape `s` with its axes reordered: file axis i is the
/// parameter's axis axes[i]. Sets the slot's shape and perm (file element -> parameter element).
void transpose(const Shape& s, const std::vector<int>& axes, WeightSlot& slot) {
  MPX_CHECK(static_cast<int>(axes.size()) == s.rank);
  std::vector<int64_t> stride(axes.size(), 1);  // of the parameter, row-major
  for (int i = s.rank - 2; i >= 0; --i) stride[static_cast<size_t>(i)] = stride[static_cast<size_t>(i) + 1] * s[i + 1];
  slot.shape.clear();
  for (int a : axes) slot.shape.push_back(s[a]);
  slot.perm.assign(static_cast<size_t>(s.numel()), 0);
  std::vector<int64_t> idx(axes.size(), 0);  // the file's index, row-major
  for (int64_t& to : slot.perm) {
    for (size_t i = 0; i < axes.size(); ++i) to += idx[i] * stride[static_cast<size_t>(axes[i])];
    for (size_t i = axes.size(); i-- > 0;) {
      if (++idx[i] < slot.shape[i]) break;
      idx[i] = 0;
    }
  }
}

/// The file tensor of a parameter of ExportLayout::Permuted: its elements viewed as a.view,
/// transposed by a.perm (the layer's declaration, nn/model.h).
void transpose_view(const ParamInfo& p, const ExportAxes& a, WeightSlot& slot) {
  MPX_CHECK_MSG(a.view.numel() == p.shape.numel() && static_cast<int>(a.perm.size()) == a.view.rank,
                fmt::format("{}/{}: its export view {} does not fit its shape {}", p.layer, p.name, a.view.str(),
                            p.shape.str()));
  transpose(a.view, a.perm, slot);
}

/// model column i (h, w, c order) of file column j (c, h, w order) for an [H, W, C] map.
int64_t nhwc_of_nchw(int64_t j, const Shape& o) {
  const int64_t H = o[0], W = o[1], C = o[2];
  const int64_t c = j / (H * W), h = (j / W) % H, w = j % W;
  return (h * W + w) * C + c;
}

}  // namespace

std::vector<WeightSlot> weight_slots(const Model& m, const Config& cfg, const Shape& input, WeightsLayout layout) {
  std::map<std::string, Shape> out_shapes;
  for (const LayerInfo& li : m.layer_infos()) out_shapes[li.name] = li.output_shape;
  std::map<std::string, Shape> origins;
  if (layout == WeightsLayout::PyTorch) find_flatten_origins(cfg.model.layers, input, std::nullopt, out_shapes, origins);

  // Each parameter's layout is the one its layer declared (ParamInfo::layout, nn/model.h).
  using L = ExportLayout;
  std::vector<WeightSlot> slots;
  const std::vector<ParamInfo>& ps = m.params();
  for (size_t i = 0; i < ps.size(); ++i) {
    const ParamInfo& p = ps[i];
    WeightSlot s;
    s.param = i;
    s.shape = dims(p.shape);
    const auto org = origins.find(p.layer);
    if (layout == WeightsLayout::Keras) {
      s.name = p.layer + "/" + p.name;
      if (p.layout == L::ConvKernel)
        transpose(p.shape, {1, 2, 3, 0}, s);  // [K, R, S, C] -> [R, S, C, K]
      else if (p.layout == L::DenseKernel)
        transpose(p.shape, {1, 0}, s);  // [Cout, Cin] -> [Cin, Cout]
      else if (p.layout == L::Permuted)
        transpose_view(p, p.keras_axes, s);
    } else {
      s.name = p.layer + "." + p.torch_name;
      if (p.layout == L::ConvKernel) {
        transpose(p.shape, {0, 3, 1, 2}, s);  // [K, R, S, C] -> [K, C, R, S]
      } else if (p.layout == L::Permuted) {
        transpose_view(p, p.torch_axes, s);
      } else if (p.layout == L::DenseKernel && org != origins.end()) {  // reorder input columns
        MPX_CHECK(p.shape.rank == 2);
        const int64_t O = p.shape[0], I = p.shape[1];
        MPX_CHECK(I == org->second.numel());
        s.perm.resize(static_cast<size_t>(p.shape.numel()));
        for (int64_t o = 0; o < O; ++o)
          for (int64_t j = 0; j < I; ++j) s.perm[static_cast<size_t>(o * I + j)] = o * I + nhwc_of_nchw(j, org->second);
      } else if (p.layout == L::InputFeatures && org != origins.end()) {
        const int64_t n = p.shape.numel();
        MPX_CHECK(n == org->second.numel());
        s.perm.resize(static_cast<size_t>(n));
        for (int64_t j = 0; j < n; ++j) s.perm[static_cast<size_t>(j)] = nhwc_of_nchw(j, org->second);
      }
    }
    slots.push_back(std::move(s));
  }
  return slots;
}

// ---- export ---------------------------------------------------------------------

StFile export_weights(const Model& m, Backend& be, const Config& cfg, const Shape& input, WeightsLayout layout,
                      std::map<std::string, std::string> metadata) {
  std::vector<float> master(static_cast<size_t>(m.num_params())), state(static_cast<size_t>(m.num_state()));
  if (m.num_params() > 0) be.download(master.data(), m.master());
  if (m.num_state() > 0) be.download(state.data(), m.state());
  StFile f;
  f.metadata = std::move(metadata);
  f.metadata["layout"] = weights_layout_name(layout);
  for (const WeightSlot& s : weight_slots(m, cfg, input, layout)) {
    const ParamInfo& p = m.params()[s.param];
    const float* src = (p.trainable ? master.data() : state.data()) + p.offset;
    const auto n = static_cast<size_t>(p.shape.numel());
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = s.perm.empty() ? src[i] : src[s.perm[i]];
    f.tensors.push_back(make_st_tensor(s.name, DType::F32, s.shape, v.data()));
  }
  return f;
}

// ---- import ---------------------------------------------------------------------

namespace {

WeightsLayout detect_layout(const StFile& f, const std::string& source) {
  const auto it = f.metadata.find("layout");
  if (it != f.metadata.end()) {
    if (auto l = parse_weights_layout(it->second)) return *l;
    throw ConfigError(fmt::format("{}: __metadata__ layout '{}' is neither keras nor pytorch", source, it->second));
  }
  for (const StTensor& t : f.tensors)
    if (t.name.find('/') != std::string::npos) return WeightsLayout::Keras;
  for (const StTensor& t : f.tensors) {
    const std::string& n = t.name;
    for (const char* suffix : {".weight", ".bias", ".running_mean", ".running_var"}) {
      const size_t k = std::char_traits<char>::length(suffix);
      if (n.size() > k && n.compare(n.size() - k, k, suffix) == 0) return WeightsLayout::PyTorch;
    }
  }
  return WeightsLayout::Keras;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

WeightsLayout import_weights(Model& m, Backend& be, const Config& cfg, const Shape& input, const StFile& f,
                             const std::string& source) {
  const WeightsLayout layout = detect_layout(f, source);
  const std::vector<WeightSlot> slots = weight_slots(m, cfg, input, layout);
  std::map<std::string, const StTensor*> by_name;
  for (const StTensor& t : f.tensors) by_name[t.name] = &t;

  std::vector<float> master(static_cast<size_t>(m.num_params())), state(static_cast<size_t>(m.num_state()));
  std::set<std::string> used;
  for (const WeightSlot& s : slots) {
    const ParamInfo& p = m.params()[s.param];
    const auto it = by_name.find(s.name);
    if (it == by_name.end())
      throw ConfigError(fmt::format(
          "{}: tensor '{}' (layer '{}', {} {}) is missing; the file ({} layout, {} tensors) does not fit the model "
          "of config '{}'",
          source, s.name, p.layer, p.name, shape_str(s.shape), weights_layout_name(layout), f.tensors.size(),
          cfg.name));
    const StTensor& t = *it->second;
    if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16")
      throw ConfigError(fmt::format("{}: tensor '{}' has dtype {}; weights must be F32, F16 or BF16", source, s.name,
                                    t.dtype));
    if (t.shape != s.shape)
      throw ConfigError(fmt::format("{}: tensor '{}' has shape {} in the file, the model (config '{}', {} layout) "
                                    "expects {}",
                                    source, s.name, shape_str(t.shape), cfg.name, weights_layout_name(layout),
                                    shape_str(s.shape)));
    const std::vector<float> v = st_to_float32(t, source);
    float* dst = (p.trainable ? master.data() : state.data()) + p.offset;
    for (size_t i = 0; i < v.size(); ++i) dst[s.perm.empty() ? i : static_cast<size_t>(s.perm[i])] = v[i];
    used.insert(s.name);
  }
  for (const StTensor& t : f.tensors) {
    if (used.count(t.name)) continue;
    if (layout == WeightsLayout::PyTorch && ends_with(t.name, ".num_batches_tracked")) continue;
    throw ConfigError(fmt::format("{}: tensor '{}' ({} {}) is not a parameter of the model of config '{}' ({} "
                                  "layout); the file was written for another architecture",
                                  source, t.name, t.dtype, shape_str(t.shape), cfg.name, weights_layout_name(layout)));
  }
  if (m.num_params() > 0) be.upload(m.master(), master.data());
  if (m.num_state() > 0) be.upload(m.state(), state.data());
  m.refresh_compute_copy();
  return layout;
}

WeightsLayout import_weights(Model& m, Backend& be, const Config& cfg, const Shape& input, const std::string& path) {
  return import_weights(m, be, cfg, input, read_safetensors(path), path);
}

}  // namespace mpx
