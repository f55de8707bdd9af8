// SPDX-License-Identifier: MIT
// Gradient buckets and the per-step all-reduce (grad_sync.h).
#include "dist/grad_sync.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace mpx {

GradBuckets::GradBuckets(const std::vector<GradRange>& ready_order, size_t min_bytes) : order_(ready_order) {
  last_of_bucket_.assign(order_.size(), -1);
  GradRange cur;
  auto close = [&](size_t last) {
    last_of_bucket_[last] = static_cast<int>(buckets_.size());
    buckets_.push_back(cur);
    cur = GradRange{};
  };
  for (size_t i = 0; i < order_.size(); ++i) {
    const GradRange r = order_[i];
    MPX_CHECK_MSG(r.count > 0 && r.offset >= 0, fmt::format("GradBuckets: empty range at {}", i));
    if (cur.count > 0) {
      const bool adjacent = r.offset + r.count == cur.offset || r.offset == cur.offset + cur.count;
      if (!adjacent) close(i - 1);
    }
    if (cur.count == 0) {
      cur = r;
    } else {
      cur.offset = std::min(cur.offset, r.offset);
      cur.count += r.count;
    }
    if (static_cast<size_t>(cur.count) * sizeof(float) >= min_bytes) close(i);
  }
  if (cur.count > 0) close(order_.size() - 1);
}

int GradBuckets::on_ready(int64_t offset, int64_t count) {
  MPX_CHECK_MSG(next_ < order_.size() && (order_[next_] == GradRange{offset, count}),
                fmt::format("GradBuckets: gradient range [{}, +{}) reported where range #{} of {} was expected", offset,
                            count, next_, order_.size()));
  const int b = last_of_bucket_[next_];
  if (++next_ == order_.size()) next_ = 0;
  return b;
}

std::function<void(int64_t, int64_t)> GradBuckets::hook(
    std::function<void(int index, const GradRange& bucket)> on_bucket) {
  return [this, on_bucket = std::move(on_bucket)](int64_t offset, int64_t count) {
    const int b = on_ready(offset, count);
    if (b >= 0) on_bucket(b, buckets_[static_cast<size_t>(b)]);
  };
}

GradSync::GradSync(Backend& be, Model& model, Communicator* comm, Communicator* device_comm, const DistConfig& cfg)
    : be_(be), model_(model), comm_(comm), device_comm_(device_comm), world_(comm ? comm->world_size() : 1),
      host_grads_(be.info().name == "cpu") {
  if (world_ == 1 || model_.num_params() == 0) return;
  Communicator* c = device_comm_ ? device_comm_ : host_grads_ ? comm_ : nullptr;
  const bool want = cfg.overlap_allreduce == OverlapMode::On ||
                    (cfg.overlap_allreduce == OverlapMode::Auto && device_comm_ != nullptr);
  if (!c || !want) return;
  const size_t bucket = static_cast<size_t>(std::max<int64_t>(4, cfg.bucket_bytes));
  if (device_comm_) device_comm_->set_compute_stream(be_.native_stream());
  overlap_comm_ = c;
  buckets_ = std::make_unique<GradBuckets>(model_.grad_ready_ranges(), bucket);
  float* g = model_.grads().as<float>();
  model_.set_grad_ready_hook(buckets_->hook([this, g](int, const GradRange& b) {
    if (b.offset == 0) fire_before_send();  // before the bucket holding the first gradient leaves
    inflight_.push_back(overlap_comm_->start_all_reduce_sum(g + b.offset, static_cast<size_t>(b.count)));
  }));
  overlap_what_ = fmt::format("{} buckets of at least {} B, all-reduced during the backward pass",
                              buckets_->buckets().size(), bucket);
}

std::string GradSync::path() const {
  if (world_ == 1) return "";
  if (device_comm_) return device_comm_->kind();
  return host_grads_ ? comm_->kind() : comm_->kind() + " through host memory";
}

void GradSync::fire_before_send() {
  if (!armed_) return;
  armed_ = false;
  if (before_send_ && model_.num_params() > 0) before_send_();
}

void GradSync::reduce() {
  const Tensor g = model_.grads();
  if (inflight_.empty()) fire_before_send();
  armed_ = false;
  if (world_ == 1 || g.empty() || g.numel() == 0) return;
  if (buckets_) {
    // The backward pass started every bucket (or, on a rank without records this step, none:
    // start them all now, in the same order, so that the collectives match across ranks).
    if (inflight_.empty())
      for (const GradRange& b : buckets_->buckets())
        inflight_.push_back(overlap_comm_->start_all_reduce_sum(g.as<float>() + b.offset, static_cast<size_t>(b.count)));
    for (Communicator::Handle h : inflight_) overlap_comm_->wait(h);
    inflight_.clear();
    return;
  }
  if (device_comm_) {
    be_.synchronize();
    device_comm_->all_reduce_sum(g);
  } else if (host_grads_) {
    comm_->all_reduce_sum(g);
  } else {
    staging_.resize(static_cast<size_t>(g.numel()));
    be_.download(staging_.data(), g);
    comm_->all_reduce_sum(staging_.data(), staging_.size());
    be_.upload(g, staging_.data());
  }
}

}  // namespace mpx
