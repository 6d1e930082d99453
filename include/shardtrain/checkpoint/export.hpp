// Offline consolidation (no MPI): a checkpoint's tensors merged by name into one HDF5 file, or into a
// Hugging Face directory (safetensors + config.json + tokenizer files) that `transformers` loads as
// LlamaForCausalLM. No permutation is needed: shardtrain's q/k/v weights already use Hugging Face's
// rotate-half RoPE layout and (Hkv*Dh, D) key/value shapes; a tied lm_head is simply absent.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardtrain/model/config.hpp"
#include "shardtrain/runtime/dtype.hpp"

namespace shardtrain::checkpoint {

enum class ExportFormat { Hdf5, Safetensors };
ExportFormat parse_export_format(std::string_view text);  // hdf5 | safetensors; throws UsageError

// Whether a tokenizer named for the export must be the checkpoint's (Match), or need only load (LoadOnly: another
// file form of the same vocabulary, say a tokenizer.json for the tiktoken file the run used).
enum class TokenizerCheck { Match, LoadOnly };

struct ExportOptions {
  ExportFormat format = ExportFormat::Hdf5;
  DType dtype = DType::F32;                      // F32 or BF16 (round to nearest even)
  uint64_t max_shard_bytes = uint64_t{2} << 30;  // safetensors: above this, model-0000k-of-0000n files + index
  // Safetensors only: a tokenizer file or folder the user named, which must load and fit the weights (no more ids
  // than the model's vocabulary, the hash the checkpoint records): DataError naming it otherwise. "" = the one the
  // checkpoint names, shipped when it loads and still fits (a note says why not otherwise).
  std::string tokenizer;
  TokenizerCheck tokenizer_check = TokenizerCheck::Match;
  std::string recorded_tokenizer;  // where the checkpoint's recorded tokenizer was found, when not at its recorded path
};

struct ExportSummary {
  int64_t tensors = 0;
  uint64_t bytes = 0;
  int files = 0;
  std::string tokenizer_note;  // what was done about tokenizer files
};

// Writes `output` (a file for HDF5, a directory for safetensors), refusing to overwrite an existing
// path (UsageError, before any work; so are "" and, for HDF5, a name ending in '/'). It is written under a
// temporary name of its own (OUT.tmp-PID) and renamed when complete; a failure removes that temporary and
// nothing else. One tensor in memory at a time.
ExportSummary consolidate(const std::string& checkpoint_dir, const std::string& output, const ExportOptions& options);

// A full tensor held in memory: its Hugging Face name, shape and fp32 values (as many as the shape holds).
struct FullTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::span<const float> values;
};

// The Hugging Face directory consolidate() writes (safetensors split as options.max_shard_bytes says,
// config.json, generation_config.json, options.tokenizer if given), from tensors already in memory, in
// the model's registry order; a tied lm_head is absent, as from a checkpoint. Refuses an existing path.
ExportSummary export_hf_directory(const model::LlamaConfig& config, std::span<const FullTensor> tensors,
                                  const std::string& out_dir, const ExportOptions& options);

// One safetensors file of `tensors`, in order, as F32 or BF16 (round to nearest even). Refuses an existing
// path. Returns the bytes of tensor data written.
uint64_t write_safetensors_file(const std::string& path, std::span<const FullTensor> tensors, DType dtype);

}  // namespace shardtrain::checkpoint
