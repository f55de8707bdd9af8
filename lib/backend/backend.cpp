// SPDX-License-Identifier: MIT
// The non-virtual half of Backend: Buffer ownership, memory accounting, and the
// shape/dtype validation of every public op, done once here so the CPU and CUDA
// implementations (*_impl) never repeat it and cannot drift on it.
#include "backend/backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/error.h"

namespace mpx {

// ---- Buffer ------------------------------------------------------------------

Buffer::~Buffer() { reset(); }

Buffer::Buffer(Buffer&& o) noexcept : backend_(o.backend_), ptr_(o.ptr_), bytes_(o.bytes_) {
  o.backend_ = nullptr;
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    backend_ = o.backend_;
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.backend_ = nullptr;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void Buffer::reset() {
  if (backend_ && ptr_) {
    backend_->free_impl(ptr_);
    backend_->note_free(bytes_);
  }
  backend_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

Tensor Buffer::view(DType t, Shape s) const {
  const size_t need = static_cast<size_t>(s.numel()) * dtype_size(t);
  MPX_CHECK_MSG(need <= bytes_, fmt::format("view {}{} needs {} bytes, the buffer has {}", dtype_name(t), s.str(),
                                            need, bytes_));
  return Tensor(ptr_, t, s);
}

// ---- accounting --------------------------------------------------------------

void Backend::note_alloc(size_t bytes) {
  mem_.current_bytes += bytes;
  mem_.peak_bytes = std::max(mem_.peak_bytes, mem_.current_bytes);
}

void Backend::note_free(size_t bytes) { mem_.current_bytes -= std::min(bytes, mem_.current_bytes); }

// ---- validation helpers --------------------------------------------------------

namespace {

std::string dims(const Tensor& t) { return t.empty() ? std::string("(empty)") : t.str(); }

// Throws with the op name and a message; the tensors' strings go in the message.
#define MPX_VALIDATE(cond, ...) MPX_CHECK_MSG(cond, fmt::format(__VA_ARGS__))

void require_data(const char* op, const char* name, const Tensor& t) {
  MPX_VALIDATE(!t.empty() || t.numel() == 0, "{}: {} {} has no data", op, name, dims(t));
}

void require_float(const char* op, const char* name, const Tensor& t) {
  require_data(op, name, t);
  MPX_VALIDATE(is_float(t.dtype), "{}: {} must be float32, float16 or bfloat16, got {}", op, name, t.str());
}

void require_f32(const char* op, const char* name, const Tensor& t) {
  require_data(op, name, t);
  MPX_VALIDATE(t.dtype == DType::F32, "{}: {} must be float32, got {}", op, name, t.str());
}

void require_rank(const char* op, const char* name, const Tensor& t, int rank) {
  MPX_VALIDATE(t.shape.rank == rank, "{}: {} must have rank {} ({}), got {}", op, name, rank,
               rank == 4 ? "NHWC" : rank == 2 ? "[N, C]" : "vector", t.str());
}

void require_same_dtype(const char* op, const char* an, const Tensor& a, const char* bn, const Tensor& b) {
  MPX_VALIDATE(a.dtype == b.dtype, "{}: {} {} and {} {} must have the same dtype", op, an, a.str(), bn, b.str());
}

void require_same_shape(const char* op, const char* an, const Tensor& a, const char* bn, const Tensor& b) {
  MPX_VALIDATE(a.shape == b.shape, "{}: {} {} and {} {} must have the same shape", op, an, a.str(), bn, b.str());
}

void require_same_numel(const char* op, const char* an, const Tensor& a, const char* bn, const Tensor& b) {
  MPX_VALIDATE(a.numel() == b.numel(), "{}: {} {} and {} {} must have the same number of elements", op, an,
               a.str(), bn, b.str());
}

void require_shape(const char* op, const char* name, const Tensor& t, Shape s) {
  MPX_VALIDATE(t.shape == s, "{}: {} must have shape {}, got {}", op, name, s.str(), t.str());
}

// A vector of C elements: [C] (rank 1).
void require_vector(const char* op, const char* name, const Tensor& t, int64_t c) {
  MPX_VALIDATE(t.numel() == c && t.shape.rank >= 1, "{}: {} must have {} elements ([{}]), got {}", op, name, c, c,
               t.str());
}

// Weight-gradient outputs: float32 or the compute dtype.
void require_grad_dtype(const char* op, const char* name, const Tensor& g, DType compute) {
  MPX_VALIDATE(g.dtype == DType::F32 || g.dtype == compute, "{}: {} must be float32 or {}, got {}", op, name,
               dtype_name(compute), g.str());
}

void check_conv_params(const char* op, const Conv2dParams& p) {
  MPX_VALIDATE(p.R > 0 && p.S > 0 && p.stride_h > 0 && p.stride_w > 0 && p.pad_top >= 0 && p.pad_left >= 0 &&
                   p.pad_bottom >= 0 && p.pad_right >= 0,
               "{}: bad geometry R={} S={} stride={}x{} pad t/l/b/r={}/{}/{}/{}", op, p.R, p.S, p.stride_h,
               p.stride_w, p.pad_top, p.pad_left, p.pad_bottom, p.pad_right);
}

// x [N,H,W,C], w [K,R,S,C], y [N,P,Q,K]: all shapes consistent with p.
void check_conv_shapes(const char* op, const Conv2dParams& p, const Tensor& x, const char* xn, const Tensor& w,
                       const Tensor& y, const char* yn) {
  check_conv_params(op, p);
  require_rank(op, xn, x, 4);
  require_rank(op, "w", w, 4);
  require_rank(op, yn, y, 4);
  MPX_VALIDATE(w.shape[1] == p.R && w.shape[2] == p.S,
               "{}: w {} must be [K, R, S, C] with R={} S={} from the geometry", op, w.str(), p.R, p.S);
  MPX_VALIDATE(x.shape[3] == w.shape[3], "{}: {} {} and w {} disagree on C", op, xn, x.str(), w.str());
  const int P = p.out_h(static_cast<int>(x.shape[1])), Q = p.out_w(static_cast<int>(x.shape[2]));
  MPX_VALIDATE(P > 0 && Q > 0, "{}: {} {} is smaller than the {}x{} filter with this padding", op, xn, x.str(), p.R,
               p.S);
  const Shape ys{x.shape[0], P, Q, w.shape[0]};
  MPX_VALIDATE(y.shape == ys, "{}: {} must be {} for {} and w {} (R={} S={} stride {}x{} pad t/l/b/r {}/{}/{}/{}), got {}",
               op, yn, ys.str(), x.str(), w.str(), p.R, p.S, p.stride_h, p.stride_w, p.pad_top, p.pad_left,
               p.pad_bottom, p.pad_right, y.str());
}

void check_pool_shapes(const char* op, const PoolParams& p, const Tensor& x, const Tensor& y) {
  MPX_VALIDATE(p.R > 0 && p.S > 0 && p.stride_h > 0 && p.stride_w > 0 && p.pad_top >= 0 && p.pad_left >= 0 &&
                   p.pad_bottom >= 0 && p.pad_right >= 0 && p.pad_top < p.R && p.pad_bottom < p.R &&
                   p.pad_left < p.S && p.pad_right < p.S,
               "{}: bad pooling geometry {}x{} stride {}x{} pad t/l/b/r {}/{}/{}/{} (padding must be < window)", op,
               p.R, p.S, p.stride_h, p.stride_w, p.pad_top, p.pad_left, p.pad_bottom, p.pad_right);
  require_rank(op, "x", x, 4);
  require_rank(op, "y", y, 4);
  require_float(op, "x", x);
  require_same_dtype(op, "x", x, "y", y);
  const int P = p.out_h(static_cast<int>(x.shape[1])), Q = p.out_w(static_cast<int>(x.shape[2]));
  const Shape ys{x.shape[0], P, Q, x.shape[3]};
  MPX_VALIDATE(P > 0 && Q > 0 && y.shape == ys, "{}: y must be {} for x {} ({}x{} window, stride {}x{}), got {}",
               op, ys.str(), x.str(), p.R, p.S, p.stride_h, p.stride_w, y.str());
}

// Dense: x [N, Cin] (or any rank with N leading), w [Cout, Cin], y [N, Cout].
void check_dense_shapes(const char* op, const Tensor& x, const char* xn, const Tensor& w, const Tensor& y,
                        const char* yn) {
  require_rank(op, "w", w, 2);
  require_rank(op, yn, y, 2);
  MPX_VALIDATE(x.shape.rank >= 2, "{}: {} must be [N, Cin], got {}", op, xn, x.str());
  const int64_t n = x.shape[0];
  MPX_VALIDATE(n > 0 && x.numel() == n * w.shape[1], "{}: {} {} and w {} disagree on Cin (w is [Cout, Cin])", op,
               xn, x.str(), w.str());
  const Shape ys{n, w.shape[0]};
  MPX_VALIDATE(y.shape == ys, "{}: {} must be {} for {} and w {}, got {}", op, yn, ys.str(), x.str(), w.str(),
               y.str());
}

// The activation's parameter (the backward of leaky_relu from its output needs slope >= 0),
// and the optional pre-activation output of a fused layer: y's dtype and shape, not y itself.
void check_activation(const char* op, Activation act) {
  MPX_VALIDATE(act.kind != ActKind::LeakyRelu || (std::isfinite(act.alpha) && act.alpha >= 0.0f),
               "{}: leaky_relu needs a finite negative slope >= 0, got {}", op, act.alpha);
}
void check_pre(const char* op, const Tensor& pre, const Tensor& y) {
  if (pre.empty()) return;
  require_same_dtype(op, "y", y, "pre", pre);
  require_same_shape(op, "y", y, "pre", pre);
  MPX_VALIDATE(pre.data != y.data, "{}: pre must not alias y", op);
}

void check_bias(const char* op, const Tensor& bias, int64_t k, DType compute) {
  if (bias.empty()) return;
  require_vector(op, "bias", bias, k);
  MPX_VALIDATE(bias.dtype == DType::F32 || bias.dtype == compute, "{}: bias must be float32 or {}, got {}", op,
               dtype_name(compute), bias.str());
}

}  // namespace

// ---- memory ------------------------------------------------------------------

Buffer Backend::alloc(size_t bytes, const char* what) {
  const size_t n = bytes == 0 ? 64 : bytes;
  void* p = alloc_impl(n);
  if (!p) {
    throw OutOfMemoryError(fmt::format("out of {} memory allocating {} bytes ({:.1f} MiB) for {}: {} MiB in use",
                                       info().name, bytes, bytes / 1048576.0, what ? what : "?",
                                       mem_.current_bytes / 1048576));
  }
  note_alloc(n);
  return Buffer(this, p, n);
}

void Backend::upload(const Tensor& dst, const void* host_src) {
  require_data("upload", "dst", dst);
  MPX_VALIDATE(host_src || dst.numel() == 0, "upload: null host pointer for {}", dst.str());
  if (dst.numel() == 0) return;
  upload_impl(dst.data, host_src, dst.bytes());
}

void Backend::download(void* host_dst, const Tensor& src) {
  require_data("download", "src", src);
  MPX_VALIDATE(host_dst || src.numel() == 0, "download: null host pointer for {}", src.str());
  if (src.numel() == 0) return;
  download_impl(host_dst, src.data, src.bytes());
}

void Backend::fill(const Tensor& dst, float value) {
  require_data("fill", "dst", dst);
  if (dst.numel() == 0) return;
  fill_impl(dst, value);
}

void Backend::copy(const Tensor& dst, const Tensor& src) {
  require_data("copy", "dst", dst);
  require_data("copy", "src", src);
  require_same_dtype("copy", "dst", dst, "src", src);
  require_same_numel("copy", "dst", dst, "src", src);
  if (dst.numel() == 0 || dst.data == src.data) return;
  copy_impl(dst, src);
}

// ---- casts and input ---------------------------------------------------------

void Backend::cast(const Tensor& src, const Tensor& dst) {
  require_float("cast", "src", src);
  require_float("cast", "dst", dst);
  require_same_numel("cast", "src", src, "dst", dst);
  if (src.numel() == 0) return;
  cast_impl(src, dst);
}

void Backend::normalize_input(const Tensor& x_u8, const Tensor& mean, const Tensor& std, const Tensor& y) {
  const char* op = "normalize_input";
  require_data(op, "x", x_u8);
  MPX_VALIDATE(x_u8.dtype == DType::U8, "{}: x must be uint8, got {}", op, x_u8.str());
  MPX_VALIDATE(x_u8.shape.rank >= 2, "{}: x must be [N, H, W, C], got {}", op, x_u8.str());
  const int64_t c = x_u8.shape[x_u8.shape.rank - 1];
  require_f32(op, "mean", mean);
  require_f32(op, "std", std);
  require_vector(op, "mean", mean, c);
  require_vector(op, "std", std, c);
  require_float(op, "y", y);
  require_same_numel(op, "x", x_u8, "y", y);
  MPX_VALIDATE(y.shape[0] == x_u8.shape[0], "{}: x {} and y {} disagree on N", op, x_u8.str(), y.str());
  if (y.numel() == 0) return;
  normalize_input_impl(x_u8, mean, std, y);
}

// ---- convolution -------------------------------------------------------------

void Backend::conv2d_forward(const Conv2dParams& p, const Tensor& x, const Tensor& w, const Tensor& bias,
                             const Tensor& y, Activation act, const Tensor& pre) {
  const char* op = "conv2d_forward";
  require_float(op, "x", x);
  require_data(op, "w", w);
  require_data(op, "y", y);
  require_same_dtype(op, "x", x, "w", w);
  require_same_dtype(op, "x", x, "y", y);
  check_conv_shapes(op, p, x, "x", w, y, "y");
  check_bias(op, bias, w.shape[0], x.dtype);
  check_activation(op, act);
  check_pre(op, pre, y);
  if (y.numel() == 0) return;
  conv2d_forward_impl(p, x, w, bias, y, act, pre);
}

void Backend::conv2d_backward_data(const Conv2dParams& p, const Tensor& dy, const Tensor& w, const Tensor& dx) {
  const char* op = "conv2d_backward_data";
  require_float(op, "dy", dy);
  require_data(op, "w", w);
  require_data(op, "dx", dx);
  require_same_dtype(op, "dy", dy, "w", w);
  require_same_dtype(op, "dy", dy, "dx", dx);
  check_conv_shapes(op, p, dx, "dx", w, dy, "dy");
  if (dx.numel() == 0) return;
  conv2d_backward_data_impl(p, dy, w, dx);
}

void Backend::conv2d_backward_filter(const Conv2dParams& p, const Tensor& x, const Tensor& dy, const Tensor& dw,
                                     const Tensor& db) {
  const char* op = "conv2d_backward_filter";
  require_float(op, "x", x);
  require_data(op, "dy", dy);
  require_data(op, "dw", dw);
  require_same_dtype(op, "x", x, "dy", dy);
  require_grad_dtype(op, "dw", dw, x.dtype);
  check_conv_shapes(op, p, x, "x", dw, dy, "dy");
  if (!db.empty()) {
    require_vector(op, "db", db, dw.shape[0]);
    require_grad_dtype(op, "db", db, x.dtype);
  }
  conv2d_backward_filter_impl(p, x, dy, dw, db);
}

// ---- dense -------------------------------------------------------------------

void Backend::dense_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, Activation act,
                            const Tensor& pre) {
  const char* op = "dense_forward";
  require_float(op, "x", x);
  require_data(op, "w", w);
  require_data(op, "y", y);
  require_same_dtype(op, "x", x, "w", w);
  require_same_dtype(op, "x", x, "y", y);
  check_dense_shapes(op, x, "x", w, y, "y");
  check_bias(op, bias, w.shape[0], x.dtype);
  check_activation(op, act);
  check_pre(op, pre, y);
  dense_forward_impl(x, w, bias, y, act, pre);
}

void Backend::dense_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx) {
  const char* op = "dense_backward_data";
  require_float(op, "dy", dy);
  require_data(op, "w", w);
  require_data(op, "dx", dx);
  require_same_dtype(op, "dy", dy, "w", w);
  require_same_dtype(op, "dy", dy, "dx", dx);
  check_dense_shapes(op, dx, "dx", w, dy, "dy");
  dense_backward_data_impl(dy, w, dx);
}

void Backend::dense_backward_weights(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& db) {
  const char* op = "dense_backward_weights";
  require_float(op, "x", x);
  require_data(op, "dy", dy);
  require_data(op, "dw", dw);
  require_same_dtype(op, "x", x, "dy", dy);
  require_grad_dtype(op, "dw", dw, x.dtype);
  check_dense_shapes(op, x, "x", dw, dy, "dy");
  if (!db.empty()) {
    require_vector(op, "db", db, dw.shape[0]);
    require_grad_dtype(op, "db", db, x.dtype);
  }
  dense_backward_weights_impl(x, dy, dw, db);
}

// ---- elementwise -------------------------------------------------------------

void Backend::activation_forward(Activation act, const Tensor& x, const Tensor& y) {
  const char* op = "activation_forward";
  require_float(op, "x", x);
  require_data(op, "y", y);
  require_same_dtype(op, "x", x, "y", y);
  require_same_numel(op, "x", x, "y", y);
  check_activation(op, act);
  if (x.numel() == 0) return;
  activation_forward_impl(act, x, y);
}

void Backend::activation_backward(Activation act, const Tensor& saved, const Tensor& dy, const Tensor& dx) {
  const char* op = "activation_backward";
  require_float(op, "saved", saved);
  require_data(op, "dy", dy);
  require_data(op, "dx", dx);
  require_same_dtype(op, "saved", saved, "dy", dy);
  require_same_dtype(op, "saved", saved, "dx", dx);
  require_same_numel(op, "saved", saved, "dy", dy);
  require_same_numel(op, "saved", saved, "dx", dx);
  check_activation(op, act);
  if (saved.numel() == 0) return;
  activation_backward_impl(act, saved, dy, dx);
}

void Backend::add(const Tensor& a, const Tensor& b, const Tensor& y) {
  const char* op = "add";
  require_float(op, "a", a);
  require_data(op, "b", b);
  require_data(op, "y", y);
  require_same_dtype(op, "a", a, "b", b);
  require_same_dtype(op, "a", a, "y", y);
  require_same_shape(op, "a", a, "b", b);
  require_same_numel(op, "a", a, "y", y);
  if (a.numel() == 0) return;
  add_impl(a, b, y);
}

// ---- pooling -----------------------------------------------------------------

void Backend::pool_forward(const PoolParams& p, const Tensor& x, const Tensor& y) {
  check_pool_shapes("pool_forward", p, x, y);
  if (y.numel() == 0) return;
  pool_forward_impl(p, x, y);
}

void Backend::pool_backward(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                            const Tensor& dx) {
  const char* op = "pool_backward";
  check_pool_shapes(op, p, x, y);
  require_data(op, "dy", dy);
  require_data(op, "dx", dx);
  require_same_dtype(op, "x", x, "dy", dy);
  require_same_dtype(op, "x", x, "dx", dx);
  require_same_shape(op, "y", y, "dy", dy);
  require_same_shape(op, "x", x, "dx", dx);
  if (dx.numel() == 0) return;
  pool_backward_impl(p, x, y, dy, dx);
}

void Backend::global_avg_pool_forward(const Tensor& x, const Tensor& y) {
  const char* op = "global_avg_pool_forward";
  require_float(op, "x", x);
  require_data(op, "y", y);
  require_rank(op, "x", x, 4);
  require_same_dtype(op, "x", x, "y", y);
  require_shape(op, "y", y, Shape{x.shape[0], x.shape[3]});
  MPX_VALIDATE(x.shape[1] * x.shape[2] > 0, "{}: x {} has no pixels", op, x.str());
  if (y.numel() == 0) return;
  global_avg_pool_forward_impl(x, y);
}

void Backend::global_avg_pool_backward(const Tensor& dy, const Tensor& dx) {
  const char* op = "global_avg_pool_backward";
  require_float(op, "dy", dy);
  require_data(op, "dx", dx);
  require_rank(op, "dx", dx, 4);
  require_same_dtype(op, "dy", dy, "dx", dx);
  require_shape(op, "dy", dy, Shape{dx.shape[0], dx.shape[3]});
  MPX_VALIDATE(dx.shape[1] * dx.shape[2] > 0, "{}: dx {} has no pixels", op, dx.str());
  if (dx.numel() == 0) return;
  global_avg_pool_backward_impl(dy, dx);
}

// ---- batch normalization -----------------------------------------------------

namespace {
int64_t bn_channels(const char* op, const Tensor& x) {
  MPX_VALIDATE(x.shape.rank == 4 || x.shape.rank == 2, "{}: x must be [N, H, W, C] or [N, C], got {}", op,
               x.str());
  return x.shape[x.shape.rank - 1];
}
void require_param(const char* op, const char* name, const Tensor& t, int64_t c) {
  require_f32(op, name, t);
  require_vector(op, name, t, c);
}
}  // namespace

void Backend::batch_norm_forward_training(const Tensor& x, const Tensor& gamma, const Tensor& beta, float momentum,
                                          float epsilon, const Tensor& running_mean, const Tensor& running_var,
                                          const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& y) {
  const char* op = "batch_norm_forward_training";
  require_float(op, "x", x);
  const int64_t c = bn_channels(op, x);
  require_param(op, "gamma", gamma, c);
  require_param(op, "beta", beta, c);
  require_param(op, "running_mean", running_mean, c);
  require_param(op, "running_var", running_var, c);
  require_param(op, "saved_mean", saved_mean, c);
  require_param(op, "saved_invstd", saved_invstd, c);
  require_data(op, "y", y);
  require_same_dtype(op, "x", x, "y", y);
  require_same_shape(op, "x", x, "y", y);
  MPX_VALIDATE(epsilon > 0 && momentum >= 0 && momentum <= 1, "{}: epsilon {} must be > 0, momentum {} in [0, 1]",
               op, epsilon, momentum);
  MPX_VALIDATE(x.numel() > 0, "{}: empty batch {}", op, x.str());
  batch_norm_forward_training_impl(x, gamma, beta, momentum, epsilon, running_mean, running_var, saved_mean,
                                   saved_invstd, y);
}

void Backend::batch_norm_forward_inference(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                           const Tensor& running_mean, const Tensor& running_var, float epsilon,
                                           const Tensor& y) {
  const char* op = "batch_norm_forward_inference";
  require_float(op, "x", x);
  const int64_t c = bn_channels(op, x);
  require_param(op, "gamma", gamma, c);
  require_param(op, "beta", beta, c);
  require_param(op, "running_mean", running_mean, c);
  require_param(op, "running_var", running_var, c);
  require_data(op, "y", y);
  require_same_dtype(op, "x", x, "y", y);
  require_same_shape(op, "x", x, "y", y);
  MPX_VALIDATE(epsilon > 0, "{}: epsilon {} must be > 0", op, epsilon);
  if (x.numel() == 0) return;
  batch_norm_forward_inference_impl(x, gamma, beta, running_mean, running_var, epsilon, y);
}

void Backend::batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& saved_mean,
                                  const Tensor& saved_invstd, const Tensor& dx, const Tensor& dgamma,
                                  const Tensor& dbeta) {
  const char* op = "batch_norm_backward";
  require_float(op, "x", x);
  const int64_t c = bn_channels(op, x);
  require_data(op, "dy", dy);
  require_data(op, "dx", dx);
  require_same_dtype(op, "x", x, "dy", dy);
  require_same_dtype(op, "x", x, "dx", dx);
  require_same_shape(op, "x", x, "dy", dy);
  require_same_shape(op, "x", x, "dx", dx);
  require_param(op, "gamma", gamma, c);
  require_param(op, "saved_mean", saved_mean, c);
  require_param(op, "saved_invstd", saved_invstd, c);
  require_param(op, "dgamma", dgamma, c);
  require_param(op, "dbeta", dbeta, c);
  MPX_VALIDATE(x.numel() > 0, "{}: empty batch {}", op, x.str());
  batch_norm_backward_impl(x, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta);
}

