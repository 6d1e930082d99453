// `shardtrain parity dump`: one forward+backward of a Llama model on a deterministic, right-padded batch,
// written out for an outside reference to recompute: the weights as a Hugging Face directory, every
// gradient under its Hugging Face name, the batch and the loss. scripts/parity-transformers.py compares
// them with transformers' LlamaForCausalLM (docs/model.md, "Parity with Hugging Face transformers").
// Offline: one process, on the CPU ops backend or the CUDA one (the global --device).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "command.hpp"
#include "shardtrain/checkpoint/export.hpp"
#include "shardtrain/checkpoint/source.hpp"
#include "shardtrain/model/dense_params.hpp"
#include "shardtrain/model/llama.hpp"
#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/ops/cuda_ops.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/topology.hpp"
#include "shardtrain/train/config_io.hpp"

namespace fs = std::filesystem;

namespace shardtrain::cli {
namespace {

constexpr int32_t kIgnoreIndex = -100;  // transformers' ignore_index, and ModelOptions' default

struct ParityOptions {
  std::string config, init_from, out, dtype = "f32";
  int64_t layers = 0, hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, vocab = 0;  // 0: the config's
  int64_t batch = 2, seq = 16;
  int64_t padded_rows = -1;  // -1: batch / 2 (the last rows)
  int64_t pad_len = -1;      // -1: max(1, seq / 4)
  int64_t pad_id = -1;       // -1: vocab_size - 1
  uint64_t seed = 1234;
  int threads = 0;
};

DType parse_parity_dtype(const std::string& text) {
  if (text == "f32" || text == "fp32" || text == "float32") return DType::F32;
  if (text == "bf16" || text == "bfloat16") return DType::BF16;
  throw UsageError(fmt::format("--dtype '{}': expected f32 or bf16 (the activation dtype)", text));
}

// The architecture: a training config's [model] section with the options given over it, or the one that
// --init-from's weights were saved with.
model::LlamaConfig resolve_model(const ParityOptions& o, std::unique_ptr<checkpoint::TensorSource>& source) {
  if (o.config.empty() == o.init_from.empty())
    throw UsageError(
        "parity dump: give the model with --config FILE (a training config's [model]) or with --init-from PATH "
        "(weights and their architecture), one of the two");
  const bool overridden = o.layers || o.hidden || o.intermediate || o.heads || o.kv_heads || o.vocab;
  if (!o.init_from.empty()) {
    if (overridden)
      throw UsageError(
          "--layers/--hidden/--intermediate/--heads/--kv-heads/--vocab change the architecture: not with "
          "--init-from, whose weights fix it");
    source = checkpoint::open_tensor_source(o.init_from);
    return source->model_config();
  }
  model::LlamaConfig c = train::load_train_config(o.config).model;
  if (o.layers) c.num_hidden_layers = o.layers;
  if (o.hidden) c.hidden_size = o.hidden;
  if (o.intermediate) c.intermediate_size = o.intermediate;
  if (o.heads) c.num_attention_heads = o.heads;
  if (o.kv_heads) c.num_key_value_heads = o.kv_heads;
  if (o.vocab) c.vocab_size = o.vocab;
  c.validate();
  return c;
}

// Random ids in [0, V) other than the pad id; the last `padded_rows` rows end with a run of pad tokens
// (pad_len, pad_len + 1, ... of them) whose targets are ignore_index. Targets are the next token, already
// shifted: the target of position i is the id at i + 1 (the last real position's comes from the same
// stream, one token past the row). attention_mask is 1 on real tokens, 0 on padding.
struct ParityBatch {
  int64_t batch = 0, seq = 0;
  int32_t pad_id = 0;
  std::vector<int32_t> input_ids, targets, attention_mask;  // (B, S) each
  std::vector<int64_t> lengths;                             // real tokens per row
  int64_t counted = 0;                                      // targets != ignore_index
};

ParityBatch make_batch(const ParityOptions& o, int64_t vocab) {
  ParityBatch pb;
  pb.batch = o.batch;
  pb.seq = o.seq;
  if (vocab < 2) throw UsageError(fmt::format("vocab_size {}: a parity batch needs at least 2 ids (one is padding)", vocab));
  const int64_t pad = o.pad_id >= 0 ? o.pad_id : vocab - 1;
  if (pad >= vocab) throw UsageError(fmt::format("--pad-id {}: expected an id in [0, {})", pad, vocab));
  pb.pad_id = static_cast<int32_t>(pad);
  const int64_t rows = o.padded_rows >= 0 ? o.padded_rows : o.batch / 2;
  const int64_t run = o.pad_len >= 0 ? o.pad_len : std::max<int64_t>(1, o.seq / 4);
  if (rows > o.batch) throw UsageError(fmt::format("--padded-rows {}: expected at most --batch ({})", rows, o.batch));
  if (rows > 0 && (run < 1 || run >= o.seq))
    throw UsageError(fmt::format("--pad-len {}: expected 1 to seq - 1 ({}) pad tokens, so a padded row keeps a real token",
                                 run, o.seq - 1));
  std::mt19937_64 gen(o.seed);  // fully specified by the standard: the same ids everywhere
  const auto draw = [&] {
    const auto id = static_cast<int64_t>(gen() % static_cast<uint64_t>(vocab - 1));
    return static_cast<int32_t>(id >= pad ? id + 1 : id);
  };
  const auto n = static_cast<size_t>(o.batch * o.seq);
  pb.input_ids.assign(n, pb.pad_id);
  pb.targets.assign(n, kIgnoreIndex);
  pb.attention_mask.assign(n, 0);
  for (int64_t r = 0; r < o.batch; ++r) {
    const int64_t j = r - (o.batch - rows);  // index among the padded rows, < 0 for a full row
    const int64_t length = j < 0 ? o.seq : o.seq - std::min(o.seq - 1, run + j);
    pb.lengths.push_back(length);
    std::vector<int32_t> tokens(static_cast<size_t>(length + 1));
    for (int32_t& t : tokens) t = draw();
    for (int64_t i = 0; i < length; ++i) {
      const auto at = static_cast<size_t>(r * o.seq + i);
      pb.input_ids[at] = tokens[static_cast<size_t>(i)];
      pb.targets[at] = tokens[static_cast<size_t>(i + 1)];
      pb.attention_mask[at] = 1;
    }
    pb.counted += length;
  }
  return pb;
}

std::vector<float> to_f32(const ops::Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::F32) std::copy_n(t.as<const float>(), v.size(), v.data());
  else if (t.dtype == DType::BF16) convert_bf16_to_f32(t.as<const bf16>(), v.data(), v.size());
  else throw InternalError(fmt::format("parity dump: cannot read a {} tensor as fp32", t.describe()));
  return v;
}

ops::Tensor on_device(const DeviceBuffer& buffer, const ops::Tensor& host, const ops::Tensor& host_base) {
  const auto offset = static_cast<char*>(host.data) - static_cast<char*>(host_base.data);
  return ops::make_tensor(static_cast<char*>(buffer.data()) + offset, host.dtype, host.shape, DeviceKind::Cuda);
}

// The CUDA backend: parameters (as `params` holds them) and f32 gradients in device buffers owned here,
// the batch on the device, an explicit loss scale; the gradients come back into `params`.
model::LossResult run_on_cuda(model::LlamaModel& llama, ops::Ops& ops, model::DenseParams& params, const ParityBatch& pb,
                              double scale) {
  const ops::Tensor host_params = params.flat_params(), host_grads = params.flat_grads();
  const size_t id_bytes = pb.input_ids.size() * sizeof(int32_t);
  DeviceBuffer dev_params(host_params.bytes()), dev_grads(host_grads.bytes()), dev_ids(id_bytes), dev_targets(id_bytes);
  copy_async(dev_params.data(), host_params.data, host_params.bytes(), StreamRef{});
  copy_async(dev_ids.data(), pb.input_ids.data(), id_bytes, StreamRef{});
  copy_async(dev_targets.data(), pb.targets.data(), id_bytes, StreamRef{});
  ops.fill(ops::make_tensor(dev_grads.data(), host_grads.dtype, host_grads.shape, DeviceKind::Cuda), 0.0);
  model::ParamBinding& binding = llama.binding();
  for (const model::ParamInfo& p : llama.spec().params()) {
    binding.bind_param(p.index, on_device(dev_params, params.param(p.index), host_params));
    binding.bind_grad(p.index, on_device(dev_grads, params.grad(p.index), host_grads));
  }
  model::Batch batch;
  batch.input_ids = ops::make_tensor(dev_ids.data(), DType::I32, {pb.batch, pb.seq}, DeviceKind::Cuda);
  batch.targets = ops::make_tensor(dev_targets.data(), DType::I32, {pb.batch, pb.seq}, DeviceKind::Cuda);
  batch.pad_token_id = pb.pad_id;
  stream_synchronize(StreamRef{});
  const model::LossResult r = llama.forward_backward(batch, model::StepOptions{scale});
  copy_async(host_grads.data, dev_grads.data(), host_grads.bytes(), StreamRef{});
  stream_synchronize(StreamRef{});
  for (const model::ParamInfo& p : llama.spec().params()) binding.unbind(p.index);  // the buffers end here
  return r;
}

void write_json_file(const fs::path& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(1) << "\n";
  if (!out) throw IoError(fmt::format("{}: cannot write", path.string()));
}

nlohmann::json rows_of(const std::vector<int32_t>& v, int64_t batch, int64_t seq) {
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t r = 0; r < batch; ++r) rows.push_back(std::vector<int32_t>(v.begin() + r * seq, v.begin() + (r + 1) * seq));
  return rows;
}

