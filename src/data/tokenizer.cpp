// Tokenizer (load, decode, metadata) and Encoder (split by regex, merge each piece, cache the result).
#include "shardtrain/data/tokenizer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <unordered_map>
#include <utility>
#include <vector>

#include "shardtrain/runtime/error.hpp"
#include "tokenizer_model.hpp"
#include "utf8.hpp"

namespace shardtrain::data {

const char* tokenizer_format_name(TokenizerFormat f) {
  switch (f) {
    case TokenizerFormat::Tiktoken: return "tiktoken";
    case TokenizerFormat::HuggingFaceJson: return "tokenizer.json";
    case TokenizerFormat::Gpt2Encoder: return "gpt2-encoder";
  }
  return "?";
}

// The split patterns as published with the encodings (tiktoken, Llama 3). Possessive quantifiers and
// `$` (end of text only: PCRE2_DOLLAR_ENDONLY) keep PCRE2 equivalent to the Rust engines.
std::string_view gpt2_split_pattern() {
  return R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
}
std::string_view cl100k_split_pattern() {
  return R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s)";
}
std::string_view o200k_split_pattern() {
  return R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
         R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
         R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
}
std::string_view llama3_split_pattern() {
  return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
}

Tokenizer Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(fs::path(path) / "tokenizer.json")) return load((fs::path(path) / "tokenizer.json").string());
    if (fs::exists(fs::path(path) / "encoder.json") && fs::exists(fs::path(path) / "vocab.bpe"))
      return Tokenizer(detail::load_gpt2_encoder(path));
    // A Hugging Face folder of GPT-2's files (shardtrain's export of a model trained with encoder.json + vocab.bpe).
    if (fs::exists(fs::path(path) / "vocab.json") && fs::exists(fs::path(path) / "merges.txt"))
      return Tokenizer(detail::load_gpt2_encoder(path, "vocab.json", "merges.txt"));
    throw DataError(fmt::format(
        "{}: folder has neither tokenizer.json nor GPT-2's encoder.json + vocab.bpe (or vocab.json + merges.txt)", path));
  }
  if (!fs::exists(path, ec)) throw DataError(fmt::format("{}: tokenizer file not found", path));
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".tiktoken") return Tokenizer(detail::load_tiktoken(path));
  if (ext == ".json") return Tokenizer(detail::load_hf_json(detail::read_file(path), path));
  throw DataError(
      fmt::format("{}: unknown tokenizer format (expected *.tiktoken, tokenizer.json, or a folder with "
                  "encoder.json + vocab.bpe)",
                  path));
}

Tokenizer Tokenizer::from_json_text(const std::string& json_text, const std::string& origin) {
  return Tokenizer(detail::load_hf_json(json_text, origin));
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, SpecialTokenMode mode) const {
  Encoder enc(*this, 1 << 12);
  return enc.encode(text, mode);
}

std::string Tokenizer::decode(std::span<const TokenId> ids) const {
  std::string out;
  for (TokenId id : ids) {
    if (id >= model_->id_to_bytes.size())
      throw DataError(fmt::format("token id {} is not in the vocabulary of {} (ids 0 to {})", id, model_->name,
                                  model_->id_to_bytes.size() - 1));
    if (model_->id_to_bytes[id].empty())
      throw DataError(fmt::format("token id {} is not in the vocabulary of {}: a gap in its ids 0 to {}, no token has it",
                                  id, model_->name, model_->id_to_bytes.size() - 1));
    out += model_->id_to_bytes[id];
  }
  if (model_->prepend_space && !out.empty() && out.front() == ' ') out.erase(0, 1);  // the Prepend's space
  return out;
}

size_t Tokenizer::vocab_size() const { return model_->id_to_bytes.size(); }
std::string_view Tokenizer::token_bytes(TokenId id) const {
  return id < model_->id_to_bytes.size() ? std::string_view(model_->id_to_bytes[id]) : std::string_view();
}
std::optional<TokenId> Tokenizer::token_id(std::string_view bytes) const {
  auto s = model_->special_ids.find(std::string(bytes));
  if (s != model_->special_ids.end()) return s->second;
  auto t = model_->bytes_to_id.find(std::string(bytes));
  if (t != model_->bytes_to_id.end()) return t->second;
  return std::nullopt;
}
const std::vector<SpecialToken>& Tokenizer::special_tokens() const { return model_->specials; }

