// q/k/v as one GEMM and gate/up as one (decoder_layer.cpp) against one GEMM per projection
// (ProjectionFusion::Never): the same loss and gradients within rounding, with and without checkpointing; the
// bindings that decide it (DenseParams, FSDP unit layouts of two wrap policies, a binding that separates the
// parameters), the debug line that says so, the gradient binding the fused MLP backward needs, and the order of
// the hooks around a fused group.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "model_test_util.hpp"
#include "shardtrain/fsdp/units.hpp"
#include "shardtrain/model/dense_params.hpp"
#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"

namespace shardtrain::model::test {
namespace {

// GQA 6 over 2 heads of 24, and 8 heads of 8 without grouping (the shapes the op tests run, at model scale).
LlamaConfig config(int64_t heads, int64_t kv_heads, int64_t head_dim) {
  LlamaConfig c = tiny_config();
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.hidden_size = heads * head_dim;
  c.intermediate_size = 40;
  c.vocab_size = 23;
  return c;
}

struct Result {
  double loss = 0;
  std::vector<double> grads;  // every gradient element, in parameter order
  std::vector<LayerProjections> paths;
};

// The parameters' values, so that differently laid out stores hold the same model.
std::vector<std::vector<double>> initial_values(const ModelSpec& spec) {
  DenseParams init(spec, DType::F64, DType::F64);
  init.initialize();
  std::vector<std::vector<double>> v;
  for (const ParamInfo& p : spec.params()) {
    const ops::Tensor t = init.param(p.index);
    v.emplace_back(t.as<double>(), t.as<double>() + p.numel);
  }
  return v;
}

// Parameters and gradients in one flat buffer per FSDP unit of a wrap policy, at the engine's offsets
// (make_flat_layout), bound as the engine binds a gathered unit; or, with no policy, DenseParams.
class Store {
 public:
  Store(const ModelSpec& spec, DType dtype, const fsdp::WrapConfig* wrap) : spec_(spec), dtype_(dtype) {
    const auto init = initial_values(spec);
    std::vector<std::vector<int>> groups;
    if (wrap) {
      for (const fsdp::UnitSpec& u : fsdp::plan_units(spec, *wrap)) groups.push_back(u.params);
    } else {
      dense_ = std::make_unique<DenseParams>(spec, dtype, dtype);
    }
    for (const auto& params : groups) {
      const fsdp::FlatLayout l = fsdp::make_flat_layout(spec, params, 1);
      buffers_.emplace_back(static_cast<size_t>(l.padded_numel) * dtype_size(dtype), 0);
      grads_.emplace_back(static_cast<size_t>(l.padded_numel) * dtype_size(dtype), 0);
      for (const fsdp::FlatEntry& e : l.entries) {
        const size_t at = static_cast<size_t>(e.offset) * dtype_size(dtype);
        views_.resize(spec.params().size());
        views_[static_cast<size_t>(e.param)] = {buffers_.back().data() + at, grads_.back().data() + at};
      }
    }
    for (const ParamInfo& p : spec.params()) {
      const ops::Tensor t = param(p.index);
      for (int64_t i = 0; i < p.numel; ++i) set(t, i, init[static_cast<size_t>(p.index)][static_cast<size_t>(i)]);
    }
  }
  ops::Tensor param(int i) const {
    if (dense_) return dense_->param(i);
    return ops::make_tensor(views_[static_cast<size_t>(i)].first, dtype_, param_shape(spec_.param(i)));
  }
  ops::Tensor grad(int i) const {
    if (dense_) return dense_->grad(i);
    return ops::make_tensor(views_[static_cast<size_t>(i)].second, dtype_, param_shape(spec_.param(i)));
  }
  // Overwrite: the projections' gradients bound to be overwritten (as the FSDP engine binds a fresh buffer), their
  // memory filled with NaN first, so that any read of it before the GEMM's write shows.
  void bind(ParamBinding& b, GradWrite projections = GradWrite::Accumulate) const {
    for (const ParamInfo& p : spec_.params()) {
      b.bind_param(p.index, param(p.index));
      const bool gemm = gemm_writes_gradient(spec_, p.index);
      const GradWrite write = gemm ? projections : GradWrite::Accumulate;
      if (write == GradWrite::Overwrite) {
        const ops::Tensor g = grad(p.index);
        for (int64_t i = 0; i < p.numel; ++i) set(g, i, std::nan(""));
      }
      b.bind_grad(p.index, grad(p.index), write);
    }
  }
  std::vector<double> all_grads() const {
    std::vector<double> out;
    for (const ParamInfo& p : spec_.params())
      for (int64_t i = 0; i < p.numel; ++i) out.push_back(get(grad(p.index), i));
    return out;
  }

