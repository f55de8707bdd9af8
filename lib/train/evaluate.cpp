// SPDX-License-Identifier: MIT
// Test-set evaluation (evaluate.h).
#include "train/evaluate.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/half.h"

namespace mpx {

std::vector<TtaView> tta_views(TtaMode mode) {
  switch (mode) {
    case TtaMode::None: break;
    case TtaMode::Mirror: return {{0, false, 0.5}, {0, true, 0.5}};
    case TtaMode::MirrorTranslate:  // airbench94's level 2: half the mirror pair, a quarter each shifted pair
      return {{0, false, 0.25}, {0, true, 0.25}, {-1, false, 0.125}, {-1, true, 0.125}, {1, false, 0.125}, {1, true, 0.125}};
  }
  return {{0, false, 1.0}};
}

void tta_apply(const TtaView& v, const uint8_t* src, int H, int W, int C, uint8_t* dst) {
  shift_reflect(src, H, W, C, v.shift, v.shift, v.flip, dst);
}

namespace {

// The sums of this rank's slice (all-reduced over the ranks) as the evaluation's result.
EvalResult eval_result(double loss, double correct, std::vector<double>& confusion, int K, Communicator* comm,
                       const Dataset& ds, const Model& model) {
  if (comm && comm->world_size() > 1) {
    double v[2] = {loss, correct};
    comm->all_reduce_sum(v, 2);
    loss = v[0], correct = v[1];
    comm->all_reduce_sum(confusion.data(), confusion.size());
  }
  EvalResult r;
  r.num_classes = K;
  for (double v : confusion) r.confusion.push_back(static_cast<int64_t>(std::llround(v)));
  r.count = ds.size();
  r.loss = r.count ? loss / static_cast<double>(r.count) : 0.0;
  r.accuracy = r.count ? correct / static_cast<double>(r.count) : 0.0;
  r.policy = policy_name(model.policy());
  return r;
}

// train.tta: every view of a batch through the model, the weighted mean of their logits, and
// the loss, accuracy and confusion of the mean on the host (float64).
EvalResult evaluate_views(Backend& be, Model& model, BatchBuffers& bb, const Dataset& ds, Communicator* comm,
                          const EvalProgress& progress, TtaMode tta, std::vector<float>* logits_out) {
  const std::vector<TtaView> views = tta_views(tta);
  const int K = ds.num_classes;
  std::vector<double> confusion(static_cast<size_t>(K) * static_cast<size_t>(K), 0.0);
  const int64_t B = bb.max_batch, ib = ds.image_bytes();
  const int64_t world = comm ? comm->world_size() : 1, rank = comm ? comm->rank() : 0;
  const int64_t begin = ds.size() * rank / world, end = ds.size() * (rank + 1) / world;
  std::vector<uint8_t> img(static_cast<size_t>(B * ib)), raw;
  std::vector<float> host;
  std::vector<double> mean;
  double loss = 0, correct = 0;
  if (logits_out) logits_out->clear();
  for (int64_t i = begin; i < end; i += B) {
    const int64_t n = std::min(B, end - i);
    const Tensor x = bb.images(n);
    mean.assign(static_cast<size_t>(n * K), 0.0);
    for (const TtaView& v : views) {
      for (int64_t r = 0; r < n; ++r)
        tta_apply(v, ds.images.data() + (i + r) * ib, ds.H, ds.W, ds.C, img.data() + r * ib);
      be.upload(x, img.data());
      const Tensor logits = model.forward(x, false);
      MPX_CHECK(logits.numel() == n * K);
      raw.resize(logits.bytes());
      host.resize(static_cast<size_t>(n * K));
      be.download(raw.data(), logits);
      convert(raw.data(), logits.dtype, host.data(), DType::F32, host.size());
      for (size_t j = 0; j < host.size(); ++j) mean[j] += v.weight * static_cast<double>(host[j]);
    }
    for (int64_t r = 0; r < n; ++r) {
      const double* z = mean.data() + r * K;
      const int truth = ds.labels[static_cast<size_t>(i + r)];
      const int pred = static_cast<int>(std::max_element(z, z + K) - z);
      double mx = z[0], sum = 0;
      for (int k = 1; k < K; ++k) mx = std::max(mx, z[k]);
      for (int k = 0; k < K; ++k) sum += std::exp(z[k] - mx);
      if (truth >= 0 && truth < K) {
        loss += mx + std::log(sum) - z[truth];
        correct += pred == truth ? 1.0 : 0.0;
        confusion[static_cast<size_t>(truth * K + pred)] += 1.0;
      }
      if (logits_out)
        for (int k = 0; k < K; ++k) logits_out->push_back(static_cast<float>(z[k]));
    }
    if (progress) progress(i + n - begin, end - begin);
  }
  return eval_result(loss, correct, confusion, K, comm, ds, model);
}

}  // namespace

EvalResult evaluate_model(Backend& be, Model& model, BatchBuffers& bb, const Dataset& ds, Communicator* comm,
                          const EvalProgress& progress, TtaMode tta, std::vector<float>* logits_out) {
  if (tta != TtaMode::None) return evaluate_views(be, model, bb, ds, comm, progress, tta, logits_out);
  if (logits_out) logits_out->clear();
  double loss = 0, correct = 0;
  const int K = ds.num_classes;
  std::vector<double> confusion(static_cast<size_t>(K) * static_cast<size_t>(K), 0.0);
  std::vector<float> host;
  std::vector<uint8_t> raw;
  const int64_t B = bb.max_batch;
  const int64_t world = comm ? comm->world_size() : 1, rank = comm ? comm->rank() : 0;
  const int64_t begin = ds.size() * rank / world, end = ds.size() * (rank + 1) / world;
  for (int64_t i = begin; i < end; i += B) {
    const int64_t n = std::min(B, end - i);
    const Tensor x = bb.images(n), y = bb.labels(n);
    be.upload(x, ds.images.data() + i * ds.image_bytes());
    be.upload(y, ds.labels.data() + i);
    const Tensor logits = model.forward(x, false);
    be.softmax_cross_entropy(logits, y, 1.0f, bb.loss(), bb.correct(), Tensor());
    float l = 0, c = 0;
    be.download(&l, bb.loss());
    be.download(&c, bb.correct());
    loss += static_cast<double>(l);
    correct += static_cast<double>(c);
    // The predicted classes on the host (n x K logits, in whatever dtype the last layer has).
    if (logits.numel() == n * K) {
      raw.resize(logits.bytes());
      host.resize(static_cast<size_t>(n) * static_cast<size_t>(K));
      be.download(raw.data(), logits);
      convert(raw.data(), logits.dtype, host.data(), DType::F32, host.size());
      if (logits_out) logits_out->insert(logits_out->end(), host.begin(), host.end());
      for (int64_t r = 0; r < n; ++r) {
        const float* row = host.data() + r * K;
        const int pred = static_cast<int>(std::max_element(row, row + K) - row);
        const int truth = ds.labels[static_cast<size_t>(i + r)];
        if (truth >= 0 && truth < K) confusion[static_cast<size_t>(truth * K + pred)] += 1.0;
      }
    }
    if (progress) progress(i + n - begin, end - begin);
  }
  return eval_result(loss, correct, confusion, K, comm, ds, model);
}

std::vector<double> EvalResult::per_class_accuracy() const {
  std::vector<double> acc;
  for (int t = 0; t < num_classes; ++t) {
    int64_t row = 0;
    for (int p = 0; p < num_classes; ++p) row += confusion[static_cast<size_t>(t * num_classes + p)];
    acc.push_back(row > 0 ? static_cast<double>(confusion[static_cast<size_t>(t * num_classes + t)]) /
                                static_cast<double>(row)
                          : std::nan(""));
  }
  return acc;
}

}  // namespace mpx
