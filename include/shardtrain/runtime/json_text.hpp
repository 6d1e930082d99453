// JSON text of anything that may hold a path or user text (a file name, a tokenizer path, a special token): a name
// that is not UTF-8 (latin-1 'caf\xe9.txt', as old archives unpack) made nlohmann's dump() throw type_error 316, after
// the whole tokenization or at a training run's first checkpoint save. Here each such byte becomes U+FFFD instead.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace shardtrain {

// j.dump(indent), with every byte that is not part of valid UTF-8 written as U+FFFD.
template <typename Json>
std::string json_text(const Json& j, int indent = -1) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}

// `s` as json_text records it. A recorded path is compared with this of the current one, like with like: a latin-1
// name read back from a checkpoint is U+FFFD where the name on disk has its byte.
inline std::string json_recorded(std::string_view s) {
  if (s.empty()) return {};
  return nlohmann::json::parse(json_text(nlohmann::json(std::string(s)))).get<std::string>();
}

}  // namespace shardtrain