 private:
  static void set(const ops::Tensor& t, int64_t i, double v) {
    if (t.dtype == DType::F64) t.as<double>()[i] = v;
    else t.as<float>()[i] = static_cast<float>(v);
  }
  static double get(const ops::Tensor& t, int64_t i) {
    return t.dtype == DType::F64 ? t.as<double>()[i] : static_cast<double>(t.as<float>()[i]);
  }
  const ModelSpec& spec_;
  DType dtype_;
  std::unique_ptr<DenseParams> dense_;
  std::vector<std::vector<char>> buffers_, grads_;
  std::vector<std::pair<char*, char*>> views_;
};

Result run(const LlamaConfig& c, DType dtype, ProjectionFusion fusion, Checkpointing ckpt = Checkpointing::None,
           const fsdp::WrapConfig* wrap = nullptr, GradWrite projections = GradWrite::Accumulate) {
  auto ops = ops::make_cpu_ops({2});
  LlamaModel model(c, *ops, ModelOptions{.activation_dtype = dtype, .checkpointing = ckpt, .projection_fusion = fusion});
  Store store(model.spec(), dtype, wrap);
  store.bind(model.binding(), projections);
  HostBatch hb = random_batch(2, 7, c.vocab_size, 5);
  Result r;
  for (int step = 0; step < 2; ++step) r.loss += model.forward_backward(hb.batch()).loss_sum;  // gradients accumulate
  r.grads = store.all_grads();
  for (int l = 0; l < c.num_hidden_layers; ++l) r.paths.push_back(model.projections(l));
  return r;
}

void expect_paths(const Result& r, ProjectionPath want, const std::string& what) {
  for (size_t l = 0; l < r.paths.size(); ++l) {
    const LayerProjections& p = r.paths[l];
    EXPECT_TRUE(p.qkv_forward == want && p.qkv_backward == want && p.gate_up_forward == want && p.gate_up_backward == want)
        << what << ": layer " << l;
  }
}

// Largest |a - b| over the largest |b|: the fused GEMMs sum dn (and nothing else) in another order.
double relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

TEST(ModelFusion, FusedProjectionsGiveTheSeparateOnesLossAndGradients) {
  for (const LlamaConfig& c : {tiny_config(), config(6, 2, 24), config(8, 8, 8)}) {
    for (Checkpointing ckpt : {Checkpointing::None, Checkpointing::PerLayer}) {
      for (DType dt : {DType::F32, DType::F64}) {
        const std::string what = std::to_string(c.num_attention_heads) + "/" + std::to_string(c.num_key_value_heads) +
                                 " heads of " + std::to_string(c.head_dim()) + " " + dtype_name(dt) +
                                 (ckpt == Checkpointing::PerLayer ? " checkpointing" : "");
        const Result fused = run(c, dt, ProjectionFusion::WhereAdjacent, ckpt);
        const Result separate = run(c, dt, ProjectionFusion::Never, ckpt);
        expect_paths(fused, ProjectionPath::Fused, what);
        expect_paths(separate, ProjectionPath::Separate, what);
        // Measured: the same losses to the bit (the forward GEMMs form the same dot products); gradients apart by at
        // most 2.1e-7 (f32) and 2.7e-16 (f64) of the largest, from dn1 and dn2 summed in one GEMM, not two or three.
        const bool f32 = dt == DType::F32;
        EXPECT_NEAR(fused.loss, separate.loss, (f32 ? 1e-7 : 1e-15) * std::abs(separate.loss)) << what;
        ASSERT_EQ(fused.grads.size(), separate.grads.size());
        EXPECT_LT(relative_difference(fused.grads, separate.grads), f32 ? 1e-6 : 2e-15) << what;
        EXPECT_GT(*std::max_element(separate.grads.begin(), separate.grads.end()), 0.0) << what;
      }
    }
  }
}

// The FSDP engine binds each unit's parameters at their offsets in its flat buffer. Decoder-layer units hold
// q, k, v (and gate, up) adjacent; a policy that wraps every Linear puts each projection in a unit of its own, and
// the layer says so and runs the separate GEMMs, with the same results.
TEST(ModelFusion, AWrapPolicyThatSplitsTheProjectionsTakesSeparateGemmsAndSaysSo) {
  const LlamaConfig c = config(6, 2, 24);
  fsdp::WrapConfig layers;  // TRANSFORMER_BASED_WRAP of LlamaDecoderLayer
  fsdp::WrapConfig linears;
  linears.transformer_layer_cls = {ModuleClass::Linear};
  const Result dense = run(c, DType::F32, ProjectionFusion::WhereAdjacent);
  const Result by_layer = run(c, DType::F32, ProjectionFusion::WhereAdjacent, Checkpointing::None, &layers);
  expect_paths(by_layer, ProjectionPath::Fused, "decoder-layer units");
  EXPECT_EQ(by_layer.loss, dense.loss);
  EXPECT_EQ(by_layer.grads, dense.grads);

  log::configure({0, 1, LogLevel::Debug, false});
  ::testing::internal::CaptureStderr();
  const Result by_linear = run(c, DType::F32, ProjectionFusion::WhereAdjacent, Checkpointing::None, &linears);
  const std::string log_text = ::testing::internal::GetCapturedStderr();
  log::configure({});
  expect_paths(by_linear, ProjectionPath::Separate, "one unit per Linear");
  const Result separate = run(c, DType::F32, ProjectionFusion::Never);
  EXPECT_EQ(by_linear.loss, separate.loss);
  EXPECT_EQ(by_linear.grads, separate.grads);
  for (const char* line : {"model.layers.0: q_proj, k_proj, v_proj forward: one GEMM each (not adjacent in memory",
                           "model.layers.1: gate_proj, up_proj backward: one GEMM each (not adjacent in memory"}) {
    EXPECT_NE(log_text.find(line), std::string::npos) << line << "\n" << log_text;
  }
  // Once per layer and group, not per step (the run takes two steps).
  size_t count = 0;
  for (size_t at = log_text.find("q_proj, k_proj, v_proj forward"); at != std::string::npos;
       at = log_text.find("q_proj, k_proj, v_proj forward", at + 1))
    ++count;
  EXPECT_EQ(count, static_cast<size_t>(c.num_hidden_layers)) << log_text;
}

// The tiny model on the CPU, its parameters in a DenseParams, initialized and bound.
struct BoundTinyModel {
  LlamaConfig c = tiny_config();
  std::unique_ptr<ops::Ops> ops = ops::make_cpu_ops({1});
  LlamaModel model{c, *ops};
  DenseParams params{model.spec()};
  BoundTinyModel() {
    params.initialize();
    params.bind(model.binding());
  }
};

// A binding that moves k_proj away from q_proj: that layer's q/k/v take the separate GEMMs, gate/up stay fused.
TEST(ModelFusion, ABindingThatSeparatesQkvTakesSeparateGemms) {
  BoundTinyModel t;
  const LlamaConfig& c = t.c;
  LlamaModel& model = t.model;
  DenseParams& params = t.params;
  const int k = model.spec().layer(1).params.k_proj;
  std::vector<float> k_copy(static_cast<size_t>(model.spec().param(k).numel));
  std::memcpy(k_copy.data(), params.param(k).data, params.param(k).bytes());
  model.binding().bind_param(k, ops::make_tensor(k_copy.data(), DType::F32, param_shape(model.spec().param(k))));
  EXPECT_FALSE(model.binding().params_adjacent(model.spec().layer(1).params.q_proj, 3));
  EXPECT_TRUE(model.binding().params_adjacent(model.spec().layer(0).params.q_proj, 3));
  HostBatch hb = random_batch(2, 5, c.vocab_size, 3);
  model.forward_backward(hb.batch());
  EXPECT_EQ(model.projections(0).qkv_forward, ProjectionPath::Fused);
  EXPECT_EQ(model.projections(1).qkv_forward, ProjectionPath::Separate);
  EXPECT_EQ(model.projections(1).qkv_backward, ProjectionPath::Separate);
  EXPECT_EQ(model.projections(1).gate_up_forward, ProjectionPath::Fused);
  // Rebound in place: fused again.
  params.bind(model.binding());
  model.forward_backward(hb.batch());
  EXPECT_EQ(model.projections(1).qkv_forward, ProjectionPath::Fused);
}

// Views that follow one another in memory but lie in two allocations (the FSDP engine's region: its unit) are not one
// matrix: two units' buffers that the allocator placed end to end, q_proj wrapped alone and k/v with the norms,
// were fused into one GEMM that read past the first buffer's end (the CUDA emulator stopped it).
TEST(ModelFusion, AdjacentViewsOfTwoRegionsTakeSeparateGemms) {
  BoundTinyModel t;
  LlamaModel& model = t.model;
  DenseParams& params = t.params;
  const LayerIndex::Params& l1 = model.spec().layer(1).params;
  const int units[2] = {0, 1};  // stand-ins for two units' addresses
  for (const int p : {l1.q_proj, l1.k_proj, l1.v_proj}) {
    const void* region = p == l1.q_proj ? &units[0] : &units[1];
    model.binding().bind_param(p, params.param(p), region);
    model.binding().bind_grad(p, params.grad(p), GradWrite::Accumulate, region);
  }
  EXPECT_FALSE(model.binding().params_adjacent(l1.q_proj, 3));
  EXPECT_FALSE(model.binding().grads_adjacent(l1.q_proj, 3));
  EXPECT_TRUE(model.binding().params_adjacent(l1.k_proj, 2));  // one region: still one matrix
  HostBatch hb = random_batch(2, 5, t.c.vocab_size, 3);
  model.forward_backward(hb.batch());
  EXPECT_EQ(model.projections(1).qkv_forward, ProjectionPath::Separate);
  EXPECT_EQ(model.projections(1).qkv_backward, ProjectionPath::Separate);
  EXPECT_EQ(model.projections(0).qkv_forward, ProjectionPath::Fused);
}

// The fused MLP backward writes [dWg; dWu] in one GEMM: gradients bound apart from parameters that were adjacent
// are refused with the layer's name, not written out of bounds.
TEST(ModelFusion, GradientsBoundApartFromAdjacentParametersAreAClearError) {
  BoundTinyModel t;
  const LlamaConfig& c = t.c;
  LlamaModel& model = t.model;
  const int up = model.spec().layer(0).params.up_proj;
  std::vector<float> up_grad(static_cast<size_t>(model.spec().param(up).numel));
  model.binding().bind_grad(up, ops::make_tensor(up_grad.data(), DType::F32, param_shape(model.spec().param(up))));
  HostBatch hb = random_batch(1, 4, c.vocab_size, 2);
  try {
    model.forward_backward(hb.batch());
    ADD_FAILURE() << "no error";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0: the gradients of gate_proj and up_proj are not bound adjacent"),
              std::string::npos)
        << e.what();
  }
}

// Projection gradients bound to be overwritten (memory holding NaN) come out bit for bit as zeroed ones: the first
// dW GEMM writes each whole (beta 0), the second step's adds (two forward_backward calls, one binding), on the
// fused GEMMs and the separate ones, with and without checkpointing.
TEST(ModelFusion, GradientsBoundToBeOverwrittenEqualZeroedOnes) {
  const fsdp::WrapConfig layers;  // one unit a decoder layer: q/k/v and gate/up adjacent
  for (ProjectionFusion fusion : {ProjectionFusion::WhereAdjacent, ProjectionFusion::Never}) {
    for (Checkpointing ckpt : {Checkpointing::None, Checkpointing::PerLayer}) {
      const Result zeroed = run(config(6, 2, 24), DType::F32, fusion, ckpt, &layers);
      const Result overwritten = run(config(6, 2, 24), DType::F32, fusion, ckpt, &layers, GradWrite::Overwrite);
      EXPECT_EQ(overwritten.loss, zeroed.loss);
      ASSERT_EQ(overwritten.grads.size(), zeroed.grads.size());
      size_t differ = 0;
      for (size_t i = 0; i < zeroed.grads.size(); ++i) differ += overwritten.grads[i] != zeroed.grads[i];
      EXPECT_EQ(differ, 0u) << (fusion == ProjectionFusion::Never ? "separate" : "fused")
                            << (ckpt == Checkpointing::PerLayer ? ", checkpointing" : "");
      expect_paths(overwritten, fusion == ProjectionFusion::Never ? ProjectionPath::Separate : ProjectionPath::Fused,
                   "overwritten");
    }
  }
}

TEST(ModelFusion, OverwritingIsOnlyForGradientsOneGemmWritesWhole) {
  BoundTinyModel t;
  const LlamaConfig& c = t.c;
  LlamaModel& model = t.model;
  DenseParams& params = t.params;
  const LayerIndex::Params& p = model.spec().layer(0).params;
  EXPECT_TRUE(gemm_writes_gradient(model.spec(), p.q_proj));
  EXPECT_TRUE(gemm_writes_gradient(model.spec(), p.down_proj));
  EXPECT_FALSE(gemm_writes_gradient(model.spec(), p.input_layernorm));
  EXPECT_FALSE(gemm_writes_gradient(model.spec(), model.spec().embed_param()));
  EXPECT_TRUE(gemm_writes_gradient(model.spec(), model.spec().lm_head_param()));  // the fused loss's first chunk
  LlamaConfig tied = c;
  tied.tie_word_embeddings = true;
  const ModelSpec tied_spec(tied);  // its lm_head is the embedding, which embedding_backward adds into
  EXPECT_FALSE(gemm_writes_gradient(tied_spec, tied_spec.lm_head_param()));
  // A norm's gradient is added into by rmsnorm_backward: it cannot be bound to be overwritten.
  try {
    model.binding().bind_grad(p.input_layernorm, params.grad(p.input_layernorm), GradWrite::Overwrite);
    ADD_FAILURE() << "no error";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("input_layernorm.weight to be overwritten: its ops add into it"), std::string::npos)
        << e.what();
  }
  // q and k written by one GEMM but bound in different ways: the driver's mistake, named.
  model.binding().bind_grad(p.q_proj, params.grad(p.q_proj), GradWrite::Overwrite);
  HostBatch hb = random_batch(1, 4, c.vocab_size, 2);
  try {
    model.forward_backward(hb.batch());
    ADD_FAILURE() << "no error";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("q_proj.weight and model.layers.0.self_attn.k_proj.weight are written by one "
                                         "GEMM but bound, one to be overwritten, the other to accumulate"),
              std::string::npos)
        << e.what();
  }
  // Bound again to be overwritten, and written: nothing left unwritten.
  for (int i : {p.q_proj, p.k_proj, p.v_proj}) {
    model.binding().bind_grad(i, params.grad(i), GradWrite::Overwrite);
    EXPECT_TRUE(model.binding().grad_unwritten(i));
  }
  model.forward_backward(hb.batch());
  for (int i : {p.q_proj, p.k_proj, p.v_proj}) EXPECT_FALSE(model.binding().grad_unwritten(i));
}

