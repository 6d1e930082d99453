// AdamW and gradient norms: the host update (one parallel region per step, vectorized inner loops) and
// everything both paths share; the CUDA half is in adamw_cuda.cpp.
#include "shardtrain/optim/adamw.hpp"
#include "shardtrain/runtime/timing_device.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <span>
#include <thread>

#include "adamw_internal.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::optim {

namespace {
constexpr DecayScope kScopes[] = {DecayScope::All, DecayScope::ExemptNorms, DecayScope::ExemptNormsAndEmbeddings};
}  // namespace

const char* decay_scope_name(DecayScope scope) {
  switch (scope) {
    case DecayScope::All: return "all";
    case DecayScope::ExemptNorms: return "exempt_norms";
    case DecayScope::ExemptNormsAndEmbeddings: return "exempt_norms_and_embeddings";
  }
  return "?";
}

DecayScope parse_decay_scope(std::string_view t) {
  for (DecayScope s : kScopes)
    if (t == decay_scope_name(s)) return s;
  throw ConfigError(
      fmt::format("optim.decay: unknown scope '{}' (expected all, exempt_norms or exempt_norms_and_embeddings)", t));
}

void AdamWConfig::validate() const {
  if (!(lr > 0)) throw ConfigError(fmt::format("optim.lr: {} (expected a positive learning rate)", lr));
  if (!(beta1 >= 0 && beta1 < 1)) throw ConfigError(fmt::format("optim.beta1: {} (expected 0 <= beta1 < 1)", beta1));
  if (!(beta2 >= 0 && beta2 < 1)) throw ConfigError(fmt::format("optim.beta2: {} (expected 0 <= beta2 < 1)", beta2));
  if (!(eps > 0)) throw ConfigError(fmt::format("optim.eps: {} (expected a positive epsilon)", eps));
  if (!(weight_decay >= 0)) throw ConfigError(fmt::format("optim.weight_decay: {} (expected 0 or more)", weight_decay));
}

