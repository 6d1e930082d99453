// TensorBoard event files (tensorboard.hpp): the protobuf encoding is libprotobuf-lite's (tensorboard_event.proto),
// the CRC-32C ISA-L's (crc32_iscsi is CRC-32C).
#include "shardtrain/train/tensorboard.hpp"

#include <fmt/format.h>
#include <isa-l/crc.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <filesystem>

#include "file_append.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "tensorboard_event.pb.h"

namespace shardtrain::train {

namespace {
namespace fs = std::filesystem;

void add_scalar(std::vector<TensorBoardScalar>& out, std::string tag, const nlohmann::ordered_json& v) {
  if (v.is_number()) out.push_back({std::move(tag), v.get<double>()});  // null (a NaN), strings and booleans: none
}

double wall_time_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string host_name() {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}
}  // namespace

std::vector<TensorBoardScalar> tensorboard_scalars(const std::string& json_line, int64_t* step) {
  std::vector<TensorBoardScalar> out;
  // Parsed back from the line itself, so the scalars are metrics.jsonl's values whoever wrote the line (a hook
  // too); ordered: the tags follow the line's keys.
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(json_line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return out;
  const auto kind = j.find("kind");
  const auto at = j.find("step");
  if (kind == j.end() || !kind->is_string() || at == j.end() || !at->is_number_integer()) return out;
  const std::string k = kind->get<std::string>();
  if (k != "train" && k != "eval") return out;
  *step = at->get<int64_t>();
  for (const auto& [key, v] : j.items()) {
    if (key == "step") continue;
    if (v.is_object()) {
      for (const auto& [name, w] : v.items()) add_scalar(out, fmt::format("{}/{}/{}", k, key, name), w);
    } else {
      add_scalar(out, fmt::format("{}/{}", k, key), v);
    }
  }
  return out;
}

uint32_t masked_crc32c(std::string_view bytes) {
  // ISA-L's crc32_iscsi leaves the initial and final inversions of CRC-32C to the caller.
  const uint32_t crc = ~crc32_iscsi(reinterpret_cast<unsigned char*>(const_cast<char*>(bytes.data())),
                                    static_cast<int>(bytes.size()), 0xffffffffu);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, masked_crc32c(out), 4);  // of the 8 length bytes
  out.append(data);
  put_le(out, masked_crc32c(data), 4);
  return out;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string base = (fs::path(dir) / fmt::format("events.out.tfevents.{}.{}", seconds, host_name())).string();
  for (int n = 0; fd_ < 0; ++n) {
    path_ = n == 0 ? base : fmt::format("{}.{}", base, n);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0 && (errno != EEXIST || n == 100))
      throw IoError(fmt::format("{}: cannot create the TensorBoard event file: {}", path_, std::strerror(errno)));
  }
  tensorboard::Event e;
  e.set_wall_time(wall_time_now());
  e.set_file_version("brain.Event:2");
  if (const int err = append_whole(fd_, tfrecord(e.SerializeAsString())); err != 0) {
    ::close(fd_);
    throw IoError(fmt::format("{}: cannot write the TensorBoard event file: {}", path_, std::strerror(err)));
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void TensorBoardWriter::write_scalars(int64_t step, const std::vector<TensorBoardScalar>& scalars) {
  tensorboard::Event e;
  e.set_wall_time(wall_time_now());
  e.set_step(step);
  tensorboard::Summary* summary = e.mutable_summary();
  for (const TensorBoardScalar& s : scalars) {
    tensorboard::SummaryValue* v = summary->add_value();
    v->set_tag(s.tag);
    v->set_simple_value(static_cast<float>(s.value));
  }
  append(tfrecord(e.SerializeAsString()));
}

void TensorBoardWriter::write_metrics_line(const std::string& json_line) {
  int64_t step = 0;
  const std::vector<TensorBoardScalar> scalars = tensorboard_scalars(json_line, &step);
  if (!scalars.empty()) write_scalars(step, scalars);
}

void TensorBoardWriter::append(const std::string& record) {
  const int err = append_whole(fd_, record);
  if (err == 0) {
    if (dropped_ > 0) log::warn("train: {}: writing TensorBoard events again, {} record(s) were lost", path_, dropped_);
    dropped_ = 0;
    return;
  }
  // As metrics.jsonl: the record is dropped whole (a torn one would end TensorBoard's reading of the file)
  // and training goes on.
  if (dropped_++ == 0)
    log::error(
        "train: {}: a TensorBoard record could not be written ({}); training goes on, and records are dropped until one can be",
        path_, std::strerror(err));
}

bool TensorBoardWriter::removed() const {
  struct stat st {};
  return fd_ >= 0 && ::fstat(fd_, &st) == 0 && st.st_nlink == 0;
}

}  // namespace shardtrain::train