// A fused group opens the hooks of all its modules before its GEMM and closes them after, in reverse: the
// engine gathers every unit the GEMM reads first, and reduces a unit only when all its gradients are written.
class Recorder : public ModuleHooks {
 public:
  explicit Recorder(const ModelSpec& spec) : spec_(spec) {}
  void before_forward(int m, ForwardPhase) override { add("F+", m); }
  void after_forward(int m, ForwardPhase) override { add("F-", m); }
  void before_backward(int m) override { add("B+", m); }
  void after_backward(int m) override { add("B-", m); }
  std::vector<std::string> log;

 private:
  void add(const char* what, int m) {
    const std::string& name = spec_.module(m).name;
    if (name.rfind("model.layers.0.", 0) == 0 && name.find("_proj") != std::string::npos)
      log.push_back(what + name.substr(name.rfind('.') + 1));
  }
  const ModelSpec& spec_;
};

TEST(ModelFusion, HooksNestAroundEachGroup) {
  auto ops = ops::make_cpu_ops({1});
  LlamaModel model(tiny_config(), *ops);
  DenseParams params(model.spec());
  params.initialize();
  params.bind(model.binding());
  Recorder hooks(model.spec());
  model.set_hooks(&hooks);
  HostBatch hb = random_batch(1, 4, 19, 2);
  model.forward_backward(hb.batch());
  const std::vector<std::string> want = {
      "F+q_proj",    "F+k_proj",    "F+v_proj",  "F-v_proj",    "F-k_proj",    "F-q_proj",    "F+o_proj",
      "F-o_proj",    "F+gate_proj", "F+up_proj", "F-up_proj",   "F-gate_proj", "F+down_proj", "F-down_proj",
      "B+down_proj", "B-down_proj", "B+up_proj", "B+gate_proj", "B-gate_proj", "B-up_proj",   "B+o_proj",
      "B-o_proj",    "B+v_proj",    "B+k_proj",  "B+q_proj",    "B-q_proj",    "B-k_proj",    "B-v_proj"};
  EXPECT_EQ(hooks.log, want);
  EXPECT_EQ(model.projections(0).qkv_forward, ProjectionPath::Fused);
}

}  // namespace
}  // namespace shardtrain::model::test
