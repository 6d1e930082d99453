// CpuOps: the Ops interface on the host, each op (op_list.inc) forwarding to its function in this folder.
#include <cblas.h>

#include <memory>
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
  std::unique_ptr<Ops> make_side_ops() const override { return std::make_unique<CpuOps>(CpuOpsOptions{ctx_.threads}); }

#define SHARDTRAIN_OP(R, name, params, args) \
  R name params override { return cpu::name(ctx_, SHARDTRAIN_OP_UNPAREN args); }
#include "shardtrain/ops/op_list.inc"
#undef SHARDTRAIN_OP

  void defer_loss(bool on) override { ctx_.defer_loss = on; }
  LossSums take_loss() override { return std::exchange(ctx_.deferred_total, LossSums{}); }

 private:
  cpu::Context ctx_;
};

}  // namespace

std::unique_ptr<Ops> make_cpu_ops(const CpuOpsOptions& options) { return std::make_unique<CpuOps>(options); }

}  // namespace shardtrain::ops
