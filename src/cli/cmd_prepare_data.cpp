// `shardtrain prepare-data`: tokenize text, JSONL, Parquet or Arrow files with all cores into one HDF5 dataset (docs/data.md).
#include <fmt/format.h>

#include <memory>

#include "command.hpp"
#include "shardtrain/data/dataset.hpp"
#include "shardtrain/data/prepare.hpp"
#include "shardtrain/runtime/log.hpp"

namespace shardtrain::cli {

Command add_prepare_data_command(CLI::App& parent) {
  auto o = std::make_shared<data::PrepareOptions>();
  auto format = std::make_shared<std::string>("auto");
  auto blank_lines = std::make_shared<bool>(false);
  auto overwrite = std::make_shared<bool>(false);
  auto* app =
      parent.add_subcommand("prepare-data", "tokenize text, JSONL, Parquet or Arrow files into an HDF5 token dataset");
  app->add_option("--tokenizer,-t", o->tokenizer, "*.tiktoken, tokenizer.json, or a folder with one")->required();
  app->add_option(
         "--input,-i", o->inputs,
         "text or JSONL files (plain, .gz or .zst), Parquet or Arrow files, or folders of them (sorted; a save_to_disk folder: its files)")
      ->required();
  app->add_option("--output,-o", o->output,
                  "the dataset to write, e.g. data/sotu.h5 (an existing one only with --overwrite)")
      ->required()
      ->check(outside_checkpoints_check());
  app->add_flag("--overwrite", *overwrite, "replace an existing output (by a whole new file, once it is written)");
  app->add_option(
         "--format", *format,
         "auto (*.jsonl/*.json[.gz|.zst] are JSONL, *.parquet Parquet, *.arrow/*.feather Arrow), text, jsonl, parquet or arrow")
      ->capture_default_str();
  app->add_flag("--blank-line-documents", *blank_lines,
                "text: one document per blank-line-separated block (default: per file)");
  app->add_option("--text-field", o->documents.text_field, "JSONL: the field holding the text; Parquet, Arrow: the column")
      ->capture_default_str();
  app->add_option(
      "--token-field", o->documents.token_field,
      "inputs already tokenized: the JSONL field, or Arrow or Parquet column, of each document's token ids (e.g. input_ids), "
      "imported as they are; the tokenizer must be the one that made them");
  app->add_option("--validation-fraction", o->validation_fraction, "share of documents held out for validation")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.999));
  auto split_by = std::make_shared<std::string>("shuffle");
  app->add_option("--split-by", *split_by,
                  "how validation documents are picked: shuffle (exactly the fraction, by position: prepared again from a "
                  "corpus that grew, documents change sides) or content (by a hash of each document's tokens: the same "
                  "document stays on its side whatever else the corpus holds, duplicates never straddle the split)")
      ->capture_default_str()
      ->check(CLI::IsMember({"shuffle", "content"}));
  app->add_option("--seed", o->seed, "seed of the train/validation choice")
      ->capture_default_str()
      ->check(unsigned_check());  // "-1" went into the unsigned seed as 2^64 - 1 without a word
  app->add_option("--threads", o->threads,
                  "tokenizer threads (0: every core this process may use, e.g. Slurm's --cpus-per-task; more than 1024 "
                  "are cut to 1024)")
      ->capture_default_str()
      ->check(count_range(0, 65536));
  auto batch_mb = std::make_shared<size_t>(o->batch_bytes >> 20);
  app->add_option("--batch-mb", *batch_mb, "MB of text read and tokenized at a time (memory does not grow with the corpus)")
      ->capture_default_str()
      ->check(count_range());

  Command c;
  c.app = app;
  c.launch = Launch::Offline;
  c.run = [app, o, format, blank_lines, overwrite, batch_mb, split_by](Runtime*) {
    o->batch_bytes = *batch_mb << 20;
    o->split_by = data::parse_split_by(*split_by);
    o->existing = *overwrite ? data::ExistingOutput::Replace : data::ExistingOutput::Refuse;
    o->documents.format = data::parse_input_format(*format);
    o->documents.text_field_given = app->count("--text-field") > 0;
    o->documents.split = *blank_lines ? data::DocumentSplit::BlankLines : data::DocumentSplit::PerFile;
    const auto s = data::prepare_dataset(*o);
    if (!o->documents.token_field.empty()) {  // imported, not tokenized: no text to count
      log::info(
          "prepare-data: {} files, {} documents ({} train, {} validation by {}{}), {} tokens imported from \"{}\" on {} "
          "thread{}, {:.1f}s in all; wrote {}",
          s.files, s.documents, s.train_documents, s.validation_documents, data::split_by_name(o->split_by),
          s.empty_documents_skipped ? fmt::format(", {} empty skipped", s.empty_documents_skipped) : std::string(), s.tokens,
          o->documents.token_field, s.threads, s.threads == 1 ? "" : "s", s.seconds, o->output);
      return 0;
    }
    log::info(
        "prepare-data: {} files, {} documents ({} train, {} validation by {}{}), {} tokens from {:.1f} MB; "
        "tokenized at {:.1f} MB/s on {} thread{}, {:.1f}s in all; wrote {}",
        s.files, s.documents, s.train_documents, s.validation_documents, data::split_by_name(o->split_by),
        s.empty_documents_skipped ? fmt::format(", {} empty skipped", s.empty_documents_skipped) : std::string(), s.tokens,
        static_cast<double>(s.bytes) / 1e6, s.mb_per_second(), s.threads, s.threads == 1 ? "" : "s", s.seconds, o->output);
    return 0;
  };
  return c;
}

}  // namespace shardtrain::cli
