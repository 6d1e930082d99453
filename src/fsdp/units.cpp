// Wrap policies and flat layouts.
#include "shardtrain/fsdp/units.hpp"

#include <algorithm>
#include <cctype>
#include <map>

#include <fmt/format.h>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::fsdp {

const char* wrap_policy_name(WrapPolicy p) {
  switch (p) {
    case WrapPolicy::TransformerBased: return "TRANSFORMER_BASED_WRAP";
    case WrapPolicy::SizeBased: return "SIZE_BASED_WRAP";
    case WrapPolicy::NoWrap: return "NO_WRAP";
  }
  return "?";
}

WrapPolicy parse_wrap_policy(std::string_view text) {
  std::string k;
  for (char c : text) k.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  if (k == "TRANSFORMER_BASED_WRAP" || k == "TRANSFORMER") return WrapPolicy::TransformerBased;
  if (k == "SIZE_BASED_WRAP" || k == "SIZE") return WrapPolicy::SizeBased;
  if (k == "NO_WRAP" || k == "NONE") return WrapPolicy::NoWrap;
  throw ConfigError(
      fmt::format("unknown wrap policy '{}' (expected TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP)", text));
}

namespace {

// Fills first_use / last_use from the modules that read each unit's parameters.
void mark_uses(const model::ModelSpec& spec, std::vector<UnitSpec>& units) {
  std::vector<int> unit_of(spec.params().size(), -1);
  for (const UnitSpec& u : units)
    for (int p : u.params) unit_of[p] = u.index;
  for (const model::ModuleInfo& m : spec.modules()) {
    for (int p : m.uses) {
      UnitSpec& u = units[unit_of[p]];
      if (u.first_use < 0 || m.index < u.first_use) u.first_use = m.index;
      u.last_use = std::max(u.last_use, m.index);
    }
  }
}

}  // namespace

std::vector<UnitSpec> plan_units(const model::ModelSpec& spec, const WrapConfig& config) {
  const auto& modules = spec.modules();
  std::vector<int> owner(modules.size(), -1);  // unit (by creation) that claims each module
  std::vector<std::vector<int>> groups;        // params per claimed group
  std::vector<std::string> names;

  if (config.policy == WrapPolicy::TransformerBased) {
    if (config.transformer_layer_cls.empty())
      throw ConfigError("transformer_layer_cls_to_wrap: expected at least one class");
    for (const model::ModuleInfo& m : modules) {  // pre-order: parents before children
      const bool listed = std::find(config.transformer_layer_cls.begin(), config.transformer_layer_cls.end(), m.cls) !=
                          config.transformer_layer_cls.end();
      if (listed) {
        owner[m.index] = static_cast<int>(groups.size());
        groups.emplace_back();
        names.push_back(m.name);
      } else if (m.parent >= 0) {
        owner[m.index] = owner[m.parent];
      }
    }
    for (const model::ModuleInfo& m : modules)
      if (owner[m.index] >= 0)
        for (int p : m.params) groups[owner[m.index]].push_back(p);
    // The seed's wrapping (fully_shard on each layer, then on model.model, then on the root): what the layers leave
    // of the base model (the embedding and the final norm) is a unit of its own, "model", and the root keeps lm_head
    // alone, so the lm_head's gather is prefetched behind the last layers and its reduction overlaps theirs.
    std::vector<int> base;
    for (const model::ModuleInfo& m : modules)
      if (owner[m.index] < 0 && m.name.rfind("model.", 0) == 0)
        for (int p : m.params) base.push_back(p);
    if (!base.empty()) {
      groups.push_back(std::move(base));
      names.push_back("model");
    }
  } else if (config.policy == WrapPolicy::SizeBased) {
    if (config.min_num_params <= 0)
      throw ConfigError(fmt::format("min_num_params {}: expected a positive count", config.min_num_params));
    int64_t in_group = 0;
    bool open = false;
    for (const model::ModuleInfo& m : modules) {
      if (m.params.empty()) continue;
      if (!open) {
        groups.emplace_back();
        names.push_back(m.name);
        open = true;
        in_group = 0;
      }
      for (int p : m.params) {
        groups.back().push_back(p);
        in_group += spec.param(p).numel;
      }
      if (in_group >= config.min_num_params) open = false;
    }
    if (open) {  // the trailing group is too small to be a unit of its own
      groups.pop_back();
      names.pop_back();
    }
  }

  std::vector<bool> claimed(spec.params().size(), false);
  std::vector<UnitSpec> units;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].empty()) continue;
    UnitSpec u;
    u.index = static_cast<int>(units.size());
    u.name = names[g];
    u.params = groups[g];
    for (int p : u.params) claimed[p] = true;
    units.push_back(std::move(u));
  }
  UnitSpec root;
  root.is_root = true;
  root.name = "root";
  for (const model::ParamInfo& p : spec.params())
    if (!claimed[p.index]) root.params.push_back(p.index);
  root.index = static_cast<int>(units.size());
  units.push_back(std::move(root));
  mark_uses(spec, units);
  // Order by first use in forward; the root joins at its first use like any other unit.
  std::stable_sort(units.begin(), units.end(), [](const UnitSpec& a, const UnitSpec& b) {
    return (a.first_use < 0 ? INT32_MAX : a.first_use) < (b.first_use < 0 ? INT32_MAX : b.first_use);
  });
  for (size_t i = 0; i < units.size(); ++i) units[i].index = static_cast<int>(i);
  return units;
}

FlatLayout make_flat_layout(const model::ModelSpec& spec, const std::vector<int>& params, int shards, int64_t alignment) {
  FlatLayout l;
  l.shards = shards;
  int64_t at = 0;
  for (int p : params) {
    at = (at + alignment - 1) / alignment * alignment;
    l.entries.push_back({p, at, spec.param(p).numel});
    at += spec.param(p).numel;
  }
  l.used = at;
  l.padded_numel = std::max<int64_t>(shards, (at + shards - 1) / shards * shards);
  return l;
}

std::vector<ParamRange> FlatLayout::ranges(int64_t begin, int64_t end) const {
  std::vector<ParamRange> out;
  for (const FlatEntry& e : entries) {
    const int64_t b = std::max(begin, e.offset), f = std::min(end, e.offset + e.numel);
    if (b < f) out.push_back({e.param, b, f, b - e.offset});
  }
  return out;
}

}  // namespace shardtrain::fsdp
