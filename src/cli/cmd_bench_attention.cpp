// `shardtrain bench attention`: every attention implementation of the backend at given shapes, forward and
// backward, in TFLOP/s, beside each other: on a GPU cuDNN's fused flash attention (deterministic backward and
// not), our tensor-core kernels (mma) and our FMA kernels (fma, at sequences up to 2048); on the CPU its one
// implementation. Each row also says how far its output and gradients are from the tensor-core kernels' (the
// first GPU reference that ran), and whether two backward runs gave the same bits.
// Work counted as FlashAttention's benchmarks count it: forward 4 B H S^2 Dh / 2 (causal: half the score matrix),
// backward 2.5 x forward (five products of that size, the recompute of the scores included). With documents the
// causal count is kept (the kernels skip more, so the rate reads higher than the arithmetic done).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cmd_bench.hpp"
#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/ops/cuda_ops.hpp"
#include "shardtrain/ops/peak.hpp"
#include "shardtrain/runtime/dtype.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/timer.hpp"

namespace shardtrain::cli {
namespace {

using ops::Tensor;

struct BenchAttentionOptions {
  std::vector<std::string> shapes;  // "B,S,H,Hkv,Dh"
  int documents = 0;                // documents per row (0: plain causal)
  int iters = 10, warmup = 3;
  std::string json, markdown;
};

struct Shape {
  int64_t b, s, h, hkv, dh;
  std::string name;
};

// The shapes issue 35 names: the seed's (Dh 64, seq 512), Llama 3.2 1B's micro-batch (Dh 64, seq 2048) and
// Llama 3 8B's (Dh 128, seq 8192), each a micro-batch one GPU takes.
const std::vector<Shape> kDefaultShapes = {
    {64, 512, 12, 3, 64, "seed"}, {8, 2048, 32, 8, 64, "1B"}, {1, 8192, 32, 8, 128, "8B"}};

Shape parse_shape(const std::string& text) {
  std::vector<int64_t> v;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    try {
      size_t used = 0;
      v.push_back(std::stoll(part, &used));
      if (used != part.size()) v.back() = -1;
    } catch (const std::exception&) {
      v.push_back(-1);
    }
  }
  if (v.size() != 5 || v[0] < 1 || v[1] < 1 || v[2] < 1 || v[3] < 1 || v[4] < 1 || v[2] % v[3] != 0)
    throw UsageError(fmt::format("bench attention: --shape '{}': expected B,S,H,Hkv,Dh (positive, Hkv dividing H)", text));
  return Shape{v[0], v[1], v[2], v[3], v[4], text};
}

struct Row {
  std::string shape, impl, ran, note;
  double fwd_s = 0, bwd_s = 0, fwd_flops = 0;
  double out_err = -1, grad_err = -1;  // relative L2 against the reference; -1: not compared
  int deterministic = -1;              // two backward runs bit-identical: 1, differ: 0, not checked: -1
};

std::vector<uint16_t> to_host(const Tensor& t, StreamRef stream) {
  std::vector<uint16_t> h(static_cast<size_t>(t.numel()) * dtype_size(t.dtype) / 2);
  copy_async(h.data(), t.data, t.bytes(), stream);
  stream_synchronize(stream);
  return h;
}

std::string tflops(double flops_per_s) {
  const double t = flops_per_s * 1e-12;
  return t >= 10 ? fmt::format("{:.1f}", t) : fmt::format("{:.3g}", t);
}

double bf16_value(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ||a - b|| / ||b|| over bf16 (or f32) contents.
double rel_err(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b, DType dtype) {
  double num = 0, den = 0;
  if (dtype == DType::BF16) {
    for (size_t i = 0; i < a.size(); ++i) {
      const double x = bf16_value(a[i]), y = bf16_value(b[i]);
      num += (x - y) * (x - y), den += y * y;
    }
  } else {
    const auto* fa = reinterpret_cast<const float*>(a.data());
    const auto* fb = reinterpret_cast<const float*>(b.data());
    for (size_t i = 0; i < a.size() / 2; ++i) num += (fa[i] - fb[i]) * (fa[i] - fb[i]), den += double(fb[i]) * fb[i];
  }
  return den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
}

int run_bench_attention(const BenchAttentionOptions& o, Runtime* rt) {
  if (rt->topology().world_size > 1)
    throw UsageError("bench attention: runs on one rank (start it without mpirun, or with -np 1)");
  if (o.documents < 0) throw UsageError(fmt::format("bench attention: --documents {}: expected 0 or more", o.documents));
  std::vector<Shape> shapes;
  for (const std::string& s : o.shapes) shapes.push_back(parse_shape(s));
  if (shapes.empty()) shapes = kDefaultShapes;

  const Device& device = rt->device();
  const bool cuda = device.is_cuda();
  // A shape far past the memory failed as std::bad_alloc (an "internal error"): about a dozen tensors of B S H Dh
  // (inputs, output, gradients, the reference's copies) in f32 is the bound, checked before anything is allocated.
  const double memory = cuda ? static_cast<double>(device.memory_bytes)
                             : static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  for (const Shape& sh : shapes) {
    const double bytes = 12.0 * 4.0 * static_cast<double>(sh.b) * static_cast<double>(sh.s) * static_cast<double>(sh.h) *
                         static_cast<double>(sh.dh);
    if (memory > 0 && bytes > memory)
      throw ConfigError(fmt::format("bench attention: --shape '{}' needs about {:.3g} GiB, more than the {:.3g} GiB of {}",
                                    sh.name, bytes / (1ull << 30), memory / (1ull << 30),
                                    cuda ? device.name : std::string("this host")));
  }
  std::unique_ptr<CudaStream> stream;
  std::unique_ptr<ops::Ops> backend;
  if (cuda) {
    backend = ops::make_cuda_ops();
    stream = std::make_unique<CudaStream>();
    backend->set_stream(stream->ref());
  } else {
    backend = ops::make_cpu_ops(ops::CpuOpsOptions{rt->host_threads()});
  }
  const StreamRef sref = stream ? stream->ref() : StreamRef{};
  const DType dt = cuda ? DType::BF16 : DType::F32;
#if SHARDTRAIN_WITH_CUDA
  auto* cuda_ops = cuda ? static_cast<ops::CudaOps*>(backend.get()) : nullptr;
  const ops::AttentionImpl initial = cuda ? ops::CudaOps::attention_impl() : ops::AttentionImpl::Auto;
#endif

  std::vector<Row> rows;
  for (const Shape& sh : shapes) {
    const ops::AttentionShape as{sh.b, sh.s, sh.h, sh.hkv, sh.dh};
    const int64_t n = sh.b * sh.s;
    std::vector<ops::OpsBuffer> buffers;
    uint64_t seed = 0;
    auto tensor = [&](DType d, ops::Shape shape, double scale) {
      buffers.emplace_back(backend->device(), static_cast<size_t>(shape.numel()) * dtype_size(d));
      const Tensor t = buffers.back().view(d, shape);
      if (scale > 0) ops::fill_uniform(t, ++seed, scale, sref);
      return t;
    };
    const Tensor q = tensor(dt, {sh.b, sh.s, sh.h, sh.dh}, 1.0), k = tensor(dt, {sh.b, sh.s, sh.hkv, sh.dh}, 1.0),
                 v = tensor(dt, {sh.b, sh.s, sh.hkv, sh.dh}, 1.0), dout = tensor(dt, {sh.b, sh.s, sh.h, sh.dh}, 1.0);
    const Tensor out = tensor(dt, {sh.b, sh.s, sh.h, sh.dh}, 0), lse = tensor(DType::F32, {sh.b, sh.h, sh.s}, 0);
    const Tensor dq = tensor(dt, {sh.b, sh.s, sh.h, sh.dh}, 0), dk = tensor(dt, {sh.b, sh.s, sh.hkv, sh.dh}, 0),
                 dv = tensor(dt, {sh.b, sh.s, sh.hkv, sh.dh}, 0);
    // Segments: 0 everywhere (causal), or --documents runs of equal length per row.
    const Tensor segments = tensor(DType::I32, {sh.b, sh.s}, 0);
    {
      std::vector<int32_t> seg(static_cast<size_t>(n), 0);
      const int64_t docs = std::max<int64_t>(1, o.documents);
      for (int64_t r = 0; r < sh.b; ++r)
        for (int64_t i = 0; i < sh.s; ++i)
          seg[static_cast<size_t>(r * sh.s + i)] = static_cast<int32_t>(r * docs + i * docs / sh.s);
      copy_async(segments.data, seg.data(), seg.size() * 4, sref);
      stream_synchronize(sref);
    }
    ops::AttentionMask mask{segments};
    mask.hint = o.documents > 0 ? ops::SegmentsHint::Documents : ops::SegmentsHint::Causal;
    mask.runs = o.documents > 0 ? sh.b * o.documents : 0;
    const double fwd_flops = 4.0 * static_cast<double>(sh.b * sh.h) * static_cast<double>(sh.s) * static_cast<double>(sh.s) *
                             static_cast<double>(sh.dh) / 2.0;

    struct Impl {
      std::string name;
      bool deterministic;
    };
    std::vector<Impl> impls;
    if (cuda) {
      impls = {{"mma", true}, {"cudnn", true}, {"cudnn", false}};
      if (sh.s <= 2048) impls.push_back({"fma", true});
    } else {
      impls = {{"cpu", true}};
    }
    std::vector<uint16_t> ref_out, ref_dq, ref_dk, ref_dv;
    for (const Impl& im : impls) {
      Row r;
      r.shape = fmt::format("B={} S={} H={}/{} Dh={}{}", sh.b, sh.s, sh.h, sh.hkv, sh.dh,
                            o.documents > 0 ? fmt::format(" documents {}/row", o.documents) : std::string(" causal"));
      r.impl = im.name == "cudnn" ? (im.deterministic ? "cudnn (deterministic)" : "cudnn (fast backward)") : im.name;
      r.fwd_flops = fwd_flops;
#if SHARDTRAIN_WITH_CUDA
      if (cuda) {
        cuda_ops->set_deterministic_attention(im.deterministic);
        if (im.name == "cudnn") {  // what Auto would run: cuDNN only where it can run the call
          ops::CudaOps::set_attention_impl(ops::AttentionImpl::Auto);
          const std::string fwd_choice = cuda_ops->attention_choice(as, dt, mask, false);
          const std::string bwd_choice = cuda_ops->attention_choice(as, dt, mask, true);
          if (fwd_choice != "cudnn" || bwd_choice != "cudnn") {
            r.ran = "not run";
            r.note = fwd_choice != "cudnn" ? fwd_choice : bwd_choice;
            rows.push_back(r);
            continue;
          }
        }
        ops::CudaOps::set_attention_impl(im.name == "cudnn" ? ops::AttentionImpl::Cudnn
                                         : im.name == "mma" ? ops::AttentionImpl::Mma
                                                            : ops::AttentionImpl::Fma);
      }
#endif
      try {
        r.fwd_s = median_call_seconds(backend->device(), sref, o.warmup, o.iters,
                                      [&] { backend->attention_forward(as, q, k, v, mask, out, lse); });
        r.bwd_s = median_call_seconds(backend->device(), sref, o.warmup, o.iters,
                                      [&] { backend->attention_backward(as, q, k, v, out, lse, dout, mask, dq, dk, dv); });
        r.ran = "ran";
        // Correctness beside the speed: the output and gradients against the first implementation that ran.
        backend->attention_forward(as, q, k, v, mask, out, lse);
        backend->attention_backward(as, q, k, v, out, lse, dout, mask, dq, dk, dv);
        const std::vector<uint16_t> h_out = to_host(out, sref), h_dq = to_host(dq, sref), h_dk = to_host(dk, sref),
                                    h_dv = to_host(dv, sref);
        backend->attention_backward(as, q, k, v, out, lse, dout, mask, dq, dk, dv);
        r.deterministic = to_host(dq, sref) == h_dq && to_host(dk, sref) == h_dk && to_host(dv, sref) == h_dv ? 1 : 0;
        if (ref_out.empty()) {
          ref_out = h_out, ref_dq = h_dq, ref_dk = h_dk, ref_dv = h_dv;
        } else {
          r.out_err = rel_err(h_out, ref_out, dt);
          r.grad_err = std::max({rel_err(h_dq, ref_dq, dt), rel_err(h_dk, ref_dk, dt), rel_err(h_dv, ref_dv, dt)});
        }
      } catch (const Error& e) {
        r.ran = "failed";
        r.note = e.what();
      }
      rows.push_back(r);
    }
  }
#if SHARDTRAIN_WITH_CUDA
  if (cuda) ops::CudaOps::set_attention_impl(initial);
#endif

  const std::string ref_name = cuda ? "mma" : "cpu";
  fmt::print(
      "bench attention on {}: {} in, fp32 statistics; median of {} calls after {} warm-up; TFLOP/s as FlashAttention "
      "counts (forward 2 B H S^2 Dh causal, backward 2.5x); errors: relative L2 against {}\n\n",
      device.describe(), dtype_name(dt), o.iters, o.warmup, ref_name);
  std::string md = fmt::format(
      "| shape | implementation | forward | TFLOP/s | backward | TFLOP/s | out err | grad err | deterministic | note |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    const bool ran = r.ran == "ran";
    auto err = [](double e) { return e < 0 ? std::string("ref") : fmt::format("{:.2e}", e); };
    const std::string line =
        ran ? fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |", r.shape, r.impl, format_seconds(r.fwd_s),
                          tflops(r.fwd_flops / r.fwd_s), format_seconds(r.bwd_s), tflops(2.5 * r.fwd_flops / r.bwd_s),
                          err(r.out_err), err(r.grad_err), r.deterministic == 1 ? "yes" : "no", r.note)
            : fmt::format("| {} | {} | | | | | | | | {}: {} |", r.shape, r.impl, r.ran, r.note);
    md += line + "\n";
  }
  fmt::print("{}", md);
  if (!o.markdown.empty()) {
    write_text_file(o.markdown, fmt::format("# bench attention on {}\n\n{} in, fp32 statistics; median of {} calls after {} "
                                            "warm-up; TFLOP/s as FlashAttention counts (forward 2 B H S^2 Dh causal, "
                                            "backward 2.5x forward); errors: relative L2 against {}\n\n{}",
                                            device.describe(), dtype_name(dt), o.iters, o.warmup, ref_name, md));
  }
  if (!o.json.empty()) {
    nlohmann::ordered_json j;
    j["device"] = device.describe();
    j["dtype"] = dtype_name(dt);
    j["iters"] = o.iters;
    j["warmup"] = o.warmup;
    j["flops_convention"] = "forward 4*B*H*S^2*Dh/2 (causal), backward 2.5x forward";
    j["reference"] = ref_name;
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const Row& r : rows) {
      nlohmann::ordered_json x;
      x["shape"] = r.shape;
      x["implementation"] = r.impl;
      x["ran"] = r.ran;
      x["note"] = r.note;
      if (r.ran == "ran") {
        x["forward_s"] = r.fwd_s;
        x["backward_s"] = r.bwd_s;
        x["forward_tflops"] = r.fwd_flops / r.fwd_s * 1e-12;
        x["backward_tflops"] = 2.5 * r.fwd_flops / r.bwd_s * 1e-12;
        x["out_rel_err"] = r.out_err;
        x["grad_rel_err"] = r.grad_err;
        x["deterministic"] = r.deterministic == 1;
      }
      list.push_back(x);
    }
    j["rows"] = list;
    write_text_file(o.json, j.dump(2) + "\n");
  }
  for (const Row& r : rows)
    if (r.ran == "failed") return 1;
  return 0;
}

}  // namespace

BenchSubcommand add_bench_attention_command(CLI::App& bench) {
  auto o = std::make_shared<BenchAttentionOptions>();
  CLI::App* a = bench.add_subcommand("attention",
                                     "time every attention implementation (cuDNN, our tensor-core and FMA "
                                     "kernels) forward and backward at given shapes, with their errors");
  a->add_option("--shape", o->shapes, "B,S,H,Hkv,Dh (repeatable; default: the seed's, the 1B's and the 8B's micro-batches)");
  a->add_option("--documents", o->documents, "documents per row, packed (0: plain causal)")->capture_default_str();
  a->add_option("--iters", o->iters, "timed calls per row")->capture_default_str()->check(CLI::Range(1, 100000));
  a->add_option("--warmup", o->warmup, "untimed calls first")->capture_default_str()->check(CLI::Range(0, 100000));
  a->add_option("--json", o->json, "also write the rows as JSON to this file")->check(output_file_check());
  a->add_option("--markdown", o->markdown, "also write the table as markdown to this file")->check(output_file_check());
  return {a, [o](Runtime* rt) { return run_bench_attention(*o, rt); }};
}

}  // namespace shardtrain::cli
