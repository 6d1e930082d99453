// Sizes and places the activation buffers of one micro-batch shape (see activation_plan.hpp).
#include "shardtrain/model/activation_plan.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "shardtrain/ops/host_buffer.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::model {

ActivationPlan::ActivationPlan(const LlamaConfig& c, int64_t batch, int64_t seq, DType dtype, Checkpointing checkpointing)
    : batch_(batch), seq_(seq), checkpointing_(checkpointing) {
  // The widest buffer's bytes, times the buffers a layer keeps and the layers, estimated in floating point first: the
  // int64 products below wrap past 2^63 (plan once printed 12884901888 GiB for 3.9e14). No machine holds an exabyte.
  const long double widest = static_cast<long double>(std::max({c.hidden_size, c.intermediate_size * 2, c.kv_dim()})) *
                             static_cast<long double>(batch) * static_cast<long double>(seq) * dtype_size(DType::F64);
  if (widest * (16.0L * (c.num_hidden_layers + 1) + 16.0L) > 0x1p60L)
    throw ConfigError(
        fmt::format("a micro-batch of {} x {} tokens needs more than an exabyte (2^60 bytes) of activations for this model: "
                    "expected a smaller micro-batch or sequence",
                    batch, seq));
  const int64_t n = batch * seq, d = c.hidden_size, f = c.intermediate_size, kv = c.kv_dim();
  const DType stats = dtype == DType::F64 ? DType::F64 : DType::F32;
  const auto layers = static_cast<size_t>(c.num_hidden_layers);
  token_shape_ = {n, d};
  kv_shape_ = {n, kv};
  mlp_shape_ = {n, f};
  lse_shape_ = {batch, c.num_attention_heads, seq};
  row_shape_ = {n};
  hidden.resize(layers + 1);
  this->layers.resize(layers);
  add("segments", &segments, DType::I32, {batch, seq});
  add("positions", &positions, DType::I32, {batch, seq});
  for (size_t l = 0; l <= layers; ++l) {
    // hidden[l + 1] is layer l's output: read by layer l + 1's backward, rewritten by layer l's recompute under
    // checkpointing; either way dead once layer l's backward is done. hidden[0], the embedding's output: layer 0's.
    if (layers > 0) freed_.push_back({static_cast<int>(l == 0 ? 0 : l - 1), bytes_, 0});
    add(fmt::format("hidden[{}]", l), &hidden[l], dtype, {n, d});
    if (layers > 0) freed_.back().bytes = bytes_ - freed_.back().offset;
  }
  if (checkpointing == Checkpointing::PerLayer) {
    const size_t begin = bytes_;
    add_layer("recompute.", shared_, dtype, stats);
    freed_.push_back({0, begin, bytes_ - begin});
  } else {
    for (size_t l = 0; l < layers; ++l) {
      const size_t begin = bytes_;
      add_layer(fmt::format("layers[{}].", l), this->layers[l], dtype, stats);
      freed_.push_back({static_cast<int>(l), begin, bytes_ - begin});
    }
  }
  add("final_norm", &final_norm, dtype, {n, d});
  add("final_rstd", &final_rstd, stats, {n});
  Workspace& w = work;
  add("work.attn_out", &w.attn_out, dtype, {n, d});
  add("work.grad_hidden[0]", &w.grad_hidden[0], dtype, {n, d});
  add("work.grad_hidden[1]", &w.grad_hidden[1], dtype, {n, d});
  add("work.dh", &w.dh, dtype, {n, d});
  add("work.dn", &w.dn, dtype, {n, d});
  add("work.dattn", &w.dattn, dtype, {n, d});
  add("work.dq", &w.dq, dtype, {n, d});
  add("work.dk", &w.dk, dtype, {n, kv});
  add("work.dv", &w.dv, dtype, {n, kv});
  const int64_t qkv_cols = d + 2 * kv;
  add("work.dact", &w.dact, dtype, {n, f}, static_cast<size_t>(n * std::max(f, qkv_cols)) * dtype_size(dtype));
  share_last("work.qkv", &w.qkv, dtype, {n, qkv_cols});
}

void ActivationPlan::add_layer(const std::string& p, LayerActivations& a, DType dtype, DType stats) {
  add(p + "n1", &a.n1, dtype, token_shape_);
  add(p + "rstd1", &a.rstd1, stats, row_shape_);
  add(p + "q", &a.q, dtype, token_shape_);
  add(p + "k", &a.k, dtype, kv_shape_);
  add(p + "v", &a.v, dtype, kv_shape_);
  add(p + "attn", &a.attn, dtype, token_shape_);
  add(p + "lse", &a.lse, stats, lse_shape_);
  add(p + "h", &a.h, dtype, token_shape_);
  add(p + "n2", &a.n2, dtype, token_shape_);
  add(p + "rstd2", &a.rstd2, stats, row_shape_);
  add(p + "gate_up", &a.gate_up, dtype, {mlp_shape_[0], 2 * mlp_shape_[1]});
  add(p + "act", &a.act, dtype, mlp_shape_);
}

void ActivationPlan::add(std::string name, ops::Tensor* view, DType dtype, ops::Shape shape, size_t reserve) {
  view->dtype = dtype;
  view->shape = shape;
  view->device = DeviceKind::Cpu;
  view->data = nullptr;
  entries_.push_back(Entry{std::move(name), view, bytes_});
  const size_t a = kAlignment;
  bytes_ += (std::max(view->bytes(), reserve) + a - 1) / a * a;
}

void ActivationPlan::share_last(std::string name, ops::Tensor* view, DType dtype, ops::Shape shape) {
  view->dtype = dtype;
  view->shape = shape;
  view->device = DeviceKind::Cpu;
  view->data = nullptr;
  const size_t at = entries_.back().offset;
  if (at + view->bytes() > bytes_)
    throw InternalError(
        fmt::format("activation plan: {} ({} B) does not fit in {}", name, view->bytes(), entries_.back().name));
  shared_views_.push_back(Entry{std::move(name), view, at});
}

void ActivationPlan::place(void* base, DeviceKind device) {
  for (std::vector<Entry>* list : {&entries_, &shared_views_}) {
    for (Entry& e : *list) {
      e.view->data = static_cast<char*>(base) + e.offset;
      e.view->device = device;
    }
  }
  if (checkpointing_ == Checkpointing::PerLayer)
    for (LayerActivations& a : layers) a = shared_;
}

std::string ActivationPlan::describe() const {
  std::string s = fmt::format("activation plan for batch {} x seq {}: {:.2f} MiB\n", batch_, seq_,
                              static_cast<double>(bytes_) / (1 << 20));
  for (const Entry& e : entries_)
    s += fmt::format("  {:<24} {:<5} {:<18} {:>12} B\n", e.name, dtype_name(e.view->dtype), e.view->shape.str(),
                     e.view->bytes());
  for (const Entry& e : shared_views_) {
    const auto owner = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& o) { return o.offset == e.offset; });
    s += fmt::format("  {:<24} {:<5} {:<18} {:>12} B, in {}'s memory\n", e.name, dtype_name(e.view->dtype),
                     e.view->shape.str(), e.view->bytes(), owner->name);
  }
  return s;
}

}  // namespace shardtrain::model