namespace {
std::optional<TokenId> first_special(const detail::TokenizerModel& m, std::initializer_list<std::string_view> names) {
  for (auto n : names) {
    auto it = m.special_ids.find(std::string(n));
    if (it != m.special_ids.end()) return it->second;
  }
  return std::nullopt;
}
}  // namespace

std::optional<TokenId> Tokenizer::eot_id() const {
  return first_special(*model_, {"[EOT]", "<|endoftext|>", "<|end_of_text|>", "</s>", "<|eot_id|>", "<eos>", "<|im_end|>"});
}
std::optional<TokenId> Tokenizer::bot_id() const {
  return first_special(*model_, {"[BOT]", "<|begin_of_text|>", "<|startoftext|>", "<s>", "<bos>"});
}
std::optional<TokenId> Tokenizer::pad_id() const {
  return first_special(*model_, {"[PAD]", "<pad>", "<|pad|>", "<|padding|>"});
}

namespace {

bool ascii_graphic(char c) { return c > ' ' && c < 0x7f; }
bool ascii_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// A place last_safe_cut may give: before " L" or after "\nL", L an ASCII letter, with a printable ASCII character
// before (a newline only for regex splits: a byte-fallback model's words begin at spaces alone). ASCII on both
// sides keeps NFC from composing across the cut and keeps it off a UTF-8 sequence.
bool is_cut_place(std::string_view text, size_t at, bool newlines) {
  if (at == 0 || at >= text.size()) return false;
  if (text[at] == ' ') return at + 1 < text.size() && ascii_letter(text[at + 1]) && ascii_graphic(text[at - 1]);
  return newlines && at >= 2 && text[at - 1] == '\n' && ascii_letter(text[at]) && ascii_graphic(text[at - 2]);
}

}  // namespace

namespace {

// What encode and decode read from a model, each part length-prefixed and in a fixed order (the merge table sorted),
// hashed: equal for two files that spell one tokenizer differently.
std::string encoding_hash_of(const detail::TokenizerModel& m) {
  std::string out;
  const auto num = [&out](uint64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); };
  const auto str = [&](std::string_view s) {
    num(s.size());
    out.append(s);
  };
  str("shardtrain-tokenizer-encoding-1");
  num(m.id_to_bytes.size());
  for (const auto& t : m.id_to_bytes) str(t);
  std::vector<std::pair<std::string_view, TokenId>> regular(m.bytes_to_id.begin(), m.bytes_to_id.end());
  std::sort(regular.begin(), regular.end());
  num(regular.size());
  for (const auto& [bytes, id] : regular) {
    str(bytes);
    num(id);
  }
  for (const TokenId id : m.byte_ids) num(id);
  std::vector<std::array<uint64_t, 3>> merges;
  merges.reserve(m.merges.size());
  for (const auto& [key, merge] : m.merges) merges.push_back({key, merge.rank, merge.result});
  std::sort(merges.begin(), merges.end());
  num(merges.size());
  for (const auto& entry : merges)
    for (const uint64_t v : entry) num(v);
  for (const bool flag : {m.whole_piece_lookup, m.byte_fallback, m.prepend_space, m.prepend_first_segment_only,
                          m.prepend_unless_spaced, m.split_at_spaces, m.nfc, m.add_prefix_space})
    num(flag ? 1 : 0);
  num(m.split_patterns.size());
  for (const auto& p : m.split_patterns) str(p);
  num(m.specials.size());
  for (const auto& s : m.specials) {
    str(s.content);
    num(s.id);
  }
  num(m.added.size());
  for (const auto& a : m.added) {
    str(a.content);
    num(a.id);
    num((a.special ? 1u : 0u) | (a.lstrip ? 2u : 0u) | (a.rstrip ? 4u : 0u) | (a.normalized ? 8u : 0u));
  }
  return detail::fnv1a64_hex(out);
}

}  // namespace

bool same_tokenizer(std::string_view hash_a, std::string_view encoding_a, std::string_view hash_b,
                    std::string_view encoding_b) {
  if (hash_a == hash_b) return true;
  return !encoding_a.empty() && encoding_a == encoding_b;
}

