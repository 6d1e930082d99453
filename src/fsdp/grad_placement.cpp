// Gradient shards in activation memory that backward is done with (grad_placement.hpp).
#include "shardtrain/fsdp/grad_placement.hpp"

#include <algorithm>

namespace shardtrain::fsdp {

std::optional<size_t> highest_fit(std::vector<ArenaSpan> free, std::vector<ArenaSpan> taken, size_t bytes, size_t align) {
  if (bytes == 0 || align == 0) return std::nullopt;
  auto by_begin = [](const ArenaSpan& a, const ArenaSpan& b) { return a.begin < b.begin; };
  std::sort(free.begin(), free.end(), by_begin);
  std::sort(taken.begin(), taken.end(), by_begin);
  // The free union minus the taken spans, as gaps in ascending order.
  std::vector<ArenaSpan> gaps;
  for (const ArenaSpan& f : free) {
    if (f.end <= f.begin) continue;
    if (!gaps.empty() && f.begin <= gaps.back().end) gaps.back().end = std::max(gaps.back().end, f.end);
    else gaps.push_back(f);
  }
  std::vector<ArenaSpan> open;
  for (const ArenaSpan& g : gaps) {
    size_t at = g.begin;
    for (const ArenaSpan& t : taken) {
      if (t.end <= at || t.begin >= g.end) continue;
      if (t.begin > at) open.push_back({at, t.begin});
      at = std::max(at, t.end);
    }
    if (at < g.end) open.push_back({at, g.end});
  }
  for (auto g = open.rbegin(); g != open.rend(); ++g) {
    if (g->end - g->begin < bytes) continue;
    const size_t start = (g->end - bytes) / align * align;
    if (start >= g->begin) return start;
  }
  return std::nullopt;
}

void GradPlacer::begin_pass(const std::vector<model::FreedInBackward>& freed) {
  freed_ = freed;
  done_.assign(freed_.size(), false);
  taken_.clear();
  stage_used_ = 0;
}

void GradPlacer::layer_done(int layer) {
  for (size_t i = 0; i < freed_.size(); ++i)
    if (freed_[i].layer == layer) done_[i] = true;
}

std::optional<size_t> GradPlacer::place(size_t bytes) {
  std::vector<ArenaSpan> free;
  for (size_t i = 0; i < freed_.size(); ++i)
    if (done_[i]) free.push_back({freed_[i].offset, freed_[i].offset + freed_[i].bytes});
  const std::optional<size_t> at = highest_fit(std::move(free), taken_, bytes, kAlignment);
  if (at) taken_.push_back({*at, *at + bytes});
  return at;
}

size_t GradPlacer::stage_capacity(const model::ModelSpec& spec) {
  size_t bytes = 0;
  for (const model::ParamInfo& p : spec.params())
    if (spec.module(p.module).cls == model::ModuleClass::RMSNorm)
      bytes += rounded(static_cast<size_t>(p.numel) * sizeof(float));
  return bytes;
}

std::optional<std::vector<const FlatEntry*>> GradPlacer::stage_request(const FlatLayout& layout,
                                                                       const model::ModuleInfo& module,
                                                                       const std::vector<int>& staged) const {
  if (module.cls != model::ModuleClass::RMSNorm) return std::nullopt;
  std::vector<const FlatEntry*> entries;
  size_t bytes = 0;
  for (const FlatEntry& e : layout.entries) {
    const bool used = std::find(module.uses.begin(), module.uses.end(), e.param) != module.uses.end();
    if (!used || std::find(staged.begin(), staged.end(), e.param) != staged.end()) continue;
    entries.push_back(&e);
    bytes += rounded(static_cast<size_t>(e.numel) * sizeof(float));
  }
  if (bytes > stage_capacity_ - stage_used_) return std::nullopt;
  return entries;
}

std::optional<size_t> GradPlacer::stage(size_t bytes) {
  if (stage_used_ + rounded(bytes) > stage_capacity_) return std::nullopt;
  const size_t at = stage_used_;
  stage_used_ += rounded(bytes);
  return at;
}

}  // namespace shardtrain::fsdp
