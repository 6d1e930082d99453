// Loaders: tiktoken rank files, Hugging Face tokenizer.json (byte-level BPE) and GPT-2's encoder.json +
// vocab.bpe. Each turns its file into a TokenizerModel; anything outside the byte-level BPE family is a
// DataError that names the file and the field.
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <limits>
#include <sstream>
#include <type_traits>
#include <unordered_map>

#include "shardtrain/runtime/error.hpp"
#include "tokenizer_model.hpp"

namespace shardtrain::data::detail {
namespace {

using nlohmann::json;

// Token ids a file may give: below the largest vocabulary shardtrain trains (2^24). A larger one would size the id
// table by itself (an id of 2000000000 ended in std::bad_alloc), and one past 2^32 would wrap to another id.
constexpr uint64_t kTokenIdLimit = uint64_t{1} << 24;

// "an object", "a string": what a JSON value is, for the messages.
std::string kind_of(const json& v) {
  const std::string t = v.type_name();
  return (std::string_view("aeiou").find(t[0]) != std::string_view::npos ? "an " : "a ") + t;
}

// The id `v` of `what` ("vocab entry 'a'"), or a DataError naming it.
TokenId token_id(const json& v, const std::string& where, const std::string& what) {
  if (!v.is_number_unsigned()) throw DataError(fmt::format("{}: {} has no integer id", where, what));
  const uint64_t id = v.get<uint64_t>();
  if (id >= kTokenIdLimit)
    throw DataError(fmt::format("{}: {} has id {}, out of range (ids must be below {})", where, what, id, kTokenIdLimit));
  return static_cast<TokenId>(id);
}

// obj[key] when it is there and not null, else `fallback`; one of another type is a DataError naming the field
// (`name`, e.g. "model.byte_fallback") and what it holds, where the JSON library's own message names neither.
template <typename T>
T typed_field(const json& obj, const char* key, T fallback, const std::string& path, const std::string& name) {
  if (!obj.is_object() || !obj.contains(key) || obj[key].is_null()) return fallback;
  const json& v = obj[key];
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean())
      throw DataError(fmt::format("{}: field '{}' should be true or false, not {}", path, name, kind_of(v)));
  } else {
    if (!v.is_string()) throw DataError(fmt::format("{}: field '{}' should be a string, not {}", path, name, kind_of(v)));
  }
  return v.get<T>();
}

// A section that is an object or null (absent); anything else is a DataError naming it.
const json& object_or_null(const json& v, const std::string& path, const std::string& name) {
  if (!v.is_null() && !v.is_object())
    throw DataError(fmt::format("{}: field '{}' should be an object or null, not {}", path, name, kind_of(v)));
  return v;
}

// added_tokens: [{"id": N, "content": "...", "special": true, "lstrip": false, "rstrip": false, "normalized": false,
// "single_word": false}]. A special one is matched in the text only where special tokens are recognized, any other
// always (what tokenizer.add_tokens writes). An empty content would match everywhere without advancing (encode
// --special never ended), and a content given twice leaves an id that no text produces, so both are refused,
// naming the entry; so is single_word, which shardtrain does not implement.
void load_added_tokens(TokenizerModel& m, const json& j, const std::string& path) {
  if (!j.contains("added_tokens") || j["added_tokens"].is_null()) return;
  const json& added = j["added_tokens"];
  if (!added.is_array())
    throw DataError(fmt::format("{}: field 'added_tokens' should be an array, not {}", path, kind_of(added)));
  std::unordered_map<std::string, size_t> seen;
  for (size_t i = 0; i < added.size(); ++i) {
    const json& t = added[i];
    const std::string name = fmt::format("added_tokens[{}]", i);
    if (!t.is_object()) throw DataError(fmt::format("{}: field '{}' should be an object, not {}", path, name, kind_of(t)));
    if (!t.contains("content")) throw DataError(fmt::format("{}: field '{}.content' is missing", path, name));
    AddedToken a;
    a.content = typed_field(t, "content", std::string(), path, name + ".content");
    if (a.content.empty())
      throw DataError(fmt::format("{}: field '{}.content' is empty (a special token needs text)", path, name));
    a.special = typed_field(t, "special", true, path, name + ".special");
    a.lstrip = typed_field(t, "lstrip", false, path, name + ".lstrip");
    a.rstrip = typed_field(t, "rstrip", false, path, name + ".rstrip");
    a.normalized = typed_field(t, "normalized", false, path, name + ".normalized");
    if (typed_field(t, "single_word", false, path, name + ".single_word"))
      throw DataError(
          fmt::format("{}: {} ('{}') has single_word true, which is not supported (expected false; "
                      "special, lstrip, rstrip and normalized are)",
                      path, name, a.content));
    a.id = token_id(t.contains("id") ? t["id"] : json(), path, name);
    if (const auto [it, fresh] = seen.emplace(a.content, i); !fresh)
      throw DataError(fmt::format("{}: {} has the content '{}' of added_tokens[{}] (each special token once)", path, name,
                                  a.content, it->second));
    if (a.special) m.specials.push_back({a.content, a.id});
    m.added.push_back(std::move(a));
  }
}

