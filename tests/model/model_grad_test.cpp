// Whole-model forward/backward: finite differences in f64, loss at init, tied embeddings, gradient
// accumulation.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "model_test_util.hpp"
#include "shardtrain/model/dense_params.hpp"
#include "shardtrain/ops/cpu_ops.hpp"

namespace shardtrain::model::test {
namespace {

void check_model_gradients(const LlamaConfig& config, Checkpointing ckpt) {
  auto ops = ops::make_cpu_ops({2});
  LlamaModel model(config, *ops, ModelOptions{DType::F64, ckpt, -100, 3});
  DenseParams params(model.spec(), DType::F64, DType::F64);
  params.initialize();
  params.bind(model.binding());
  HostBatch hb = random_batch(2, 5, config.vocab_size, 17);
  hb.targets[3] = -100;
  hb.docs = {0, 0, 1, 1, 1, 2, 2, 2, 2, 2};
  hb.pad = 0;
  hb.ids[9] = 0;  // one padded position
  hb.targets[9] = -100;
  const Batch batch = hb.batch();
  const LossResult r = model.forward_backward(batch, StepOptions{1.0});  // gradients of the loss sum
  EXPECT_EQ(r.tokens, 8);
  const double eps = 1e-5;
  for (const ParamInfo& p : model.spec().params()) {
    double* w = params.param(p.index).as<double>();
    const double* g = params.grad(p.index).as<double>();
    const int64_t stride = std::max<int64_t>(1, p.numel / 12);
    for (int64_t i = 0; i < p.numel; i += stride) {
      const double saved = w[i];
      w[i] = saved + eps;
      const double up = model.forward(batch).loss_sum;
      w[i] = saved - eps;
      const double down = model.forward(batch).loss_sum;
      w[i] = saved;
      const double fd = (up - down) / (2 * eps);
      ASSERT_NEAR(g[i], fd, 1e-6 * std::max(1.0, std::abs(fd))) << p.name << "[" << i << "]";
    }
  }
}

TEST(ModelGradients, FiniteDifferencesF64) { check_model_gradients(tiny_config(), Checkpointing::None); }

TEST(ModelGradients, FiniteDifferencesTiedAndCheckpointed) {
  LlamaConfig c = tiny_config();
  c.tie_word_embeddings = true;
  c.num_key_value_heads = 1;
  check_model_gradients(c, Checkpointing::PerLayer);
}

// A model of `c` on the CPU backend, its f32 parameters initialized and bound.
struct InitializedModel {
  explicit InitializedModel(const LlamaConfig& c) : ops(ops::make_cpu_ops({2})), model(c, *ops), params(model.spec()) {
    params.initialize();
    params.bind(model.binding());
  }
  std::unique_ptr<ops::Ops> ops;
  LlamaModel model;
  DenseParams params;
};

// Untied and tied, under each init scheme (a tied embedding under reset_parameters was N(0, 1): loss 63 here).
TEST(ModelGradients, LossAtInitIsNearLogVocab) {
  for (const bool tied : {false, true})
    for (const InitScheme scheme : {InitScheme::ResetParameters, InitScheme::Scaled}) {
      LlamaConfig c = tiny_config();
      c.vocab_size = 512;
      c.hidden_size = 64;
      c.intermediate_size = 128;
      c.tie_word_embeddings = tied;
      c.init_scheme = scheme;
      InitializedModel m(c);
      HostBatch hb = random_batch(2, 32, c.vocab_size, 3);
      const LossResult r = m.model.forward(hb.batch());
      const std::string what = fmt::format("tied {} scaled {}", tied, scheme == InitScheme::Scaled);
      EXPECT_EQ(r.tokens, 64) << what;
      EXPECT_NEAR(r.mean(), std::log(512.0), 0.05 * std::log(512.0)) << what;
      EXPECT_GT(r.mean(), std::log(512.0) * 0.99) << what;  // a random model is no better than uniform
    }
}

TEST(ModelGradients, GradientsAccumulateAcrossCalls) {
  const LlamaConfig c = tiny_config();
  InitializedModel m(c);
  HostBatch hb = random_batch(2, 6, c.vocab_size, 5);
  const LossResult first = m.model.forward_backward(hb.batch());
  const ops::Tensor g = m.params.flat_grads();
  const std::vector<float> once(g.as<float>(), g.as<float>() + g.numel());
  const LossResult second = m.model.forward_backward(hb.batch());
  EXPECT_EQ(first.loss_sum, second.loss_sum);
  for (int64_t i = 0; i < g.numel(); ++i) EXPECT_FLOAT_EQ(g.as<float>()[i], 2 * once[static_cast<size_t>(i)]);
}

}  // namespace
}  // namespace shardtrain::model::test
