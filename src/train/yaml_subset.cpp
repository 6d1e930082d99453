// The strict YAML-subset reader for Accelerate config files (yaml_subset.hpp).
#include "shardtrain/train/yaml_subset.hpp"

#include <fmt/format.h>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::train {
namespace {

struct Line {
  int number = 0;
  int indent = 0;
  std::string text;  // without indentation and comment, right-trimmed
};

std::string rtrim(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

class Parser {
 public:
  Parser(std::string_view text, std::string source) : source_(std::move(source)) { split(text); }

  YamlNode document() {
    if (lines_.empty()) {
      YamlNode n;
      n.kind = YamlNode::Kind::Map;
      n.line = 1;
      return n;
    }
    if (lines_[0].indent != 0) fail(lines_[0].number, "the document must start at column 1");
    YamlNode root = block(0);
    if (pos_ < lines_.size()) fail(lines_[pos_].number, "unexpected indentation");
    return root;
  }

 private:
  [[noreturn]] void fail(int line, const std::string& what) const {
    throw ConfigError(
        fmt::format("{}:{}: {} (Accelerate configs are read as a YAML subset: nested key: value mappings, "
                    "- item lists, quoted or plain scalars, [] and {{}})",
                    source_, line, what));
  }

  // Removes a # comment that is outside quotes (a # starts a comment at the line start or after a space).
  std::string strip_comment(const std::string& s, int number) const {
    char quote = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      const char c = s[i];
      if (quote) {
        if (c == quote) {
          if (quote == '\'' && i + 1 < s.size() && s[i + 1] == '\'') ++i;  // '' inside single quotes
          else quote = 0;
        } else if (quote == '"' && c == '\\') {
          ++i;
        }
      } else if (c == '\'' || c == '"') {
        quote = c;
      } else if (c == '#' && (i == 0 || s[i - 1] == ' ')) {
        return s.substr(0, i);
      }
    }
    if (quote) fail(number, "a quoted scalar is not closed on its line");
    return s;
  }

  void split(std::string_view text) {
    int number = 0;
    size_t start = 0;
    while (start <= text.size()) {
      const size_t nl = text.find('\n', start);
      std::string raw(text.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start));
      ++number;
      size_t indent = 0;
      while (indent < raw.size() && (raw[indent] == ' ' || raw[indent] == '\t')) {
        if (raw[indent] == '\t') fail(number, "a tab in the indentation");
        ++indent;
      }
      std::string body = rtrim(strip_comment(raw.substr(indent), number));
      if (!body.empty()) {
        if (body == "---" && lines_.empty()) {
          // a leading document marker is fine
        } else if (body == "---" || body == "...") {
          fail(number, "more than one document");
        } else {
          lines_.push_back({number, static_cast<int>(indent), body});
        }
      }
      if (nl == std::string_view::npos) break;
      start = nl + 1;
    }
  }

  YamlNode scalar(std::string s, int number) const {
    YamlNode n;
    n.line = number;
    if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") {
      n.null = true;
      return n;
    }
    const char c0 = s[0];
    if (c0 == '&' || c0 == '*' || c0 == '!' || c0 == '|' || c0 == '>' || c0 == '%' || c0 == '@' || c0 == '`')
      fail(number,
           fmt::format("'{}' starts an anchor, alias, tag or multi-line scalar, which this reader does not take", c0));
    if (c0 == '\'' || c0 == '"') {
      if (s.size() < 2 || s.back() != c0) fail(number, "text after a quoted scalar");
      std::string body = s.substr(1, s.size() - 2), out;
      for (size_t i = 0; i < body.size(); ++i) {
        if (c0 == '\'' && body[i] == '\'') {
          if (i + 1 < body.size() && body[i + 1] == '\'') {
            out += '\'';
            ++i;
          } else {
            fail(number, "a lone ' inside a single-quoted scalar");
          }
        } else if (c0 == '"' && body[i] == '\\' && i + 1 < body.size()) {
          const char e = body[++i];
          switch (e) {
            case 'n': out += '\n'; break;
            case 't': out += '\t'; break;
            case '"': out += '"'; break;
            case '\\': out += '\\'; break;
            case '/': out += '/'; break;
            default: fail(number, fmt::format("the escape \\{} is not supported", e));
          }
        } else if (c0 == '"' && body[i] == '"') {
          fail(number, "an unescaped \" inside a double-quoted scalar");
        } else {
          out += body[i];
        }
      }
      n.scalar = out;
      n.quoted = true;
      return n;
    }
    if (c0 == '[') {
      if (s.back() != ']') fail(number, "a flow list must close on its line");
      n.kind = YamlNode::Kind::List;
      const std::string inner = s.substr(1, s.size() - 2);
      size_t start = 0;
      if (inner.find_first_not_of(' ') == std::string::npos) return n;
      while (true) {
        const size_t comma = inner.find(',', start);
        std::string item = inner.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        item.erase(0, item.find_first_not_of(' '));
        item = rtrim(item);
        if (item.empty() || item[0] == '[' || item[0] == '{') fail(number, "flow lists may hold only scalars");
        n.list.push_back(scalar(item, number));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
      return n;
    }
    if (c0 == '{') {
      if (s.find_first_not_of(' ', 1) != s.size() - 1 || s.back() != '}')
        fail(number, "only the empty flow mapping {} is supported");
      n.kind = YamlNode::Kind::Map;
      return n;
    }
    if (s.find(": ") != std::string::npos) fail(number, "a mapping inside a scalar (one key per line)");
    n.scalar = s;
    return n;
  }