int run_parity_dump(const ParityOptions& o, DevicePreference device) {
  const DType act = parse_parity_dtype(o.dtype);
  std::unique_ptr<checkpoint::TensorSource> source;
  const model::LlamaConfig config = resolve_model(o, source);
  const fs::path out(o.out);
  if (fs::exists(out) && !(fs::is_directory(out) && fs::is_empty(out)))
    throw UsageError(
        fmt::format("--out {}: already exists and is not an empty directory; the dump never overwrites", o.out));
  const ParityBatch pb = make_batch(o, config.vocab_size);

  // The backend: CUDA when asked for, or by default when a GPU exists and the model can run there.
  const int threads = o.threads > 0 ? o.threads : usable_cores();
  require_threads_start(threads, "--threads");  // the CPU backend is also the fallback below
  bool cuda = device == DevicePreference::Cuda || (device == DevicePreference::Auto && cuda_device_count() > 0);
  model::ModelOptions mo;
  mo.activation_dtype = act;
  mo.ignore_index = kIgnoreIndex;
  std::unique_ptr<ops::Ops> ops = cuda ? ops::make_cuda_ops() : ops::make_cpu_ops(ops::CpuOpsOptions{threads});
  auto llama = std::make_unique<model::LlamaModel>(config, *ops, mo);
  if (cuda && llama->prepare(pb.batch, pb.seq).hidden[0].device != DeviceKind::Cuda) {
    const char* why =
        "the model places its activations in host memory (docs/model.md, \"Not yet\"), which the CUDA ops refuse";
    if (device == DevicePreference::Cuda)
      throw Error(ExitCode::Device, fmt::format("parity dump --device cuda: {}; run with --device cpu", why));
    log::warn("parity dump: {}: running on the CPU ops backend", why);
    cuda = false;
    llama.reset();
    ops = ops::make_cpu_ops(ops::CpuOpsOptions{threads});
    llama = std::make_unique<model::LlamaModel>(config, *ops, mo);
  }
  const model::ModelSpec& spec = llama->spec();

  // fp32 weights (the model's own init, or --init-from's); with bf16 activations the model computes with
  // their bf16 rounding, and that rounding is what the Hugging Face directory holds.
  model::DenseParams master(spec);
  if (source) checkpoint::load_dense(*source, master);
  else master.initialize();
  std::optional<model::DenseParams> rounded;
  if (act == DType::BF16) {
    rounded.emplace(spec, DType::BF16, DType::F32);
    for (const model::ParamInfo& p : spec.params())
      convert_f32_to_bf16(master.param(p.index).as<const float>(), rounded->param(p.index).as<bf16>(),
                          static_cast<size_t>(p.numel));
  }
  model::DenseParams& params = rounded ? *rounded : master;
  params.zero_grads();

  const double scale = 1.0 / static_cast<double>(pb.counted);  // the mean over counted targets
  model::LossResult r;
  if (cuda) {
    r = run_on_cuda(*llama, *ops, params, pb, scale);
  } else {
    params.bind(llama->binding());
    model::Batch batch;
    batch.input_ids = ops::make_tensor(const_cast<int32_t*>(pb.input_ids.data()), DType::I32, {pb.batch, pb.seq});
    batch.targets = ops::make_tensor(const_cast<int32_t*>(pb.targets.data()), DType::I32, {pb.batch, pb.seq});
    batch.pad_token_id = pb.pad_id;
    r = llama->forward_backward(batch, model::StepOptions{scale});
  }
  if (r.tokens != pb.counted)
    throw InternalError(fmt::format("parity dump: the model counted {} targets, the batch has {}", r.tokens, pb.counted));

  // Outputs: weights and gradients in fp32 under the Hugging Face names, the batch, the result last.
  std::vector<std::vector<float>> weights, grads;
  for (const model::ParamInfo& p : spec.params()) {
    weights.push_back(to_f32(params.param(p.index)));
    grads.push_back(to_f32(params.grad(p.index)));
  }
  std::vector<checkpoint::FullTensor> weight_tensors, grad_tensors;
  nlohmann::json shapes = nlohmann::json::array();
  double grad_sq = 0;
  bool finite = std::isfinite(r.loss_sum);
  for (const model::ParamInfo& p : spec.params()) {
    const auto i = static_cast<size_t>(p.index);
    weight_tensors.push_back({p.name, p.shape, weights[i]});
    grad_tensors.push_back({p.name, p.shape, grads[i]});
    shapes.push_back({{"name", p.name}, {"shape", p.shape}});
    for (float g : grads[i]) {
      grad_sq += static_cast<double>(g) * g;
      finite = finite && std::isfinite(g);
    }
  }
  fs::create_directories(out);
  checkpoint::ExportOptions eo;
  eo.format = checkpoint::ExportFormat::Safetensors;
  eo.dtype = act == DType::BF16 ? DType::BF16 : DType::F32;  // bf16: exactly the values computed with
  checkpoint::export_hf_directory(config, weight_tensors, (out / "hf").string(), eo);
  checkpoint::write_safetensors_file((out / "grads.safetensors").string(), grad_tensors, DType::F32);
  write_json_file(out / "batch.json", {{"input_ids", rows_of(pb.input_ids, pb.batch, pb.seq)},
                                       {"targets", rows_of(pb.targets, pb.batch, pb.seq)},
                                       {"attention_mask", rows_of(pb.attention_mask, pb.batch, pb.seq)}});
  const nlohmann::json result = {
      {"format", "shardtrain-parity-dump"},
      {"loss", r.mean()},
      {"loss_sum", r.loss_sum},
      {"counted_tokens", r.tokens},
      {"finite", finite},
      {"grad_norm", std::sqrt(grad_sq)},
      {"backend", cuda ? "cuda" : "cpu"},
      {"dtype", dtype_name(act)},
      {"weights_dtype", dtype_name(eo.dtype)},
      {"grads_dtype", "f32"},
      {"batch", pb.batch},
      {"seq", pb.seq},
      {"row_lengths", pb.lengths},
      {"pad_token_id", pb.pad_id},
      {"ignore_index", kIgnoreIndex},
      {"seed", o.seed},
      {"weights", source ? fmt::format("from {}", o.init_from)
                         : fmt::format("init {} (seed {})", model::init_scheme_name(config.init_scheme), config.init_seed)},
      {"config", o.config},
      {"model",
       {{"vocab_size", config.vocab_size},
        {"hidden_size", config.hidden_size},
        {"intermediate_size", config.intermediate_size},
        {"num_hidden_layers", config.num_hidden_layers},
        {"num_attention_heads", config.num_attention_heads},
        {"num_key_value_heads", config.num_key_value_heads},
        {"head_dim", config.head_dim()},
        {"rms_norm_eps", config.rms_norm_eps},
        {"rope_theta", config.rope_theta},
        {"rope_scaling", ops::rope_scaling_name(config.rope_scaling)},
        {"rope_factor", config.rope_factor},
        {"rope_low_freq_factor", config.rope_low_freq_factor},
        {"rope_high_freq_factor", config.rope_high_freq_factor},
        {"rope_original_max_position_embeddings", config.rope_original_max_position_embeddings},
        {"tie_word_embeddings", config.tie_word_embeddings}}},
      {"params", shapes},
      {"files", {{"hf", "hf"}, {"grads", "grads.safetensors"}, {"batch", "batch.json"}}}};
  write_json_file(out / "result.json", result);
  std::printf("parity dump: loss %.9g over %lld targets (%s, %s activations), %zu gradients -> %s\n", r.mean(),
              static_cast<long long>(r.tokens), cuda ? "cuda" : "cpu", dtype_name(act), grads.size(), o.out.c_str());
  std::fflush(stdout);
  if (!finite)
    throw DataError(
        fmt::format("parity dump: the loss or a gradient is not finite (see {})", (out / "result.json").string()));
  return 0;
}

}  // namespace