// An added token with normalized true is matched in the normalized text (its content normalized too): with a
// normalizer that is not the text shardtrain searches, so such a file is refused, naming the entry.
void refuse_normalized_added_tokens(const TokenizerModel& m, std::string_view normalizer, const std::string& path) {
  for (size_t i = 0; i < m.added.size(); ++i)
    if (m.added[i].normalized)
      throw DataError(
          fmt::format("{}: added_tokens[{}] ('{}') has normalized true with the normalizer '{}', which is "
                      "not supported (expected normalized false, or no normalizer)",
                      path, i, m.added[i].content, normalizer));
}

// model.dropout skips random merges on every encode; null and 0 are the deterministic BPE.
void refuse_dropout(const json& model, const std::string& path) {
  if (!model.contains("dropout") || model["dropout"].is_null()) return;
  const json& d = model["dropout"];
  if (!d.is_number())
    throw DataError(fmt::format("{}: field 'model.dropout' should be a number or null, not {}", path, kind_of(d)));
  if (d.get<double>() != 0)
    throw DataError(
        fmt::format("{}: field 'model.dropout' is {}: BPE dropout (random merges skipped on every encode) is "
                    "a training-time augmentation that shardtrain does not apply; set it to null",
                    path, d.dump()));
}

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool base64_decode(std::string_view in, std::string& out) {
  out.clear();
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    const int v = base64_value(c);
    if (v < 0) return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return true;
}

struct TiktokenSpec {
  std::string_view name;
  std::string_view pattern;
  std::vector<SpecialToken> specials;
};

std::vector<TiktokenSpec> tiktoken_specs() {
  return {
      {"r50k_base", gpt2_split_pattern(), {{"<|endoftext|>", 50256}}},
      {"gpt2", gpt2_split_pattern(), {{"<|endoftext|>", 50256}}},
      {"p50k_base", gpt2_split_pattern(), {{"<|endoftext|>", 50256}}},
      {"cl100k_base",
       cl100k_split_pattern(),
       {{"<|endoftext|>", 100257},
        {"<|fim_prefix|>", 100258},
        {"<|fim_middle|>", 100259},
        {"<|fim_suffix|>", 100260},
        {"<|im_start|>", 100264},
        {"<|im_end|>", 100265},
        {"<|im_sep|>", 100266},
        {"<|endofprompt|>", 100276}}},
      {"o200k_base",
       o200k_split_pattern(),
       {{"<|endoftext|>", 199999},
        {"<|fim_prefix|>", 200000},
        {"<|fim_middle|>", 200001},
        {"<|fim_suffix|>", 200002},
        {"<|im_start|>", 200003},
        {"<|im_end|>", 200004},
        {"<|im_sep|>", 200005},
        {"<|endofprompt|>", 200006}}},
  };
}

