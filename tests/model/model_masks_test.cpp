// Padding and document masks (a padded or packed batch equals its sequences run one by one), activation
// checkpointing (bit-identical gradients), and the hook interface an FSDP driver relies on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "model_test_util.hpp"
#include "shardtrain/model/dense_params.hpp"
#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::model::test {
namespace {

// Three sequences of token ids (inputs are seq[0:L], targets seq[1:L+1]); 0 is the pad id.
const std::vector<std::vector<int32_t>> kSequences = {{3, 7, 1, 18, 5, 9, 2}, {4, 4, 11, 6, 13}, {8, 15, 10, 12}};

struct Run {
  double loss_sum = 0;
  int64_t tokens = 0;
  std::vector<double> grads;
};

Run run_batches(const LlamaConfig& c, std::vector<HostBatch> batches) {
  auto ops = ops::make_cpu_ops({2});
  LlamaModel model(c, *ops, ModelOptions{DType::F64});
  DenseParams params(model.spec(), DType::F64, DType::F64);
  params.initialize();
  params.bind(model.binding());
  Run run;
  for (HostBatch& hb : batches) {
    const LossResult r = model.forward_backward(hb.batch(), StepOptions{1.0});
    run.loss_sum += r.loss_sum;
    run.tokens += r.tokens;
  }
  const ops::Tensor g = params.flat_grads();
  run.grads.assign(g.as<double>(), g.as<double>() + g.numel());
  return run;
}

void expect_same(const Run& a, const Run& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_NEAR(a.loss_sum, b.loss_sum, 1e-10 * std::abs(b.loss_sum));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) ASSERT_NEAR(a.grads[i], b.grads[i], 1e-10) << i;
}

Run one_by_one(const LlamaConfig& c) {
  std::vector<HostBatch> batches;
  for (const auto& seq : kSequences) {
    const auto len = static_cast<int64_t>(seq.size()) - 1;
    HostBatch hb(1, len);
    for (int64_t i = 0; i < len; ++i) {
      hb.ids[static_cast<size_t>(i)] = seq[static_cast<size_t>(i)];
      hb.targets[static_cast<size_t>(i)] = seq[static_cast<size_t>(i + 1)];
    }
    batches.push_back(hb);
  }
  return run_batches(c, batches);
}

TEST(ModelMasks, PaddedBatchEqualsSequencesOneByOne) {
  const LlamaConfig c = tiny_config();
  HostBatch hb(3, 6);
  hb.pad = 0;
  for (int64_t r = 0; r < 3; ++r) {
    const auto& seq = kSequences[static_cast<size_t>(r)];
    for (int64_t i = 0; i < 6; ++i) {
      const bool real = i + 1 < static_cast<int64_t>(seq.size());
      hb.ids[static_cast<size_t>(r * 6 + i)] = real ? seq[static_cast<size_t>(i)] : 0;
      hb.targets[static_cast<size_t>(r * 6 + i)] = real ? seq[static_cast<size_t>(i + 1)] : -100;
    }
  }
  expect_same(run_batches(c, {hb}), one_by_one(c));
}

TEST(ModelMasks, PackedBatchEqualsSequencesOneByOne) {
  const LlamaConfig c = tiny_config();
  HostBatch hb(1, 13);
  size_t at = 0;
  for (size_t d = 0; d < kSequences.size(); ++d) {
    const auto& seq = kSequences[d];
    for (size_t i = 0; i + 1 < seq.size(); ++i, ++at) {
      hb.ids[at] = seq[i];
      hb.targets[at] = seq[i + 1];
      hb.docs.push_back(static_cast<int32_t>(d));
    }
  }
  ASSERT_EQ(at, 13u);
  expect_same(run_batches(c, {hb}), one_by_one(c));
}

std::vector<float> grads_f32(const LlamaConfig& c, Checkpointing ckpt, DType act, double* loss) {
  auto ops = ops::make_cpu_ops({2});
  LlamaModel model(c, *ops, ModelOptions{act, ckpt});
  DenseParams params(model.spec());
  params.initialize();
  params.bind(model.binding());
  HostBatch hb = random_batch(3, 9, c.vocab_size, 8);
  hb.docs = std::vector<int32_t>(27, 0);
  for (size_t i = 14; i < 27; ++i) hb.docs[i] = 1;
  *loss = model.forward_backward(hb.batch()).loss_sum;
  const ops::Tensor g = params.flat_grads();
  return std::vector<float>(g.as<float>(), g.as<float>() + g.numel());
}

TEST(ModelCheckpointing, GradientsBitIdentical) {
  for (DType act : {DType::F32, DType::BF16}) {
    double loss_plain = 0, loss_ckpt = 0;
    const auto plain = grads_f32(tiny_config(), Checkpointing::None, act, &loss_plain);
    const auto ckpt = grads_f32(tiny_config(), Checkpointing::PerLayer, act, &loss_ckpt);
    EXPECT_EQ(loss_plain, loss_ckpt);
    ASSERT_EQ(plain.size(), ckpt.size());
    EXPECT_EQ(std::memcmp(plain.data(), ckpt.data(), plain.size() * sizeof(float)), 0) << dtype_name(act);
  }
}

