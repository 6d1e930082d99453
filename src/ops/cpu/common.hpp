// Private helpers of the CPU backend: the per-backend context (threads, scratch), its side of the shared
// argument checks (../validate.hpp), dtype dispatch, and load/store between storage types (f32, bf16, f64)
// and the compute type (f32, or f64 for f64 storage).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "../validate.hpp"
#include "shardtrain/ops/host_buffer.hpp"
#include "shardtrain/ops/ops.hpp"
#include "shardtrain/runtime/dtype.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::ops::cpu {

// Scratch slots: each op uses its own slots so nested helpers never overwrite a caller's buffer.
enum class Slot { GemmA, GemmB, GemmC, Weight, WeightGrad, Logits, LossRows, Count };

struct Context {
  int threads = 1;
  std::vector<HostBuffer> scratch = std::vector<HostBuffer>(static_cast<size_t>(Slot::Count));
  // Ops::defer_loss: while on, the loss ops return zero sums and add theirs to deferred_total.
  bool defer_loss = false;
  LossSums deferred_total;

  LossSums deferred(const LossSums& s) {
    if (!defer_loss) return s;
    deferred_total.loss_sum += s.loss_sum;
    deferred_total.tokens += s.tokens;
    return {};
  }

  template <typename T>
  T* scratch_for(Slot slot, int64_t count) {
    HostBuffer& b = scratch[static_cast<size_t>(slot)];
    b.reserve(static_cast<size_t>(count) * sizeof(T));
    return b.as<T>();
  }
};

template <typename T>
struct compute_type {
  using type = float;
};
template <>
struct compute_type<double> {
  using type = double;
};
template <typename T>
using acc_t = typename compute_type<T>::type;

template <typename T>
inline acc_t<T> load(const T& v) {
  return static_cast<acc_t<T>>(v);
}
template <typename T, typename A>
inline void store(T& dst, A v) {
  if constexpr (std::is_same_v<T, bf16>) dst = bf16(static_cast<float>(v));
  else dst = static_cast<T>(v);
}

inline void require_cpu(const Tensor& t, const char* op, const char* name) {
  require(t.defined(), op, "{} is not bound", name);
  require(t.device == DeviceKind::Cpu, op, "{} is not in host memory", name);
}

inline void require_float(const Tensor& t, const char* op, const char* name) {
  require_cpu(t, op, name);
  require(dtype_is_float(t.dtype), op, "{} has dtype {}, expected f32, bf16 or f64", name, dtype_name(t.dtype));
}

// The CPU backend's side of the shared validators: host memory; f32, bf16 or f64. A peer operand (one the op
// compares with a checked tensor) is left to that comparison.
class HostTensorChecks final : public TensorChecks {
 public:
  void require_resident(const Tensor& t, const char* op, const char* name) const override { require_cpu(t, op, name); }
  void require_float(const Tensor& t, const char* op, const char* name) const override { cpu::require_float(t, op, name); }
  // Peers too: an unbound k, v, out or dout must be an error, not a null dereference.
  void require_peer(const Tensor& t, const char* op, const char* name) const override { cpu::require_float(t, op, name); }
};
inline constexpr HostTensorChecks tensor_checks{};

// Calls f(T{}) with T the storage type of dtype t.
template <typename F>
decltype(auto) dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::F32: return f(float{});
    case DType::BF16: return f(bf16{});
    case DType::F64: return f(double{});
    default: break;
  }
  throw InternalError(fmt::format("{}: unsupported dtype {}", op, dtype_name(t)));
}

// A float tensor in compute type A: the tensor's own memory when it already is A, else a converted copy.
template <typename A>
const A* as_compute(Context& ctx, Slot slot, const Tensor& t) {
  if (t.dtype == dtype_of_v<A>) return t.as<const A>();
  A* out = ctx.scratch_for<A>(slot, t.numel());
  const int64_t n = t.numel();
  dispatch_float(t.dtype, "as_compute", [&](auto tag) {
    using T = decltype(tag);
    const T* in = t.as<const T>();
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<A>(load(in[i]));
  });
  return out;
}

// dst = src (Into::Store) or dst += src (Into::Add); src in compute type A, dst any float dtype.
enum class Into { Store, Add };
template <typename A>
void write_into(const A* src, const Tensor& dst, Into how) {
  const int64_t n = dst.numel();
  dispatch_float(dst.dtype, "write_into", [&](auto tag) {
    using T = decltype(tag);
    T* out = dst.as<T>();
    for (int64_t i = 0; i < n; ++i) store(out[i], how == Into::Add ? load(out[i]) + src[i] : src[i]);
  });
}

}  // namespace shardtrain::ops::cpu