void add_token(TokenizerModel& m, std::string bytes, TokenId id, const std::string& where) {
  if (id >= m.id_to_bytes.size()) m.id_to_bytes.resize(id + 1);
  if (!m.id_to_bytes[id].empty()) throw DataError(fmt::format("{}: id {} is assigned twice", where, id));
  m.id_to_bytes[id] = bytes;
  m.bytes_to_id.emplace(std::move(bytes), id);
}

// Reads the HF vocabulary (byte-level mapped strings) into the model.
void load_mapped_vocab(TokenizerModel& m, const json& vocab, const std::string& where) {
  if (!vocab.is_object()) throw DataError(fmt::format("{}: 'vocab' should be an object of token -> id", where));
  std::string bytes;
  for (const auto& [token, idv] : vocab.items()) {
    const TokenId id = token_id(idv, where, fmt::format("vocab entry '{}'", token));
    if (!unmap_byte_level(token, bytes)) {
      // Added tokens sometimes appear in the vocab unmapped (e.g. "<|endoftext|>" maps to itself anyway);
      // tokens that are not byte-level strings are only allowed when they are also added tokens.
      continue;
    }
    add_token(m, bytes, id, where);
  }
}

// Reads merges in the string ("a b") or pair (["a", "b"]) format; rank = position in the list. `to_bytes`
// turns a vocabulary string into the model's bytes (false: not a string of this vocabulary's kind).
template <typename ToBytes>
void load_merges(TokenizerModel& m, const json& merges, const std::string& where, ToBytes to_bytes) {
  if (!merges.is_array()) throw DataError(fmt::format("{}: 'merges' should be an array", where));
  std::string a, b, left, right;
  uint32_t rank = 0;
  for (const auto& e : merges) {
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ', 1);
      if (sp == std::string::npos) throw DataError(fmt::format("{}: merge {} '{}' is not 'left right'", where, rank, s));
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      throw DataError(fmt::format("{}: merge {} is neither 'left right' nor [left, right]", where, rank));
    }
    if (!to_bytes(a, left) || !to_bytes(b, right))
      throw DataError(fmt::format("{}: merge {} ('{}' '{}') is not byte-level", where, rank, a, b));
    auto l = m.bytes_to_id.find(left), r = m.bytes_to_id.find(right), res = m.bytes_to_id.find(left + right);
    if (l == m.bytes_to_id.end() || r == m.bytes_to_id.end() || res == m.bytes_to_id.end())
      throw DataError(
          fmt::format("{}: merge {} ('{}' '{}') uses or makes a token missing from the vocab", where, rank, a, b));
    m.merges.emplace(pair_key(l->second, r->second), Merge{rank, res->second});
    ++rank;
  }
}

void load_mapped_merges(TokenizerModel& m, const json& merges, const std::string& where) {
  load_merges(m, merges, where, [](std::string_view s, std::string& out) { return unmap_byte_level(s, out); });
}

// `name` is the field's path in the file ("pre_tokenizer.pretokenizers[1]"), for the messages.
void apply_pre_tokenizer(TokenizerModel& m, const json& pt, const std::string& where, bool& byte_level_seen,
                         const std::string& name = "pre_tokenizer") {
  if (object_or_null(pt, where, name).is_null()) return;
  const std::string type = typed_field(pt, "type", std::string(), where, name + ".type");
  if (type == "Sequence") {
    const json& list = pt.at("pretokenizers");
    for (size_t i = 0; i < list.size(); ++i)
      apply_pre_tokenizer(m, list[i], where, byte_level_seen, fmt::format("{}.pretokenizers[{}]", name, i));
  } else if (type == "ByteLevel") {
    byte_level_seen = true;
    if (typed_field(pt, "add_prefix_space", false, where, name + ".add_prefix_space")) m.add_prefix_space = true;
    if (typed_field(pt, "use_regex", true, where, name + ".use_regex")) m.split_patterns.emplace_back(gpt2_split_pattern());
  } else if (type == "Split") {
    const json& pattern = pt.at("pattern");
    const std::string behavior = typed_field(pt, "behavior", std::string("Isolated"), where, name + ".behavior");
    const bool invert = typed_field(pt, "invert", false, where, name + ".invert");
    if (behavior != "Isolated" || invert)
      throw DataError(
          fmt::format("{}: pre_tokenizer Split with behavior '{}' (invert {}) is not supported; expected Isolated", where,
                      behavior, invert));
    if (pattern.contains("Regex")) {
      m.split_patterns.push_back(pattern["Regex"].get<std::string>());
    } else if (pattern.contains("String")) {
      std::string quoted;
      for (char c : pattern["String"].get<std::string>()) {
        if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) quoted.push_back('\\');
        quoted.push_back(c);
      }
      m.split_patterns.push_back(quoted);
    } else {
      throw DataError(fmt::format("{}: pre_tokenizer Split needs pattern.Regex or pattern.String", where));
    }
  } else {
    throw DataError(
        fmt::format("{}: pre_tokenizer type '{}' is not supported (expected ByteLevel, Split or Sequence)", where, type));
  }
}

