// `shardtrain tokenizer train|encode|decode|info`: train a byte-level BPE (tokenizer.json), and inspect
// how a tokenizer encodes text. Offline: no MPI.
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <memory>
#include <sstream>

#include "command.hpp"
#include "shardtrain/data/bpe_trainer.hpp"
#include "shardtrain/data/documents.hpp"
#include "shardtrain/data/output_file.hpp"
#include "shardtrain/data/tokenizer.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"

namespace shardtrain::cli {
namespace {

struct TokenizerArgs {
  std::vector<std::string> inputs;
  std::string output = "tokenizer.json";
  size_t vocab_size = 8192;
  std::vector<std::string> specials = {"[BOT]", "[EOT]", "[PAD]"};
  std::string pattern;
  uint64_t min_frequency = 2;
  int threads = 0;
  std::string format = "auto";
  bool blank_lines = false;
  std::string text_field = "text";
  std::string tokenizer;
  bool overwrite = false;
  std::string text;
  bool text_given = false;  // --text, even empty
  bool text_field_given = false;
  std::string input_file;
  bool json = false;
  bool recognize_special = false;
  std::vector<uint32_t> ids;
};

std::string read_input(const TokenizerArgs& a) {
  if (a.text_given) return a.text;
  if (!a.input_file.empty() && a.input_file != "-") {
    // A folder opens as a stream and fails only while being read, which the library throws as an exception of
    // its own (an "internal error").
    if (std::error_code ec; std::filesystem::is_directory(a.input_file, ec))
      throw DataError(fmt::format("{}: is a folder; --input takes a file to encode", a.input_file));
    std::ifstream in(a.input_file, std::ios::binary);
    if (!in) throw DataError(fmt::format("{}: cannot open for reading", a.input_file));
    std::string text(std::istreambuf_iterator<char>(in), {});
    if (in.bad()) throw DataError(fmt::format("{}: cannot read it", a.input_file));
    return text;
  }
  return std::string(std::istreambuf_iterator<char>(std::cin), {});
}

int run_train(const TokenizerArgs& a) {
  // The output is checked before any work, as prepare-data's is: an existing file (the training text itself, once)
  // was replaced without a word, and a name that Tokenizer::load cannot read back was found only after training.
  const auto existing = a.overwrite ? data::ExistingOutput::Replace : data::ExistingOutput::Refuse;
  data::check_output_path(a.output, existing, "tokenizer train");
  data::sweep_dead_output_temporaries(a.output);
  if (std::filesystem::path(a.output).extension() != ".json")
    throw UsageError(
        fmt::format("{}: a tokenizer.json's name must end in .json (loading picks the format by it)", a.output));
  data::BpeTrainOptions o;
  o.vocab_size = a.vocab_size;
  o.special_tokens = a.specials;
  o.split_pattern = a.pattern;
  o.min_frequency = a.min_frequency;
  o.threads = a.threads;
  o.documents.format = data::parse_input_format(a.format);
  o.documents.split = a.blank_lines ? data::DocumentSplit::BlankLines : data::DocumentSplit::PerFile;
  o.documents.text_field = a.text_field;
  o.documents.text_field_given = a.text_field_given;
  const auto is_tokenizer_json = [](const std::string& file) {  // an earlier tokenizer, which this run replaces
    std::ifstream in(file, std::ios::binary);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    return j.is_object() && j.contains("model") && j["model"].is_object();
  };
  const auto files = data::expand_inputs(a.inputs, a.output, {is_tokenizer_json, "a tokenizer.json"});
  data::check_text_field_applies(files, o.documents);
  data::check_text_inputs_are_text(files, o.documents);
  const auto r = data::train_bpe(files, o);
  const auto check = data::Tokenizer::from_json_text(r.tokenizer_json, a.output);  // what we write must load back
  data::write_file_into_place(a.output, r.tokenizer_json, existing,
                              "a tokenizer is not replaced unless asked (tokenizer train --overwrite)");
  log::info("tokenizer train: {} files, {:.1f} MB, {} distinct words -> vocab {} ({} merges) in {:.1f}s; wrote {} ({})",
            files.size(), static_cast<double>(r.input_bytes) / 1e6, r.unique_words, check.vocab_size(), r.merges, r.seconds,
            a.output, check.hash());
  return 0;
}

int run_encode(const TokenizerArgs& a) {
  const auto tok = data::Tokenizer::load(a.tokenizer);
  const std::string text = read_input(a);
  const auto ids =
      tok.encode(text, a.recognize_special ? data::SpecialTokenMode::Recognize : data::SpecialTokenMode::AsText);
  if (a.json) {
    nlohmann::json pieces = nlohmann::json::array();
    for (auto id : ids)
      pieces.push_back(
          nlohmann::json(std::string(tok.token_bytes(id))).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    std::cout
        << nlohmann::json{{"tokenizer", tok.name()}, {"ids", ids}, {"count", ids.size()}, {"bytes", text.size()}}.dump()
        << "\n";
  } else {
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
    std::cout << line << "\n";
    log::info("{} tokens for {} bytes ({:.2f} bytes/token) with {}", ids.size(), text.size(),
              ids.empty() ? 0.0 : static_cast<double>(text.size()) / static_cast<double>(ids.size()), tok.name());
  }
  return 0;
}

int run_decode(const TokenizerArgs& a) {
  const auto tok = data::Tokenizer::load(a.tokenizer);
  std::vector<data::TokenId> ids(a.ids.begin(), a.ids.end());
  if (ids.empty()) {
    // Decimal ids between spaces, newlines or commas (encode's output, a pasted list), each whole: stoul read
    // "9906,1917" as 9906, "1e3" as 1, "-1" and 2^32 + 1 wrapped, and printed other text with exit 0.
    std::string word;
    while (std::cin >> word) {
      for (size_t at = 0; at <= word.size();) {
        const size_t end = std::min(word.find(',', at), word.size());
        const std::string_view id(word.data() + at, end - at);
        at = end + 1;
        if (id.empty()) continue;
        uint64_t v = 0;
        const auto [p, ec] = std::from_chars(id.data(), id.data() + id.size(), v);
        if (ec != std::errc() || p != id.data() + id.size() || v > std::numeric_limits<data::TokenId>::max())
          throw UsageError(fmt::format(
              "tokenizer decode: '{}' on stdin is not a token id (expected decimal ids from 0 to {}, separated by "
              "spaces or commas)",
              id, std::numeric_limits<data::TokenId>::max()));
        ids.push_back(static_cast<data::TokenId>(v));
      }
    }
  }
  std::cout << tok.decode(ids);
  std::cout.flush();
  return 0;
}

int run_info(const TokenizerArgs& a) {
  const auto tok = data::Tokenizer::load(a.tokenizer);
  nlohmann::json specials = nlohmann::json::object();
  for (const auto& s : tok.special_tokens()) specials[s.content] = s.id;
  auto opt = [](std::optional<data::TokenId> v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  std::cout << nlohmann::json{{"name", tok.name()},
                              {"path", tok.path()},
                              {"format", data::tokenizer_format_name(tok.format())},
                              {"hash", tok.hash()},
                              {"encoding_hash", tok.encoding_hash()},
                              {"vocab_size", tok.vocab_size()},
                              {"eot_id", opt(tok.eot_id())},
                              {"bot_id", opt(tok.bot_id())},
                              {"pad_id", opt(tok.pad_id())},
                              {"nfc", tok.normalizes_nfc()},
                              {"split_patterns", tok.split_patterns()},
                              {"special_tokens", specials}}
                   .dump(2)
            << "\n";
  return 0;
}

}  // namespace

Command add_tokenizer_command(CLI::App& parent) {
  auto args = std::make_shared<TokenizerArgs>();
  auto* app = parent.add_subcommand("tokenizer", "train a byte-level BPE tokenizer, or inspect one (encode, decode, info)");
  app->require_subcommand(1);

  auto* train = app->add_subcommand(
      "train", "train a byte-level BPE on text, JSONL, Parquet or Arrow files and write a tokenizer.json");
  train
      ->add_option("--input,-i", args->inputs,
                   "text or JSONL files (plain, .gz or .zst), Parquet or Arrow files, or folders of them")
      ->required();
  train->add_option("--output,-o", args->output, "tokenizer.json to write (an existing one only with --overwrite)")
      ->check(outside_checkpoints_check())
      ->capture_default_str();
  train->add_flag("--overwrite", args->overwrite, "replace an existing output (by a whole new file, once it is written)");
  train->add_option("--vocab-size", args->vocab_size, "vocabulary size: special tokens + 256 bytes + merges")
      ->capture_default_str()
      ->check(CLI::Range(size_t{260}, size_t{1} << 24));
  // Taken as written: CLI11 reads a value in brackets as a list ("[BOT]" became BOT, "[a,b]" two tokens), and
  // brackets are how special tokens are usually written.
  train
      ->add_option("--special", args->specials,
                   "a special token, taken as written (repeat the option for each); given ids 0, 1, ...")
      ->capture_default_str()
      ->allow_extra_args(false);
  train->add_option("--pattern", args->pattern, "pre-tokenizer split regex (PCRE2); default: Llama 3's")
      ->check(CLI::Validator(
          [](std::string& s) {
            return s.empty() ? std::string("expected a regex (leave --pattern out for Llama 3's)") : "";
          },
          ""));
  train->add_option("--min-frequency", args->min_frequency, "stop when the best pair is rarer")->capture_default_str();
  train
      ->add_option("--threads", args->threads,
                   "word-counting threads (0: every core this process may use; more than 1024 are cut to 1024)")
      ->capture_default_str()
      ->check(count_range(0, 65536));
  train->add_option("--format", args->format, "auto, text, jsonl, parquet or arrow")->capture_default_str();
  train->add_flag("--blank-line-documents", args->blank_lines, "text: a document per blank-line-separated block");
  train->add_option("--text-field", args->text_field, "JSONL: the field holding the text; Parquet, Arrow: the column")
      ->capture_default_str();

  auto* encode = app->add_subcommand("encode", "print the token ids of text (--text, --input FILE, or stdin)");
  encode->add_option("--tokenizer,-t", args->tokenizer, "*.tiktoken, tokenizer.json, or a folder")->required();
  auto* text_option = encode->add_option("--text", args->text, "the text to encode");
  // One source: --input given with --text used to be ignored without a word.
  encode->add_option("--input,-i", args->input_file, "file to encode ('-': stdin)")->excludes(text_option);
  encode->add_flag("--json", args->json, "print a JSON object with the ids");
  encode->add_flag("--special", args->recognize_special, "encode special-token text as the special token");

  auto* decode = app->add_subcommand("decode", "print the text of token ids (arguments, or whitespace-separated on stdin)");
  decode->add_option("--tokenizer,-t", args->tokenizer, "*.tiktoken, tokenizer.json, or a folder")->required();
  decode->add_option("ids", args->ids, "token ids");

  auto* info = app->add_subcommand("info", "print a tokenizer's vocabulary size, special tokens, pattern and hash");
  info->add_option("--tokenizer,-t", args->tokenizer, "*.tiktoken, tokenizer.json, or a folder")->required();

  Command c;
  c.app = app;
  c.launch = Launch::Offline;
  c.run = [args, train, encode, decode, info, text_option](Runtime*) {
    args->text_given = text_option->count() > 0;
    args->text_field_given = train->count("--text-field") > 0;
    if (train->parsed()) return run_train(*args);
    if (encode->parsed()) return run_encode(*args);
    if (decode->parsed()) return run_decode(*args);
    if (info->parsed()) return run_info(*args);
    throw UsageError("tokenizer: expected train, encode, decode or info");
  };
  return c;
}

}  // namespace shardtrain::cli
