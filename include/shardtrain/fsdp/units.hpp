// FSDP units: how a wrap policy cuts the model's modules into units, and how each unit's parameters
// are laid out in one flat buffer that S ranks shard into contiguous slices.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shardtrain/model/spec.hpp"

namespace shardtrain::fsdp {

enum class WrapPolicy { TransformerBased, SizeBased, NoWrap };
const char* wrap_policy_name(WrapPolicy p);           // "TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"
WrapPolicy parse_wrap_policy(std::string_view text);  // also accepts transformer|size|none; throws ConfigError

struct WrapConfig {
  WrapPolicy policy = WrapPolicy::TransformerBased;
  std::vector<model::ModuleClass> transformer_layer_cls = {model::ModuleClass::LlamaDecoderLayer};
  int64_t min_num_params = 100'000'000;  // SIZE_BASED_WRAP: a unit closes once it holds this many elements
};

struct UnitSpec {
  int index = 0;
  std::string name;         // the first module's name, or "root"
  bool is_root = false;     // the unclaimed rest: gathered from first use in forward to the end of backward
  std::vector<int> params;  // in execution order
  int first_use = -1;       // first module (execution order) reading one of its params
  int last_use = -1;        // last such module
};

// Units in the order of their first use in forward; the root unit is always present (possibly empty
// of parameters only when every parameter is claimed) and flagged is_root.
// TRANSFORMER_BASED_WRAP: each module of a listed class starts a unit holding its subtree's parameters,
// except those of nested listed modules. SIZE_BASED_WRAP: consecutive parameter-owning modules are
// grouped until a group reaches min_num_params elements; a trailing smaller group joins the root.
// NO_WRAP: everything is the root unit.
std::vector<UnitSpec> plan_units(const model::ModelSpec& spec, const WrapConfig& config);

// Where one parameter sits in its unit's flat buffer.
struct FlatEntry {
  int param = 0;
  int64_t offset = 0;  // elements from the buffer start
  int64_t numel = 0;
};

// An element range [begin, end) in the flat buffer that belongs to one parameter, and where it starts
// inside that parameter.
struct ParamRange {
  int param = 0;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t param_offset = 0;  // element of the (flattened) parameter at `begin`
};

struct FlatLayout {
  std::vector<FlatEntry> entries;
  int64_t used = 0;          // elements up to the end of the last parameter
  int64_t padded_numel = 0;  // N: a multiple of the shard count
  int shards = 1;            // S
  int64_t shard_numel() const { return padded_numel / shards; }
  int64_t shard_begin(int rank) const { return rank * shard_numel(); }
  // The parts of parameters inside [begin, end), in buffer order (padding skipped).
  std::vector<ParamRange> ranges(int64_t begin, int64_t end) const;
};

// Offsets aligned to `alignment` elements (so every view starts 16-byte aligned in bf16 and fp32),
// total padded to a multiple of `shards`.
FlatLayout make_flat_layout(const model::ModelSpec& spec, const std::vector<int>& params, int shards, int64_t alignment = 8);

}  // namespace shardtrain::fsdp
