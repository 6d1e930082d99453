// `shardtrain evaluate`: the loss and perplexity of trained weights (a checkpoint, a directory of them, a
// consolidated file or a Hugging Face directory) on a dataset's held-out or training split. It is the
// trainer's own evaluation (train::Evaluator on a train::Replica, as the trainer builds them): the same mesh,
// engine, backend and loaders, so on the training run's ranks and batches it gives the run's validation loss,
// and it runs wherever train runs (mpirun, several ranks, a GPU). Nothing is written but --json.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "command.hpp"
#include "config_args.hpp"
#include "shardtrain/checkpoint/checkpoint.hpp"
#include "shardtrain/checkpoint/reader.hpp"
#include "shardtrain/checkpoint/source.hpp"
#include "shardtrain/data/dataset.hpp"
#include "shardtrain/data/tokenizer.hpp"
#include "shardtrain/runtime/address_space.hpp"
#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/json_text.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/train/config_io.hpp"
#include "shardtrain/train/evaluator.hpp"
#include "shardtrain/train/inputs.hpp"
#include "shardtrain/train/rank_agreement.hpp"
#include "shardtrain/train/startup.hpp"
#include "shardtrain/train/replica.hpp"
#include "shardtrain/train/run_dir.hpp"

namespace shardtrain::cli {
namespace {

// A configuration's run length where evaluation has none to give (it takes no steps), for a config to resolve.
constexpr std::string_view kNoRunLength = "[schedule]\nmax_steps = 1\n";

struct EvaluateOptions {
  ConfigArgs args;
  std::string weights;
  std::string split = "validation";
  std::string batches = "all";
  std::string json;
  std::string tokenizer;  // for bits per byte; "" = the one the dataset names
  bool every_checkpoint = false;
};

// Each id's length in bytes under the dataset's tokenizer (0 for special tokens: they stand for no text),
// for bits per byte, the measure that does not depend on the tokenizer. Empty, with the reason in `why`, when the
// tokenizer cannot be read; a tokenizer other than the dataset's is an error.
std::vector<uint32_t> bytes_per_id(const std::string& given, const data::TokenDataset& dataset, std::string* why) {
  const data::DatasetInfo& info = dataset.info();
  // The recorded path is relative to the folder prepare-data ran in: looked for above the dataset too, past a file of
  // that name here that is another tokenizer.
  const std::string path =
      given.empty() ? resolve_recorded_path(info.tokenizer_path, dataset.path(),
                                            is_recorded_tokenizer(info.tokenizer_hash, info.tokenizer_encoding_hash))
                    : given;
  std::optional<data::Tokenizer> tok;
  try {
    if (!path.empty()) tok = data::Tokenizer::load(path);
  } catch (const DataError& e) {
    if (!given.empty()) throw;
    *why = e.what();
    return {};
  }
  if (!tok) {
    *why = fmt::format("{} names no tokenizer file", dataset.path());
    return {};
  }
  if (!info.tokenizer_hash.empty() &&
      !data::same_tokenizer(tok->hash(), tok->encoding_hash(), info.tokenizer_hash, info.tokenizer_encoding_hash))
    throw DataError(fmt::format("--tokenizer {}: {} is not the tokenizer of {} ({}, {})", path, tok->hash(), dataset.path(),
                                info.tokenizer_name, info.tokenizer_hash));
  std::vector<uint32_t> bytes(tok->vocab_size());
  for (size_t id = 0; id < bytes.size(); ++id)
    bytes[id] = static_cast<uint32_t>(tok->token_bytes(static_cast<data::TokenId>(id)).size());
  for (const data::SpecialToken& s : tok->special_tokens())  // token_bytes gives their content ("<|endoftext|>")
    if (s.id < bytes.size()) bytes[s.id] = 0;
  return bytes;
}

// Whether `out` is the file or folder `input` (however spelled: another path, a link) or lies inside the folder `input`.
bool is_or_inside(const std::string& out, const std::string& input) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (input.empty() || !fs::exists(input, ec)) return false;
  if (fs::exists(out, ec) && fs::equivalent(out, input, ec)) return true;
  if (!fs::is_directory(input, ec)) return false;
  const fs::path where = fs::weakly_canonical(fs::absolute(out, ec), ec);
  if (ec) return false;
  for (fs::path dir = where.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    if (fs::equivalent(dir, input, ec)) return true;
    if (dir == dir.parent_path()) break;
  }
  return false;
}

// --json must not be one of the evaluation's inputs (`what`, named by `input`): written after the work, it replaced
// the weights, the dataset or the config it was computed from.
void refuse_json_over_input(const std::string& json, const std::string& input, const std::string& what) {
  if (json.empty() || !is_or_inside(json, input)) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool same = fs::exists(json, ec) && fs::equivalent(json, input, ec);
  throw UsageError(
      fmt::format("--json {}: {} {} ({}), an input of this evaluation, which the JSON would replace; "
                  "expected a file of its own",
                  json, same ? "is" : "lies in", what, input));
}

// A training run's own files, its config.toml, result.json, metrics.jsonl, TensorBoard events and the like: --json over
// one replaced it with exit 0, and `train -c RUN_DIR/config.toml --resume auto` then failed ("not valid TOML"). The
// run directory's eval.json (what the quickstart writes) is evaluate's own.
void refuse_json_over_run_file(const std::string& json) {
  namespace fs = std::filesystem;
  if (json.empty()) return;
  const fs::path path(json);
  const std::string name = path.filename().string();
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  if (name == "eval.json" || !train::is_own_config_toml((dir / "config.toml").string())) return;
  std::string metrics = "metrics.jsonl";
  try {  // the run's own name for its metrics, when it chose one
    const train::TrainConfig run = train::load_train_config((dir / "config.toml").string());
    if (!run.logging.metrics_file.empty()) metrics = fs::path(run.logging.metrics_file).filename().string();
  } catch (const Error&) {
  }
  if (train::is_reserved_run_dir_name(name) || name == metrics || name == "metrics.jsonl")
    throw UsageError(
        fmt::format("--json {}: is a file of the training run in {} (its {}), which the JSON would replace; "
                    "expected a file of its own ({} is one)",
                    json, dir.string(), name, (dir / "eval.json").string()));
}

int64_t parse_batches(const std::string& text) {
  if (text == "all") return 0;
  try {
    size_t used = 0;
    const long long n = std::stoll(text, &used);
    if (used == text.size() && n > 0) return n;
  } catch (const std::exception&) {
  }
  throw UsageError(fmt::format("--batches '{}': expected all or a positive number of evaluation batches per source", text));
}

data::DatasetSplit parse_split(const std::string& text) {
  if (text == "validation") return data::DatasetSplit::Validation;
  if (text == "train") return data::DatasetSplit::Train;
  throw UsageError(fmt::format("--split '{}': expected validation (the held-out samples) or train", text));
}

// One set of weights, imported into the replica's engine (evaluate_weights' first half): the node's first rank
// reads for the node with checkpoint.cpu_ram_efficient_loading, unless `each_rank_reads` (a damaged chunk must reach
// every rank's catch alike, not leave the node's other ranks in the leader's broadcast).
void import_for_evaluation(train::Replica& replica, const data::TokenDataset& dataset, checkpoint::TensorSource& source,
                           const train::TrainConfig& c, bool each_rank_reads) {
  train::check_weights_tokenizer(source.path(), source.tokenizer(), dataset);
  checkpoint::import_weights(replica.engine(), source,
                             c.checkpoint.cpu_ram_efficient_loading && !each_rank_reads
                                 ? checkpoint::ImportMode::NodeLeaderReads
                                 : checkpoint::ImportMode::EveryRankReadsItsSlices);
}

// The imported weights through the trainer's evaluation (collective), printed by rank 0; returns its JSON record.
nlohmann::json evaluate_weights(train::Evaluator& evaluator, const checkpoint::TensorSource& source,
                                const std::vector<uint32_t>& id_bytes, Runtime* rt) {
  const std::vector<train::Evaluator::SourcePlan> plan = evaluator.plan();
  const auto t0 = std::chrono::steady_clock::now();
  int64_t tokens = 0;
  std::vector<train::SourceLoss> by_source;
  const double loss = evaluator.evaluate(&tokens, &by_source, id_bytes.empty() ? nullptr : &id_bytes);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const auto ppl = [](double l) { return std::exp(l); };
  // Bits per byte: the source's loss in bits over its targets' bytes. A mixture's is the sources' in their
  // weights, as its loss.
  const auto bpb = [](const train::SourceLoss& s) {
    return s.bytes > 0 ? s.loss * static_cast<double>(s.tokens) / std::log(2.0) / static_cast<double>(s.bytes) : 0.0;
  };
  const bool print = rt->topology().world_rank == 0;
  if (print)
    std::printf("evaluate: %s%s\n", source.path().c_str(),
                source.step() >= 0 ? fmt::format(" (step {})", source.step()).c_str() : "");
  nlohmann::json sources = nlohmann::json::array();
  for (size_t k = 0; k < by_source.size(); ++k) {
    const train::SourceLoss& s = by_source[k];
    const train::Evaluator::SourcePlan& p = plan[k];  // evaluate() reports the sources in the plan's order
    if (print)
      std::printf(
          "  %s: %lld of %lld samples (%lld batch(es) of %lld), %lld tokens%s: loss %.6f, perplexity %.4g, %.4f bits per token%s\n",
          s.path.c_str(), static_cast<long long>(p.sequences), static_cast<long long>(p.samples),
          static_cast<long long>(p.micro_batches), static_cast<long long>(p.sequences / p.micro_batches),
          static_cast<long long>(s.tokens), s.bytes ? fmt::format(" ({} bytes)", s.bytes).c_str() : "", s.loss, ppl(s.loss),
          s.loss / std::log(2.0), s.bytes ? fmt::format(", {:.4f} bits per byte", bpb(s)).c_str() : "");
    nlohmann::json j = {{"path", s.path},
                        {"samples", p.samples},
                        {"sequences", p.sequences},
                        {"tokens", s.tokens},
                        {"loss", s.loss},
                        {"perplexity", ppl(s.loss)},
                        {"bits_per_token", s.loss / std::log(2.0)}};
    if (s.bytes) j["bytes"] = s.bytes, j["bits_per_byte"] = bpb(s);
    sources.push_back(std::move(j));
  }
  double mixed_bpb = 0, weights = 0;
  for (size_t k = 0; k < by_source.size(); ++k) mixed_bpb += plan[k].weight * bpb(by_source[k]), weights += plan[k].weight;
  mixed_bpb = id_bytes.empty() || weights <= 0 ? 0.0 : mixed_bpb / weights;
  if (print && by_source.size() > 1)
    std::printf("  mixture (the sources' losses in their weights): loss %.6f, perplexity %.4g%s\n", loss, ppl(loss),
                mixed_bpb > 0 ? fmt::format(", {:.4f} bits per byte", mixed_bpb).c_str() : "");
  if (print)
    std::printf("  %lld tokens in %.2f s, %.0f tokens/s on %d rank(s)\n", static_cast<long long>(tokens), seconds,
                seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0, rt->topology().world_size);
  return {{"weights", source.path()}, {"step", source.step()},
          {"sources", sources},       {"loss", loss},
          {"perplexity", ppl(loss)},  {"bits_per_byte", mixed_bpb > 0 ? nlohmann::json(mixed_bpb) : nlohmann::json()},
          {"tokens", tokens},         {"seconds", seconds}};
}

// A checkpoint of --every-checkpoint's listing that is no more: its DONE marker gone (a running job's rotation removes
// the folder, its DONE with it).
bool removed_since_listed(const std::string& path) {
  std::error_code ec;
  return !std::filesystem::exists(std::filesystem::path(path) / "DONE", ec);
}

int run_evaluate(const EvaluateOptions& o, Runtime* rt) {
  // The inputs the command line names; the datasets (and their tokenizers) once the config is resolved.
  refuse_json_over_input(o.json, o.weights, "the weights --weights");
  refuse_json_over_input(o.json, o.args.config, "the config --config");
  refuse_json_over_input(o.json, o.args.fsdp_config, "the config --fsdp-config");
  refuse_json_over_input(o.json, o.args.accelerate_config, "the config --accelerate-config");
  refuse_json_over_input(o.json, o.tokenizer, "the tokenizer --tokenizer");
  refuse_json_over_run_file(o.json);
  if (!rt->device().is_cuda()) check_address_space(rt->host_threads(), "evaluate");
  const int64_t batches = parse_batches(o.batches);
  const data::DatasetSplit split = parse_split(o.split);
  // Evaluate's own options, and the weights they name, alike on every rank. Ranks given other --split, --batches or
  // --weights (a command line per rank), or that found another newest checkpoint in --weights' folder (node-local
  // disks, or a save published between their listings), evaluated other things and printed rank 0's as the result,
  // exit 0 (loss 3.570 for a step-800 checkpoint whose loss is 3.422: half of step 400's weights); other --batches hung
  // in the collectives until the watchdog.
  const std::string options =
      train::first_disagreement(rt->world(), {{"--weights", o.weights},
                                              {"--split", o.split},
                                              {"--batches", o.batches},
                                              {"--tokenizer", o.tokenizer},
                                              {"--every-checkpoint", o.every_checkpoint ? "given" : "not given"}});
  if (!options.empty())
    throw on_every_rank(UsageError(fmt::format(
        "the ranks were given different evaluations: {}; every rank must run the same evaluate command line", options)));
  // What to evaluate: the weights, or with --every-checkpoint each complete checkpoint of the directory,
  // oldest first (the milestones keep_every keeps, and the newest).
  std::vector<std::string> targets;
  std::vector<int64_t> target_steps;  // -1 for weights named alone
  if (o.every_checkpoint) {
    // Rank 0's list: a rank that listed the directory itself while the run was publishing a save (or on a disk of its
    // node) evaluated one checkpoint more than the others, and waited for them in its collectives. The steps are
    // rank 0's too (the lambda runs there only), which alone prints the table and writes --json.
    targets = train::rank0_answer(rt->world(), [&] {
      std::vector<std::string> found;
      for (const auto& [step, path] : checkpoint::complete_checkpoints(o.weights)) {
        found.push_back(path);
        target_steps.push_back(step);
      }
      return found;
    });
    target_steps.resize(targets.size(), -1);
    if (targets.empty())
      throw CheckpointError(fmt::format(
          "{}: --every-checkpoint: no complete checkpoint (step_N with DONE) in this directory{}", o.weights,
          checkpoint::is_complete(o.weights)
              ? fmt::format(" (it is a checkpoint itself: without --every-checkpoint for it alone, or the directory "
                            "above it, {}, for all)",
                            std::filesystem::path(o.weights).lexically_normal().parent_path().string())
              : std::string()));
  } else {
    targets.push_back(o.weights);
    target_steps.push_back(-1);
  }
  // The newest one that opens gives the run config; a damaged one among several is skipped (below), not the end.
  std::unique_ptr<checkpoint::TensorSource> source;
  size_t source_index = targets.size();
  for (size_t k = targets.size(); k-- > 0 && !source;) {
    try {
      source = checkpoint::open_tensor_source(targets[k]);
      source_index = k;
    } catch (const checkpoint::CheckpointDamaged&) {
      if (!o.every_checkpoint || k == 0) throw;
    } catch (const CheckpointError&) {  // removed since the listing (a running job's rotation): the next older
      if (!o.every_checkpoint || k == 0 || !removed_since_listed(targets[k])) throw;
    }
  }

  // The weights --weights names, alike on every rank (of a folder of checkpoints, each rank opened its newest).
  if (!o.every_checkpoint) {
    const std::string weights =
        train::first_disagreement(rt->world(), {{"the weights " + o.weights + " names", source->path()}});
    if (!weights.empty())
      throw on_every_rank(CheckpointError(fmt::format(
          "the ranks found different weights: {}; every rank must see the same checkpoints (a folder on each node's "
          "own disk, or a save published while the ranks looked: name the checkpoint itself)",
          weights)));
  }

  // The run's configuration: --config, else the one the (newest) checkpoint was trained with (its data,
  // layout, sequence length, mesh), else the defaults; then the overrides. The architecture is the weights'.
  std::vector<std::string> notes;
  std::string config_source;
  // Weights without a run config (a consolidated file, a Hugging Face directory) and no --config: the
  // defaults, given a run length only because a config must have one (evaluation takes no steps).
  const std::string saved = source->config_toml();
  train::TrainConfig c;
  try {
    c = o.args.resolve(notes, config_source, saved.empty() ? kNoRunLength : saved,
                       saved.empty() ? "the defaults" : "the run config saved with the weights");
  } catch (const ConfigError& e) {
    // Said for what it is: "data.path: expected the dataset file written by prepare-data" left the user to guess that
    // these weights, unlike a checkpoint, carry no run (and so no dataset) of their own.
    if (!saved.empty() || !o.args.config.empty() || std::string_view(e.what()).rfind("data.path:", 0) != 0) throw;
    throw ConfigError(fmt::format(
        "{}: these weights carry no run configuration (a consolidated file or a Hugging Face directory does not; a "
        "checkpoint does), so there is no dataset to evaluate on: give --data.path DATASET, or --config the run's "
        "config",
        source->path()));
  }
  for (const auto& n : notes) log::info("evaluate: {}", n);
  c.model = source->model_config();
  // The overrides given on the command line, by key.
  const std::vector<train::ConfigField>& fields = train::config_fields();
  const auto overridden = [&](const std::function<bool(const train::ConfigField&)>& which) {
    std::vector<std::string> keys;
    for (size_t i = 0; i < fields.size() && i < o.args.override_options.size(); ++i)
      if (which(fields[i]) && o.args.override_options[i]->count() > 0) keys.push_back(fields[i].dotted());
    return keys;
  };
  // The architecture is the weights': a --model.* override changes nothing, and was taken without a word.
  for (const std::string& key : overridden([](const train::ConfigField& f) { return f.section == "model"; }))
    if (rt->topology().world_rank == 0)
      log::warn("evaluate: --{} is not used: the model is the weights' ({})", key, source->path());
  // The saved config's datasets are relative to the folder the run started in, which may not be this one; a file of
  // the same name here that is another dataset than the one the weights record (their sources' identities) was
  // evaluated with exit 0. Only for the datasets the saved config names: those the user names (--config, the HF or
  // Accelerate files, --data.path, --data.mixture) are theirs.
  std::map<std::string, std::string> identities;  // the recorded path -> its identity, as the checkpoint records them
  const bool user_data = !o.args.config.empty() || !o.args.fsdp_config.empty() || !o.args.accelerate_config.empty() ||
                         !overridden([](const train::ConfigField& f) {
                            return f.dotted() == "data.path" || f.dotted() == "data.mixture";
                          }).empty();
  if (const auto record =
          nlohmann::json::parse(source->tokenizer().empty() ? std::string("{}") : source->tokenizer(), nullptr, false);
      !user_data && record.is_object() && record.contains("sources") && record["sources"].is_array())
    for (const auto& s : record["sources"])
      if (s.is_object() && s.value("path", "") != "" && s.value("identity", "") != "")
        identities[s["path"].get<std::string>()] = s["identity"].get<std::string>();
  const auto recorded_dataset = [&](const std::string& recorded) {
    return [&identities, key = json_recorded(recorded)](const std::string& path) {
      const auto it = identities.find(key);
      if (it == identities.end()) return true;  // nothing recorded to compare with
      try {
        return data::TokenDataset::open(path).identity() == it->second;
      } catch (const Error&) {
        return false;
      }
    };
  };
  c.data.path = resolve_recorded_path(c.data.path, source->path(), recorded_dataset(c.data.path));
  for (size_t i = 0; i < c.data.mixture.size(); ++i) {
    const data::MixtureEntry e = data::parse_mixture_entry(c.data.mixture[i], fmt::format("data.mixture[{}]", i));
    if (const std::string p = resolve_recorded_path(e.path, source->path(), recorded_dataset(e.path)); p != e.path)
      c.data.mixture[i] = fmt::format("{}:{}", p, e.weight);
  }
  c.checkpoint.resume.clear();
  c.checkpoint.init_from.clear();
  c.validate_for_evaluation();  // the model is the weights' now
  c.validate_evaluation_for_world(rt->topology().world_size, rt->topology().node_count);
  // Host collectives and loads no collective watchdog covers, timed as a training run's start-up (startup.hpp): a rank
  // held up (a file system that stopped answering) ends the job with exit code 10 instead of holding it.
  train::StartupWatch watch(c);
  watch.stage("the ranks' agreement on the configuration");
  train::check_ranks_agree_on_config(rt->world(), train::to_toml(c));  // before any collective a difference could mismatch
  watch.stage("opening the datasets");

  // A dataset whose ids go past the weights' vocabulary was made with another tokenizer than the weights were
  // trained with (5, as the tokenizers' hashes say where both are recorded). open_data_sources' own check names
  // model.vocab_size, a key to raise in a training config; here the model is the weights'.
  std::optional<std::pair<std::string, data::DatasetInfo>> first;
  for (const data::MixtureEntry& e : c.data.sources()) {
    refuse_json_over_input(o.json, e.path, c.data.mixture.empty() ? "the dataset data.path" : "a dataset of data.mixture");
    const data::DatasetInfo info = data::TokenDataset::open(e.path).info();
    // A mixture's sources share one tokenizer, as train requires (data::MixedSource): the evaluator reads each source
    // alone, so a source of another tokenizer was evaluated with exit 0, its bits per byte by the first's tokenizer.
    if (!first) first.emplace(e.path, info);
    if (!data::same_tokenizer(info.tokenizer_hash, info.tokenizer_encoding_hash, first->second.tokenizer_hash,
                              first->second.tokenizer_encoding_hash))
      throw DataError(fmt::format(
          "{}: tokenized with {} ({}), but {} with {} ({}); every source of a mixture must use the same tokenizer", e.path,
          info.tokenizer_name, info.tokenizer_hash, first->first, first->second.tokenizer_name,
          first->second.tokenizer_hash));
    refuse_json_over_input(o.json, resolve_recorded_path(info.tokenizer_path, e.path), "the dataset's tokenizer");
    if (info.vocab_size > c.model.vocab_size)
      throw CheckpointError(fmt::format(
          "{}: a model of {} token ids, but {} holds ids of {} ({}); use a dataset prepared with the weights' tokenizer",
          source->path(), c.model.vocab_size, e.path, info.tokenizer_name, info.vocab_size));
  }
  // The trainer's inputs, replica and evaluation, without its optimizer, training loader or run directory.
  const std::vector<data::MixtureComponent> sources = train::open_data_sources(c);
  watch.stage("the ranks' agreement on the datasets");
  train::check_ranks_agree_on_data(rt->world(), sources);
  check_model_fits(c, *rt);
  watch.stage("building the mesh, its communicators (NCCL's start on a GPU) and the model");
  train::Replica replica(*rt, c);
  train::Evaluator evaluator(replica, c, sources, {train::EvaluatorOptions::Use::Evaluation, split, batches});
  const auto split_empty = [&](const data::MixtureComponent& m) { return m.dataset->split_documents(split).empty(); };
  if (evaluator.empty() && std::all_of(sources.begin(), sources.end(), split_empty))
    throw DataError(fmt::format("{}: the {} split is empty (0 documents, 0 tokens): nothing to evaluate; {}",
                                c.data.describe(), data::dataset_split_name(split),
                                split == data::DatasetSplit::Validation
                                    ? "prepare the dataset with --validation-fraction above 0 (prepare-data), or "
                                      "evaluate its training split (--split train)"
                                    : "evaluate its validation split (--split validation), or a dataset with training "
                                      "documents"));
  if (evaluator.empty())
    throw DataError(fmt::format("{}: no source has {} {} samples, one evaluation batch (micro-batch {} x {} ranks)",
                                c.data.describe(), evaluator.batch_sequences(), data::dataset_split_name(split),
                                c.micro_batch_size_for(rt->topology().world_size), rt->topology().world_size));
  const data::TokenDataset& dataset = *sources.front().dataset;
  watch.stage("reading the dataset's tokenizer");
  std::string why;
  std::vector<uint32_t> id_bytes = bytes_per_id(o.tokenizer, dataset, &why);  // a mixture's sources share one
  // Bits per byte on every rank or on none: each rank reads the tokenizer itself, and one that could not (a file on
  // another node's disk) once skipped the all-reduce of the bytes the others waited in, until the watchdog ended them.
  // Said once for the job, with the first failing rank's reason.
  int missing = id_bytes.empty() ? 1 : 0;
  ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &missing, 1, MPI_INT, MPI_SUM, rt->world()));
  why = train::lowest_error(rt->world(), rt->topology().world_rank, why);
  if (missing > 0) {
    id_bytes.clear();
    const int W = rt->topology().world_size;
    if (rt->topology().world_rank == 0)
      log::warn("evaluate: no bits per byte: {} ({}); give it with --tokenizer{}",
                missing == W ? std::string("the dataset's tokenizer cannot be read")
                             : fmt::format("{} of {} ranks cannot read the dataset's tokenizer", missing, W),
                why, missing == W ? "" : ", at a path every node sees");
  }
  if (rt->topology().world_rank == 0)
    std::printf("evaluate: the %s split; config: %s\n", data::dataset_split_name(split), config_source.c_str());

  // With --every-checkpoint a damaged checkpoint (a bad DONE, a chunk whose checksum fails on whichever rank reads
  // it) is skipped with its reason, on every rank alike, instead of ending the table at the first one. One that a
  // running job's rotation (keep_last) removed since the listing, before or while it was read, is skipped with a
  // note: the table of a live run's milestones ended at the first such one, exit 5 (or blamed a node-local disk).
  std::vector<nlohmann::json> results;
  const int rank = rt->topology().world_rank;
  const auto gone_on_rank0 = [&](const std::string& path) {
    int gone = rank == 0 && removed_since_listed(path) ? 1 : 0;
    ST_CHECK_MPI(MPI_Bcast(&gone, 1, MPI_INT, 0, rt->world()));
    if (gone && rank == 0)
      log::warn("evaluate: {} skipped: removed since it was listed (a running job's rotation: checkpoint.keep_last)", path);
    return gone != 0;
  };
  size_t removed = 0;
  for (size_t k = 0; k < targets.size(); ++k) {
    if (o.every_checkpoint) {
      if (gone_on_rank0(targets[k])) {
        ++removed;
        continue;
      }
      train::check_ranks_see_checkpoint(rt->world(), targets[k], "evaluate --every-checkpoint");
    }
    std::unique_ptr<checkpoint::TensorSource> weights;
    std::string damaged, failed;
    watch.checkpoint_stage(fmt::format("loading {}", targets[k]));
    try {
      // Each checkpoint must be of the same model (import_weights refuses another architecture, naming it).
      weights = k == source_index ? std::move(source) : checkpoint::open_tensor_source(targets[k]);
      import_for_evaluation(replica, dataset, *weights, c, o.every_checkpoint);
    } catch (const checkpoint::CheckpointDamaged& e) {
      if (!o.every_checkpoint) throw;
      damaged = e.what();
    } catch (const CheckpointError& e) {
      if (!o.every_checkpoint) throw;
      failed = e.what();
    }
    if (o.every_checkpoint) {
      damaged = train::lowest_error(rt->world(), rank, damaged);
      failed = train::lowest_error(rt->world(), rank, failed);
      if ((!damaged.empty() || !failed.empty()) && gone_on_rank0(targets[k])) {
        ++removed;
        watch.done();
        continue;
      }
      if (!failed.empty()) throw on_every_rank(CheckpointError(failed));
    }
    watch.done();  // the evaluation's collectives are the watchdog's
    if (!damaged.empty()) {
      if (rank == 0) log::warn("evaluate: {} skipped, damaged: {}", targets[k], damaged);
      results.push_back({{"weights", targets[k]}, {"step", target_steps[k]}, {"error", damaged}});
      continue;
    }
    results.push_back(evaluate_weights(evaluator, *weights, id_bytes, rt));
  }
  if (results.empty())
    throw CheckpointError(
        fmt::format("{}: --every-checkpoint: each of its {} complete checkpoint(s) was removed while "
                    "evaluate ran (a running job's rotation: checkpoint.keep_last)",
                    o.weights, removed));
  if (std::all_of(results.begin(), results.end(), [](const nlohmann::json& r) { return r.contains("error"); }))
    throw checkpoint::CheckpointDamaged(
        fmt::format("{}: --every-checkpoint: none of its {} complete checkpoint(s) could be "
                    "evaluated, each is damaged (above)",
                    o.weights, results.size()));
  if (rank != 0) return 0;
  if (results.size() > 1) {
    std::printf("every checkpoint of %s:\n  %10s  %10s  %12s  %14s\n", o.weights.c_str(), "step", "loss", "perplexity",
                "bits per byte");
    for (const nlohmann::json& r : results) {
      if (r.contains("error")) {
        std::printf("  %10lld  %10s  (damaged: not evaluated)\n", static_cast<long long>(r["step"].get<int64_t>()), "-");
        continue;
      }
      std::printf("  %10lld  %10.6f  %12.4g  %14s\n", static_cast<long long>(r["step"].get<int64_t>()),
                  r["loss"].get<double>(), r["perplexity"].get<double>(),
                  r["bits_per_byte"].is_null() ? "-" : fmt::format("{:.4f}", r["bits_per_byte"].get<double>()).c_str());
    }
  }
  if (!o.json.empty()) {
    nlohmann::json j = {{"split", data::dataset_split_name(split)},
                        {"config", config_source},
                        {"seq_len", c.data.seq_len},
                        {"layout", data::batch_layout_name(c.data.layout)},
                        {"ranks", rt->topology().world_size}};
    if (o.every_checkpoint) {
      j["checkpoints"] = results;
    } else {
      j.update(results.front());
    }
    write_json_file(o.json, j, "the evaluation (--json)");
  }
  return 0;
}

}  // namespace

