// SPDX-License-Identifier: MIT
// Test-set evaluation (evaluate.h).
#include "train/evaluate.h"

#include <algorithm>
#include <cmath>

#include "core/half.h"

namespace mpx {

EvalResult evaluate_model(Backend& be, Model& model, BatchBuffers& bb, const Dataset& ds, Communicator* comm,
                          const EvalProgress& progress) {
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
      for (int64_t r = 0; r < n; ++r) {
        const float* row = host.data() + r * K;
        const int pred = static_cast<int>(std::max_element(row, row + K) - row);
        const int truth = ds.labels[static_cast<size_t>(i + r)];
        if (truth >= 0 && truth < K) confusion[static_cast<size_t>(truth * K + pred)] += 1.0;
      }
    }
    if (progress) progress(i + n - begin, end - begin);
  }
  if (world > 1) {
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
