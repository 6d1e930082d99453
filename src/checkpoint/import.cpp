// Loading model weights from any TensorSource: whole into DenseParams, or slice by slice into an
// engine's master shards (every rank its own ranges, or one reader per node handing units out).
#include <mpi.h>

#include <fmt/format.h>

#include "shardtrain/checkpoint/source.hpp"
#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/log.hpp"

namespace shardtrain::checkpoint {
namespace {

void check_tensors(const model::ModelSpec& spec, TensorSource& source) {
  check_same_model(source.model_config(), spec.config(), source.path());
  for (const model::ParamInfo& p : spec.params()) {
    if (!source.has(p.name)) throw CheckpointError(fmt::format("{}: tensor '{}' is missing", source.path(), p.name));
  }
}

}  // namespace

void load_dense(TensorSource& source, model::DenseParams& params) {
  const model::ModelSpec& spec = params.spec();
  check_tensors(spec, source);
  for (const model::ParamInfo& p : spec.params()) {
    const ops::Tensor view = params.param(p.index);
    if (view.dtype != DType::F32) throw InternalError("load_dense: DenseParams must hold fp32 parameters");
    source.read(p.name, 0, std::span<float>(view.as<float>(), static_cast<size_t>(p.numel)));
  }
}

void import_weights(fsdp::FsdpEngine& engine, TensorSource& source, ImportMode mode) {
  const model::ModelSpec& spec = engine.model_spec();
  check_tensors(spec, source);
  MPI_Comm world = engine.mesh().world_comm();
  MpiComm node = [&] {
    MPI_Comm c = MPI_COMM_NULL;
    ST_CHECK_MPI(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &c));
    return MpiComm(c);
  }();
  const bool leader = node.rank() == 0;
  engine.release_gathered();  // units gathered ahead of the next step hold the master shards about to be replaced
  for (size_t i = 0; i < engine.shards().size(); ++i) {
    const fsdp::ShardView& v = engine.shards()[i];
    std::vector<float> shard(static_cast<size_t>(v.numel), 0.0f);
    if (mode == ImportMode::EveryRankReadsItsSlices) {
      for (const fsdp::ParamRange& r : v.ranges) {
        source.read(spec.param(r.param).name, r.param_offset,
                    std::span<float>(shard.data() + r.begin, static_cast<size_t>(r.end - r.begin)));
      }
    } else {
      // The node's first rank reads the whole unit once; every rank of the node keeps its slice.
      const fsdp::FlatLayout& layout = engine.layout(v.unit);
      std::vector<float> unit(static_cast<size_t>(layout.padded_numel), 0.0f);
      if (leader) {
        for (const fsdp::ParamRange& r : layout.ranges(0, layout.padded_numel)) {
          source.read(spec.param(r.param).name, r.param_offset,
                      std::span<float>(unit.data() + r.begin, static_cast<size_t>(r.end - r.begin)));
        }
      }
      ST_CHECK_MPI(MPI_Bcast(unit.data(), static_cast<int>(unit.size()), MPI_FLOAT, 0, node.get()));
      std::copy(unit.begin() + v.flat_begin, unit.begin() + v.flat_begin + v.numel, shard.begin());
    }
    copy_async(v.param, shard.data(), shard.size() * sizeof(float), {});
    stream_synchronize({});
  }
  engine.zero_grad();
  log::info("checkpoint: initialized the model from {} ({})", source.path(),
            mode == ImportMode::NodeLeaderReads ? "one reader per node" : "every rank reads its slices");
}

}  // namespace shardtrain::checkpoint
