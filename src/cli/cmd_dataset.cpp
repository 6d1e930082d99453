// `shardtrain dataset info`: what a prepared dataset holds, what the batch layouts make of it at a sequence
// length, a mixture's shares, and (--verify) every block's checksum read now instead of mid-run
// (docs/data.md, "Inspecting a dataset"). Offline: no MPI.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "command.hpp"
#include "shardtrain/data/batches.hpp"
#include "shardtrain/data/dataset.hpp"
#include "shardtrain/data/mixture.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/json_text.hpp"
#include "shardtrain/train/config.hpp"

namespace shardtrain::cli {
namespace {

namespace fs = std::filesystem;

struct DatasetInfoOptions {
  std::vector<std::string> entries;  // PATH or PATH:WEIGHT
  int seq_len = 512;
  std::string layout = "packed";
  bool verify = false;
  bool json = false;
};

nlohmann::ordered_json layout_summary(const data::TokenDataset& ds, data::DatasetSplit split, data::BatchLayout layout,
                                      int seq) {
  const data::LayoutStats st = data::layout_stats(ds, split, layout, seq);
  nlohmann::ordered_json j;
  j["samples"] = st.samples;
  if (layout == data::BatchLayout::Padded) {
    j["documents_cut"] = st.documents_cut;
    j["tokens_cut"] = st.tokens_cut;
    j["padding_fraction"] = st.padding_fraction;
  }
  return j;
}

nlohmann::ordered_json summarize(const data::TokenDataset& ds, int seq) {
  const data::DatasetInfo& info = ds.info();
  nlohmann::ordered_json j;
  j["path"] = ds.path();
  std::error_code ec;
  j["file_bytes"] = fs::file_size(ds.path(), ec);
  j["tokens_mapped"] = ds.mapped();
  j["metadata_checksums"] = {{"recorded", ds.metadata_recorded()}, {"entries", ds.metadata_entries()}};
  auto id = [](const std::optional<data::TokenId>& t) { return t ? int64_t{*t} : int64_t{-1}; };
  j["tokenizer"] = {
      {"name", info.tokenizer_name}, {"format", info.tokenizer_format},
      {"hash", info.tokenizer_hash}, {"encoding_hash", info.tokenizer_encoding_hash},  // "" where the file predates it
      {"path", info.tokenizer_path}, {"vocab_size", info.vocab_size},
      {"eot_id", id(info.eot_id)},   {"bot_id", id(info.bot_id)},
      {"pad_id", id(info.pad_id)}};
  j["documents"] = ds.num_documents();
  j["tokens"] = ds.num_tokens();
  j["validation_split"] = {
      {"by", data::split_by_name(info.split_by)}, {"fraction", info.validation_fraction}, {"seed", info.split_seed}};
  std::vector<uint64_t> sizes(ds.num_documents());
  for (size_t d = 0; d < sizes.size(); ++d) sizes[d] = ds.document_size(d);
  std::sort(sizes.begin(), sizes.end());
  if (!sizes.empty())
    j["document_tokens"] = {{"min", sizes.front()},
                            {"median", sizes[sizes.size() / 2]},
                            {"mean", static_cast<double>(ds.num_tokens()) / static_cast<double>(sizes.size())},
                            {"max", sizes.back()}};
  for (const auto split : {data::DatasetSplit::Train, data::DatasetSplit::Validation}) {
    uint64_t tokens = 0;
    for (int64_t d : ds.split_documents(split)) tokens += ds.document_size(static_cast<size_t>(d));
    nlohmann::ordered_json s;
    s["documents"] = ds.split_documents(split).size();
    s["tokens"] = tokens;
    s["packed"] = layout_summary(ds, split, data::BatchLayout::Packed, seq);
    s["padded"] = layout_summary(ds, split, data::BatchLayout::Padded, seq);
    j[data::dataset_split_name(split)] = s;
  }
  j["sources"] = info.sources;
  return j;
}

std::string print(const nlohmann::ordered_json& j, int seq) {
  const auto& t = j["tokenizer"];
  std::string out = fmt::format("dataset {}\n", j["path"].get<std::string>());
  out += fmt::format("  {:.1f} MB; tokens {}\n", j["file_bytes"].get<double>() / 1e6,
                     j["tokens_mapped"].get<bool>() ? "mapped from the file (format 2)" : "read whole (format 1)");
  const auto& m = j["metadata_checksums"];
  out += m["recorded"].get<bool>()
             ? fmt::format("  metadata: ok ({} attributes, layouts and links match their checksums)\n",
                           m["entries"].get<int64_t>())
             : std::string(
                   "  metadata: NOT CHECKED (prepared before metadata checksums existed; prepare it again to add them)\n");
  out += fmt::format("  tokenizer {} ({}, {}), vocab {}; eot {}, bot {}, pad {}\n", t["name"].get<std::string>(),
                     t["format"].get<std::string>(), t["hash"].get<std::string>(), t["vocab_size"].get<int64_t>(),
                     t["eot_id"].get<int64_t>(), t["bot_id"].get<int64_t>(), t["pad_id"].get<int64_t>());
  out += fmt::format("  {} documents, {} tokens", j["documents"].get<uint64_t>(), j["tokens"].get<uint64_t>());
  if (j.contains("document_tokens")) {
    const auto& d = j["document_tokens"];
    out += fmt::format("; tokens per document: min {}, median {}, mean {:.1f}, max {}", d["min"].get<uint64_t>(),
                       d["median"].get<uint64_t>(), d["mean"].get<double>(), d["max"].get<uint64_t>());
  }
  out += "\n";
  const auto& v = j["validation_split"];
  out += fmt::format("  validation split: {:g} of the documents by {} (seed {})\n", v["fraction"].get<double>(),
                     v["by"].get<std::string>(), v["seed"].get<uint64_t>());
  for (const char* split : {"train", "validation"}) {
    const auto& s = j[split];
    out += fmt::format("  {:<10} {} documents, {} tokens; at seq_len {}: packed {} samples, padded {} samples", split,
                       s["documents"].get<uint64_t>(), s["tokens"].get<uint64_t>(), seq,
                       s["packed"]["samples"].get<uint64_t>(), s["padded"]["samples"].get<uint64_t>());
    const auto& p = s["padded"];
    const auto tokens = s["tokens"].get<uint64_t>();
    if (p["samples"].get<uint64_t>() > 0 && tokens > 0)
      out += fmt::format(" ({} documents cut, {:.1f}% of the tokens never seen; {:.1f}% padding)",
                         p["documents_cut"].get<uint64_t>(),
                         100.0 * static_cast<double>(p["tokens_cut"].get<uint64_t>()) / static_cast<double>(tokens),
                         100 * p["padding_fraction"].get<double>());
    out += "\n";
  }
  const auto& sources = j["sources"];
  if (!sources.empty())
    out += fmt::format("  made from {} input path(s): {}{}\n", sources.size(), sources.front().get<std::string>(),
                       sources.size() > 1 ? fmt::format(" ... {}", sources.back().get<std::string>()) : std::string());
  return out;
}

int run_dataset_info(const DatasetInfoOptions& o) {
  if (o.seq_len < 1) throw UsageError(fmt::format("--seq-len: expected 1 or more, got {}", o.seq_len));
  const data::BatchLayout layout = data::parse_batch_layout(o.layout);
  // Files, or PATH:WEIGHT entries read as data.mixture reads them (a mixture, previewed below): every entry weighted,
  // no file twice. A weighted and an unweighted entry once mixed (the latter weighing 1), and a file listed twice was
  // previewed as two shares of a mixture that train refuses.
  std::vector<data::MixtureComponent> components;
  const bool weighted = std::any_of(o.entries.begin(), o.entries.end(),
                                    [](const std::string& e) { return !fs::exists(e) && e.find(':') != std::string::npos; });
  std::vector<data::MixtureEntry> entries;
  for (const std::string& e : o.entries) entries.push_back({e, 1.0});
  if (weighted) {
    try {
      entries = train::parse_mixture(o.entries, [](size_t i) { return fmt::format("argument {}", i + 1); });
    } catch (const ConfigError& e) {
      throw UsageError(e.what());  // the command line's, not a configuration's
    }
  }
  nlohmann::ordered_json all = nlohmann::ordered_json::array();
  for (size_t i = 0; i < o.entries.size(); ++i) {
    const data::MixtureEntry& e = entries[i];
    auto ds = std::make_shared<data::TokenDataset>(data::TokenDataset::open(e.path));
    nlohmann::ordered_json j = summarize(*ds, o.seq_len);
    if (!o.json) std::fputs(print(j, o.seq_len).c_str(), stdout);
    std::fflush(stdout);
    if (o.verify) {
      const uint64_t blocks = data::verify_dataset(*ds, !o.json);
      j["verified"] = true;
      if (!o.json)
        std::printf("  checksums: ok (%llu blocks of %llu tokens read; every id below %lld)\n",
                    static_cast<unsigned long long>(blocks), static_cast<unsigned long long>(data::kChecksumBlockTokens),
                    static_cast<long long>(ds->info().vocab_size));
    }
    all.push_back(j);
    components.push_back({ds, e.weight});
  }
  nlohmann::ordered_json mixture;
  if (weighted || components.size() > 1) {
    // What data.mixture would make of these (train split, the given layout and seq_len, shuffled).
    const data::MixedSource mix(components, data::DatasetSplit::Train, layout, o.seq_len, 0, true);
    mixture["layout"] = data::batch_layout_name(layout);
    mixture["seq_len"] = o.seq_len;
    mixture["samples_per_epoch"] = mix.num_samples();
    mixture["sources"] = nlohmann::ordered_json::array();
    std::string text = fmt::format("mixture ({} layout, seq_len {}): {} samples per epoch\n",
                                   data::batch_layout_name(layout), o.seq_len, mix.num_samples());
    for (size_t k = 0; k < mix.size(); ++k) {
      mixture["sources"].push_back({{"path", mix.dataset(k).path()},
                                    {"weight", mix.weight(k)},
                                    {"samples_per_epoch", mix.samples_per_epoch(k)},
                                    {"source_samples", mix.source_samples(k)},
                                    {"times_seen_per_epoch", mix.times_seen_per_epoch(k)}});
      text += fmt::format("  {:<40} {}\n", mix.dataset(k).path(), mix.share(k));
    }
    if (!o.json) std::fputs(text.c_str(), stdout);
  }
  if (o.json) {
    nlohmann::ordered_json out = {{"datasets", all}};
    if (!mixture.is_null()) out["mixture"] = mixture;
    std::printf("%s\n", json_text(out, 2).c_str());
  }
  return 0;
}

}  // namespace

Command add_dataset_command(CLI::App& parent) {
  auto o = std::make_shared<DatasetInfoOptions>();
  Command c;
  c.app = parent.add_subcommand("dataset",
                                "inspect prepared datasets: contents, samples per layout, a mixture's shares, checksums");
  CLI::App* info = c.app->add_subcommand(
      "info", "print what datasets hold and what the layouts make of them; --verify reads every block");
  info->add_option("datasets", o->entries,
                   "prepared datasets (HDF5 from prepare-data), or PATH:WEIGHT entries to preview a mixture")
      ->required();
  info->add_option("--seq-len", o->seq_len, "sequence length for the sample counts")->capture_default_str();
  info->add_option("--layout", o->layout, "packed or padded: the mixture preview's layout")->capture_default_str();
  info->add_flag("--verify", o->verify, "read every token now: each block's checksum, every id inside the vocabulary");
  info->add_flag("--json", o->json, "one JSON object on stdout");
  c.app->require_subcommand(1);
  c.launch = Launch::Offline;
  c.run = [o](Runtime*) { return run_dataset_info(*o); };
  return c;
}

}  // namespace shardtrain::cli
