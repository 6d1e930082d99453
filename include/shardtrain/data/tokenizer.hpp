// BPE tokenizers: tiktoken rank files (r50k_base/GPT-2, p50k_base, cl100k_base, o200k_base), Hugging Face
// tokenizer.json files of the byte-level BPE family (GPT-2, Llama 3, Qwen style) and of the SentencePiece-style
// BPE with byte fallback (Llama 2, Mistral), and GPT-2's original encoder.json + vocab.bpe. Text is split by the tokenizer's regex (PCRE2, UTF + UCP,
// JIT) and each piece is merged by rank. encode/decode round-trip exactly on any bytes, invalid UTF-8
// included: invalid bytes never match the split regex and become their own byte-level pieces.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace shardtrain::data {

using TokenId = uint32_t;

enum class TokenizerFormat { Tiktoken, HuggingFaceJson, Gpt2Encoder };
const char* tokenizer_format_name(TokenizerFormat f);

// How text that spells a special token ("<|endoftext|>") is encoded. AsText matches tiktoken's
// encode_ordinary and is what dataset preparation uses: a document cannot inject control tokens. An added token
// that is not special (tokenizer.json's "special": false, what tokenizer.add_tokens writes) is its id in both.
enum class SpecialTokenMode { AsText, Recognize };

// Where a text starts: at a document's beginning (a tokenizer that adds a leading space adds it there), or as the
// rest of a document cut at a place Tokenizer::last_safe_cut found (nothing added: the pieces' tokens, one after
// the other, are the whole document's).
enum class TextStart { Document, Continuation };

struct SpecialToken {
  std::string content;
  TokenId id = 0;
};

namespace detail {
struct TokenizerModel;
}

class Tokenizer {
 public:
  // path: a *.tiktoken rank file (the stem picks the split pattern and special tokens: r50k_base,
  // p50k_base, cl100k_base, o200k_base), a tokenizer.json, or a folder holding tokenizer.json or
  // encoder.json + vocab.bpe. Throws DataError naming the file and field on anything unsupported.
  static Tokenizer load(const std::string& path);
  // Builds a tokenizer from an already-parsed tokenizer.json text (what the trainer writes).
  static Tokenizer from_json_text(const std::string& json_text, const std::string& origin);

  std::vector<TokenId> encode(std::string_view text, SpecialTokenMode mode = SpecialTokenMode::AsText) const;
  std::string decode(std::span<const TokenId> ids) const;  // throws DataError on an unknown id

  size_t vocab_size() const;                                      // largest id + 1 (special tokens included)
  std::string_view token_bytes(TokenId id) const;                 // empty for an unused id
  std::optional<TokenId> token_id(std::string_view bytes) const;  // a special token's content or a token's bytes
  const std::vector<SpecialToken>& special_tokens() const;
  // Well-known roles, found by name: end of text (<|endoftext|>, <|end_of_text|>, [EOT], </s>, <|im_end|>...),
  // beginning of text (<|begin_of_text|>, [BOT], <s>, <|startoftext|>) and padding ([PAD], <pad>, <|pad|>).
  std::optional<TokenId> eot_id() const;
  std::optional<TokenId> bot_id() const;
  std::optional<TokenId> pad_id() const;

  // The last place in `text` where it may be cut so that encoding the part before it and then the rest
  // (TextStart::Continuation) gives the tokens of encoding it whole, with SpecialTokenMode::AsText; 0 where there
  // is none. Such a place lies before a space or after a newline that has an ASCII letter after it and a printable
  // ASCII character (not a space) before it: the split patterns of GPT-2, cl100k, o200k, Llama 3 and their kind
  // never join the text on both sides of one, and a Metaspace or word-exact byte-fallback model cuts its words
  // there. A tokenizer whose pieces do join there (a custom pattern such as `\s?\p{L}+`, found by encoding a few
  // probes when it is loaded), a byte-fallback model that merges across spaces, one with no split pattern, or one
  // with added tokens that are not special has no such place: it returns 0.
  size_t last_safe_cut(std::string_view text) const;
  // Whether last_safe_cut can give a place at all (false: it returns 0 for any text).
  bool has_safe_cuts() const { return cuts_are_exact_; }

  const std::string& name() const;  // "r50k_base", "llama3/tokenizer.json", ...
  const std::string& path() const;
  const std::string& hash() const;  // "fnv1a64:<16 hex>" of the file contents: the identity datasets record
  // "fnv1a64:<16 hex>" of what encode and decode do, not of how the file spells it: the tokens and their ids, the
  // merges and their ranks, the split patterns, the special and added tokens with their flags, the normalization. The
  // same tokenizer.json re-saved by transformers (other indentation and key order, merges as pairs) keeps it; any
  // change to an id does not. Datasets and checkpoints record it beside hash(); same_tokenizer() takes either.
  const std::string& encoding_hash() const;
  TokenizerFormat format() const;
  const std::vector<std::string>& split_patterns() const;  // regexes applied in order
  bool normalizes_nfc() const;
  // SentencePiece-style BPE (tokenizer.json with model.byte_fallback: Llama 2, Mistral): characters merge, bytes
  // only for characters the vocabulary lacks (<0xNN> tokens), spaces are U+2581, and the text is one piece.
  bool byte_fallback() const;

  const detail::TokenizerModel& model() const { return *model_; }

 private:
  explicit Tokenizer(std::shared_ptr<const detail::TokenizerModel> m);
  std::shared_ptr<const detail::TokenizerModel> model_;
  bool cuts_are_exact_ = false;  // last_safe_cut's places keep the tokens (checked on probes at load)
  std::string encoding_hash_;
  friend class Encoder;
};

// Per-thread encoding state: the regex match data and the piece -> ids cache that makes repeated words
// free. Not thread-safe; make one per worker thread. The Tokenizer must outlive it.
class Encoder {
 public:
  explicit Encoder(const Tokenizer& tokenizer, size_t cache_entries = 1 << 18);
  ~Encoder();
  Encoder(Encoder&&) noexcept;
  Encoder& operator=(Encoder&&) = delete;
  Encoder(const Encoder&) = delete;
  Encoder& operator=(const Encoder&) = delete;

  std::vector<TokenId> encode(std::string_view text, SpecialTokenMode mode = SpecialTokenMode::AsText,
                              TextStart start = TextStart::Document);
  void encode_append(std::string_view text, std::vector<TokenId>& out, SpecialTokenMode mode = SpecialTokenMode::AsText,
                     TextStart start = TextStart::Document);
  size_t cache_size() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Whether two recorded identities name one tokenizer: the same file (hash), or files that encode alike (encoding
// hash; empty where a record predates it, which then compares by file alone).
bool same_tokenizer(std::string_view hash_a, std::string_view encoding_a, std::string_view hash_b,
                    std::string_view encoding_b);

// Well-known split patterns (tiktoken's and Llama 3's), for the trainer and the docs.
std::string_view gpt2_split_pattern();
std::string_view cl100k_split_pattern();
std::string_view o200k_split_pattern();
std::string_view llama3_split_pattern();

}  // namespace shardtrain::data