// ---- loss --------------------------------------------------------------------

namespace {
/// The arguments of softmax_cross_entropy and its scaled twin.
void require_softmax_args(const char* op, const Tensor& logits, const Tensor& labels, const Tensor& loss_sum_out,
                          const Tensor& correct_out, const Tensor& dlogits) {
  require_f32(op, "logits", logits);
  require_rank(op, "logits", logits, 2);
  require_data(op, "labels", labels);
  MPX_VALIDATE(labels.dtype == DType::I32, "{}: labels must be int32, got {}", op, labels.str());
  MPX_VALIDATE(labels.numel() == logits.shape[0] && labels.shape.rank >= 1,
               "{}: labels {} must have one entry per row of logits {}", op, labels.str(), logits.str());
  MPX_VALIDATE(logits.shape[1] > 0, "{}: logits {} has no classes", op, logits.str());
  require_f32(op, "loss_sum_out", loss_sum_out);
  require_f32(op, "correct_out", correct_out);
  MPX_VALIDATE(loss_sum_out.numel() == 1 && correct_out.numel() == 1,
               "{}: loss_sum_out {} and correct_out {} must be float32 [1]", op, loss_sum_out.str(),
               correct_out.str());
  if (!dlogits.empty()) {
    require_f32(op, "dlogits", dlogits);
    require_same_shape(op, "logits", logits, "dlogits", dlogits);
  }
}
}  // namespace