namespace detail {

StepScalars step_scalars(const AdamWConfig& config, int64_t step, double lr, double grad_scale) {
  const double bc1 = 1.0 - std::pow(config.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(config.beta2, static_cast<double>(step));
  StepScalars s;
  s.beta1 = static_cast<float>(config.beta1);
  s.beta2 = static_cast<float>(config.beta2);
  s.step_size = static_cast<float>(lr / bc1);
  s.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  s.eps = static_cast<float>(config.eps);
  s.grad_scale = static_cast<float>(grad_scale);
  s.decay_factor = static_cast<float>(1.0 - lr * config.weight_decay);
  return s;
}

}  // namespace detail

namespace {

// Below this many elements in a step, one thread does it all (a parallel region costs more).
constexpr int64_t kParallelMinElements = 32768;

// Elements [a, b) of one segment. kernels/adamw.cu does the same operations in the same order.
inline void update_elements(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                            int64_t a, int64_t b, const detail::StepScalars& s, float decay) {
  const float b1 = s.beta1, b2 = s.beta2, gs = s.grad_scale, eps = s.eps;
  const float step_size = s.step_size, inv_sqrt_bc2 = s.inv_sqrt_bc2;
#pragma omp simd
  for (int64_t k = a; k < b; ++k) {
    const float gk = g[k] * gs;
    m[k] = b1 * m[k] + (1.0f - b1) * gk;
    v[k] = b2 * v[k] + (1.0f - b2) * gk * gk;
    const float denom = std::sqrt(v[k]) * inv_sqrt_bc2 + eps;
    p[k] = p[k] * decay - step_size * m[k] / denom;
  }
}

}  // namespace

AdamW::AdamW(const fsdp::FsdpEngine& engine, const AdamWConfig& config, MemoryLedger* ledger)
    : config_(config), threads_(omp_get_max_threads()), ledger_(ledger) {
  init(engine.shards(), engine.model_spec());
}

AdamW::AdamW(const std::vector<fsdp::ShardView>& shards, const model::ModelSpec& spec, const AdamWConfig& config,
             MemoryLedger* ledger)
    : config_(config), threads_(omp_get_max_threads()), ledger_(ledger) {
  init(shards, spec);
}

// step_async's thread and what it shares with the callers: one update at a time, shard by shard; `done`
// counts the shards of the current update that are finished.
struct AdamW::Worker {
  std::mutex mu;
  std::condition_variable cv;
  bool pending = false;  // an update was handed over and not yet taken
  bool busy = false;     // an update was handed over and is not finished
  bool stop = false;
  size_t done = 0;
  detail::StepScalars scalars;
  std::chrono::milliseconds delay{0};
  std::exception_ptr error;
  double last_update_s = 0;  // the last finished update's wall time (0 once taken)
  double waited_s = 0;       // callers blocked in wait_shard / wait since the last take
  std::thread thread;
};

namespace {
double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

AdamW::~AdamW() {
  if (!worker_) return;
  {
    std::lock_guard<std::mutex> lock(worker_->mu);
    worker_->stop = true;
  }
  worker_->cv.notify_all();
  worker_->thread.join();  // after the update in progress, if any
}

void AdamW::init(const std::vector<fsdp::ShardView>& shards, const model::ModelSpec& spec) {
  config_.validate();
  device_ = shards.empty() ? DeviceKind::Cpu : shards.front().device;
  for (size_t i = 0; i < shards.size(); ++i) {
    const fsdp::ShardView& v = shards[i];
    if (v.device != device_) {
      throw InternalError(fmt::format("AdamW: shard {} is in {} memory, shard 0 in {} (expected one kind for all shards)", i,
                                      v.device == DeviceKind::Cuda ? "device" : "host",
                                      device_ == DeviceKind::Cuda ? "device" : "host"));
    }
    State s;
    s.numel = v.numel;
    s.param = v.param;
    s.grad = v.grad;
    for (const fsdp::ParamRange& r : v.ranges) {
      if (r.begin < 0 || r.begin > r.end || r.end > v.numel) {
        throw InternalError(
            fmt::format("AdamW: shard {} has the range [{}, {}) (expected one inside [0, {}))", i, r.begin, r.end, v.numel));
      }
      const model::ModuleClass cls = spec.module(spec.param(r.param).module).cls;
      const bool exempt = (config_.decay != DecayScope::All && cls == model::ModuleClass::RMSNorm) ||
                          (config_.decay == DecayScope::ExemptNormsAndEmbeddings && cls == model::ModuleClass::Embedding);
      s.ranges.push_back({r.begin, r.end, !exempt});
    }
    if (device_ == DeviceKind::Cuda && timing::current()) {
      allocate_timed_state(s);
      state_bytes_ += 2 * s.numel * static_cast<int64_t>(sizeof(float));
    } else if (device_ == DeviceKind::Cuda) {
      allocate_device_state(s);  // zeroed
      state_bytes_ += 2 * s.numel * static_cast<int64_t>(sizeof(float));
    } else if (timing::current() && timing::TimingDevice::is_host_address(v.param)) {
      priced_host_ = true;  // offloaded shards on a timing device: the state holds no memory either
      s.timed_exp_avg = PinnedBuffer(static_cast<size_t>(v.numel) * sizeof(float));
      s.timed_exp_avg_sq = PinnedBuffer(static_cast<size_t>(v.numel) * sizeof(float));
      s.exp_avg = static_cast<float*>(s.timed_exp_avg.data());
      s.exp_avg_sq = static_cast<float*>(s.timed_exp_avg_sq.data());
      state_bytes_ += 2 * s.numel * static_cast<int64_t>(sizeof(float));
    } else {
      s.host_exp_avg = ops::HostBuffer(static_cast<size_t>(v.numel) * sizeof(float));
      s.host_exp_avg_sq = ops::HostBuffer(static_cast<size_t>(v.numel) * sizeof(float));
      s.exp_avg = s.host_exp_avg.as<float>();
      s.exp_avg_sq = s.host_exp_avg_sq.as<float>();
      if (v.numel > 0) {
        std::memset(s.exp_avg, 0, static_cast<size_t>(v.numel) * sizeof(float));
        std::memset(s.exp_avg_sq, 0, static_cast<size_t>(v.numel) * sizeof(float));
      }
      state_bytes_ += static_cast<int64_t>(s.host_exp_avg.size() + s.host_exp_avg_sq.size());
    }
    states_.push_back(std::move(s));
  }
  build_segments();
  if (ledger_) ledger_->add(MemoryCategory::OptimizerStates, state_bytes_);
}

// The segment table: every non-empty range of every shard, in order, with its prefix sums; on a GPU, the chunk
// table made of it. A shard whose gradient has no memory yet (null) gets null gradient pointers, rebound before
// any update reads them (bind_shards).
void AdamW::build_segments() {
  segments_.clear();
  segment_offsets_.assign(1, 0);
  shard_segments_.clear();
  for (const State& s : states_) {
    shard_segments_.push_back(segments_.size());
    for (const DecayRange& r : s.ranges) {
      if (r.end == r.begin) continue;
      segments_.push_back({s.param + r.begin, s.grad ? s.grad + r.begin : nullptr, s.exp_avg + r.begin,
                           s.exp_avg_sq + r.begin, r.end - r.begin, r.decay});
      segment_offsets_.push_back(segment_offsets_.back() + (r.end - r.begin));
    }
  }
  shard_segments_.push_back(segments_.size());
  if (device_ == DeviceKind::Cuda && !timing::current()) upload_chunk_table();
}

void AdamW::bind_shards(const std::vector<fsdp::ShardView>& shards) {
  if (shards.size() != states_.size()) {
    throw InternalError(
        fmt::format("AdamW::step: {} shards given, the optimizer was built for {}", shards.size(), states_.size()));
  }
  bool moved = false;
  for (size_t i = 0; i < shards.size(); ++i) {
    const State& s = states_[i];
    if (shards[i].param != s.param || shards[i].numel != s.numel) {
      throw InternalError(fmt::format(
          "AdamW::step: shard {} is not the one the optimizer was built for (its parameters or size changed)", i));
    }
    if (shards[i].numel > 0 && shards[i].grad == nullptr)
      throw InternalError(fmt::format("AdamW::step: shard {} has no gradient (no backward placed it)", i));
    moved = moved || shards[i].grad != s.grad;
  }
  if (!moved) return;
  // The engine placed gradient shards elsewhere (in activation memory, fsdp/grad_placement.hpp): the tables
  // follow, after any update still reading the old ones.
  wait();
  for (size_t i = 0; i < shards.size(); ++i) states_[i].grad = shards[i].grad;
  build_segments();
}

void AdamW::step(const std::vector<fsdp::ShardView>& shards, double lr, double grad_scale, StreamRef stream) {
  bind_shards(shards);
  wait();
  ++steps_;
  update_shards(0, states_.size(), lr, grad_scale, stream);
}

void AdamW::step_split(const std::vector<fsdp::ShardView>& shards, double lr, double grad_scale, StreamRef stream,
                       const std::vector<int>& first, const std::function<void()>& between) {
  bind_shards(shards);
  wait();
  ++steps_;
  std::vector<bool> early(states_.size(), false);
  for (int i : first) early.at(static_cast<size_t>(i)) = true;
  // Each run of consecutive shards on one side is one update (one launch on a device).
  auto update = [&](bool side) {
    for (size_t a = 0; a < states_.size();) {
      if (early[a] != side) {
        ++a;
        continue;
      }
      size_t b = a;
      while (b < states_.size() && early[b] == side) ++b;
      update_shards(a, b, lr, grad_scale, stream);
      a = b;
    }
  };
  update(true);
  if (between) between();
  update(false);
}

void AdamW::update_shards(size_t first, size_t end, double lr, double grad_scale, StreamRef stream) {
  const size_t s0 = shard_segments_[first], s1 = shard_segments_[end];
  if (s0 == s1) return;
  if (device_ == DeviceKind::Cuda && timing::current()) {
    step_timed(*timing::current(), stream, segment_offsets_[s1] - segment_offsets_[s0]);
  } else if (device_ == DeviceKind::Cuda) {
    step_device(lr, grad_scale, stream, segment_chunks_[s0], segment_chunks_[s1] - segment_chunks_[s0]);
  } else if (priced_host_) {
    timing::TimingDevice& t = *timing::current();
    t.host_work(28.0 * static_cast<double>(segment_offsets_[s1] - segment_offsets_[s0]) / t.costs().host_memory_bytes_per_s,
                "adamw (host, priced)", timing::WorkKind::Compute);
  } else {
    update_segments(detail::step_scalars(config_, steps_, lr, grad_scale), s0, s1);
  }
}

void AdamW::step_async(const std::vector<fsdp::ShardView>& shards, double lr, double grad_scale) {
  bind_shards(shards);
  if (device_ == DeviceKind::Cuda || priced_host_)
    throw InternalError("AdamW::step_async: the shards are on the device or hold no memory (use step)");
  wait();
  ++steps_;
  if (!worker_) {
    worker_ = std::make_unique<Worker>();
    worker_->thread = std::thread([this, w = worker_.get()] {
      std::unique_lock<std::mutex> lock(w->mu);
      for (;;) {
        w->cv.wait(lock, [w] { return w->pending || w->stop; });
        if (!w->pending) return;
        w->pending = false;
        const auto started = std::chrono::steady_clock::now();
        const detail::StepScalars sc = w->scalars;
        const std::chrono::milliseconds delay = w->delay;
        for (size_t i = 0; i + 1 < shard_segments_.size(); ++i) {
          lock.unlock();
          if (delay.count() > 0) std::this_thread::sleep_for(delay);
          try {
            update_segments(sc, shard_segments_[i], shard_segments_[i + 1]);
          } catch (...) {
            lock.lock();
            w->error = std::current_exception();
            break;
          }
          lock.lock();
          w->done = i + 1;
          w->cv.notify_all();
        }
        w->last_update_s = seconds_between(started, std::chrono::steady_clock::now());
        w->busy = false;
        w->cv.notify_all();
      }
    });
  }
  {
    std::lock_guard<std::mutex> lock(worker_->mu);
    worker_->scalars = detail::step_scalars(config_, steps_, lr, grad_scale);
    worker_->delay = async_delay_;
    worker_->done = 0;
    worker_->pending = worker_->busy = true;
  }
  worker_->cv.notify_all();
}

void AdamW::wait_shard(int shard) const {
  if (!worker_) return;
  std::unique_lock<std::mutex> lock(worker_->mu);
  const auto ready = [&] { return !worker_->busy || worker_->done > static_cast<size_t>(shard); };
  if (!ready()) {
    const auto from = std::chrono::steady_clock::now();
    worker_->cv.wait(lock, ready);
    worker_->waited_s += seconds_between(from, std::chrono::steady_clock::now());
  }
  if (worker_->error) std::rethrow_exception(worker_->error);
}

AdamW::AsyncTimes AdamW::take_async_times() const {
  if (!worker_) return {};
  std::lock_guard<std::mutex> lock(worker_->mu);
  const AsyncTimes t{worker_->last_update_s, worker_->waited_s};
  worker_->last_update_s = worker_->waited_s = 0;
  return t;
}

void AdamW::wait() const {
  if (!worker_) return;
  std::unique_lock<std::mutex> lock(worker_->mu);
  if (worker_->busy) {
    const auto from = std::chrono::steady_clock::now();
    worker_->cv.wait(lock, [&] { return !worker_->busy; });
    worker_->waited_s += seconds_between(from, std::chrono::steady_clock::now());
  }
  if (worker_->error) std::rethrow_exception(worker_->error);
}

// One parallel region: thread t of T takes elements [total t / T, total (t+1) / T) of the concatenated
// segments, so every thread gets an equal share however small or many the ranges are. Each element's
// arithmetic does not depend on the split, so the result is the same at any thread count, and the same
// whether a step is one call over every segment or one call per shard (step_async).
void AdamW::update_segments(const detail::StepScalars& sc, size_t first, size_t end) const {
  const int64_t base = segment_offsets_[first], total = segment_offsets_[end] - base;
  const Segment* segments = segments_.data();
  const int64_t* offsets = segment_offsets_.data();
#pragma omp parallel num_threads(threads_) if (total > kParallelMinElements)
  {
    const auto threads = static_cast<int64_t>(omp_get_num_threads()), t = static_cast<int64_t>(omp_get_thread_num());
    if (t == 0 && total > kParallelMinElements) last_update_threads_.store(static_cast<int>(threads));
    const int64_t lo = base + total * t / threads, hi = base + total * (t + 1) / threads;
    if (lo < hi) {
      // The segment holding element lo: the last offset <= lo (offsets strictly increase).
      auto k = static_cast<size_t>(std::upper_bound(offsets + first, offsets + end + 1, lo) - offsets - 1);
      for (int64_t at = lo; at < hi && k < end; ++k) {
        const Segment& g = segments[k];
        const int64_t a = at - offsets[k], b = std::min(g.n, hi - offsets[k]);
        update_elements(g.param, g.grad, g.exp_avg, g.exp_avg_sq, a, b, sc, g.decay ? sc.decay_factor : 1.0f);
        at = offsets[k] + b;
      }
    }
  }
}

const AdamW::State& AdamW::state_for_copy(size_t i, size_t elements, const char* what) const {
  if (i >= states_.size()) throw InternalError(fmt::format("AdamW::{}: shard {} of {}", what, i, states_.size()));
  const State& s = states_[i];
  if (static_cast<int64_t>(elements) != s.numel)
    throw InternalError(fmt::format("AdamW::{}: {} elements given for shard {} (expected {})", what, elements, i, s.numel));
  return s;
}

void AdamW::read_state(size_t i, OptimState which, std::span<float> host_out) const {
  const State& s = state_for_copy(i, host_out.size(), "read_state");
  wait();
  if (host_out.empty()) return;
  if (device_ == DeviceKind::Cuda) {
    detail::device_copy_sync(host_out.data(), s.state(which), host_out.size_bytes());
  } else {
    std::memcpy(host_out.data(), s.state(which), host_out.size_bytes());
  }
}

void AdamW::write_state(size_t i, OptimState which, std::span<const float> host_in) {
  const State& s = state_for_copy(i, host_in.size(), "write_state");
  wait();
  if (host_in.empty()) return;
  if (device_ == DeviceKind::Cuda) {
    detail::device_copy_sync(s.state(which), host_in.data(), host_in.size_bytes());
  } else {
    std::memcpy(s.state(which), host_in.data(), host_in.size_bytes());
  }
}

namespace {

// Every shard in host memory, every one on the device, or nothing at all (no shards): which.
DeviceKind shards_device(const std::vector<fsdp::ShardView>& shards, const char* what) {
  const DeviceKind d = shards.empty() ? DeviceKind::Cpu : shards.front().device;
  for (const fsdp::ShardView& s : shards) {
    if (s.device != d)
      throw InternalError(fmt::format("{}: shards in both host and device memory (expected one kind)", what));
  }
  return d;
}

// Blocks of the host sum of squares: fixed, so the order of additions is too.
constexpr int64_t kNormBlock = 16384;
constexpr int kNormLanes = 8;

// Sum of squares of g[0, n) in double: element k goes to lane k % 8 (eight independent chains the compiler
// turns into vector registers, where one running sum waits on each add's latency), the lanes added in a
// fixed tree.
double block_sum_of_squares(const float* __restrict g, int64_t n) {
  double lane[kNormLanes] = {};
  int64_t k = 0;
  for (; k + kNormLanes <= n; k += kNormLanes) {
    for (int j = 0; j < kNormLanes; ++j) {
      const double v = g[k + j];
      lane[j] += v * v;
    }
  }
  for (int j = 0; k < n; ++k, ++j) lane[j] += static_cast<double>(g[k]) * g[k];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

}  // namespace

// Every shard cut into blocks of kNormBlock elements; the blocks are summed in parallel into a list, then the
// list is added in order: the same double at any thread count, and bandwidth-bound rather than bound by the
// latency of one chain of dependent adds per thread.
double host_sum_of_squares(const std::vector<fsdp::ShardView>& shards) {
  std::vector<std::span<const float>> blocks;
  for (const fsdp::ShardView& s : shards) {
    for (int64_t at = 0; at < s.numel; at += kNormBlock)
      blocks.emplace_back(s.grad + at, static_cast<size_t>(std::min(kNormBlock, s.numel - at)));
  }
  const auto count = static_cast<int64_t>(blocks.size());
  std::vector<double> partial(blocks.size());
#pragma omp parallel for schedule(static) if (count > 2)
  for (int64_t b = 0; b < count; ++b) {
    const std::span<const float> block = blocks[static_cast<size_t>(b)];
    partial[static_cast<size_t>(b)] = block_sum_of_squares(block.data(), static_cast<int64_t>(block.size()));
  }
  double total = 0;
  for (const double p : partial) total += p;
  return total;
}

// On a timing device (runtime/timing_device.hpp, `shardtrain predict`): the same kernels, collective and copy as
// device_grad_sq_sum_start, as time. The fused AdamW kernel moves 28 bytes an element (param, m and v read and
// written, the gradient read); a sum of squares reads 4.
void GradNorm::timed_sq_sum_start(const std::vector<fsdp::ShardView>& shards, Communicator* device_axis, StreamRef stream) {
  timing::TimingDevice& t = *timing::current();
  if (device_.size() < sizeof(double)) device_ = DeviceBuffer(256);
  if (host_.size() < sizeof(double)) host_ = PinnedBuffer(sizeof(double));
  for (const fsdp::ShardView& v : shards) {
    if (v.numel == 0) continue;
    t.enqueue(stream, timing::WorkKind::Compute, t.memory_bound_seconds(4.0 * static_cast<double>(v.numel)),
              t.costs().launch_s, "grad norm sum_squares");
  }
  if (device_axis) device_axis->all_reduce(device_.data(), device_.data(), 1, DType::F64, ReduceOp::Sum, stream);
  copy_async(host_.data(), device_.data(), sizeof(double), stream);
  copied_.record(stream);
}

void AdamW::allocate_timed_state(State& s) {
  const size_t bytes = static_cast<size_t>(s.numel) * sizeof(float);
  s.device_exp_avg = DeviceBuffer(bytes);
  s.device_exp_avg_sq = DeviceBuffer(bytes);
  s.exp_avg = static_cast<float*>(s.device_exp_avg.data());
  s.exp_avg_sq = static_cast<float*>(s.device_exp_avg_sq.data());
}

void AdamW::step_timed(timing::TimingDevice& t, StreamRef stream, int64_t elements) const {
  t.enqueue(stream, timing::WorkKind::Compute, t.memory_bound_seconds(28.0 * static_cast<double>(elements)),
            t.costs().launch_s, "adamw");
}

void GradNorm::start(const std::vector<fsdp::ShardView>& shards, Communicator* shard_axis, StreamRef stream) {
  started_ = true;
  host_axis_ = nullptr;
  unit_sums_ = 0;
  on_device_ = shards_device(shards, "gradient norm") == DeviceKind::Cuda;
  const bool reduce = shard_axis != nullptr && shard_axis->size() > 1;
  if (on_device_) {
    const bool device_axis = reduce && shard_axis->space() == MemorySpace::Device;
    if (timing::current()) {
      timed_sq_sum_start(shards, device_axis ? shard_axis : nullptr, stream);
    } else {
      detail::device_grad_sq_sum_start(shards, device_axis ? shard_axis : nullptr, stream, device_, host_, copied_);
    }
    if (reduce && !device_axis) host_axis_ = shard_axis;
    return;
  }
  double total = 0;
  if (timing::current() && !shards.empty() && timing::TimingDevice::is_host_address(shards.front().param)) {
    // Offloaded shards on a timing device hold no memory: the sums are priced (4 bytes an element read), not run.
    timing::TimingDevice& t = *timing::current();
    double elements = 0;
    for (const fsdp::ShardView& v : shards) elements += static_cast<double>(v.numel);
    t.host_work(4.0 * elements / t.costs().host_memory_bytes_per_s, "grad norm sum_squares (host, priced)",
                timing::WorkKind::Compute);
  } else {
    total = host_sum_of_squares(shards);
  }
  if (reduce) shard_axis->all_reduce(std::span<double>(&total, 1), ReduceOp::Sum);
  value_ = total;
}

void GradNorm::start_from_unit_sums(const double* device_sums, size_t count, StreamRef stream) {
  started_ = true;
  on_device_ = true;
  unit_sums_ = count;
  host_axis_ = nullptr;
  if (host_.size() < count * sizeof(double)) host_ = PinnedBuffer(count * sizeof(double));  // once
  copy_async(host_.data(), device_sums, count * sizeof(double), stream);
  copied_.record(stream);
}

void GradNorm::start_local(const fsdp::FsdpEngine& engine, bool shards_rewritten) {
  const double* unit_sums = shards_rewritten ? nullptr : engine.device_grad_sq_sums();
  if (unit_sums) {
    start_from_unit_sums(unit_sums, engine.units().size());
  } else {
    start(engine.shards(), nullptr);
  }
}

double GradNorm::sum_of_squares() {
  if (!started_) throw InternalError("GradNorm: the result read before start()");
  started_ = false;
  if (on_device_) {
    copied_.synchronize();
    if (timing::TimingDevice::is_host_address(host_.data())) {
      value_ = 0;  // a timing device's pinned buffer: nothing was copied into it (what the device "holds": zeros)
    } else if (unit_sums_ > 0) {  // in unit order, as the device adds shards in start()
      const auto* sums = static_cast<const double*>(host_.data());
      value_ = 0;
      for (size_t i = 0; i < unit_sums_; ++i) value_ += sums[i];
    } else {
      std::memcpy(&value_, host_.data(), sizeof(double));
    }
    if (host_axis_) host_axis_->all_reduce(std::span<double>(&value_, 1), ReduceOp::Sum);
  }
  return value_;
}

double GradNorm::norm() { return std::sqrt(sum_of_squares()); }

double grad_sq_sum_local(const std::vector<fsdp::ShardView>& shards, StreamRef stream, GradNorm* reuse) {
  GradNorm local;
  GradNorm& g = reuse ? *reuse : local;
  g.start(shards, nullptr, stream);
  return g.sum_of_squares();
}

double grad_norm_global(const std::vector<fsdp::ShardView>& shards, Communicator& shard_axis, StreamRef stream,
                        GradNorm* reuse) {
  GradNorm local;
  GradNorm& g = reuse ? *reuse : local;
  g.start(shards, &shard_axis, stream);
  return g.norm();
}

double clip_coefficient(double grad_norm, double max_norm) {
  if (max_norm <= 0 || !std::isfinite(grad_norm)) return 1.0;
  return grad_norm > max_norm ? max_norm / (grad_norm + 1e-6) : 1.0;
}

void poison_first_gradient(const std::vector<fsdp::ShardView>& shards) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const fsdp::ShardView& s : shards) {
    if (s.numel == 0) continue;
    if (s.device == DeviceKind::Cuda) {
      detail::device_copy_sync(s.grad, &nan, sizeof(float));
    } else {
      s.grad[0] = nan;
    }
    return;
  }
}

}  // namespace shardtrain::optim
