// load_op_profile (op_profile.hpp): a `bench ops --json` file as key -> seconds per call, older files keyed through
// today's rows (op_rows.hpp) in record mode.
#include "op_profile.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "op_rows.hpp"
#include "shardtrain/runtime/dtype.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::cli {
namespace {

using nlohmann::json;

// Fields read with the file and the field's path in every error.
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& expected) const {
    throw ConfigError(
        fmt::format("{}: {}: expected {} (an op profile: `shardtrain bench ops --json` output)", path_, field, expected));
  }
  const json& at(const json& j, const std::string& parent, const char* name, const char* expected) const {
    const std::string field = parent.empty() ? name : parent + "." + name;
    if (!j.is_object() || !j.contains(name)) fail(field, fmt::format("{} (missing)", expected));
    return j.at(name);
  }
  double number(const json& j, const std::string& parent, const char* name) const {
    const json& v = at(j, parent, name, "a number");
    if (!v.is_number()) fail(parent.empty() ? name : parent + "." + name, fmt::format("a number, not {}", v.dump()));
    return v.get<double>();
  }
  double positive(const json& j, const std::string& parent, const char* name) const {
    const double v = number(j, parent, name);
    if (!(v > 0) || !std::isfinite(v))
      fail(parent.empty() ? name : parent + "." + name, fmt::format("a positive number, not {}", v));
    return v;
  }
  int64_t count(const json& j, const std::string& parent, const char* name) const {
    const json& v = at(j, parent, name, "an integer");
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      fail(parent.empty() ? name : parent + "." + name, fmt::format("an integer of 0 or more, not {}", v.dump()));
    return v.get<int64_t>();
  }
  std::string text(const json& j, const std::string& parent, const char* name) const {
    const json& v = at(j, parent, name, "a string");
    if (!v.is_string()) fail(parent.empty() ? name : parent + "." + name, fmt::format("a string, not {}", v.dump()));
    return v.get<std::string>();
  }

 private:
  std::string path_;
};

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw ConfigError(fmt::format("{}: cannot open for reading (an op profile: `shardtrain bench ops --json`)", path));
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    throw ConfigError(fmt::format("{}: not valid JSON (expected `shardtrain bench ops --json` output)", path));
  if (!j.is_object())
    throw ConfigError(fmt::format("{}: expected a JSON object (`shardtrain bench ops --json` output)", path));
  return j;
}

// The profile's own model, micro-batch and dtype, to record today's rows at.
BenchShape profile_shape(const Reader& r, const json& j) {
  const json& m = r.at(j, "", "model", "an object");
  BenchShape s;
  s.model.num_hidden_layers = r.count(m, "model", "layers");
  s.model.hidden_size = r.count(m, "model", "hidden");
  s.model.num_attention_heads = r.count(m, "model", "heads");
  s.model.num_key_value_heads = r.count(m, "model", "kv_heads");
  s.model.intermediate_size = r.count(m, "model", "intermediate");
  s.model.vocab_size = r.count(m, "model", "vocab");
  s.batch = r.count(j, "", "batch");
  s.seq = r.count(j, "", "seq");
  s.model.max_position_embeddings = std::max<int64_t>(s.model.max_position_embeddings, s.seq);
  try {
    s.model.validate();
  } catch (const Error& e) {
    r.fail("model", fmt::format("a valid model ({})", e.what()));
  }
  const int64_t head_dim = r.count(m, "model", "head_dim");
  if (head_dim != s.model.head_dim())
    r.fail("model.head_dim",
           fmt::format("hidden / heads = {} (the only head dim the model has), not {}", s.model.head_dim(), head_dim));
  if (s.batch < 1 || s.seq < 1) r.fail("batch, seq", "1 or more");
  s.source = "profile";
  return s;
}

struct Row {
  std::string op, shapes;
  double seconds = 0, work = 0, cpu_seconds = 0;
  int64_t calls_per_microbatch = 0;
  std::vector<ops::OpCall> calls;
};