void Backend::softmax_cross_entropy(const Tensor& logits, const Tensor& labels, float grad_scale,
                                    const Tensor& loss_sum_out, const Tensor& correct_out, const Tensor& dlogits) {
  require_softmax_args("softmax_cross_entropy", logits, labels, loss_sum_out, correct_out, dlogits);
  softmax_cross_entropy_impl(logits, labels, grad_scale, loss_sum_out, correct_out, dlogits);
}

// ---- dropout -----------------------------------------------------------------

void Backend::dropout_forward(const Tensor& x, float rate, uint64_t seed, uint64_t offset, const Tensor& mask,
                              const Tensor& y) {
  const char* op = "dropout_forward";
  require_float(op, "x", x);
  require_data(op, "y", y);
  require_data(op, "mask", mask);
  require_same_dtype(op, "x", x, "y", y);
  require_same_numel(op, "x", x, "y", y);
  require_same_numel(op, "x", x, "mask", mask);
  MPX_VALIDATE(mask.dtype == DType::U8, "{}: mask must be uint8, got {}", op, mask.str());
  MPX_VALIDATE(rate >= 0.0f && rate < 1.0f, "{}: rate {} must be in [0, 1)", op, rate);
  if (x.numel() == 0) return;
  dropout_forward_impl(x, rate, seed, offset, mask, y);
}