Tokenizer::Tokenizer(std::shared_ptr<const detail::TokenizerModel> m)
    : model_(std::move(m)), encoding_hash_(encoding_hash_of(*model_)) {
  const auto& model = *model_;
  // A byte-fallback model that merges across spaces, or one without a split pattern, makes the text one piece.
  if (model.byte_fallback ? !(model.split_at_spaces || model.words_are_exact) : model.splits.empty()) return;
  // Added tokens that are not special are matched in the text first: one may span a place, take the whitespace
  // there (lstrip, rstrip), or leave a segment that Llama 2's normalizer gives a space of its own after it.
  if (model.added_always) return;
  // The places hold for the well-known patterns; a custom one is held to them on short probes (letters, digits,
  // punctuation, contractions and whitespace on either side of each kind of place), and has none when one fails.
  cuts_are_exact_ = true;
  Encoder encoder(*this, 256);
  for (const std::string_view before : {"", "ab", "a ", " ", "\n", "1"})
    for (const char left : std::string_view("a.1'/)-:Z"))
      for (const std::string_view cut : {" ", "\n"})
        for (const char right : std::string_view("Ast"))
          for (const std::string_view after : {"b", "'s", " ", "\n", "b\n\nc"}) {
            std::string probe(before);
            probe.push_back(left);
            probe.append(cut);
            probe.push_back(right);
            probe.append(after);
            const auto whole = encoder.encode(probe);
            for (size_t at = 1; at < probe.size(); ++at) {
              if (!is_cut_place(probe, at, !model.byte_fallback)) continue;
              auto parts = encoder.encode(std::string_view(probe).substr(0, at));
              encoder.encode_append(std::string_view(probe).substr(at), parts, SpecialTokenMode::AsText,
                                    TextStart::Continuation);
              if (parts != whole) {
                cuts_are_exact_ = false;
                return;
              }
            }
          }
}

size_t Tokenizer::last_safe_cut(std::string_view text) const {
  if (!cuts_are_exact_) return 0;
  for (size_t at = text.size(); at-- > 1;)
    if (is_cut_place(text, at, !model_->byte_fallback)) return at;
  return 0;
}

bool Tokenizer::byte_fallback() const { return model_->byte_fallback; }
const std::string& Tokenizer::name() const { return model_->name; }
const std::string& Tokenizer::path() const { return model_->path; }
const std::string& Tokenizer::hash() const { return model_->hash; }
const std::string& Tokenizer::encoding_hash() const { return encoding_hash_; }
TokenizerFormat Tokenizer::format() const { return model_->format; }
const std::vector<std::string>& Tokenizer::split_patterns() const { return model_->split_patterns; }
bool Tokenizer::normalizes_nfc() const { return model_->nfc; }

// ---------------------------------------------------------------------------------------------------

namespace {
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// Rust's char::is_whitespace (Unicode White_Space), what an added token's lstrip and rstrip take.
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Where the whitespace that ends text[..at) begins (at when there is none).
size_t white_space_before(std::string_view text, size_t at) {
  while (at > 0) {
    size_t len = 0;
    char32_t cp = 0;
    for (size_t k = 1; k <= std::min<size_t>(4, at) && len == 0; ++k)
      if (detail::utf8_decode(text, at - k, cp) == k) len = k;
    if (len == 0 || !is_white_space(cp)) break;
    at -= len;
  }
  return at;
}

// Where the whitespace that starts text[at..) ends.
size_t white_space_after(std::string_view text, size_t at) {
  char32_t cp = 0;
  while (at < text.size()) {
    const size_t len = detail::utf8_decode(text, at, cp);
    if (len == 0 || !is_white_space(cp)) break;
    at += len;
  }
  return at;
}

// The two passes of added-token matching: the tokens matched on the raw text, then those with normalized true in
// the text between them.
enum class AddedPass { Raw, Normalized, Done };

}  // namespace

struct Encoder::State {
  const detail::TokenizerModel* model;
  std::shared_ptr<const detail::TokenizerModel> keep;
  std::vector<pcre2_match_data*> match_data;
  pcre2_match_context* match_context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  size_t cache_entries;
  std::vector<TokenId> symbols;  // a byte-fallback model's initial symbols
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>> cache;  // piece -> arena span
  std::vector<TokenId> arena;

  ~State() {
    for (auto* md : match_data) pcre2_match_data_free(md);
    if (match_context) pcre2_match_context_free(match_context);
    if (jit_stack) pcre2_jit_stack_free(jit_stack);
  }