void apply_normalizer(TokenizerModel& m, const json& n, const std::string& where, const std::string& name = "normalizer") {
  if (object_or_null(n, where, name).is_null()) return;
  const std::string type = typed_field(n, "type", std::string(), where, name + ".type");
  if (type == "NFC") {
    m.nfc = true;
  } else if (type == "Sequence") {
    const json& list = n.at("normalizers");
    for (size_t i = 0; i < list.size(); ++i) apply_normalizer(m, list[i], where, fmt::format("{}.normalizers[{}]", name, i));
  } else {
    throw DataError(
        fmt::format("{}: normalizer '{}' is not supported (byte-level BPE tokenizers use none or NFC)", where, type));
  }
}

// SentencePiece-style BPE (model.byte_fallback: Llama 2, Mistral, TinyLlama): vocabulary strings use U+2581
// for spaces, which the model stores as ' '; <0xNN> tokens are the bytes of characters the vocabulary lacks.
constexpr std::string_view kSpaceMark = "\u2581";

std::string unmark_spaces(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s.substr(i, kSpaceMark.size()) == kSpaceMark) {
      out.push_back(' ');
      i += kSpaceMark.size();
    } else {
      out.push_back(s[i++]);
    }
  }
  return out;
}

// "<0x41>" -> 0x41, or -1.
int byte_token(std::string_view s) {
  if (s.size() != 6 || s.substr(0, 3) != "<0x" || s[5] != '>') return -1;
  int v = 0;
  for (char c : s.substr(3, 2)) {
    v *= 16;
    if (c >= '0' && c <= '9') v += c - '0';
    else if (c >= 'A' && c <= 'F') v += c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') v += c - 'a' + 10;
    else return -1;
  }
  return v;
}

// The normalizer SentencePiece-style tokenizer.json files carry: Prepend("\u2581") then Replace(" " -> "\u2581")
// (or the Replace alone). Anything else is refused, naming it.
void apply_sentencepiece_normalizer(TokenizerModel& m, const json& n, const std::string& where) {
  std::vector<json> steps;
  if (n.is_object() && n.value("type", "") == "Sequence") {
    for (const auto& e : n.at("normalizers")) steps.push_back(e);
  } else if (!n.is_null()) {
    steps.push_back(n);
  }
  bool replaces = false;
  for (const auto& e : steps) {
    const std::string type = e.value("type", "");
    if (type == "Prepend" && e.value("prepend", "") == kSpaceMark && !replaces) {
      m.prepend_space = true;
    } else if (type == "Replace" && e.contains("pattern") && e["pattern"].value("String", "") == " " &&
               e.value("content", "") == kSpaceMark) {
      replaces = true;
    } else {
      throw DataError(
          fmt::format("{}: normalizer '{}' is not supported for a byte_fallback BPE (expected Prepend(\u2581) "
                      "and Replace(' ' -> \u2581), as Llama 2's tokenizer.json has)",
                      where, type));
    }
  }
  if (!replaces)
    throw DataError(
        fmt::format("{}: a byte_fallback BPE needs the normalizer Replace(' ' -> \u2581) (spaces as the "
                    "vocabulary writes them), or a Metaspace pre_tokenizer",
                    where));
}

