// Internal representation shared by the tokenizer loaders, the encoder and the trainer: token bytes,
// the merge table keyed by (left id, right id), the compiled split regexes and the special tokens.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "shardtrain/data/tokenizer.hpp"

namespace shardtrain::data::detail {

// Owns a compiled PCRE2 pattern (UTF, UCP, invalid UTF-8 allowed in subjects, JIT-compiled).
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& origin);  // throws DataError naming origin
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  pcre2_code* code() const { return code_; }
  const std::string& pattern() const { return pattern_; }

 private:
  pcre2_code* code_ = nullptr;
  std::string pattern_;
};

struct Merge {
  uint32_t rank = 0;
  TokenId result = 0;
};

inline uint64_t pair_key(TokenId a, TokenId b) { return (static_cast<uint64_t>(a) << 32) | b; }

// A token matched in the text before it is split and merged (tokenizer.json's added_tokens[i]): a special one only
// where the caller recognizes special tokens (SpecialTokenMode::Recognize), any other always. lstrip and rstrip take
// the whitespace on that side into the match; normalized ones are matched after the others, in the text between
// their matches (the loader accepts them only where there is no normalizer, so that text is the same).
struct AddedToken {
  std::string content;
  TokenId id = 0;
  bool special = true;
  bool lstrip = false, rstrip = false, normalized = false;
};

struct TokenizerModel {
  std::string name, path, hash;
  TokenizerFormat format = TokenizerFormat::Tiktoken;
  std::vector<std::string> id_to_bytes;                  // regular and special tokens; "" = unused id
  std::unordered_map<std::string, TokenId> bytes_to_id;  // regular tokens only
  std::array<TokenId, 256> byte_ids{};                   // the token of each single byte
  std::unordered_map<uint64_t, Merge> merges;            // pair_key(left, right) -> rank, result
  bool whole_piece_lookup = false;  // a piece that is itself a token is emitted directly (tiktoken, ignore_merges)
  // SentencePiece-style BPE (Llama 2, Mistral's tokenizer.json: model.byte_fallback): the symbols are characters
  // (a token of the character when the vocabulary has one, else its UTF-8 bytes as the <0xNN> tokens, which
  // byte_ids then holds), spaces are stored as ' ' (the vocabulary's U+2581), and the text is one piece.
  bool byte_fallback = false;
  bool prepend_space = false;  // the normalizer's Prepend("\u2581"): encode adds one leading space, decode strips one
  // A Metaspace pre_tokenizer instead of the normalizer: its prepend_scheme "first" adds the space only to the text
  // before any special token (the segment at offset 0), and it adds none to a segment that starts with a space.
  bool prepend_first_segment_only = false;
  bool prepend_unless_spaced = false;
  bool split_at_spaces = false;  // Metaspace's split: every space starts a new piece ("a\u2581\u2581b": a, \u2581, \u2581b)
  // No token of the vocabulary holds a non-space byte followed by a space, so no merge can join the text on both
  // sides of such a boundary: the text may be cut there into words, each merged (and cached) alone, exactly.
  bool words_are_exact = false;
  bool nfc = false;
  bool add_prefix_space = false;
  std::vector<std::unique_ptr<Regex>> splits;  // applied in order: each stage splits the previous pieces
  std::vector<SpecialToken> specials;          // sorted by content length, longest first
  std::unordered_map<std::string, TokenId> special_ids;
  // Every added token, special or not (finish_model makes the specials of a file without added_tokens ones);
  // added_always: one of them is not special, so text is searched for them in every mode.
  std::vector<AddedToken> added;
  bool added_always = false;
  std::vector<std::string> split_patterns;
};

// GPT-2's reversible byte <-> printable code point mapping used by byte-level vocabularies.
const std::array<char32_t, 256>& byte_to_codepoint();
// Decodes a vocabulary string of mapped code points back to raw bytes; false if a code point is unmapped.
bool unmap_byte_level(std::string_view mapped, std::string& out);
std::string map_byte_level(std::string_view bytes);

std::string fnv1a64_hex(std::string_view data);
std::string read_file(const std::string& path);  // throws DataError naming the file

// Fills byte_ids and the (left, right) -> result merge table of a tiktoken-style model, where every
// split of a token into two tokens may merge, with the token's rank as its priority.
void derive_tiktoken_merges(TokenizerModel& m);
void finish_model(TokenizerModel& m);  // byte_ids check, specials sorting, added tokens' bytes; throws DataError

// Merges one piece (raw bytes) into ids appended to out.
void bpe_encode_piece(const TokenizerModel& m, std::string_view piece, std::vector<TokenId>& out);
// The same from initial symbols (a byte-fallback model's characters), merged in place and appended to out.
void bpe_merge(const TokenizerModel& m, std::vector<TokenId> symbols, std::vector<TokenId>& out);
// A byte-fallback model's initial symbols for text: each valid UTF-8 character's token, or its bytes'.
void byte_fallback_symbols(const TokenizerModel& m, std::string_view text, std::vector<TokenId>& symbols);

std::shared_ptr<TokenizerModel> load_tiktoken(const std::string& path);
std::shared_ptr<TokenizerModel> load_hf_json(const std::string& text, const std::string& path);
// GPT-2's files in `dir`: encoder.json + vocab.bpe as published, or vocab.json + merges.txt as a Hugging Face folder
// (and shardtrain's export) names the same two files.
std::shared_ptr<TokenizerModel> load_gpt2_encoder(const std::string& dir, const std::string& encoder = "encoder.json",
                                                  const std::string& merges = "vocab.bpe");

// NFC-normalizes the valid UTF-8 runs of text (invalid bytes are kept as they are).
std::string nfc_normalize(std::string_view text);

}  // namespace shardtrain::data::detail
