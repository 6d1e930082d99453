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
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "command.hpp"
#include "shardtrain/checkpoint/source.hpp"
#include "shardtrain/data/batches.hpp"
#include "shardtrain/data/tokenizer.hpp"
#include "shardtrain/model/kv_decoder.hpp"
#include "shardtrain/model/llama.hpp"
#include "shardtrain/model/sampling.hpp"
#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/runtime/address_space.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/topology.hpp"
#include "shardtrain/train/config_io.hpp"

namespace shardtrain::cli {
namespace {

struct GenerateOptions {
  std::string checkpoint, prompt, tokenizer;
  int max_tokens = 64;
  model::SamplingOptions sampling;
  uint64_t seed = 0;
  bool add_special_tokens = false;
};

// What a tokenizer.json's post_processor puts before every text: the special tokens in front of the text in its
// TemplateProcessing's `single` template (alone, or among a Sequence's processors). Meta's Llama files put <s> or
// <|begin_of_text|> there, which transformers' tokenizer(prompt) adds by default and a model trained so expects;
// shardtrain's own datasets are packed without it (docs/checkpoints.md), so generate adds it only when asked.
std::vector<data::TokenId> template_prefix(const std::string& tokenizer_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path file =
      fs::is_directory(tokenizer_path, ec) ? fs::path(tokenizer_path) / "tokenizer.json" : fs::path(tokenizer_path);
  const auto refuse = [&](const std::string& why) {
    return UsageError(fmt::format("--add-special-tokens: {}: {}", file.string(), why));
  };
  std::ifstream in(file);
  const auto j = in ? nlohmann::json::parse(in, nullptr, false) : nlohmann::json();
  if (file.extension() != ".json" || !j.is_object())
    throw refuse("not a tokenizer.json (only a tokenizer.json's post_processor names tokens to add)");
  nlohmann::json templ;  // a copy: the processors listed below are a temporary's when there is one
  const nlohmann::json& post = j.contains("post_processor") ? j["post_processor"] : nlohmann::json();
  for (const nlohmann::json& p : post.is_object() && post.value("type", "") == "Sequence" && post.contains("processors") &&
                                         post["processors"].is_array()
                                     ? post["processors"]
                                     : nlohmann::json::array({post}))
    if (p.is_object() && p.value("type", "") == "TemplateProcessing") templ = p;
  if (!templ.is_object() || !templ.contains("single") || !templ["single"].is_array())
    throw refuse("its post_processor has no TemplateProcessing template: it adds no tokens to a text");
  std::vector<data::TokenId> ids;
  const nlohmann::json specials = templ.contains("special_tokens") ? templ["special_tokens"] : nlohmann::json();
  for (const nlohmann::json& item : templ["single"]) {
    if (item.contains("Sequence")) break;  // the text itself: what follows it is not before it
    const std::string name = item.contains("SpecialToken") && item["SpecialToken"].is_object() &&
                                     item["SpecialToken"].value("id", nlohmann::json()).is_string()
                                 ? item["SpecialToken"]["id"].get<std::string>()
                                 : std::string();
    if (name.empty() || !specials.is_object() || !specials.contains(name) || !specials[name].contains("ids") ||
        !specials[name]["ids"].is_array())
      throw refuse(fmt::format("its template's item {} names no special token with ids", item.dump()));
    for (const nlohmann::json& id : specials[name]["ids"]) {
      if (!id.is_number_unsigned()) throw refuse(fmt::format("special token '{}' has the id {}", name, id.dump()));
      ids.push_back(id.get<data::TokenId>());
    }
  }
  return ids;
}

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
    if (j.is_object()) {
      // The weights' own record (hash, encoding hash): a file of the recorded name here that is another tokenizer
      // is passed over for the one above the weights (it stopped generate with exit 4, no tokenizer having been given).
      tok_path = resolve_recorded_path(
          j.value("path", std::string()), source->path(),
          is_recorded_tokenizer(j.value("hash", std::string()), j.value("encoding_hash", std::string())));
    }
  }
  if (tok_path.empty()) throw UsageError(fmt::format("{} names no tokenizer: pass --tokenizer", o.checkpoint));
  std::error_code ec;
  if (o.tokenizer.empty() && !std::filesystem::exists(tok_path, ec))
    throw DataError(fmt::format(
        "{}: the tokenizer its weights record, {}, is not here (a relative path is looked for from this folder and from "
        "the weights' folder up): give it with --tokenizer",
        source->path(), tok_path));
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
  if (o.add_special_tokens) {
    const std::vector<data::TokenId> prefix = template_prefix(tok_path);
    for (const data::TokenId id : prefix)
      if (id >= tokenizer.vocab_size())
        throw DataError(fmt::format("--add-special-tokens: {}'s template names id {}, past its {} ids", tok_path, id,
                                    tokenizer.vocab_size()));
    ids.insert(ids.begin(), prefix.begin(), prefix.end());
    log::info("generate: the prompt begins with {} token(s) of the tokenizer's template ({})", prefix.size(),
              fmt::join(prefix, ", "));
  }
  if (ids.empty()) {
    // What the run's documents began after. Packed rows are "doc EOT doc EOT ...": a document follows an EOT and never
    // a [BOT], and a packed model begun from [BOT] wrote "ONONONON..." where from EOT it wrote prose; padded rows begin
    // with [BOT]. Weights that record no run (a Hugging Face directory): [BOT] where there is one, as transformers'
    // templates begin.
    const bool packed = [&] {
      if (source->config_toml().empty()) return false;
      try {
        train::TrainConfig run;
        train::apply_toml_text(run, source->config_toml(), source->path() + ": config");
        return run.data.layout == data::BatchLayout::Packed;
      } catch (const Error&) {
        return false;
      }
    }();
    const auto start = packed && tokenizer.eot_id() ? tokenizer.eot_id()
                       : tokenizer.bot_id()         ? tokenizer.bot_id()
                                                    : tokenizer.eot_id();
    if (!start) throw UsageError("--prompt is empty and the tokenizer has no start or end-of-text token to begin from");
    log::info("generate: no prompt: beginning from token {} ({}){}", *start, tokenizer.token_bytes(*start),
              packed ? ", what each document of the run's packed rows followed" : "");
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
  c.app->add_flag("--add-special-tokens", o->add_special_tokens,
                  "begin the prompt with the tokens the tokenizer.json's post_processor template puts before a text "
                  "(Meta's Llama <s> / <|begin_of_text|>), as transformers' tokenizer(prompt) does by default; for a "
                  "model trained with them (shardtrain's datasets are packed without)");
  // CLI11 reads "-1" into an unsigned as 2^64 - 1 without a word.
  c.app->add_option("--seed", o->seed, "sampling seed")->capture_default_str()->check(unsigned_check());
  c.launch = Launch::Offline;
  c.run = [o](Runtime*) { return run_generate(*o); };
  return c;
}

}  // namespace shardtrain::cli