// The newer layout of the same tokenizers: no normalizer and a Metaspace pre_tokenizer that writes spaces as
// \u2581 and adds one in front by its prepend_scheme ("always", "first": only before the first special token,
// "never"; older files say add_prefix_space instead), never to a segment that already starts with one; with
// split (the default) every \u2581 starts a new piece.
void apply_metaspace(TokenizerModel& m, const json& pre, const json& normalizer, const std::string& where) {
  if (!normalizer.is_null())
    throw DataError(
        fmt::format("{}: normalizer '{}' together with a Metaspace pre_tokenizer is not supported for a byte_fallback "
                    "BPE (expected no normalizer)",
                    where, normalizer.value("type", "?")));
  if (pre.value("replacement", std::string(kSpaceMark)) != kSpaceMark)
    throw DataError(fmt::format("{}: Metaspace replacement '{}' is not supported (expected \u2581)", where,
                                pre.value("replacement", "")));
  std::string scheme;
  if (pre.contains("prepend_scheme")) {
    scheme = pre.value("prepend_scheme", "");
    if (scheme != "always" && scheme != "first" && scheme != "never")
      throw DataError(fmt::format("{}: Metaspace prepend_scheme '{}': expected always, first or never", where, scheme));
    if (pre.contains("add_prefix_space") && pre["add_prefix_space"].is_boolean() && !pre["add_prefix_space"].get<bool>() &&
        scheme != "never")
      throw DataError(fmt::format("{}: Metaspace add_prefix_space false contradicts prepend_scheme '{}'", where, scheme));
  } else {
    scheme = pre.value("add_prefix_space", true) ? "always" : "never";
  }
  m.prepend_space = scheme != "never";
  m.prepend_first_segment_only = scheme == "first";
  m.prepend_unless_spaced = true;
  m.split_at_spaces = pre.value("split", true);
}

void load_sentencepiece_bpe(TokenizerModel& m, const json& j, const json& model, const std::string& path) {
  m.byte_fallback = true;
  const json& vocab = model.at("vocab");
  if (!vocab.is_object()) throw DataError(fmt::format("{}: 'vocab' should be an object of token -> id", path));
  std::array<bool, 256> have{};
  for (const auto& [token, idv] : vocab.items()) {
    const TokenId id = token_id(idv, path, fmt::format("vocab entry '{}'", token));
    if (const int b = byte_token(token); b >= 0) {  // kept out of bytes_to_id: characters look up their own tokens
      if (id >= m.id_to_bytes.size()) m.id_to_bytes.resize(id + 1);
      m.id_to_bytes[id] = std::string(1, static_cast<char>(b));
      m.byte_ids[static_cast<size_t>(b)] = id;
      have[static_cast<size_t>(b)] = true;
      continue;
    }
    add_token(m, unmark_spaces(token), id, path);
  }
  for (int b = 0; b < 256; ++b)
    if (!have[static_cast<size_t>(b)])
      throw DataError(fmt::format("{}: byte_fallback is set but the vocabulary has no <0x{:02X}> token", path, b));
  load_added_tokens(m, j, path);
  if (const json pre = j.value("pre_tokenizer", json()); pre.is_object() && pre.value("type", "") == "Metaspace") {
    apply_metaspace(m, pre, j.value("normalizer", json()), path);
  } else if (!pre.is_null()) {
    throw DataError(
        fmt::format("{}: pre_tokenizer '{}' with byte_fallback is not supported (expected none, with the normalizer "
                    "Prepend + Replace, or Metaspace)",
                    path, pre.value("type", "?")));
  } else {
    apply_sentencepiece_normalizer(m, j.value("normalizer", json()), path);
    refuse_normalized_added_tokens(m, "Prepend + Replace", path);
  }
  for (const auto& s : m.specials) {
    auto it = m.bytes_to_id.find(s.content);
    if (it != m.bytes_to_id.end() && it->second == s.id) m.bytes_to_id.erase(it);
    if (s.id < m.id_to_bytes.size()) m.id_to_bytes[s.id].clear();
  }
  finish_model(m);
  load_merges(m, model.at("merges"), path, [](std::string_view s, std::string& out) {
    out = unmark_spaces(s);
    return true;
  });
  m.words_are_exact = std::none_of(m.bytes_to_id.begin(), m.bytes_to_id.end(), [](const auto& entry) {
    const std::string& t = entry.first;
    for (size_t i = 1; i < t.size(); ++i)
      if (t[i] == ' ' && t[i - 1] != ' ') return true;
    return false;
  });
}