void Backend::dropout_backward(const Tensor& dy, const Tensor& mask, float rate, const Tensor& dx) {
  const char* op = "dropout_backward";
  require_float(op, "dy", dy);
  require_data(op, "dx", dx);
  require_data(op, "mask", mask);
  require_same_dtype(op, "dy", dy, "dx", dx);
  require_same_numel(op, "dy", dy, "dx", dx);
  require_same_numel(op, "dy", dy, "mask", mask);
  MPX_VALIDATE(mask.dtype == DType::U8, "{}: mask must be uint8, got {}", op, mask.str());
  MPX_VALIDATE(rate >= 0.0f && rate < 1.0f, "{}: rate {} must be in [0, 1)", op, rate);
  if (dy.numel() == 0) return;
  dropout_backward_impl(dy, mask, rate, dx);
}

// ---- fused mixed-precision passes --------------------------------------------

bool Backend::unscale_and_check(const Tensor& grads, float inv_scale) {
  require_f32("unscale_and_check", "grads", grads);
  if (grads.numel() == 0) return true;
  return unscale_and_check_impl(grads, inv_scale);
}

namespace {
/// The arena arguments of optimizer_step and its device-state twin.
void require_optimizer_args(const char* op, const OptimizerStep& s, const Tensor& master, const Tensor& grads,
                            const Tensor& state1, const Tensor& state2, const Tensor& compute_copy) {
  require_f32(op, "master", master);
  require_f32(op, "grads", grads);
  require_same_numel(op, "master", master, "grads", grads);
  const bool sgd = s.kind == OptimizerStep::Kind::Sgd;
  if (!sgd || s.momentum != 0.0f || !state1.empty()) {
    MPX_VALIDATE(!state1.empty(), "{}: state1 is required ({})", op,
                 sgd ? "SGD with momentum" : "Adam first moment");
    require_f32(op, "state1", state1);
    require_same_numel(op, "master", master, "state1", state1);
  }
  if (!sgd) {
    MPX_VALIDATE(!state2.empty(), "{}: state2 (Adam second moment) is required", op);
    require_f32(op, "state2", state2);
    require_same_numel(op, "master", master, "state2", state2);
  }
  if (!compute_copy.empty()) {
    MPX_VALIDATE(is_float(compute_copy.dtype), "{}: compute_copy must be a float dtype, got {}", op,
                 compute_copy.str());
    require_same_numel(op, "master", master, "compute_copy", compute_copy);
  }
}
}  // namespace

