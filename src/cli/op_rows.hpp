// The rows of `bench ops`: every op a Llama training step runs, at a model's shapes, each a function that is timed on a
// backend or run once through a recorder of op calls (record mode: which calls, with which keys, each row makes).
// `bench ops` (cmd_bench_ops.cpp) times them; the profile loader (op_profile.cpp) records them to key older profiles.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/model/config.hpp"
#include "shardtrain/ops/op_calls.hpp"
#include "shardtrain/ops/peak.hpp"

namespace shardtrain::cli {

enum class WorkKind { Flops, Bytes };

struct OpRow {
  std::string op;
  std::string shapes;
  WorkKind kind = WorkKind::Flops;
  double work = 0;     // FLOPs or bytes per call
  double seconds = 0;  // median per call
  int64_t calls = 0;   // per micro-batch forward+backward of the whole model (0: not part of it)
  double rate() const { return work / seconds; }
};

// The model and micro-batch the ops are timed at.
struct BenchShape {
  model::LlamaConfig model;
  int64_t batch = 0, seq = 0;
  std::string source;
};

// The "model" object of a profile's JSON (bench ops, bench step --ops-profile): its source and sizes.
nlohmann::ordered_json model_json(const BenchShape& shape);

// Every call made through it, described (ops/op_calls.hpp), in `calls`. Computes nothing. Reports `device` as its
// own, so that rows made only for one backend (the CUDA FMA attention rows) are recorded as that backend runs them.
class CallRecorder final : public ops::DescribingOps {
 public:
  explicit CallRecorder(DeviceKind device = DeviceKind::Cpu) : device_(device) {}
  std::vector<ops::OpCall> calls;

  DeviceKind device() const override { return device_; }
  void set_stream(StreamRef) override {}
  StreamRef stream() const override { return {}; }
  std::unique_ptr<ops::Ops> make_side_ops() const override;  // throws InternalError: one recorder, one list of calls

 protected:
  void on_call(ops::OpCall call) override { calls.push_back(std::move(call)); }

 private:
  DeviceKind device_;
};

// Times ops on one backend: each op's tensors are allocated on the device, filled, timed and freed. With a
// CallRecorder as the ops (record mode), tensors get addresses that hold no memory (nothing reads them) and each
// timed function is called once instead, its calls kept, one list per time() call, in order.
class OpsBench {
 public:
  OpsBench(ops::Ops& ops, StreamRef stream, int warmup, int iters)
      : ops_(ops), stream_(stream), warmup_(warmup), iters_(iters) {}
  explicit OpsBench(CallRecorder& recorder) : ops_(recorder), recorder_(&recorder) {}

  ops::Tensor tensor(DType dtype, ops::Shape shape, double scale = 1.0);
  void release() { buffers_.clear(); }
  double time(const std::function<void()>& fn);  // the median seconds per call (1 in record mode)

  ops::Ops& ops() { return ops_; }
  const std::vector<std::vector<ops::OpCall>>& recorded() const { return recorded_; }

 private:
  ops::Ops& ops_;
  CallRecorder* recorder_ = nullptr;
  std::vector<std::vector<ops::OpCall>> recorded_;
  StreamRef stream_;
  int warmup_ = 0, iters_ = 1;
  uint64_t seed_ = 0;
  uintptr_t next_fake_ = 0;
  std::vector<ops::OpsBuffer> buffers_;
};

// Every row at the shape's model and micro-batch, activations and parameters in `dt` (f32 or bf16).
std::vector<OpRow> run_rows(OpsBench& b, const BenchShape& s, DType dt);

// The rows in record mode on a recorder of `device`: each row (seconds 1) with the calls its function makes.
struct RecordedRow {
  OpRow row;
  std::vector<ops::OpCall> calls;
};
std::vector<RecordedRow> record_rows(const BenchShape& s, DType dt, DeviceKind device);

}  // namespace shardtrain::cli
