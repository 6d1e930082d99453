// The byte-level BPE core: GPT-2's byte <-> code point mapping, the merge loop (a heap over adjacent
// pairs, O(n log n) in the piece length), PCRE2 regex ownership and NFC normalization through ICU.
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <queue>
#include <sstream>

#include "shardtrain/runtime/error.hpp"
#include "tokenizer_model.hpp"
#include "utf8.hpp"

namespace shardtrain::data::detail {

Regex::Regex(const std::string& pattern, const std::string& origin) : pattern_(pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error, &offset, nullptr);
  if (!code_) {
    std::array<PCRE2_UCHAR, 256> msg{};
    pcre2_get_error_message(error, msg.data(), msg.size());
    throw DataError(fmt::format("{}: split pattern does not compile at offset {}: {} (pattern: {})", origin, offset,
                                reinterpret_cast<const char*>(msg.data()), pattern));
  }
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter where JIT is unavailable
}

Regex::~Regex() {
  if (code_) pcre2_code_free(code_);
}

const std::array<char32_t, 256>& byte_to_codepoint() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

namespace {
const std::array<int, 324>& codepoint_to_byte() {
  static const std::array<int, 324> table = [] {
    std::array<int, 324> t{};
    t.fill(-1);
    const auto& fwd = byte_to_codepoint();
    for (int b = 0; b < 256; ++b) t[fwd[b]] = b;
    return t;
  }();
  return table;
}
}  // namespace

bool unmap_byte_level(std::string_view mapped, std::string& out) {
  out.clear();
  size_t i = 0;
  while (i < mapped.size()) {
    char32_t cp = 0;
    const size_t len = utf8_decode(mapped, i, cp);
    if (len == 0 || cp >= 324 || codepoint_to_byte()[cp] < 0) return false;
    out.push_back(static_cast<char>(codepoint_to_byte()[cp]));
    i += len;
  }
  return true;
}

std::string map_byte_level(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) utf8_append(out, byte_to_codepoint()[b]);
  return out;
}

std::string fnv1a64_hex(std::string_view data) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : data) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return fmt::format("fnv1a64:{:016x}", h);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot open for reading", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return std::move(ss).str();
}

void derive_tiktoken_merges(TokenizerModel& m) {
  for (TokenId id = 0; id < m.id_to_bytes.size(); ++id) {
    const std::string& t = m.id_to_bytes[id];
    if (t.size() < 2 || m.special_ids.count(t)) continue;
    for (size_t k = 1; k < t.size(); ++k) {
      auto l = m.bytes_to_id.find(t.substr(0, k));
      if (l == m.bytes_to_id.end()) continue;
      auto r = m.bytes_to_id.find(t.substr(k));
      if (r == m.bytes_to_id.end()) continue;
      m.merges.emplace(pair_key(l->second, r->second), Merge{id, id});
    }
  }
}

void finish_model(TokenizerModel& m) {
  for (int b = 0; b < 256 && !m.byte_fallback; ++b) {
    auto it = m.bytes_to_id.find(std::string(1, static_cast<char>(b)));
    if (it == m.bytes_to_id.end())
      throw DataError(fmt::format("{}: the vocabulary has no token for byte 0x{:02x} (not a byte-level BPE?)", m.path, b));
    m.byte_ids[b] = it->second;
  }
  std::stable_sort(m.specials.begin(), m.specials.end(),
                   [](const SpecialToken& a, const SpecialToken& b) { return a.content.size() > b.content.size(); });
  for (const auto& s : m.specials) {
    m.special_ids[s.content] = s.id;
    if (s.id >= m.id_to_bytes.size()) m.id_to_bytes.resize(s.id + 1);
    m.id_to_bytes[s.id] = s.content;
  }
  if (m.added.empty())
    for (const auto& s : m.specials) m.added.push_back({s.content, s.id});
  for (const auto& a : m.added) {
    if (a.special) continue;
    m.added_always = true;
    if (a.id >= m.id_to_bytes.size()) m.id_to_bytes.resize(a.id + 1);
    m.id_to_bytes[a.id] = a.content;  // decodes to its text, as the Hugging Face library does
  }
}