Command add_evaluate_command(CLI::App& parent) {
  auto o = std::make_shared<EvaluateOptions>();
  Command c;
  c.app = parent.add_subcommand("evaluate",
                                "the loss and perplexity of trained weights on a dataset's validation or training split");
  c.app
      ->add_option("--weights,-w", o->weights,
                   "a checkpoint, a directory of checkpoints (its newest), a consolidated .h5 or a Hugging Face directory")
      ->required();
  c.app->add_option("--split", o->split, "validation (the held-out samples) or train")->capture_default_str();
  c.app->add_option("--batches", o->batches, "evaluation batches (micro-batch x ranks sequences) per source, or all")
      ->capture_default_str();
  c.app->add_option("--json", o->json, "also write the results to this JSON file")->check(output_file_check());
  c.app->add_option("--tokenizer", o->tokenizer,
                    "the dataset's tokenizer, for bits per byte (default: the file the dataset names)");
  c.app->add_flag("--every-checkpoint", o->every_checkpoint,
                  "--weights is a directory of checkpoints: evaluate each complete one, oldest first, and tabulate them");
  o->args.add_to(c.app, ConfigArgs::Use::Evaluate);
  c.app->footer(
      "The data, sequence length, layout and mesh come from --config, else from the checkpoint's own run config, "
      "else the defaults; --section.key overrides any of them (e.g. --data.path other.h5). The model is the weights'.\n"
      "docs/training.md, \"Evaluating weights\".");
  c.launch = Launch::Mpi;
  // Before MPI, --config and the overrides (the checkpoint's saved config is read once the ranks run).
  c.start_settings = [o] {
    StartSettings s;
    if (const auto config = o->args.resolve_quietly(kNoRunLength)) s = {config->fsdp.startup_timeout, true, ""};
    return s;
  };
  c.run = [o](Runtime* rt) { return run_evaluate(*o, rt); };
  return c;
}

}  // namespace shardtrain::cli