  // Appends the ids of `key` from the cache, or merges them with `merge(out)` and caches them.
  template <typename Merge>
  void cached(std::string_view key, std::vector<TokenId>& out, Merge merge) {
    auto it = cache.find(key);
    if (it != cache.end()) {
      out.insert(out.end(), arena.begin() + it->second.first, arena.begin() + it->second.first + it->second.second);
      return;
    }
    const size_t before = out.size();
    merge(out);
    if (cache.size() >= cache_entries || arena.size() > (size_t{1} << 30)) {
      cache.clear();
      arena.clear();
    }
    const auto offset = static_cast<uint32_t>(arena.size());
    arena.insert(arena.end(), out.begin() + static_cast<ptrdiff_t>(before), out.end());
    cache.emplace(std::string(key), std::make_pair(offset, static_cast<uint32_t>(out.size() - before)));
  }

  void encode_piece(std::string_view piece, std::vector<TokenId>& out) {
    if (piece.size() == 1) {
      out.push_back(model->byte_ids[static_cast<unsigned char>(piece[0])]);
      return;
    }
    cached(piece, out, [&](std::vector<TokenId>& o) { detail::bpe_encode_piece(*model, piece, o); });
  }

  // A byte-fallback model's word: its characters (or their bytes) merged, through the same cache.
  void encode_word(std::string_view word, std::vector<TokenId>& out) {
    cached(word, out, [&](std::vector<TokenId>& o) {
      symbols.clear();
      detail::byte_fallback_symbols(*model, word, symbols);
      detail::bpe_merge(*model, std::move(symbols), o);
    });
  }

  // Splits `text` with regex `stage` (matches and the gaps between them are both pieces), recursing
  // into later stages; the last stage's pieces are merged.
  void split(size_t stage, std::string_view text, std::vector<TokenId>& out) {
    if (stage == model->splits.size()) {
      encode_piece(text, out);
      return;
    }
    pcre2_code* code = model->splits[stage]->code();
    pcre2_match_data* md = match_data[stage];
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    const size_t n = text.size();
    size_t gap = 0, pos = 0;
    while (pos < n) {
      const int rc = pcre2_match(code, subject, n, pos, 0, md, match_context);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        std::array<PCRE2_UCHAR, 256> msg{};
        pcre2_get_error_message(rc, msg.data(), msg.size());
        throw DataError(fmt::format("{}: split regex failed: {}", model->path, reinterpret_cast<const char*>(msg.data())));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t start = ov[0], end = ov[1];
      if (end == start) {  // an empty match: step over one character and keep searching
        char32_t cp = 0;
        pos = start + std::max<size_t>(1, start < n ? detail::utf8_decode(text, start, cp) : 1);
        continue;
      }
      if (start > gap) split(stage + 1, text.substr(gap, start - gap), out);
      split(stage + 1, text.substr(start, end - start), out);
      gap = pos = end;
    }
    if (gap < n) split(stage + 1, text.substr(gap), out);
  }

  // `first`: the segment starts the input (no special token before it). A continuation gets no leading space.
  void encode_text(std::string_view text, std::vector<TokenId>& out, bool first, TextStart start) {
    if (text.empty()) return;
    const bool continues = start == TextStart::Continuation;
    if (model->byte_fallback) {  // SentencePiece style: spaces (and U+2581 itself) are the vocabulary's U+2581
      const bool spaced = text.front() == ' ' || text.substr(0, 3) == "\u2581";
      const bool prepend = !continues && model->prepend_space && (first || !model->prepend_first_segment_only) &&
                           !(spaced && model->prepend_unless_spaced);
      std::string owned = prepend ? " " : "";
      owned.reserve(text.size() + 1);
      for (size_t i = 0; i < text.size();) {
        if (text.substr(i, 3) == "\u2581") {
          owned.push_back(' ');
          i += 3;
        } else {
          owned.push_back(text[i++]);
        }
      }
      if (model->split_at_spaces) {  // Metaspace's split: a piece begins at every space
        const std::string_view t(owned);
        size_t begin = 0;
        for (size_t i = 1; i <= t.size(); ++i) {
          if (i == t.size() || t[i] == ' ') {
            encode_word(t.substr(begin, i - begin), out);
            begin = i;
          }
        }
        return;
      }
      if (!model->words_are_exact) {
        symbols.clear();
        detail::byte_fallback_symbols(*model, owned, symbols);
        detail::bpe_merge(*model, std::move(symbols), out);
        return;
      }
      // Words: cut before every space that follows a non-space (no token spans such a cut), each cached.
      const std::string_view t(owned);
      size_t begin = 0;
      for (size_t i = 1; i <= t.size(); ++i) {
        if (i == t.size() || (t[i] == ' ' && t[i - 1] != ' ')) {
          encode_word(t.substr(begin, i - begin), out);
          begin = i;
        }
      }
      return;
    }
    std::string owned;
    if (model->nfc) {
      owned = detail::nfc_normalize(text);
      text = owned;
    }
    if (model->add_prefix_space && !continues && text.front() != ' ') {
      std::string prefixed(1, ' ');
      prefixed.append(text);  // text may view owned: build apart, then move
      owned = std::move(prefixed);
      text = owned;
    }
    split(0, text, out);
  }

