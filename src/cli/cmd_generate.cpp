// `shardtrain generate`: sample text from a checkpoint (sharded or full), a consolidated HDF5 file or a
// Hugging Face directory, with a key/value cache. Offline: one process, the CPU backend.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "command.hpp"
#include "shardtrain/checkpoint/source.hpp"
#include "shardtrain/data/tokenizer.hpp"
#include "shardtrain/model/kv_decoder.hpp"
#include "shardtrain/model/llama.hpp"
#include "shardtrain/model/sampling.hpp"
#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/runtime/address_space.hpp"
#include "shardtrain/runtime/topology.hpp"

namespace shardtrain::cli {
namespace {

struct GenerateOptions {
  std::string checkpoint, prompt, tokenizer;
  int max_tokens = 64;
  model::SamplingOptions sampling;
  uint64_t seed = 0;
};

// The ids a Hugging Face directory's model ends text with: eos_token_id of its generation_config.json, else of its
// config.json, a number or a list (Llama 3 Instruct: <|end_of_text|>, <|eom_id|>, <|eot_id|>), as transformers'
// generate() stops at any of them. None for anything else (a checkpoint: its tokenizer's end-of-text).
std::set<data::TokenId> directory_eos_ids(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return {};
  for (const char* name : {"generation_config.json", "config.json"}) {
    std::ifstream in(fs::path(path) / name);
    if (!in) continue;
    const auto j = nlohmann::json::parse(in, nullptr, false);
    if (!j.is_object() || !j.contains("eos_token_id") || j["eos_token_id"].is_null()) continue;
    std::set<data::TokenId> ids;
    const nlohmann::json& e = j["eos_token_id"];
    for (const nlohmann::json& v : e.is_array() ? e : nlohmann::json::array({e}))
      if (v.is_number_unsigned()) ids.insert(v.get<data::TokenId>());
    if (!ids.empty()) return ids;
  }
  return {};
}

int run_generate(const GenerateOptions& o) {
  // validate() refuses NaN; an infinite temperature flattens every distribution to uniform noise.
  if (std::isinf(o.sampling.temperature))
    throw UsageError(fmt::format("--temperature {}: expected a finite number >= 0 (0 = greedy)", o.sampling.temperature));
  model::validate(o.sampling);
  if (o.max_tokens <= 0) throw UsageError(fmt::format("--max-tokens {}: expected a positive count", o.max_tokens));
  check_address_space(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())), "generate");
  auto source = checkpoint::open_tensor_source(o.checkpoint);
  std::string tok_path = o.tokenizer;
  if (tok_path.empty()) {
    const auto j =
        nlohmann::json::parse(source->tokenizer().empty() ? std::string("{}") : source->tokenizer(), nullptr, false);
    if (j.is_object()) tok_path = resolve_recorded_path(j.value("path", std::string()), source->path());
  }
  if (tok_path.empty()) throw UsageError(fmt::format("{} names no tokenizer: pass --tokenizer", o.checkpoint));
  const data::Tokenizer tokenizer = data::Tokenizer::load(tok_path);
  const model::LlamaConfig config = source->model_config();
  // Another tokenizer's ids mean other text: without this, sampling prints fluent-looking garbage.
  checkpoint::check_tokenizer_matches(tokenizer, tok_path, source->tokenizer(), config, source->path());

  auto ops = ops::make_cpu_ops({usable_cores()});
  model::LlamaModel llama(config, *ops);
  model::DenseParams params(llama.spec());
  checkpoint::load_dense(*source, params);
  params.bind(llama.binding());