void compile_splits(TokenizerModel& m) {
  for (const auto& p : m.split_patterns) m.splits.push_back(std::make_unique<Regex>(p, m.path));
}

}  // namespace

std::shared_ptr<TokenizerModel> load_tiktoken(const std::string& path) {
  auto m = std::make_shared<TokenizerModel>();
  m->path = path;
  m->format = TokenizerFormat::Tiktoken;
  m->whole_piece_lookup = true;
  const std::string stem = std::filesystem::path(path).stem().string();
  const std::string text = read_file(path);
  m->hash = fnv1a64_hex(text);
  m->name = stem;
  const TiktokenSpec* spec = nullptr;
  const auto specs = tiktoken_specs();
  for (const auto& s : specs)
    if (s.name == stem) spec = &s;
  if (!spec)
    throw DataError(
        fmt::format("{}: unknown tiktoken encoding '{}': the file name must be r50k_base, p50k_base, cl100k_base "
                    "or o200k_base (.tiktoken), which picks the split pattern and special tokens",
                    path, stem));
  std::istringstream in(text);
  std::string line, bytes;
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || !base64_decode(std::string_view(line).substr(0, sp), bytes) || bytes.empty())
      throw DataError(fmt::format("{}:{}: expected '<base64 token> <rank>'", path, lineno));
    // The rank: decimal digits, all of them (stoull read "-1" as 2^64 - 1 and "12abc" as 12).
    const std::string_view rank_text = std::string_view(line).substr(sp + 1);
    uint64_t rank = 0;
    if (const auto [end, ec] = std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
        ec == std::errc::result_out_of_range)
      rank = std::numeric_limits<uint64_t>::max();  // out of range below, with its digits
    else if (ec != std::errc() || end != rank_text.data() + rank_text.size())
      throw DataError(fmt::format("{}:{}: rank '{}' is not an integer from 0", path, lineno, rank_text));
    if (rank >= kTokenIdLimit)
      throw DataError(
          fmt::format("{}:{}: rank {} is out of range (ids must be below {})", path, lineno, rank_text, kTokenIdLimit));
    add_token(*m, bytes, static_cast<TokenId>(rank), path);
  }
  m->specials = spec->specials;
  m->split_patterns.emplace_back(spec->pattern);
  finish_model(*m);
  derive_tiktoken_merges(*m);
  compile_splits(*m);
  return m;
}