void Backend::optimizer_step(const OptimizerStep& s, const Tensor& master, const Tensor& grads,
                             const Tensor& state1, const Tensor& state2, const Tensor& compute_copy) {
  const char* op = "optimizer_step";
  require_optimizer_args(op, s, master, grads, state1, state2, compute_copy);
  if (s.kind != OptimizerStep::Kind::Sgd) {
    MPX_VALIDATE(s.t >= 1, "{}: Adam step t={} must be >= 1", op, s.t);
  }
  if (master.numel() == 0) return;
  optimizer_step_impl(s, master, grads, state1, state2, compute_copy);
}

// ---- the step without host synchronisation -------------------------------------

namespace {
void require_step_state(const char* op, const Tensor& state) {
  require_data(op, "state", state);
  MPX_VALIDATE(state.bytes() >= sizeof(StepState), "{}: state {} must hold a StepState ({} bytes)", op,
               state.str(), sizeof(StepState));
  MPX_VALIDATE(reinterpret_cast<uintptr_t>(state.data) % 8 == 0, "{}: state must be 8-byte aligned", op);
}
void require_scalar_f32(const char* op, const char* name, const Tensor& t) {
  require_f32(op, name, t);
  MPX_VALIDATE(t.numel() == 1, "{}: {} {} must be float32 [1]", op, name, t.str());
}
}  // namespace