ops::DeviceRates profile_rates(const OpTimeTable& t, const std::vector<Row>& rows) {
  ops::DeviceRates r{t.device, t.matmul_flops_per_s, t.copy_bytes_per_s, t.matmul_flops_per_s, t.matmul_flops_per_s, 0, 0,
                     {}};
  for (const Row& row : rows) {
    if (row.op == "attention fwd" && row.calls_per_microbatch > 0) r.attention_forward_flops_per_s = row.work / row.seconds;
    if (row.op == "attention bwd" && row.calls_per_microbatch > 0) r.attention_backward_flops_per_s = row.work / row.seconds;
    if (row.op == "linear_cross_entropy fwd+bwd" && row.calls_per_microbatch > 0)
      r.loss_flops_per_s = row.work / row.seconds;
    if (row.op == "copy") r.kernel_overhead_s = std::max(0.0, row.seconds - row.work / t.copy_bytes_per_s);
  }
  return r;
}

// The (a, b) pairs of a row's shapes, in order: "dy^T (768, 32768) x (32768, 768) += f32" -> (768, 32768), (32768, 768).
std::vector<std::pair<int64_t, int64_t>> shape_pairs(const std::string& shapes) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (size_t open = shapes.find('('); open != std::string::npos; open = shapes.find('(', open + 1)) {
    long long a = 0, b = 0;
    if (std::sscanf(shapes.c_str() + open, "(%lld, %lld)", &a, &b) == 2) out.emplace_back(a, b);
  }
  return out;
}

// A row without keys that measured a GEMM today's bench no longer runs (an older profile's separate q/k/v and gate/up
// projections) still says how fast a GEMM of its shape ran. Its dims come from its shapes as the projection rows
// write them: "x (M, K) W^T (N, K)" (fwd), "dy (M, N) W (N, K)" (bwd dx, a GEMM of M x K x N), "dy^T (N, M) x (M, K)"
// (bwd dW, N x K x M); its transposes and dtypes from today's row of the same pass (the row named "... fwd", "... bwd
// dx" or "... bwd dW" whose one call is a GEMM). nullopt when any of it does not hold, or 2 M N K is not its work.
std::optional<ops::GemmPoint> legacy_gemm_point(const Row& row, const std::vector<RecordedRow>& today,
                                                const ops::DeviceRates& rates) {
  const auto ends_with = [](const std::string& s, const std::string& end) {
    return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
  };
  const char* passes[] = {" fwd", " bwd dx", " bwd dW"};
  const auto pass = std::find_if(std::begin(passes), std::end(passes), [&](const char* p) { return ends_with(row.op, p); });
  const auto pairs = shape_pairs(row.shapes);
  if (pass == std::end(passes) || pairs.size() != 2) return std::nullopt;
  std::optional<ops::GemmKey> form;
  for (const RecordedRow& r : today)
    if (!form && ends_with(r.row.op, *pass) && r.calls.size() == 1) form = ops::parse_gemm_key(r.calls.front().key);
  if (!form) return std::nullopt;
  ops::GemmKey g = *form;
  const auto a = pairs[0], b = pairs[1];
  g.m = a.first;
  g.k = a.second;
  g.n = *pass == passes[0] ? b.first : b.second;  // the forward's W^T holds N first, a backward's second operand second
  const double flops = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  if (std::abs(flops - row.work) > 1e-9 * row.work) return std::nullopt;
  // "NT bf16 bf16 bf16" -> the dtypes' sizes, for the bytes the analytic estimate weighs (a, b, and c written, or
  // read and written when it accumulates: "dy^T (N, M) x (M, K) += f32").
  std::istringstream words(g.form);
  std::string transposes, da, db, dc;
  words >> transposes >> da >> db >> dc;
  const bool accumulates = row.shapes.find("+=") != std::string::npos;
  const auto size = [](const std::string& d) { return static_cast<double>(dtype_size(parse_dtype(d))); };
  ops::OpCall call;
  call.name = "matmul";
  call.flops = flops;
  call.bytes = static_cast<double>(g.m * g.k) * size(da) + static_cast<double>(g.k * g.n) * size(db) +
               static_cast<double>(g.m * g.n) * size(dc) * (accumulates ? 2 : 1);
  return ops::GemmPoint{fmt::format("{}: {}", row.op, row.shapes), g, row.seconds / ops::analytic_seconds(call, rates)};
}

}  // namespace

