// Reading a checkpoint without MPI or a model: its tensors by Hugging Face name, any element range,
// from whichever files hold it. Used by loading (each rank its own ranges), consolidation, export,
// `shardtrain checkpoint info` and generation.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "shardtrain/checkpoint/checkpoint.hpp"
#include "shardtrain/model/config.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/hdf5.hpp"

namespace shardtrain::checkpoint {

// A checkpoint whose files are missing, unreadable, or fail a checksum (of their data or their metadata), as
// opposed to one that is whole but does not fit the run (another model, another tokenizer). `--resume auto` falls
// back past a damaged one to the newest one that loads (docs/checkpoints.md, "Damaged checkpoints").
class CheckpointDamaged : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

// What opening a checkpoint checked of its files' metadata checksums (runtime/hdf5_checksum.hpp).
struct MetadataSummary {
  int files_checked = 0;     // files whose every attribute, layout and link matched its record
  int files_unrecorded = 0;  // files written before the records existed: accepted, not checked
  int64_t entries = 0;       // attributes, layouts and links checked
};

struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
};

class CheckpointReader {
 public:
  // Validates the DONE marker, the index, the format version, every file's metadata checksums, and that every
  // element of every tensor is held by some file. Throws CheckpointDamaged naming the file and what is wrong.
  explicit CheckpointReader(const std::string& checkpoint_dir);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& path() const { return path_; }
  StateDictType type() const { return type_; }
  int64_t step() const { return step_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo& tensor(const std::string& name) const;
  const model::LlamaConfig& model_config() const { return model_config_; }
  const std::string& trainer_state() const { return trainer_state_; }
  const std::string& config_toml() const { return config_toml_; }
  const std::string& tokenizer() const { return tokenizer_; }
  // Sharded checkpoints, and full ones saved since 2026-11-29 (before, a full checkpoint held the model alone).
  bool has_optimizer() const { return type_ == StateDictType::Sharded || full_optimizer_; }
  int64_t optimizer_steps() const { return optimizer_steps_; }
  std::vector<std::string> files() const;  // data files, relative to path()
  std::string mesh_description() const { return mesh_; }
  const MetadataSummary& metadata() const { return metadata_; }

  // Elements [begin, begin + out.size()) of a tensor's flattened values; kind is "param", "exp_avg" or
  // "exp_avg_sq" (the last two where has_optimizer()).
  void read(const std::string& name, const std::string& kind, int64_t begin, std::span<float> out);
  // Reads every dataset of every file, so HDF5 verifies each chunk's Fletcher32 checksum (the metadata's were
  // checked on opening).
  // Returns the number of elements verified.
  int64_t verify_checksums();

 private:
  struct Piece;
  hdf5::Handle& file(int index);

  std::string path_;
  StateDictType type_ = StateDictType::Sharded;
  int64_t step_ = 0;
  int64_t optimizer_steps_ = 0;
  bool full_optimizer_ = false;  // a full checkpoint's model.h5 holds AdamW's moments (kFullOptimizerGroup)
  std::string trainer_state_, config_toml_, tokenizer_, mesh_;
  model::LlamaConfig model_config_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::vector<Piece>> pieces_;
  std::vector<std::string> file_names_;
  std::vector<std::unique_ptr<hdf5::Handle>> files_;
  MetadataSummary metadata_;
};

// The model's architecture as JSON (our field names), and back; errors name the field.
std::string model_config_to_json(const model::LlamaConfig& c);
model::LlamaConfig model_config_from_json(const std::string& json, const std::string& origin);
// Throws CheckpointError naming the first field where the two configs differ.
void check_same_model(const model::LlamaConfig& saved, const model::LlamaConfig& current, const std::string& origin);

}  // namespace shardtrain::checkpoint