Command add_parity_command(CLI::App& parent) {
  auto o = std::make_shared<ParityOptions>();
  Command c;
  c.app = parent.add_subcommand("parity", "parity checks against Hugging Face transformers (docs/model.md)");
  c.app->require_subcommand(1);
  c.launch = Launch::Offline;
  c.offline_device = true;
  CLI::App* d = c.app->add_subcommand(
      "dump", "one forward+backward on a fixed padded batch: weights (HF directory), gradients, batch and loss into --out");
  d->add_option("--config,-c", o->config, "a training config (TOML): its [model] section");
  d->add_option("--init-from", o->init_from,
                "weights instead of the model's init: a checkpoint, consolidated .h5 or HF directory");
  d->add_option("--out,-o", o->out, "output directory (new or empty)")
      ->required()
      ->check(CLI::Validator(
          [](std::string& s) { return s.empty() ? std::string("expected a folder's name (new or empty)") : ""; }, ""));
  d->add_option("--dtype", o->dtype, "activations: f32 or bf16 (bf16 also rounds the weights)")->capture_default_str();
  d->add_option("--layers", o->layers, "num_hidden_layers over the config's")->check(count_range());
  d->add_option("--hidden", o->hidden, "hidden_size over the config's")->check(count_range());
  d->add_option("--intermediate", o->intermediate, "intermediate_size over the config's")->check(count_range());
  d->add_option("--heads", o->heads, "num_attention_heads over the config's")->check(count_range());
  d->add_option("--kv-heads", o->kv_heads, "num_key_value_heads over the config's")->check(count_range());
  d->add_option("--vocab", o->vocab, "vocab_size over the config's")->check(count_range());
  d->add_option("--batch", o->batch, "rows")->capture_default_str()->check(count_range());
  d->add_option("--seq", o->seq, "tokens per row")->capture_default_str()->check(count_range());
  // -1 inside stands for "not given": a value given must be 0 or more (the upper bounds are checked with the shapes).
  d->add_option("--padded-rows", o->padded_rows, "how many of the last rows end with padding (default batch / 2)")
      ->check(count_range(0));
  d->add_option("--pad-len", o->pad_len, "pad tokens ending the first padded row, one more per later row (default seq / 4)")
      ->check(count_range(0));
  d->add_option("--pad-id", o->pad_id, "the pad token id (default vocab_size - 1; the model config has none)")
      ->check(count_range(0));
  d->add_option("--seed", o->seed, "seed of the batch's token ids")->capture_default_str()->check(unsigned_check());
  d->add_option("--threads", o->threads, "CPU backend threads (0 = hardware cores, at most 1024)")
      ->capture_default_str()
      ->check(cpu_threads_range());
  // The device comes from the global --device (auto, cpu or cuda), which main hands only to MPI commands.
  const CLI::Option* global_device = parent.get_option_no_throw("--device");
  c.run = [o, global_device](Runtime*) {
    const std::string device = global_device && global_device->count() > 0 ? global_device->as<std::string>() : "auto";
    return run_parity_dump(*o, parse_device_preference(device));
  };
  return c;
}

}  // namespace shardtrain::cli