std::shared_ptr<TokenizerModel> load_hf_json(const std::string& text, const std::string& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw DataError(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
  auto m = std::make_shared<TokenizerModel>();
  m->path = path;
  m->format = TokenizerFormat::HuggingFaceJson;
  m->hash = fnv1a64_hex(text);
  const std::filesystem::path p(path);
  m->name = p.has_parent_path() && !p.parent_path().filename().empty()
                ? p.parent_path().filename().string() + "/" + p.filename().string()
                : p.filename().string();
  // GPT-2's encoder.json (a map of tokens to ids) named alone: its vocab.bpe beside it makes the tokenizer.
  // (Its token "model" has an id: "field 'model' should be an object, not a number" said nothing of that.)
  if (p.filename() == "encoder.json" && j.is_object() && !(j.contains("model") && j["model"].is_object()))
    throw DataError(
        fmt::format("{}: is GPT-2's encoder.json, half of a tokenizer: give its folder (with vocab.bpe "
                    "beside it) as the tokenizer",
                    path));
  if (!j.is_object() || !j.contains("model")) throw DataError(fmt::format("{}: field 'model' is missing", path));
  const json& model = j["model"];
  if (!model.is_object())
    throw DataError(fmt::format("{}: field 'model' should be an object, not {}", path, kind_of(model)));
  const std::string type = typed_field(model, "type", std::string("BPE"), path, "model.type");
  if (type != "BPE") throw DataError(fmt::format("{}: model.type is '{}'; only byte-level BPE is supported", path, type));
  for (const char* f : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(f) && model[f].is_string() && !model[f].get<std::string>().empty())
      throw DataError(fmt::format("{}: model.{} is set; byte-level BPE expects none", path, f));
  }
  refuse_dropout(model, path);
  const json decoder = object_or_null(j.value("decoder", json()), path, "decoder");
  object_or_null(j.value("normalizer", json()), path, "normalizer");
  object_or_null(j.value("pre_tokenizer", json()), path, "pre_tokenizer");
  if (typed_field(model, "byte_fallback", false, path, "model.byte_fallback")) {
    try {
      load_sentencepiece_bpe(*m, j, model, path);
    } catch (const json::exception& e) {
      throw DataError(fmt::format("{}: unexpected structure: {}", path, e.what()));
    }
    return m;
  }
  try {
    m->whole_piece_lookup = typed_field(model, "ignore_merges", false, path, "model.ignore_merges");
    load_mapped_vocab(*m, model.at("vocab"), path);
    load_added_tokens(*m, j, path);
    bool byte_level = false;
    apply_normalizer(*m, j.value("normalizer", json()), path);
    if (m->nfc) refuse_normalized_added_tokens(*m, "NFC", path);
    apply_pre_tokenizer(*m, j.value("pre_tokenizer", json()), path, byte_level);
    if (!byte_level && !(decoder.is_object() && decoder.value("type", "") == "ByteLevel"))
      throw DataError(
          fmt::format("{}: neither pre_tokenizer nor decoder is ByteLevel; only byte-level BPE is supported", path));
    // Added tokens take their ids even when the vocab holds them too; remove them from the regular map.
    for (const auto& s : m->specials) {
      auto it = m->bytes_to_id.find(s.content);
      if (it != m->bytes_to_id.end() && it->second == s.id) m->bytes_to_id.erase(it);
      if (s.id < m->id_to_bytes.size()) m->id_to_bytes[s.id].clear();
    }
    finish_model(*m);
    load_mapped_merges(*m, model.at("merges"), path);
  } catch (const json::exception& e) {
    throw DataError(fmt::format("{}: unexpected structure: {}", path, e.what()));
  }
  compile_splits(*m);
  return m;
}

std::shared_ptr<TokenizerModel> load_gpt2_encoder(const std::string& dir, const std::string& encoder,
                                                  const std::string& merges_file) {
  const std::string enc_path = (std::filesystem::path(dir) / encoder).string();
  const std::string bpe_path = (std::filesystem::path(dir) / merges_file).string();
  const std::string enc_text = read_file(enc_path), bpe_text = read_file(bpe_path);
  auto m = std::make_shared<TokenizerModel>();
  m->path = dir;
  m->name = "gpt2";
  m->format = TokenizerFormat::Gpt2Encoder;
  m->hash = fnv1a64_hex(enc_text + bpe_text);
  json merges = json::array();
  std::istringstream in(bpe_text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    merges.push_back(line);
  }
  try {
    load_mapped_vocab(*m, json::parse(enc_text), enc_path);
  } catch (const json::exception& e) {
    throw DataError(fmt::format("{}: not valid JSON: {}", enc_path, e.what()));
  }
  auto eot = m->bytes_to_id.find("<|endoftext|>");
  if (eot != m->bytes_to_id.end()) {
    m->specials.push_back({"<|endoftext|>", eot->second});
    m->id_to_bytes[eot->second].clear();
    m->bytes_to_id.erase(eot);
  }
  finish_model(*m);
  load_mapped_merges(*m, merges, bpe_path);
  m->split_patterns.emplace_back(gpt2_split_pattern());
  compile_splits(*m);
  return m;
}

}  // namespace shardtrain::data::detail
