// The timing ops: an Ops backend that computes nothing and charges every call to the installed timing device
// (runtime/timing_device.hpp) at what an OpCostModel says it costs. With DeviceKind::Cuda a call is a kernel on the
// ops' stream, issued by the host at the device's launch cost; with DeviceKind::Cpu (the CPU backend, synchronous)
// it is host work. Run under the FSDP engine unchanged, they lay out a step's compute in time (`shardtrain predict`).
//
// Losses are zero sums. Where CudaOps reads a loss back (a loss op while losses are not deferred, take_loss), the
// host waits for the stream as it would. Every call throws InternalError when no timing device is installed.
#pragma once

#include <memory>

#include "shardtrain/ops/op_cost.hpp"
#include "shardtrain/ops/ops.hpp"

namespace shardtrain::ops {

// `cost` must outlive the ops and every side ops made from them (make_side_ops: the same device kind and costs).
std::unique_ptr<Ops> make_timing_ops(DeviceKind device, const OpCostModel& cost);

}  // namespace shardtrain::ops
