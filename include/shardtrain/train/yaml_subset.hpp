// A small, strict reader for the YAML that Accelerate config files use: block mappings nested by
// indentation, block sequences of scalars, plain/'single'/"double"-quoted scalars, [] and {} (and flow
// lists of scalars), and # comments. Anything else (anchors, aliases, tags, multi-line scalars, several
// documents, tabs) is a ConfigError naming file:line, so a file is never half understood.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardtrain::train {

struct YamlNode {
  enum class Kind { Scalar, Map, List };
  Kind kind = Kind::Scalar;
  std::string scalar;                                 // Scalar: the text, quotes removed
  bool quoted = false;                                // Scalar: written in quotes (always a string)
  bool null = false;                                  // Scalar: empty, ~ or null
  std::vector<std::pair<std::string, YamlNode>> map;  // Map, in file order
  std::vector<YamlNode> list;                         // List
  int line = 0;                                       // 1-based line where the node starts
};

// Throws ConfigError("source:line: ...") for anything outside the subset, and for duplicate keys.
YamlNode parse_yaml_subset(std::string_view text, const std::string& source);

}  // namespace shardtrain::train
