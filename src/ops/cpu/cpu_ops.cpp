// CpuOps: the Ops interface on the host, forwarding to the kernels in this folder.
#include <cblas.h>

#include <utility>

#include "kernels.hpp"
#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/runtime/topology.hpp"

namespace shardtrain::ops {
namespace {

class CpuOps final : public Ops {
 public:
  explicit CpuOps(const CpuOpsOptions& options) {
    ctx_.threads = options.threads > 0 ? options.threads : usable_cores();
    openblas_set_num_threads(1);  // the backend splits GEMMs over its own OpenMP threads (gemm.cpp)
  }

  DeviceKind device() const override { return DeviceKind::Cpu; }
  void set_stream(StreamRef) override {}  // the host runs ops in call order
  StreamRef stream() const override { return {}; }

  void matmul(Transpose ta, Transpose tb, double alpha, const Tensor& a, const Tensor& b, double beta,
              const Tensor& c) override {
    cpu::matmul(ctx_, ta, tb, alpha, a, b, beta, c);
  }
  void matmul_add(Transpose ta, Transpose tb, double alpha, const Tensor& a, const Tensor& b, const Tensor& c,
                  const Tensor& out) override {
    cpu::matmul_add(ctx_, ta, tb, alpha, a, b, c, out);
  }
  void fill(const Tensor& out, double value) override { cpu::fill(ctx_, out, value); }
  void copy(const Tensor& src, const Tensor& dst) override { cpu::copy(ctx_, src, dst); }
  void add(const Tensor& x, const Tensor& y) override { cpu::add(ctx_, x, y); }
  void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out) override {
    cpu::embedding_forward(ctx_, ids, table, out);
  }
  void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable) override {
    cpu::embedding_backward(ctx_, ids, dout, dtable);
  }
  void rmsnorm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps, const Tensor& h_out,
                       const Tensor& y, const Tensor& rstd) override {
    cpu::rmsnorm_forward(ctx_, x, residual, weight, eps, h_out, y, rstd);
  }
  void rmsnorm_backward(const Tensor& dy, const Tensor& h, const Tensor& weight, const Tensor& rstd,
                        const Tensor& dh_extra, const Tensor& dh, const Tensor& dweight) override {
    cpu::rmsnorm_backward(ctx_, dy, h, weight, rstd, dh_extra, dh, dweight);
  }
  void rope(const Tensor& x, const Tensor& positions, const RopeFrequencies& freq, RopeDirection direction) override {
    cpu::rope(ctx_, x, positions, freq, direction);
  }
  void rope_qkv_forward(const Tensor& qkv, const Tensor& positions, const RopeFrequencies& freq, const Tensor& q,
                        const Tensor& k, const Tensor& v) override {
    cpu::rope_qkv_forward(ctx_, qkv, positions, freq, q, k, v);
  }
  void rope_qkv_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& positions,
                         const RopeFrequencies& freq, const Tensor& dqkv) override {
    cpu::rope_qkv_backward(ctx_, dq, dk, dv, positions, freq, dqkv);
  }
  void attention_forward(const AttentionShape& shape, const Tensor& q, const Tensor& k, const Tensor& v,
                         const AttentionMask& mask, const Tensor& out, const Tensor& lse) override {
    cpu::attention_forward(ctx_, shape, q, k, v, mask, out, lse);
  }
  void attention_backward(const AttentionShape& shape, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& out, const Tensor& lse, const Tensor& dout, const AttentionMask& mask,
                          const Tensor& dq, const Tensor& dk, const Tensor& dv) override {
    cpu::attention_backward(ctx_, shape, q, k, v, out, lse, dout, mask, dq, dk, dv);
  }
  void attention_segments(const Tensor& input_ids, int32_t pad_token_id, const Tensor& document_ids,
                          const Tensor& segments, const Tensor& positions) override {
    cpu::attention_segments(ctx_, input_ids, pad_token_id, document_ids, segments, positions);
  }
  void swiglu_forward(const Tensor& gate_up, GateUpLayout layout, const Tensor& out) override {
    cpu::swiglu_forward(ctx_, gate_up, layout, out);
  }
  void swiglu_backward(const Tensor& dout, const Tensor& gate_up, GateUpLayout layout, const Tensor& dgate_up) override {
    cpu::swiglu_backward(ctx_, dout, gate_up, layout, dgate_up);
  }
  LossSums cross_entropy(const Tensor& logits, const Tensor& targets, int32_t ignore_index, double grad_scale,
                         const Tensor& dlogits) override {
    return deferred(cpu::cross_entropy(ctx_, logits, targets, ignore_index, grad_scale, dlogits));
  }
  LossSums linear_cross_entropy(const Tensor& h, const Tensor& weight, const Tensor& targets, int32_t ignore_index,
                                double grad_scale, int64_t chunk_tokens, const Tensor& dh,
                                const Tensor& dweight) override {
    return deferred(cpu::linear_cross_entropy(ctx_, h, weight, targets, ignore_index, grad_scale, chunk_tokens, dh, dweight));
  }
  void sum_squares(const Tensor& x, const Tensor& out, SumInto mode) override { cpu::sum_squares(ctx_, x, out, mode); }
  void defer_loss(bool on) override { defer_ = on; }
  LossSums take_loss() override { return std::exchange(total_, LossSums{}); }

 private:
  LossSums deferred(const LossSums& s) {
    if (!defer_) return s;
    total_.loss_sum += s.loss_sum;
    total_.tokens += s.tokens;
    return {};
  }
  cpu::Context ctx_;
  bool defer_ = false;
  LossSums total_;
};

}  // namespace

std::unique_ptr<Ops> make_cpu_ops(const CpuOpsOptions& options) { return std::make_unique<CpuOps>(options); }

}  // namespace shardtrain::ops