OpTimeTable load_op_profile(const std::string& path) {
  const json j = read_json(path);
  const Reader r(path);
  OpTimeTable t;
  t.path = path;
  t.device = r.text(j, "", "device");
  t.backend = r.text(j, "", "backend");
  if (t.backend != "cuda" && t.backend != "cpu")
    r.fail("backend", fmt::format("\"cuda\" or \"cpu\", not \"{}\"", t.backend));
  t.dtype = r.text(j, "", "dtype");
  if (j.contains("source")) t.source = r.text(j, "", "source");
  if (t.dtype != "bf16" && t.dtype != "f32") r.fail("dtype", fmt::format("\"bf16\" or \"f32\", not \"{}\"", t.dtype));
  if (j.contains("model") && j.contains("batch") && j.contains("seq")) {  // the shape's fields, not the config's path
    const json& m = j.at("model");
    t.shape =
        fmt::format("layers {}, hidden {}, heads {}/{}, intermediate {}, vocab {}; batch {} x seq {}, {}",
                    m.value("layers", json()).dump(), m.value("hidden", json()).dump(), m.value("heads", json()).dump(),
                    m.value("kv_heads", json()).dump(), m.value("intermediate", json()).dump(),
                    m.value("vocab", json()).dump(), j.at("batch").dump(), j.at("seq").dump(), t.dtype);
  }
  const json& ceilings = r.at(j, "", "ceilings", "an object");
  t.matmul_flops_per_s = r.positive(ceilings, "ceilings", "matmul_flops_per_s");
  t.copy_bytes_per_s = r.positive(ceilings, "ceilings", "copy_bytes_per_s");

  const json& list = r.at(j, "", "rows", "an array of rows");
  if (!list.is_array() || list.empty()) r.fail("rows", "a non-empty array of rows");
  std::vector<Row> rows;
  bool with_calls = false;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = fmt::format("rows[{}]", i);
    const json& e = list[i];
    if (!e.is_object()) r.fail(where, "an object");
    Row row;
    row.op = r.text(e, where, "op");
    row.shapes = r.text(e, where, "shapes");
    row.seconds = r.positive(e, where, "seconds");
    row.work = r.positive(e, where, "work");
    row.calls_per_microbatch = r.count(e, where, "calls_per_microbatch");
    if (e.contains("cpu_seconds")) row.cpu_seconds = r.number(e, where, "cpu_seconds");
    if (e.contains("calls")) {
      with_calls = true;
      const json& calls = e.at("calls");
      if (!calls.is_array() || calls.empty()) r.fail(where + ".calls", "a non-empty array of calls");
      for (size_t k = 0; k < calls.size(); ++k) {
        const std::string cw = fmt::format("{}.calls[{}]", where, k);
        ops::OpCall call;
        call.key = r.text(calls[k], cw, "key");
        call.name = call.key.substr(0, call.key.find(' '));
        call.flops = r.number(calls[k], cw, "flops");
        call.bytes = r.number(calls[k], cw, "bytes");
        row.calls.push_back(std::move(call));
      }
    }
    rows.push_back(std::move(row));
  }

  std::vector<RecordedRow> today;
  if (!with_calls) {  // an older profile: keys from today's rows of the same name and shapes
    t.keys_reconstructed = true;
    today = record_rows(profile_shape(r, j), parse_dtype(t.dtype), t.backend == "cuda" ? DeviceKind::Cuda : DeviceKind::Cpu);
    for (Row& row : rows) {
      const auto it = std::find_if(today.begin(), today.end(), [&](const RecordedRow& x) { return x.row.op == row.op; });
      if (it == today.end()) {
        t.rows_without_keys.push_back(row.op + ": not a row of today's bench ops");
      } else if (it->row.shapes != row.shapes) {
        t.rows_without_keys.push_back(fmt::format("{}: shapes '{}' in the file, '{}' in today's row (the row has changed)",
                                                  row.op, row.shapes, it->row.shapes));
      } else if (std::abs(it->row.work - row.work) > 1e-9 * row.work) {
        t.rows_without_keys.push_back(
            fmt::format("{}: work {} in the file, {} in today's row (the row has changed)", row.op, row.work, it->row.work));
      } else {
        row.calls = it->calls;
      }
    }
  }
  t.rates = profile_rates(t, rows);

  // Seconds per call for each of a row's keys; then per key, the step's rows first.
  struct Candidate {
    double seconds = 0;
    bool step_row = false;
    std::string row;
  };
  std::map<std::string, std::vector<Candidate>> candidates;
  for (const Row& row : rows) {
    double analytic = 0;
    for (const ops::OpCall& call : row.calls) analytic += ops::analytic_seconds(call, t.rates);
    for (const ops::OpCall& call : row.calls) {
      const double share = row.calls.size() == 1 ? 1.0 : ops::analytic_seconds(call, t.rates) / analytic;
      std::vector<Candidate>& c = candidates[call.key];
      const bool seen = std::any_of(c.begin(), c.end(), [&](const Candidate& x) { return x.row == row.op; });
      if (!seen) c.push_back({row.seconds * share, row.calls_per_microbatch > 0, row.op});
    }
  }
  for (const auto& [key, c] : candidates) {
    const bool any_step = std::any_of(c.begin(), c.end(), [](const Candidate& x) { return x.step_row; });
    double sum = 0;
    int n = 0;
    std::string from;
    for (const Candidate& x : c) {
      if (any_step && !x.step_row) continue;
      sum += x.seconds;
      ++n;
      from += (from.empty() ? "" : ", ") + x.row;
    }
    t.seconds[key] = sum / n;
    t.row_of[key] = from;
  }
  for (const Row& row : rows)
    if (row.calls.size() == 1 && row.cpu_seconds > 0) t.cpu_seconds[row.calls.front().key] = row.cpu_seconds;
  for (const Row& row : rows)
    for (const ops::OpCall& call : row.calls)
      if (call.flops == 0) t.memory_bound_keys.insert(call.key);
  std::map<std::string, std::vector<double>> ratios;
  for (const Row& row : rows) {
    if (row.calls_per_microbatch == 0) continue;
    for (const ops::OpCall& call : row.calls) {
      const auto it = t.seconds.find(call.key);
      if (it == t.seconds.end()) continue;
      const double scale = it->second / ops::analytic_seconds(call, t.rates);
      if (call.flops == 0 && call.bytes > 0) ratios[call.name].push_back(scale);
      const std::optional<ops::GemmKey> gemm = call.flops > 0 ? ops::parse_gemm_key(call.key) : std::nullopt;
      const bool seen = std::any_of(t.gemm_points.begin(), t.gemm_points.end(),
                                    [&](const ops::GemmPoint& p) { return p.key == call.key; });
      if (gemm && !seen) t.gemm_points.push_back({call.key, *gemm, scale});
    }
  }
  for (auto& [name, r] : ratios) {
    std::sort(r.begin(), r.end());
    t.memory_bound_scale[name] = r[r.size() / 2];
  }
  for (const Row& row : rows)
    if (row.calls.empty() && row.calls_per_microbatch > 0)
      if (std::optional<ops::GemmPoint> point = legacy_gemm_point(row, today, t.rates))
        t.gemm_points.push_back(std::move(*point));
  return t;
}

}  // namespace shardtrain::cli