void bpe_encode_piece(const TokenizerModel& m, std::string_view piece, std::vector<TokenId>& out) {
  const size_t n = piece.size();
  if (n == 0) return;
  if (n == 1) {
    out.push_back(m.byte_ids[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (m.whole_piece_lookup) {
    auto it = m.bytes_to_id.find(std::string(piece));
    if (it != m.bytes_to_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<TokenId> symbols(n);
  for (size_t i = 0; i < n; ++i) symbols[i] = m.byte_ids[static_cast<unsigned char>(piece[i])];
  bpe_merge(m, std::move(symbols), out);
}

void byte_fallback_symbols(const TokenizerModel& m, std::string_view text, std::vector<TokenId>& symbols) {
  std::string ch;
  for (size_t i = 0; i < text.size();) {
    char32_t cp = 0;
    const size_t len = utf8_decode(text, i, cp);
    if (len > 0) {
      ch.assign(text.substr(i, len));
      auto it = m.bytes_to_id.find(ch);
      if (it != m.bytes_to_id.end()) {
        symbols.push_back(it->second);
        i += len;
        continue;
      }
    }
    const size_t bytes = std::max<size_t>(len, 1);  // an unknown character's bytes, or one invalid byte
    for (size_t k = 0; k < bytes; ++k) symbols.push_back(m.byte_ids[static_cast<unsigned char>(text[i + k])]);
    i += bytes;
  }
}

void bpe_merge(const TokenizerModel& m, std::vector<TokenId> symbols, std::vector<TokenId>& out) {
  const size_t n = symbols.size();
  if (n < 2) {
    out.insert(out.end(), symbols.begin(), symbols.end());
    return;
  }
  struct Node {
    TokenId token;
    int32_t prev, next;
  };
  struct Candidate {
    uint32_t rank, pos;
    TokenId left, right, result;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Node> nodes(n);
  for (size_t i = 0; i < n; ++i)
    nodes[i] = {symbols[i], static_cast<int32_t>(i) - 1, i + 1 < n ? static_cast<int32_t>(i + 1) : -1};
  std::vector<Candidate> storage;
  storage.reserve(n);
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap(std::greater<>{}, std::move(storage));
  auto consider = [&](int32_t pos) {
    const int32_t nx = nodes[pos].next;
    if (nx < 0) return;
    auto it = m.merges.find(pair_key(nodes[pos].token, nodes[nx].token));
    if (it != m.merges.end())
      heap.push({it->second.rank, static_cast<uint32_t>(pos), nodes[pos].token, nodes[nx].token, it->second.result});
  };
  for (size_t i = 0; i + 1 < n; ++i) consider(static_cast<int32_t>(i));
  std::vector<bool> dead(n, false);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int32_t pos = static_cast<int32_t>(c.pos);
    if (dead[pos] || nodes[pos].token != c.left) continue;
    const int32_t nx = nodes[pos].next;
    if (nx < 0 || nodes[nx].token != c.right) continue;
    nodes[pos].token = c.result;
    dead[nx] = true;
    nodes[pos].next = nodes[nx].next;
    if (nodes[nx].next >= 0) nodes[nodes[nx].next].prev = pos;
    if (nodes[pos].prev >= 0) consider(nodes[pos].prev);
    consider(pos);
  }
  for (int32_t i = 0; i >= 0; i = nodes[i].next) out.push_back(nodes[i].token);
}

std::string nfc_normalize(std::string_view text) {
  bool ascii = true;
  for (unsigned char c : text) ascii &= c < 0x80;
  if (ascii) return std::string(text);
  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* nfc = unorm2_getNFCInstance(&status);
  if (U_FAILURE(status)) throw DataError(fmt::format("ICU NFC normalizer unavailable: {}", u_errorName(status)));
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  std::u16string src, dst;
  while (i < text.size()) {
    size_t j = i;
    char32_t cp = 0;
    while (j < text.size()) {
      const size_t len = utf8_decode(text, j, cp);
      if (len == 0) break;
      j += len;
    }
    if (j > i) {  // a valid run [i, j)
      status = U_ZERO_ERROR;
      int32_t n16 = 0;
      src.resize(j - i + 1);
      u_strFromUTF8(reinterpret_cast<UChar*>(src.data()), static_cast<int32_t>(src.size()), &n16, text.data() + i,
                    static_cast<int32_t>(j - i), &status);
      dst.resize(static_cast<size_t>(n16) * 3 + 16);
      const int32_t nd = unorm2_normalize(nfc, reinterpret_cast<const UChar*>(src.data()), n16,
                                          reinterpret_cast<UChar*>(dst.data()), static_cast<int32_t>(dst.size()), &status);
      int32_t n8 = 0;
      std::string piece(static_cast<size_t>(nd) * 3 + 4, '\0');
      u_strToUTF8(piece.data(), static_cast<int32_t>(piece.size()), &n8, reinterpret_cast<const UChar*>(dst.data()), nd,
                  &status);
      if (U_FAILURE(status)) throw DataError(fmt::format("NFC normalization failed: {}", u_errorName(status)));
      out.append(piece.data(), static_cast<size_t>(n8));
      i = j;
    } else {
      out.push_back(text[i++]);  // an invalid byte, kept as it is
    }
  }
  return out;
}

}  // namespace shardtrain::data::detail
