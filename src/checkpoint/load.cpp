// Loading into an engine of any world size, strategy and wrap policy: each rank reads exactly the
// element ranges of its own shards, from whichever files hold them.
#include <vector>

#include <fmt/format.h>

#include "shardtrain/checkpoint/checkpoint.hpp"
#include "shardtrain/checkpoint/reader.hpp"
#include "shardtrain/runtime/log.hpp"

namespace shardtrain::checkpoint {

LoadResult load(fsdp::FsdpEngine& engine, optim::AdamW* adamw, const std::string& dir) {
  CheckpointReader reader(dir);
  return load(engine, adamw, reader);
}

LoadResult load(fsdp::FsdpEngine& engine, optim::AdamW* adamw, CheckpointReader& reader) {
  const std::string& dir = reader.path();
  check_same_model(reader.model_config(), engine.model_spec().config(), dir);
  const model::ModelSpec& spec = engine.model_spec();
  const bool with_optimizer = adamw != nullptr && reader.has_optimizer();
  engine.release_gathered();  // units gathered ahead of the next step hold the master shards about to be replaced
  for (size_t i = 0; i < engine.shards().size(); ++i) {
    const fsdp::ShardView& v = engine.shards()[i];
    std::vector<float> host(static_cast<size_t>(v.numel), 0.0f);  // padding stays zero
    auto read_into_host = [&](const std::string& kind) {
      std::fill(host.begin(), host.end(), 0.0f);
      for (const fsdp::ParamRange& r : v.ranges) {
        reader.read(spec.param(r.param).name, kind, r.param_offset,
                    std::span<float>(host.data() + r.begin, static_cast<size_t>(r.end - r.begin)));
      }
    };
    read_into_host("param");
    copy_async(v.param, host.data(), host.size() * sizeof(float), {});  // host or device shard
    stream_synchronize({});
    if (with_optimizer) {
      read_into_host("exp_avg");
      adamw->write_state(i, optim::OptimState::ExpAvg, host);
      read_into_host("exp_avg_sq");
      adamw->write_state(i, optim::OptimState::ExpAvgSq, host);
    }
  }
  if (with_optimizer) adamw->set_steps(reader.optimizer_steps());
  if (adamw && !with_optimizer && log::config().rank == 0) {  // one line, not one per rank (every rank loads)
    log::warn("checkpoint {} is a {}: the model is loaded, the optimizer starts fresh", dir,
              state_dict_type_name(reader.type()));
  }
  engine.zero_grad();
  LoadResult r;
  r.step = reader.step();
  r.type = reader.type();
  r.trainer_state = reader.trainer_state();
  r.config_toml = reader.config_toml();
  r.tokenizer = reader.tokenizer();
  r.optimizer_loaded = with_optimizer;
  return r;
}

}  // namespace shardtrain::checkpoint
