// Small text helpers shared by the layers.
#pragma once

#include <string>
#include <string_view>

namespace shardtrain {

// `s` in double quotes with ", \ and control characters escaped (\n, \t, \r, \uXXXX): a valid JSON string and
// a valid TOML basic string alike.
std::string quoted_string(std::string_view s);

}  // namespace shardtrain