  // A block (mapping or list) whose lines have exactly `indent`.
  YamlNode block(int indent) {
    YamlNode n;
    n.line = lines_[pos_].number;
    const bool is_list = lines_[pos_].text.rfind("- ", 0) == 0 || lines_[pos_].text == "-";
    n.kind = is_list ? YamlNode::Kind::List : YamlNode::Kind::Map;
    while (pos_ < lines_.size() && lines_[pos_].indent == indent) {
      const Line& l = lines_[pos_];
      if (is_list) {
        if (l.text.rfind("- ", 0) != 0 && l.text != "-") break;  // the list ends; a key of the enclosing mapping follows
        std::string item = l.text.size() > 2 ? l.text.substr(2) : std::string();
        item.erase(0, item.find_first_not_of(' '));
        if (item.find(": ") != std::string::npos || (!item.empty() && item.back() == ':'))
          fail(l.number, "lists of mappings are not supported");
        ++pos_;
        n.list.push_back(scalar(item, l.number));
        continue;
      }
      if (l.text.rfind("- ", 0) == 0) fail(l.number, "a list item where a key was expected");
      size_t colon = std::string::npos;
      if (l.text[0] == '\'' || l.text[0] == '"') fail(l.number, "quoted keys are not supported");
      for (size_t i = 0; i < l.text.size(); ++i) {
        if (l.text[i] == ':' && (i + 1 == l.text.size() || l.text[i + 1] == ' ')) {
          colon = i;
          break;
        }
      }
      if (colon == std::string::npos || colon == 0) fail(l.number, fmt::format("expected 'key: value', got '{}'", l.text));
      const std::string key = rtrim(l.text.substr(0, colon));
      std::string rest = l.text.substr(colon + 1);
      rest.erase(0, rest.find_first_not_of(' ') == std::string::npos ? rest.size() : rest.find_first_not_of(' '));
      for (const auto& [k, v] : n.map)
        if (k == key) fail(l.number, fmt::format("duplicate key '{}' (first on line {})", key, v.line));
      ++pos_;
      if (rest.empty() && pos_ < lines_.size() && lines_[pos_].indent > indent) {
        n.map.emplace_back(key, block(lines_[pos_].indent));
      } else if (rest.empty() && pos_ < lines_.size() && lines_[pos_].indent == indent &&
                 lines_[pos_].text.rfind("- ", 0) == 0) {
        n.map.emplace_back(key, block(indent));  // a list at the key's own indentation (common YAML style)
      } else {
        n.map.emplace_back(key, scalar(rest, l.number));
      }
    }
    if (pos_ < lines_.size() && lines_[pos_].indent > indent) fail(lines_[pos_].number, "unexpected indentation");
    return n;
  }

  std::string source_;
  std::vector<Line> lines_;
  size_t pos_ = 0;
};

}  // namespace

YamlNode parse_yaml_subset(std::string_view text, const std::string& source) { return Parser(text, source).document(); }

}  // namespace shardtrain::train
