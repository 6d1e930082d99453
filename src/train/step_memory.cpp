// A training step's memory against the rank's share, before anything is allocated (step_memory.hpp).
#include "shardtrain/train/step_memory.hpp"

#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "shardtrain/fsdp/plan.hpp"
#include "shardtrain/model/spec.hpp"
#include "shardtrain/runtime/address_space.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/progress.hpp"
#include "shardtrain/train/replica.hpp"

namespace shardtrain::train {
namespace {

std::string bytes_text(double bytes) { return format_bytes(static_cast<uint64_t>(std::clamp(bytes, 0.0, 1.8e19))); }

struct Part {
  std::string what;
  double bytes = 0;
  std::string key;     // the key that makes it
  std::string advice;  // what to change when it is most of a step that does not fit
};

}  // namespace

double micro_batch_buffer_bytes(int64_t micro_batch, int64_t seq_len) {
  const auto b = static_cast<double>(micro_batch);
  return b * static_cast<double>(seq_len) * 3 * sizeof(int32_t) + b * (sizeof(uint64_t) + sizeof(uint32_t));
}

RankMemory rank_memory(const Runtime& rt) {
  const Topology& t = rt.topology();
  RankMemory m;
  m.world = t.world_size;
  m.local_size = t.local_size;
  const double host = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  m.host = host / std::max(t.local_size, 1);
  m.host_name = fmt::format("host memory ({} over {} rank(s) on {})", bytes_text(host), t.local_size, t.hostname);
  if (const auto as = address_space_limit(rt.host_threads()); as && as->room() < m.host) {
    m.host = as->room();
    m.host_name = as->describe();
    m.host_advice_first = std::string(kRaiseAddressSpaceLimit) + ", or ";
  }
  const Device& d = rt.device();
  if (d.is_cuda()) {
    m.gpu = static_cast<double>(d.memory_bytes) / std::max(d.ranks_sharing, 1);
    m.gpu_name = fmt::format("{} ({} rank(s) on it)", d.describe(), d.ranks_sharing);
  }
  return m;
}

void check_step_memory(const TrainConfig& c, const Runtime& rt) { check_step_memory(c, rank_memory(rt)); }

void check_step_memory(const TrainConfig& c, const RankMemory& memory) {
  const int world = memory.world;
  const int micro = c.micro_batch_size_for(world), accumulation = c.accumulation_steps_for(world);
  if (micro <= 0 || accumulation <= 0) return;  // validate_for_world says why
  const std::string batch_key = c.data.micro_batch_size > 0 ? "data.micro_batch_size" : "data.global_batch_size";
  // A smaller micro-batch keeps the global batch: the step accumulates more of them.
  const std::string smaller_micro =
      fmt::format("{} data.micro_batch_size (now {}; the step accumulates micro-batches to the same global batch)",
                  c.data.micro_batch_size > 0 ? "lower" : "set", micro);
  const std::string batch_advice =
      smaller_micro +
      (c.fsdp.engine.activation_checkpointing ? std::string() : ", or set fsdp.activation_checkpointing = true");
  const std::string model_advice = "a smaller model, more ranks to shard it over, or fsdp.offload_params = true";
  const auto seq = static_cast<double>(c.data.seq_len), tokens = static_cast<double>(micro) * seq;

  const double host_share = memory.host, gpu_share = memory.gpu;
  const std::string &host_name = memory.host_name, &gpu_name = memory.gpu_name;
  const std::string& host_advice_first = memory.host_advice_first;  // what to change before the step's own sizes
  const bool on_gpu = gpu_share > 0;

  // The loaders' buffers, all in host memory: made at start (data/loader.hpp).
  const double buffer = micro_batch_buffer_bytes(micro, c.data.seq_len);
  const double sources = static_cast<double>(std::max<size_t>(c.data.mixture.size(), 1));
  std::vector<Part> host_parts, device_parts;
  host_parts.push_back({fmt::format("the training loader's {} micro-batches kept ready (data.prefetch)", c.data.prefetch),
                        c.data.prefetch * buffer, "data.prefetch", "lower data.prefetch"});
  host_parts.push_back({fmt::format("the {} micro-batches of {} x {} tokens a step and the next hold (2 x {} accumulation "
                                    "steps)",
                                    2 * accumulation, micro, c.data.seq_len, accumulation),
                        2.0 * accumulation * buffer, accumulation > 1 ? "data.global_batch_size" : batch_key,
                        accumulation > 1 ? "lower data.global_batch_size" : smaller_micro});
  if (c.schedule.eval_batches > 0)
    host_parts.push_back({"the validation loaders' buffers", 4 * sources * buffer, batch_key, smaller_micro});

  // Activations: every layer's input and output (N, D) and one layer's MLP (N, I) at least, in 2 bytes or more. Past
  // the memory already, nothing else is sized (the plan's byte counts would pass 2^64 for batches like these).
  const auto& m = c.model;
  const double activations_floor = tokens * 2 *
                                   (static_cast<double>(m.hidden_size) * static_cast<double>(m.num_hidden_layers + 1) +
                                    static_cast<double>(m.intermediate_size));
  const Part activations_part{fmt::format("the activations of a micro-batch of {} x {} tokens", micro, c.data.seq_len),
                              activations_floor, batch_key, batch_advice};
  const double activations_room = on_gpu ? gpu_share : host_share;  // on the device, offload or not
  if (activations_floor <= activations_room) {
    try {
      const model::ModelSpec spec(c.model);
      const fsdp::FsdpConfig engine = engine_config(c, world);
      const fsdp::MemoryEstimate e = fsdp::estimate_memory(
          spec, engine, fsdp::plan_fsdp(spec, engine, world, memory.local_size), micro, c.data.seq_len);
      const std::string model_key = largest_model_size_key(m);
      device_parts.push_back({activations_part.what, e.activations, batch_key, batch_advice});
      device_parts.push_back({"the gathered parameters and gradients", e.buffers, model_key, model_advice});
      if (engine.offload_params) host_parts.push_back({"the offloaded sharded state", e.host, model_key, model_advice});
      else device_parts.push_back({"the sharded state", e.state, model_key, model_advice});
    } catch (const Error&) {
      return;  // a mesh the world cannot build: the replica says why, in its words
    }
  } else {
    device_parts.push_back(activations_part);
  }
  if (!on_gpu) {  // one memory: the host's
    host_parts.insert(host_parts.end(), device_parts.begin(), device_parts.end());
    device_parts.clear();
  }

  auto require = [&](const std::vector<Part>& parts, double room, const std::string& name, const std::string& advice_first) {
    double total = 0;
    for (const Part& p : parts) total += p.bytes;
    if (parts.empty() || total <= room) return;
    const Part& top =
        *std::max_element(parts.begin(), parts.end(), [](const Part& a, const Part& b) { return a.bytes < b.bytes; });
    std::string list;
    for (const Part& p : parts)
      if (p.bytes > 0) list += fmt::format("{}{} {}", list.empty() ? "" : ", ", p.what, bytes_text(p.bytes));
    throw ConfigError(
        fmt::format("{}: a training step needs at least {} per rank ({}), more than {} has for this rank "
                    "({}): {}",
                    top.key, bytes_text(total), list, name, bytes_text(room), advice_first + top.advice));
  };
  require(device_parts, gpu_share, gpu_name, "");
  require(host_parts, host_share, host_name, host_advice_first);
}

}  // namespace shardtrain::train