  // Text with added tokens, split as the Hugging Face library's AddedVocabulary splits it: in each pass the leftmost
  // match, the longest of those starting there, then the next from its end. A special token found where specials
  // are text is passed over, its text left to the gap (and nothing inside it matched in this pass). lstrip takes
  // the whitespace before the match (back to the previous match), rstrip the whitespace after it. The gaps go to
  // the next pass, and from the last to encode_text as segments (`offset`: where `text` lies in the input).
  void encode_added(AddedPass pass, std::string_view text, size_t offset, bool specials, TextStart start,
                    std::vector<TokenId>& out) {
    if (pass == AddedPass::Done) {
      encode_text(text, out, offset == 0, offset == 0 ? start : TextStart::Document);
      return;
    }
    const bool normalized = pass == AddedPass::Normalized;
    const AddedPass next_pass = normalized ? AddedPass::Done : AddedPass::Normalized;
    const auto& added = model->added;
    std::vector<size_t>& at = next_match[normalized ? 1 : 0];  // each token's next occurrence, npos: none
    at.assign(added.size(), std::string_view::npos);
    for (size_t i = 0; i < added.size(); ++i)
      if (added[i].normalized == normalized) at[i] = text.find(added[i].content);
    size_t pos = 0, gap = 0;  // pos: where the search goes on; gap: where the text not yet taken begins
    while (true) {
      size_t best = std::string_view::npos, hit = 0;
      for (size_t i = 0; i < added.size(); ++i) {
        if (at[i] != std::string_view::npos && at[i] < pos) at[i] = text.find(added[i].content, pos);
        if (at[i] < best || (at[i] == best && added[i].content.size() > added[hit].content.size())) best = at[i], hit = i;
      }
      if (best == std::string_view::npos) break;
      const detail::AddedToken& token = added[hit];
      pos = best + token.content.size();
      if (token.special && !specials) continue;
      const size_t begin = token.lstrip ? std::max(white_space_before(text, best), gap) : best;
      if (gap < begin) encode_added(next_pass, text.substr(gap, begin - gap), offset + gap, specials, start, out);
      out.push_back(token.id);
      gap = token.rstrip ? white_space_after(text, pos) : pos;
    }
    if (gap < text.size()) encode_added(next_pass, text.substr(gap), offset + gap, specials, start, out);
  }

  std::array<std::vector<size_t>, 2> next_match;  // encode_added's positions, one per pass
};

Encoder::Encoder(const Tokenizer& tokenizer, size_t cache_entries) : state_(std::make_unique<State>()) {
  state_->model = tokenizer.model_.get();
  state_->keep = tokenizer.model_;
  state_->cache_entries = cache_entries;
  for (const auto& r : state_->model->splits) {
    state_->match_data.push_back(pcre2_match_data_create_from_pattern(r->code(), nullptr));
    if (!state_->match_data.back()) throw DataError("PCRE2: out of memory creating match data");
  }
  state_->match_context = pcre2_match_context_create(nullptr);
  state_->jit_stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
  if (state_->match_context && state_->jit_stack) pcre2_jit_stack_assign(state_->match_context, nullptr, state_->jit_stack);
}

Encoder::~Encoder() = default;
Encoder::Encoder(Encoder&&) noexcept = default;

std::vector<TokenId> Encoder::encode(std::string_view text, SpecialTokenMode mode, TextStart start) {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 8);
  encode_append(text, out, mode, start);
  return out;
}

void Encoder::encode_append(std::string_view text, std::vector<TokenId>& out, SpecialTokenMode mode, TextStart start) {
  const auto& model = *state_->model;
  const bool specials = mode == SpecialTokenMode::Recognize;
  if (model.added.empty() || (!specials && !model.added_always)) {
    state_->encode_text(text, out, true, start);
    return;
  }
  state_->encode_added(AddedPass::Raw, text, 0, specials, start, out);
}

size_t Encoder::cache_size() const { return state_->cache.size(); }

}  // namespace shardtrain::data
