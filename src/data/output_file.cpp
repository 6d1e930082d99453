// Outputs of the offline data tools (output_file.hpp): checks made before any work, the temporaries' names, and the
// flush-and-rename that puts a finished file in place.
#include "shardtrain/data/output_file.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/temporaries.hpp"

namespace shardtrain::data {

namespace fs = std::filesystem;

void check_output_path(const std::string& output, ExistingOutput existing, std::string_view command) {
  if (output.empty()) throw UsageError(fmt::format("{}: the output is an empty name (--output)", command));
  std::error_code ec;
  // A folder is never replaced: the final rename would fail only after all the work (and a trailing '/' names one).
  if (fs::is_directory(output, ec) || output.back() == '/')
    throw UsageError(fmt::format("{}: is a folder; {} writes one file (give its name, e.g. {}/NAME)", output, command,
                                 output.back() == '/' ? output.substr(0, output.size() - 1) : output));
  if (existing == ExistingOutput::Refuse && fs::exists(fs::symlink_status(output, ec)))
    throw UsageError(fmt::format("{}: already exists; {} does not replace it unless asked (--overwrite)", output, command));
  // The output's folder must exist before any work: a typo in it would otherwise show only after the whole corpus.
  if (const auto dir = fs::path(output).parent_path(); !dir.empty() && !fs::is_directory(dir, ec))
    throw UsageError(fmt::format("{}: the output's folder {} does not exist{} ({} makes no folders)", output, dir.string(),
                                 fs::exists(dir, ec) ? " as a folder" : "", command));
}

std::string output_temporary(const std::string& output, std::string_view kind) { return temporary_beside(output, kind); }

void sweep_dead_output_temporaries(const std::string& output) {
  for (const std::string& gone : sweep_dead_temporaries(output, {"tmp", "tokens-tmp"}))
    log::warn("{}: removed, the temporary of a run on this host whose process no longer runs (killed?)", gone);
}

namespace {

// NAME, or NAME.tmp-[HOST-]DIGITS / NAME.tokens-tmp-[HOST-]DIGITS (before 2026-11-29 the names had no host; a long
// NAME is cut in them: temporary_stem).
bool names_output_or_temporary(const std::string& file, const std::string& name) {
  if (file == name) return true;
  for (const std::string_view kind : {"tmp", "tokens-tmp"}) {
    const std::string prefix = temporary_stem(name, kind);
    if (file.size() <= prefix.size() || !file.starts_with(prefix) || file.find('/', prefix.size()) != std::string::npos)
      continue;
    const size_t dash = file.rfind('-');
    const size_t digits = dash < prefix.size() ? prefix.size() : dash + 1;  // the PID: after the host, if any
    if (digits < file.size() && file.find_first_not_of("0123456789", digits) == std::string::npos) return true;
  }
  return false;
}

fs::path resolved(const fs::path& p) {
  std::error_code ec;
  auto r = fs::weakly_canonical(fs::absolute(p, ec), ec);
  return ec ? fs::absolute(p, ec).lexically_normal() : r;
}

}  // namespace

bool is_output_or_temporary(const fs::path& path, const std::string& output) {
  if (output.empty()) return false;
  const fs::path out = resolved(output);
  // The names first (no system call): only a candidate whose name fits has its folder resolved.
  if (names_output_or_temporary(path.filename().string(), out.filename().string()) &&
      resolved(path.parent_path().empty() ? fs::path(".") : path.parent_path()) == out.parent_path())
    return true;
  // A link to the output (or the output a link): compared where both lead.
  std::error_code ec;
  return fs::exists(path, ec) && fs::exists(output, ec) && fs::equivalent(path, output, ec);
}

bool is_hdf5_file(const std::string& path) {
  static constexpr char kSignature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool found = false;
  for (off_t at = 0; !found; at = at == 0 ? 512 : at * 2) {
    char head[sizeof kSignature] = {};
    if (::pread(fd, head, sizeof head, at) != static_cast<ssize_t>(sizeof head)) break;
    found = std::memcmp(head, kSignature, sizeof head) == 0;
  }
  ::close(fd);
  return found;
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  const int rc = fd < 0 ? -1 : ::fsync(fd);
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (rc != 0) throw IoError(fmt::format("{}: cannot flush it to disk: {}", path, std::strerror(err)));
}

void move_into_place(const std::string& tmp, const std::string& path, ExistingOutput existing, std::string_view refusal) {
  const auto exists_error = [&] {
    return UsageError(fmt::format("{}: already exists; {}; the new one was not kept", path, refusal));
  };
  if (existing == ExistingOutput::Refuse) {
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) == 0) return;
    if (errno == EEXIST) throw exists_error();
    if (errno != EINVAL && errno != ENOSYS)
      throw IoError(
          fmt::format("{}: cannot move the finished file into place from {}: {}", path, tmp, std::strerror(errno)));
    std::error_code ec;
    if (fs::exists(path, ec)) throw exists_error();
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw IoError(fmt::format("{}: cannot move the finished file into place from {}: {}", path, tmp, ec.message()));
}

void write_file_into_place(const std::string& path, std::string_view contents, ExistingOutput existing,
                           std::string_view refusal) {
  TemporaryOutput guard(output_temporary(path));  // a failed write leaves nothing behind
  const std::string& tmp = guard.path();
  std::FILE* f = std::fopen(tmp.c_str(), "wbx");  // x: never through a file or link that is already there
  if (!f) throw IoError(fmt::format("{}: cannot create the temporary file {}: {}", path, tmp, std::strerror(errno)));
  const bool written = std::fwrite(contents.data(), 1, contents.size(), f) == contents.size();
  const int err = errno;
  if (std::fclose(f) != 0 || !written)
    throw IoError(fmt::format("{}: cannot write {}: {}", path, tmp, std::strerror(written ? errno : err)));
  fsync_path(tmp);  // on disk before it takes the name: a crash leaves the old file or the whole new one
  move_into_place(tmp, path, existing, refusal);
  guard.moved();
  fsync_path(fs::absolute(path).parent_path().string());  // the rename itself
}

}  // namespace shardtrain::data