TEST(ModelCheckpointing, Bf16ActivationsStayCloseToF32) {
  double l32 = 0, l16 = 0;
  const auto g32 = grads_f32(tiny_config(), Checkpointing::None, DType::F32, &l32);
  const auto g16 = grads_f32(tiny_config(), Checkpointing::None, DType::BF16, &l16);
  EXPECT_NEAR(l16, l32, 0.02 * std::abs(l32));
  double num = 0, den = 0;
  for (size_t i = 0; i < g32.size(); ++i) {
    num += (g16[i] - g32[i]) * (g16[i] - g32[i]);
    den += g32[i] * g32[i];
  }
  EXPECT_LT(std::sqrt(num / den), 0.05);
}

// Binds each top-level module's parameters only between its before_* and after_* hooks, as an FSDP driver
// does with unshard/reshard, and records the hook sequence.
class ShardingHooks : public ModuleHooks {
 public:
  ShardingHooks(const ModelSpec& spec, ParamBinding& binding, const DenseParams& store)
      : spec_(spec), binding_(binding), store_(store) {}
  void before_forward(int m, ForwardPhase phase) override {
    log.push_back("F+" + spec_.module(m).name + (phase == ForwardPhase::Recompute ? "@R" : ""));
    bind(m, true);
  }
  void after_forward(int m, ForwardPhase phase) override {
    log.push_back("F-" + spec_.module(m).name);
    if (phase == ForwardPhase::Normal) bind(m, false);  // a recompute's parameters stay for the backward
  }
  void before_backward(int m) override {
    log.push_back("B+" + spec_.module(m).name);
    bind(m, true);
  }
  void after_backward(int m) override {
    log.push_back("B-" + spec_.module(m).name);
    bind(m, false);
  }
  std::vector<std::string> log;

 private:
  void uses(int m, std::vector<int>& out) const {
    for (int p : spec_.module(m).uses) out.push_back(p);
    for (int c : spec_.module(m).children) uses(c, out);
  }
  void bind(int m, bool on) {
    if (spec_.module(m).parent >= 0) return;  // units = top-level modules
    std::vector<int> ps;
    uses(m, ps);
    for (int p : ps) {
      if (on) {
        binding_.bind_param(p, store_.param(p));
        binding_.bind_grad(p, store_.grad(p));
      } else {
        binding_.unbind(p);
      }
    }
  }
  const ModelSpec& spec_;
  ParamBinding& binding_;
  const DenseParams& store_;
};

TEST(ModelHooks, LazyBindingGivesTheSameGradientsAndNestedOrder) {
  LlamaConfig c = tiny_config();
  c.tie_word_embeddings = true;
  double ref_loss = 0;
  auto ops = ops::make_cpu_ops({2});
  LlamaModel model(c, *ops, ModelOptions{DType::F32, Checkpointing::PerLayer});
  DenseParams reference(model.spec());
  reference.initialize();
  reference.bind(model.binding());
  HostBatch hb = random_batch(2, 5, c.vocab_size, 4);
  ref_loss = model.forward_backward(hb.batch()).loss_sum;

  DenseParams store(model.spec());
  store.initialize();
  for (const ParamInfo& p : model.spec().params()) model.binding().unbind(p.index);
  ShardingHooks hooks(model.spec(), model.binding(), store);
  model.set_hooks(&hooks);
  EXPECT_EQ(model.forward_backward(hb.batch()).loss_sum, ref_loss);
  const ops::Tensor a = reference.flat_grads(), b = store.flat_grads();
  EXPECT_EQ(std::memcmp(a.data, b.data, a.bytes()), 0);

  const auto pos = [&](const std::string& s) {
    const auto it = std::find(hooks.log.begin(), hooks.log.end(), s);
    EXPECT_NE(it, hooks.log.end()) << s;
    return it - hooks.log.begin();
  };
  EXPECT_EQ(hooks.log.front(), "F+model.embed_tokens");
  EXPECT_EQ(hooks.log.back(), "B-model.embed_tokens");
  EXPECT_LT(pos("F+model.layers.0.self_attn.q_proj"), pos("F-model.layers.0.self_attn"));
  EXPECT_LT(pos("F-model.layers.1"), pos("F+model.norm"));
  EXPECT_LT(pos("B+lm_head"), pos("F-lm_head"));
  EXPECT_LT(pos("B-lm_head"), pos("B+model.norm"));
  // checkpointing: layer 1's backward starts with its recompute, nested inside B+/B- of the layer
  EXPECT_LT(pos("B+model.layers.1"), pos("F+model.layers.1@R"));
  EXPECT_LT(pos("F+model.layers.1@R"), pos("B+model.layers.1.mlp"));
  EXPECT_LT(pos("B-model.layers.1.self_attn.q_proj"), pos("B-model.layers.1"));
  EXPECT_LT(pos("B-model.layers.1"), pos("B+model.layers.0"));
}

TEST(ModelHooks, UnboundParameterIsAClearError) {
  auto ops = ops::make_cpu_ops({1});
  LlamaModel model(tiny_config(), *ops);
  HostBatch hb = random_batch(1, 4, 19, 2);
  try {
    model.forward(hb.batch());
    ADD_FAILURE() << "no error";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("model.embed_tokens.weight"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardtrain::model::test
