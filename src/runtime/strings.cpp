// Small text helpers shared by the layers (strings.hpp).
#include "shardtrain/runtime/strings.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace shardtrain {

std::string quoted_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        else out += c;
    }
  }
  return out + "\"";
}

std::string shell_quoted(std::string_view s) {
  const auto plain = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("_./:=@%+,-").find(c) != std::string_view::npos;
  };
  if (!s.empty() && std::all_of(s.begin(), s.end(), plain)) return std::string(s);
  std::string out = "'";
  for (const char c : s) {
    if (c == '\'') out += "'\\''";  // end the quotes, an escaped quote, quotes again
    else out += c;
  }
  return out + "'";
}

}  // namespace shardtrain