  std::vector<data::TokenId> ids = tokenizer.encode(o.prompt);
  if (ids.empty()) {
    const auto start = tokenizer.bot_id() ? tokenizer.bot_id() : tokenizer.eot_id();
    if (!start) throw UsageError("--prompt is empty and the tokenizer has no start or end-of-text token to begin from");
    ids.push_back(*start);
  }
  const auto prompt_tokens = static_cast<int64_t>(ids.size());
  const int64_t capacity = std::min<int64_t>(config.max_position_embeddings, prompt_tokens + o.max_tokens);
  if (prompt_tokens >= capacity) {
    throw UsageError(fmt::format("the prompt is {} tokens; the model holds {} positions (max_position_embeddings)",
                                 ids.size(), config.max_position_embeddings));
  }
  if (prompt_tokens + o.max_tokens > config.max_position_embeddings)
    log::warn(
        "generate: --max-tokens {} does not fit the model's context: the prompt's {} tokens and the new ones stop at "
        "max_position_embeddings = {}, so at most {} new tokens",
        o.max_tokens, prompt_tokens, config.max_position_embeddings, capacity - prompt_tokens);
  model::KvCacheDecoder decoder(llama.spec(), llama.binding(), *ops, capacity);
  std::mt19937_64 rng(o.seed);
  const auto t0 = std::chrono::steady_clock::now();
  std::span<const float> logits;
  for (data::TokenId id : ids) logits = decoder.step(static_cast<int32_t>(id));
  std::vector<data::TokenId> out;
  // A vocabulary padded past the tokenizer's (model.vocab_size above the dataset's, for a multiple of 64): those rows
  // are no token, and one sampled ended the run with a decode error and nothing printed. Sampled among the
  // tokenizer's ids only.
  const size_t usable = std::min(logits.size(), static_cast<size_t>(tokenizer.vocab_size()));
  std::set<data::TokenId> stop = directory_eos_ids(source->path());
  if (tokenizer.eot_id()) stop.insert(*tokenizer.eot_id());
  while (decoder.length() < capacity) {
    const int32_t next = model::sample_token(logits.first(usable), o.sampling, rng);
    if (stop.count(static_cast<data::TokenId>(next))) break;
    out.push_back(static_cast<data::TokenId>(next));
    logits = decoder.step(next);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The continuation decoded after the prompt's tokens, not alone: a SentencePiece-style tokenizer drops one
  // leading space from what it decodes, which must be the prompt's, not the continuation's.
  std::string continuation = tokenizer.decode(out);
  if (!o.prompt.empty() && !out.empty()) {
    std::vector<data::TokenId> all = ids;
    all.insert(all.end(), out.begin(), out.end());
    const std::string whole = tokenizer.decode(all), prompt = tokenizer.decode(ids);
    if (whole.compare(0, prompt.size(), prompt) == 0) continuation = whole.substr(prompt.size());
  }
  std::printf("%s%s\n", o.prompt.c_str(), continuation.c_str());
  std::fflush(stdout);
  log::info("generate: {} prompt + {} new tokens in {:.2f} s ({:.1f} tokens/s), from {}", ids.size(), out.size(), secs,
            static_cast<double>(ids.size() + out.size()) / std::max(secs, 1e-9), source->path());
  return 0;
}

}  // namespace

Command add_generate_command(CLI::App& parent) {
  auto o = std::make_shared<GenerateOptions>();
  Command c;
  c.app =
      parent.add_subcommand("generate", "sample text from a checkpoint, a consolidated file or a Hugging Face directory");
  c.app
      ->add_option("--checkpoint", o->checkpoint,
                   "checkpoint (or a directory of them: the newest), .h5 file, or HF directory")
      ->required();
  c.app->add_option("--prompt", o->prompt, "text to continue")->capture_default_str();
  c.app->add_option("--tokenizer", o->tokenizer, "tokenizer file (default: the one the checkpoint names)");
  c.app->add_option("--max-tokens", o->max_tokens, "new tokens at most")->capture_default_str();
  c.app->add_option("--temperature", o->sampling.temperature, "0 = greedy")->capture_default_str();
  c.app->add_option("--top-k", o->sampling.top_k, "sample among the k most likely (0 = all)")->capture_default_str();
  c.app->add_option("--top-p", o->sampling.top_p, "nucleus: the most likely tokens up to this probability")
      ->capture_default_str();
  // CLI11 reads "-1" into an unsigned as 2^64 - 1 without a word.
  c.app->add_option("--seed", o->seed, "sampling seed")->capture_default_str()->check(unsigned_check());
  c.launch = Launch::Offline;
  c.run = [o](Runtime*) { return run_generate(*o); };
  return c;
}

}  // namespace shardtrain::cli
