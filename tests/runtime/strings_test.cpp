// Text helpers (strings.hpp): shell_quoted's words read back by a real shell as the string they were made of.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "shardtrain/runtime/strings.hpp"

namespace shardtrain {
namespace {

// What `sh -c 'printf "%s\n" WORD'` prints: the word as a shell reads it back.
std::string read_back_by_sh(const std::string& word) {
  const std::string cmd = "printf '%s\\n' " + word;
  std::FILE* p = ::popen(("sh -c " + shell_quoted(cmd)).c_str(), "r");
  std::string out;
  char buf[256];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  ::pclose(p);
  return out;
}

// The hint "to continue, run the same command with --logging.run_dir runs/my runs/tiny cpu-... --resume auto" was
// three words there once pasted (usage error 2): a path is quoted when a shell would split or expand it.
TEST(ShellQuoted, AWordAShellReadsBackAsItWas) {
  EXPECT_EQ(shell_quoted("runs/tiny-cpu-20261130-000925"), "runs/tiny-cpu-20261130-000925");  // nothing to quote
  EXPECT_EQ(shell_quoted("/a/b_c.d:e=f@g%h+i,j"), "/a/b_c.d:e=f@g%h+i,j");
  EXPECT_EQ(shell_quoted("runs/my runs/x"), "'runs/my runs/x'");
  EXPECT_EQ(shell_quoted("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quoted(""), "''");
  const std::vector<std::string> hostile = {"runs/my runs/tiny cpu-1",
                                            "it's",
                                            "a'b'c",
                                            "$HOME",
                                            "`id`",
                                            "*",
                                            "~/x",
                                            "a\\b",
                                            "tab\there",
                                            "new\nline",
                                            "\"q\"",
                                            "ü日本",
                                            "-x",
                                            "!x",
                                            "''"};
  for (const std::string& s : hostile) EXPECT_EQ(read_back_by_sh(shell_quoted(s)), s + "\n") << shell_quoted(s);
}

}  // namespace
}  // namespace shardtrain
