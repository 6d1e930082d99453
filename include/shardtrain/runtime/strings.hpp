// Small text helpers shared by the layers.
#pragma once

#include <string>
#include <string_view>

namespace shardtrain {

// `s` in double quotes with ", \ and control characters escaped (\n, \t, \r, \uXXXX): a valid JSON string and
// a valid TOML basic string alike.
std::string quoted_string(std::string_view s);

// `s` as one word for a POSIX shell, for a command a message tells the user to paste: as it is when it holds only
// characters no shell splits, expands or globs (letters, digits and _ . / : = @ % + , -), else in single quotes
// with each ' written '\''. "runs/my runs/x" -> 'runs/my runs/x'; "" -> ''.
std::string shell_quoted(std::string_view s);

}  // namespace shardtrain
