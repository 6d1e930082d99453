// Where model weights can come from, behind one interface: a shardtrain checkpoint directory (sharded
// or full), a consolidated HDF5 file, or a Hugging Face Llama directory (config.json + safetensors).
// Tensors are read by Hugging Face name and element range, so each rank can read only its slices.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "shardtrain/checkpoint/reader.hpp"
#include "shardtrain/fsdp/engine.hpp"
#include "shardtrain/model/dense_params.hpp"

namespace shardtrain::data {
class Tokenizer;
}

namespace shardtrain::checkpoint {

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual const std::string& path() const = 0;
  virtual const model::LlamaConfig& model_config() const = 0;
  virtual std::string tokenizer() const = 0;              // identity JSON, or "" when unknown
  virtual std::string config_toml() const { return {}; }  // a checkpoint's resolved run config, else ""
  virtual int64_t step() const { return -1; }             // a checkpoint's step, else -1
  virtual bool has(const std::string& name) const = 0;
  // Every tensor the source holds, where it can list them (checkpoints, Hugging Face directories; a consolidated
  // file's layout is under its metadata checksums): loading refuses one the model does not use.
  virtual std::vector<std::string> tensor_names() const { return {}; }
  // The file that holds a tensor, for messages.
  virtual std::string file_of(const std::string& /*name*/) const { return path(); }
  // Elements [begin, begin + out.size()) of a parameter's flattened values, as fp32.
  virtual void read(const std::string& name, int64_t begin, std::span<float> out) = 0;
};

// Opens whatever `path` is; throws CheckpointError naming it when it is none of the three.
std::unique_ptr<TensorSource> open_tensor_source(const std::string& path);

// Whether `tokenizer` (loaded from `tokenizer_path`) is the one the weights at `weights` were trained with: no more
// ids than the model's vocabulary, and the hash their tokenizer record (`record`: a TensorSource's tokenizer(),
// "" = none) holds, or else the hash of the tokenizer file the record names (a Hugging Face directory's
// tokenizer.json). Throws DataError naming the tokenizer file, the weights and what differs.
void check_tokenizer_matches(const data::Tokenizer& tokenizer, const std::string& tokenizer_path, const std::string& record,
                             const model::LlamaConfig& model, const std::string& weights);

// The source describes `spec`'s model (check_same_model: the differing field named) and holds every one of its tensors
// and no other (a config.json with fewer layers than its weights): CheckpointError otherwise. Reads no weight; both
// loaders below begin with it, and `shardtrain check` calls it on checkpoint.init_from.
void check_source_tensors(const model::ModelSpec& spec, TensorSource& source);

// Every parameter of `params`' model from the source (single process: generation, tests).
void load_dense(TensorSource& source, model::DenseParams& params);

enum class ImportMode {
  EveryRankReadsItsSlices,  // each rank reads only the element ranges of its shards
  NodeLeaderReads,          // cpu_ram_efficient_loading: one rank per node reads each unit and hands it to the others
};
// Initializes the engine's master shards from the source (model weights only; the optimizer starts
// fresh). Collective over the mesh's world. Both loaders throw CheckpointError when the architecture differs, when
// the source holds a tensor the model does not use (a config.json with fewer layers than its weights), or when a
// value read is not finite (NaN or infinite weights), naming the tensor and its file.
void import_weights(fsdp::FsdpEngine& engine, TensorSource& source, ImportMode mode);

}  // namespace shardtrain::checkpoint