void Backend::softmax_cross_entropy_scaled(const Tensor& logits, const Tensor& labels, const Tensor& state,
                                           double weight, const Tensor& loss_sum_out, const Tensor& correct_out,
                                           const Tensor& dlogits) {
  const char* op = "softmax_cross_entropy_scaled";
  require_step_state(op, state);
  MPX_VALIDATE(std::isfinite(weight) && weight > 0, "{}: weight {} must be positive and finite", op, weight);
  MPX_VALIDATE(!dlogits.empty(), "{}: dlogits is required", op);
  require_softmax_args(op, logits, labels, loss_sum_out, correct_out, dlogits);
  softmax_cross_entropy_scaled_impl(logits, labels, state, weight, loss_sum_out, correct_out, dlogits);
}

void Backend::unscale_and_check_state(const Tensor& grads, const Tensor& loss_sum, const Tensor& state, int world) {
  const char* op = "unscale_and_check_state";
  require_step_state(op, state);
  require_scalar_f32(op, "loss_sum", loss_sum);
  MPX_VALIDATE(world >= 1, "{}: world {} must be >= 1", op, world);
  if (!grads.empty()) require_f32(op, "grads", grads);
  unscale_and_check_state_impl(grads, loss_sum, state, world);
}

void Backend::optimizer_step_state(const OptimizerStep& s, const Tensor& master, const Tensor& grads,
                                   const Tensor& state1, const Tensor& state2, const Tensor& compute_copy,
                                   const Tensor& state, const Tensor& lr_dev) {
  const char* op = "optimizer_step_state";
  require_step_state(op, state);
  require_scalar_f32(op, "lr", lr_dev);
  require_optimizer_args(op, s, master, grads, state1, state2, compute_copy);
  MPX_VALIDATE(compute_copy.empty() || is_16bit(compute_copy.dtype), "{}: compute_copy must be 16-bit, got {}", op,
               compute_copy.str());
  if (master.numel() == 0) return;
  optimizer_step_state_impl(s, master, grads, state1, state2, compute_copy, state, lr_dev);
}

