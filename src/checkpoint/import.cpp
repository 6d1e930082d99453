// Loading model weights from any TensorSource: whole into DenseParams, or slice by slice into an
// engine's master shards (every rank its own ranges, or one reader per node handing units out).
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <set>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "broadcast.hpp"
#include "shardtrain/checkpoint/source.hpp"
#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/log.hpp"

namespace shardtrain::checkpoint {
namespace {

// Tensors a Hugging Face file may hold that the model need not read: a tied lm_head (equal to the embeddings:
// check_tied_head) and older transformers' saved RoPE frequencies (computed from rope_theta).
bool ignorable(const std::string& name, const model::LlamaConfig& c) {
  return (c.tie_word_embeddings && name == "lm_head.weight") || name.ends_with(".rotary_emb.inv_freq");
}

// NaN or infinite weights would sample garbage and evaluate to a NaN loss: refused when read (training refuses to
// save them, exit 9; reading them is a damaged or diverged checkpoint, exit 5). Bits, not std::isfinite: immune to
// any floating-point flags the build may set.
void check_finite(std::span<const float> v, const TensorSource& source, const std::string& name, int64_t offset) {
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, &v[i], 4);
    if ((bits & 0x7f800000u) == 0x7f800000u)
      throw CheckpointError(
          fmt::format("{}: tensor '{}' holds {} at element {}: the weights are not finite (a diverged "
                      "run's, or damaged); use an earlier checkpoint",
                      source.file_of(name), name, v[i], offset + static_cast<int64_t>(i)));
  }
}

// A tied model's file may hold an lm_head.weight too: equal to the embeddings (transformers then ties them), it is
// skipped; different, transformers loads the two matrices untied, and skipping it loaded another model than theirs
// without a word (the audit's tied config with a head of its own: loss 10.26 here, 8.32 in transformers). Compared
// in pieces, element by element.
void check_tied_head(const model::ModelSpec& spec, TensorSource& source) {
  const std::string head = "lm_head.weight", embed = spec.param(spec.embed_param()).name;
  if (!spec.config().tie_word_embeddings || !source.has(head)) return;
  const int64_t numel = spec.param(spec.embed_param()).numel;
  constexpr int64_t kPiece = int64_t{1} << 20;
  std::vector<float> a(static_cast<size_t>(std::min(numel, kPiece))), b(a.size());
  for (int64_t at = 0; at < numel; at += kPiece) {
    const size_t n = static_cast<size_t>(std::min(kPiece, numel - at));
    source.read(embed, at, std::span<float>(a.data(), n));
    source.read(head, at, std::span<float>(b.data(), n));
    for (size_t i = 0; i < n; ++i) {
      if (std::memcmp(&a[i], &b[i], sizeof(float)) == 0) continue;
      throw CheckpointError(fmt::format(
          "{}: tie_word_embeddings is true in {}, but '{}' differs from '{}' (element {}: {} against {}): transformers "
          "loads the two untied, so this is a model with a head of its own; set tie_word_embeddings to false to load "
          "it so, or remove '{}' to tie them",
          source.file_of(head), source.path(), head, embed, at + static_cast<int64_t>(i), b[i], a[i], head));
    }
  }
}

}  // namespace

// None beside the model's tensors: a config.json with fewer layers than its weights would otherwise load a different,
// smaller model without a word.
void check_source_tensors(const model::ModelSpec& spec, TensorSource& source) {
  check_same_model(source.model_config(), spec.config(), source.path());
  std::set<std::string> used;
  for (const model::ParamInfo& p : spec.params()) {
    if (!source.has(p.name)) throw CheckpointError(fmt::format("{}: tensor '{}' is missing", source.path(), p.name));
    used.insert(p.name);
  }
  for (const std::string& name : source.tensor_names()) {
    if (used.count(name) || ignorable(name, spec.config())) continue;
    const model::LlamaConfig& c = spec.config();
    throw CheckpointError(
        fmt::format("{}: tensor '{}' is not part of the model that {} describes ({} layers, tie_word_embeddings {}): the "
                    "configuration and the weights disagree; refused rather than dropped",
                    source.file_of(name), name, source.path(), c.num_hidden_layers, c.tie_word_embeddings));
  }
  check_tied_head(spec, source);
}

void broadcast_floats(MPI_Comm comm, std::span<float> data, int root, size_t max_piece) {
  if (max_piece == 0 || max_piece > static_cast<size_t>(INT_MAX))
    throw InternalError(fmt::format("broadcast_floats: a piece of {} elements", max_piece));
  for (size_t at = 0; at < data.size(); at += max_piece) {
    const size_t n = std::min(max_piece, data.size() - at);
    ST_CHECK_MPI(MPI_Bcast(data.data() + at, static_cast<int>(n), MPI_FLOAT, root, comm));
  }
}

void load_dense(TensorSource& source, model::DenseParams& params) {
  const model::ModelSpec& spec = params.spec();
  check_source_tensors(spec, source);
  for (const model::ParamInfo& p : spec.params()) {
    const ops::Tensor view = params.param(p.index);
    if (view.dtype != DType::F32) throw InternalError("load_dense: DenseParams must hold fp32 parameters");
    const std::span<float> values(view.as<float>(), static_cast<size_t>(p.numel));
    source.read(p.name, 0, values);
    check_finite(values, source, p.name, 0);
  }
}

void import_weights(fsdp::FsdpEngine& engine, TensorSource& source, ImportMode mode) {
  const model::ModelSpec& spec = engine.model_spec();
  check_source_tensors(spec, source);
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
        const std::span<float> values(shard.data() + r.begin, static_cast<size_t>(r.end - r.begin));
        source.read(spec.param(r.param).name, r.param_offset, values);
        check_finite(values, source, spec.param(r.param).name, r.param_offset);
      }
    } else {
      // The node's first rank reads the whole unit once; every rank of the node keeps its slice.
      const fsdp::FlatLayout& layout = engine.layout(v.unit);
      std::vector<float> unit(static_cast<size_t>(layout.padded_numel), 0.0f);
      if (leader) {
        for (const fsdp::ParamRange& r : layout.ranges(0, layout.padded_numel)) {
          const std::span<float> values(unit.data() + r.begin, static_cast<size_t>(r.end - r.begin));
          source.read(spec.param(r.param).name, r.param_offset, values);
          check_finite(values, source, spec.param(r.param).name, r.param_offset);
        }
      }
      // In pieces: one call's int count once cut a unit of 2^32 + k elements to its first k (the node's other
      // ranks kept zeros for the rest, silently), and refused one of 2^31..2^32 as a communication error (exit 6).
      broadcast_floats(node.get(), unit, 0);
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