void Backend::loss_scale_update_state(const Tensor& state, const LossScaleRule& rule, const Tensor& loss_sum,
                                      const Tensor& correct, int64_t n) {
  const char* op = "loss_scale_update_state";
  require_step_state(op, state);
  require_scalar_f32(op, "loss_sum", loss_sum);
  require_scalar_f32(op, "correct", correct);
  MPX_VALIDATE(n >= 0, "{}: n {} must be >= 0", op, n);
  MPX_VALIDATE(rule.growth_interval >= 1 && rule.growth_factor >= 1.0 && rule.backoff_factor > 0.0 &&
                   rule.backoff_factor <= 1.0 && rule.min_scale > 0.0,
               "{}: invalid rule (growth_interval {}, growth_factor {}, backoff_factor {}, min_scale {})", op,
               rule.growth_interval, rule.growth_factor, rule.backoff_factor, rule.min_scale);
  loss_scale_update_state_impl(state, rule, loss_sum, correct, n);
}

void* Backend::staging(int slot, size_t bytes) {
  MPX_VALIDATE(slot == 0 || slot == 1, "staging: slot {} must be 0 or 1", slot);
  return staging_impl(slot, bytes);
}

void Backend::upload_staged(int slot, void* dst, size_t offset, size_t bytes) {
  MPX_VALIDATE(slot == 0 || slot == 1, "upload_staged: slot {} must be 0 or 1", slot);
  MPX_VALIDATE(dst != nullptr || bytes == 0, "upload_staged: null destination");
  if (bytes == 0) return;
  upload_staged_impl(slot, dst, offset, bytes);
}

void Backend::release_staged(int slot) {
  MPX_VALIDATE(slot == 0 || slot == 1, "release_staged: slot {} must be 0 or 1", slot);
  release_staged_impl(slot);
}

bool Backend::graph_begin_capture() { return supports_graphs() && graph_begin_capture_impl(); }

int Backend::graph_end_capture() { return graph_end_capture_impl(); }

void Backend::graph_launch(int id) {
  MPX_VALIDATE(id >= 0, "graph_launch: no graph {}", id);
  graph_launch_impl(id);
}

// ---- reductions --------------------------------------------------------------

TensorStats Backend::stats(const Tensor& x) {
  require_float("stats", "x", x);
  if (x.numel() == 0) return TensorStats{};
  return stats_impl(x);
}

}  // namespace mpx
