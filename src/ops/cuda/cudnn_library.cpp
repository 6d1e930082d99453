// cuDNN through dlopen (cudnn_library.hpp): the function table, descriptors, graph realization and plans.
#include "cudnn_library.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <array>
#include <utility>

#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::ops::cuda {
namespace {

template <typename F>
bool resolve(void* lib, const char* name, F*& out) {
  out = reinterpret_cast<F*>(dlsym(lib, name));
  return out != nullptr;
}

const char* knob_name(int64_t type) {
  switch (type) {
    case CUDNN_KNOB_TYPE_SWIZZLE: return "SWIZZLE";
    case CUDNN_KNOB_TYPE_TILE_SIZE: return "TILE_SIZE";
    case CUDNN_KNOB_TYPE_EDGE: return "EDGE";
    case CUDNN_KNOB_TYPE_MULTIPLY: return "MULTIPLY";
    case CUDNN_KNOB_TYPE_SPLIT_K_BUF: return "SPLIT_K_BUF";
    case CUDNN_KNOB_TYPE_TILEK: return "TILEK";
    case CUDNN_KNOB_TYPE_STAGES: return "STAGES";
    case CUDNN_KNOB_TYPE_REDUCTION_MODE: return "REDUCTION_MODE";
    case CUDNN_KNOB_TYPE_SPLIT_K_SLC: return "SPLIT_K_SLC";
    case CUDNN_KNOB_TYPE_IDX_MODE: return "IDX_MODE";
    case CUDNN_KNOB_TYPE_SPECFILT: return "SPECFILT";
    case CUDNN_KNOB_TYPE_KERNEL_CFG: return "KERNEL_CFG";
    case CUDNN_KNOB_TYPE_WORKSPACE: return "WORKSPACE";
    case CUDNN_KNOB_TYPE_TILE_CGA_M: return "TILE_CGA_M";
    case CUDNN_KNOB_TYPE_TILE_CGA_N: return "TILE_CGA_N";
    case CUDNN_KNOB_TYPE_BLOCK_SIZE: return "BLOCK_SIZE";
    case CUDNN_KNOB_TYPE_OCCUPANCY: return "OCCUPANCY";
    case CUDNN_KNOB_TYPE_ARRAY_SIZE_PER_THREAD: return "ARRAY_SIZE_PER_THREAD";
    case CUDNN_KNOB_TYPE_SPLIT_COLS: return "SPLIT_COLS";
    case CUDNN_KNOB_TYPE_TILE_ROWS: return "TILE_ROWS";
    case CUDNN_KNOB_TYPE_TILE_COLS: return "TILE_COLS";
    case CUDNN_KNOB_TYPE_LOAD_SIZE: return "LOAD_SIZE";
    case CUDNN_KNOB_TYPE_CTA_COUNT: return "CTA_COUNT";
    case CUDNN_KNOB_TYPE_STREAM_K: return "STREAM_K";
    case CUDNN_KNOB_TYPE_SPLIT_P_SLC: return "SPLIT_P_SLC";
    case CUDNN_KNOB_TYPE_TILE_M: return "TILE_M";
    case CUDNN_KNOB_TYPE_TILE_N: return "TILE_N";
    case CUDNN_KNOB_TYPE_WARP_SPEC_CFG: return "WARP_SPEC_CFG";
    default: return nullptr;
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------ the library

std::unique_ptr<CudnnLibrary> CudnnLibrary::load(std::string* why) {
  std::unique_ptr<CudnnLibrary> lib(new CudnnLibrary());
  std::string tried;
  for (const char* name : {"libcudnn.so.9", "libcudnn_graph.so.9"}) {
    dlerror();
    lib->handle_ = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib->handle_ != nullptr) {
      lib->soname_ = name;
      break;
    }
    const char* e = dlerror();
    tried += fmt::format("{}{} not found: {}", tried.empty() ? "" : "; ", name, e ? e : "(no dlerror)");
  }
  if (lib->handle_ == nullptr) {
    if (why) *why = tried;
    return nullptr;
  }
  Api& a = lib->api_;
  const char* missing = nullptr;
  auto need = [&](const char* name, auto*& fn) {
    if (!resolve(lib->handle_, name, fn) && missing == nullptr) missing = name;
  };
  need("cudnnGetVersion", a.GetVersion);
  need("cudnnGetErrorString", a.GetErrorString);
  need("cudnnCreate", a.Create);
  need("cudnnDestroy", a.Destroy);
  need("cudnnSetStream", a.SetStream);
  need("cudnnBackendCreateDescriptor", a.BackendCreateDescriptor);
  need("cudnnBackendDestroyDescriptor", a.BackendDestroyDescriptor);
  need("cudnnBackendSetAttribute", a.BackendSetAttribute);
  need("cudnnBackendGetAttribute", a.BackendGetAttribute);
  need("cudnnBackendFinalize", a.BackendFinalize);
  need("cudnnBackendExecute", a.BackendExecute);
  resolve(lib->handle_, "cudnnGetLastErrorString", a.GetLastErrorString);  // optional
  if (missing != nullptr) {
    if (why) *why = fmt::format("{} has no {}", lib->soname_, missing);
    return nullptr;
  }
  lib->version_ = static_cast<int64_t>(a.GetVersion());
  return lib;
}

CudnnLibrary::~CudnnLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
}

std::string CudnnLibrary::version_text() const {
  return fmt::format("{}.{}.{}", version_ / 10000, (version_ % 10000) / 100, version_ % 100);
}

std::string CudnnLibrary::error_text(cudnnStatus_t status) const {
  std::string s = fmt::format("{} ({})", api_.GetErrorString(status), static_cast<int>(status));
  if (api_.GetLastErrorString != nullptr) {
    std::array<char, 2048> msg{};
    api_.GetLastErrorString(msg.data(), msg.size());
    if (msg[0] != '\0') s += fmt::format(": {}", msg.data());
  }
  return s;
}

void CudnnLibrary::check(cudnnStatus_t status, const char* what, const char* file, int line) const {
  if (status == CUDNN_STATUS_SUCCESS) return;
  detail::throw_library_error("cuDNN", ExitCode::Device, error_text(status), what, file, line);
}

// ------------------------------------------------------------------------------------------------ descriptors

BackendDescriptor::BackendDescriptor(const CudnnLibrary& lib, cudnnBackendDescriptorType_t type, std::string what)
    : lib_(&lib), what_(std::move(what)) {
  const cudnnStatus_t st = lib.api().BackendCreateDescriptor(type, &desc_);
  if (st != CUDNN_STATUS_SUCCESS) {
    desc_ = nullptr;
    throw CudnnBuildError(
        fmt::format("cudnnBackendCreateDescriptor({}, type {}): {}", what_, static_cast<int>(type), lib.error_text(st)));
  }
}

BackendDescriptor::~BackendDescriptor() {
  if (desc_ != nullptr) lib_->api().BackendDestroyDescriptor(desc_);
}

BackendDescriptor::BackendDescriptor(BackendDescriptor&& o) noexcept
    : lib_(o.lib_), desc_(std::exchange(o.desc_, nullptr)), what_(std::move(o.what_)) {}

BackendDescriptor& BackendDescriptor::operator=(BackendDescriptor&& o) noexcept {
  if (this != &o) {
    if (desc_ != nullptr) lib_->api().BackendDestroyDescriptor(desc_);
    lib_ = o.lib_;
    desc_ = std::exchange(o.desc_, nullptr);
    what_ = std::move(o.what_);
  }
  return *this;
}

void BackendDescriptor::set(cudnnBackendAttributeName_t attr, cudnnBackendAttributeType_t type, int64_t count,
                            const void* values) const {
  const cudnnStatus_t st = lib_->api().BackendSetAttribute(desc_, attr, type, count, values);
  if (st != CUDNN_STATUS_SUCCESS)
    throw CudnnBuildError(fmt::format("cudnnBackendSetAttribute({}, attribute {}, type {}, {} element(s)): {}", what_,
                                      static_cast<int>(attr), static_cast<int>(type), count, lib_->error_text(st)));
}

void BackendDescriptor::set_desc(cudnnBackendAttributeName_t attr, const BackendDescriptor& d) const {
  cudnnBackendDescriptor_t raw = d.get();
  set(attr, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
}

cudnnStatus_t BackendDescriptor::try_finalize() const { return lib_->api().BackendFinalize(desc_); }

void BackendDescriptor::finalize() const {
  const cudnnStatus_t st = try_finalize();
  if (st != CUDNN_STATUS_SUCCESS)
    throw CudnnBuildError(fmt::format("cudnnBackendFinalize({}): {}", what_, lib_->error_text(st)));
}

// ------------------------------------------------------------------------------------------------ realization

RealizedGraph realize_operations(const CudnnLibrary& lib, const SdpaGraph& g) {
  RealizedGraph r;
  r.tensors.resize(g.tensors.size());
  auto index_of = [&](int64_t uid) -> size_t {
    for (size_t i = 0; i < g.tensors.size(); ++i)
      if (g.tensors[i].uid == uid) return i;
    throw CudnnBuildError(fmt::format("SDPA graph: no tensor #{}", uid));
  };
  auto make_tensor = [&](size_t i) {
    const GraphTensor& t = g.tensors[i];
    BackendDescriptor d(lib, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor " + t.name);
    const cudnnDataType_t dtype = t.dtype;
    d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dtype);
    d.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, t.dims.data());
    d.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, t.strides.data());
    d.set_int64(CUDNN_ATTR_TENSOR_UNIQUE_ID, t.uid);
    d.set_int64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16);
    const bool is_virtual = t.is_virtual, by_value = t.by_value;
    if (is_virtual) d.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) d.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    if (t.ragged_offset_uid != 0) {
      const BackendDescriptor& offsets = r.tensors[index_of(t.ragged_offset_uid)];
      if (offsets.get() == nullptr)
        throw CudnnBuildError(fmt::format("SDPA graph: ragged offsets of {} not realized first", t.name));
      d.set_desc(CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, offsets);
    }
    d.finalize();
    r.tensors[i] = std::move(d);
  };
  // The offset tensors first: tensors refer to them.
  for (size_t i = 0; i < g.tensors.size(); ++i)
    if (g.tensors[i].ragged_offset_uid == 0) make_tensor(i);
  for (size_t i = 0; i < g.tensors.size(); ++i)
    if (g.tensors[i].ragged_offset_uid != 0) make_tensor(i);

  auto tensor = [&](int64_t uid) -> const BackendDescriptor& { return r.tensors[index_of(uid)]; };
  for (const GraphOp& op : g.ops) {
    switch (op.kind) {
      case GraphOpKind::Matmul: {
        BackendDescriptor md(lib, CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul descriptor " + op.name);
        const cudnnDataType_t compute = op.compute;
        md.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
        if (op.padded_matmul) {
          const double padding = 0.0;
          md.set(CUDNN_ATTR_MATMUL_PADDING_VALUE, CUDNN_TYPE_DOUBLE, 1, &padding);
        }
        md.finalize();
        BackendDescriptor d(lib, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul " + op.name);
        d.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, tensor(op.x));
        d.set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, tensor(op.b));
        d.set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, tensor(op.y));
        d.set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, md);
        if (op.m_override) d.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, tensor(op.m_override));
        if (op.n_override) d.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, tensor(op.n_override));
        if (op.k_override) d.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, tensor(op.k_override));
        d.finalize();
        r.parameters.push_back(std::move(md));
        r.operations.push_back(std::move(d));
        break;
      }
      case GraphOpKind::Pointwise: {
        BackendDescriptor pd(lib, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise descriptor " + op.name);
        const cudnnPointwiseMode_t mode = op.pointwise;
        const cudnnDataType_t compute = op.compute;
        pd.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
        pd.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &compute);
        if (op.pointwise == CUDNN_POINTWISE_GEN_INDEX) pd.set_int64(CUDNN_ATTR_POINTWISE_AXIS, op.axis);
        pd.finalize();
        BackendDescriptor d(lib, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise " + op.name);
        d.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pd);
        d.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, tensor(op.x));
        if (op.b) d.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, tensor(op.b));
        if (op.t) d.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, tensor(op.t));
        d.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, tensor(op.y));
        d.finalize();
        r.parameters.push_back(std::move(pd));
        r.operations.push_back(std::move(d));
        break;
      }
      case GraphOpKind::Reduction: {
        BackendDescriptor rd(lib, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction descriptor " + op.name);
        const cudnnReduceTensorOp_t mode = op.reduction;
        const cudnnDataType_t compute = op.compute;
        rd.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
        rd.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
        rd.finalize();
        BackendDescriptor d(lib, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction " + op.name);
        d.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, tensor(op.x));
        d.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, tensor(op.y));
        d.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd);
        d.finalize();
        r.parameters.push_back(std::move(rd));
        r.operations.push_back(std::move(d));
        break;
      }
      case GraphOpKind::Reshape: {
        BackendDescriptor d(lib, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape " + op.name);
        d.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, tensor(op.x));
        d.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, tensor(op.y));
        d.finalize();
        r.operations.push_back(std::move(d));
        break;
      }
    }
  }
  return r;
}

void finalize_graph(const CudnnLibrary& lib, RealizedGraph& r, cudnnHandle_t handle) {
  BackendDescriptor graph(lib, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
  std::vector<cudnnBackendDescriptor_t> ops;
  ops.reserve(r.operations.size());
  for (const BackendDescriptor& d : r.operations) ops.push_back(d.get());
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops.size()), ops.data());
  if (handle != nullptr) graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  graph.finalize();
  r.graph = std::move(graph);
}

BackendDescriptor device_properties(const CudnnLibrary& lib, const std::string& json) {
  BackendDescriptor d(lib, CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, "device properties");
  d.set(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, static_cast<int64_t>(json.size() + 1), json.c_str());
  d.finalize();
  return d;
}

// ------------------------------------------------------------------------------------------------ plans

std::string ExecutionPlan::describe() const {
  return fmt::format("engine {}{}{}{}", engine, knobs.empty() ? "" : " (" + knobs + ")",
                     runtime_compiled ? ", runtime-compiled" : "",
                     nondeterministic ? ", nondeterministic" : ", deterministic");
}

std::string PlanAttempt::describe() const {
  std::string notes = nondeterministic ? "nondeterministic" : "deterministic";
  if (runtime_compiled) notes += ", runtime-compiled";
  return fmt::format("engine {} [{}{}]: {}", engine, notes, knobs.empty() ? "" : "; " + knobs,
                     skipped ? "skipped (nondeterministic)" : text);
}

ExecutionPlan choose_plan(const CudnnLibrary& lib, const BackendDescriptor& graph, cudnnHandle_t handle,
                          const BackendDescriptor* device, bool deterministic_only, std::vector<PlanAttempt>* attempts) {
  const auto& api = lib.api();
  std::string answers;
  int tried = 0;
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    const char* mode_name = mode == CUDNN_HEUR_MODE_A ? "A" : "fallback";
    BackendDescriptor heur(lib, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, fmt::format("engine heuristics ({})", mode_name));
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (handle == nullptr && device != nullptr) heur.set_desc(CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, *device);
    if (const cudnnStatus_t st = heur.try_finalize(); st != CUDNN_STATUS_SUCCESS) {
      answers += fmt::format("; heuristics {}: {}", mode_name, lib.error_text(st));
      continue;
    }
    int64_t count = 0;
    if (const cudnnStatus_t st = api.BackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
        st != CUDNN_STATUS_SUCCESS) {
      answers += fmt::format("; heuristics {} results: {}", mode_name, lib.error_text(st));
      continue;
    }
    std::vector<BackendDescriptor> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      configs.emplace_back(lib, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, fmt::format("engine config {}", i));
      raw.push_back(configs.back().get());
    }
    int64_t got = 0;
    if (count > 0) {
      if (const cudnnStatus_t st = api.BackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data());
          st != CUDNN_STATUS_SUCCESS) {
        answers += fmt::format("; heuristics {} results: {}", mode_name, lib.error_text(st));
        continue;
      }
    }
    // Configs the heuristics name but then hold back fail a runtime prerequisite (cuDNN's log says which: no
    // driver library for runtime-compiled engines, for one).
    if (got == 0) answers += fmt::format("; heuristics {}: {} config(s) named, none usable", mode_name, count);
    for (int64_t i = 0; i < got; ++i) {
      ++tried;
      const BackendDescriptor& cfg = configs[static_cast<size_t>(i)];
      ExecutionPlan p;
      PlanAttempt at;
      BackendDescriptor engine(lib, CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine");
      cudnnBackendDescriptor_t engine_raw = engine.get();
      int64_t n = 0;
      if (api.BackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                  &engine_raw) == CUDNN_STATUS_SUCCESS) {
        api.BackendGetAttribute(engine_raw, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &at.engine);
        std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
        if (api.BackendGetAttribute(engine_raw, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                    static_cast<int64_t>(notes.size()), &n, notes.data()) == CUDNN_STATUS_SUCCESS)
          for (int64_t k = 0; k < n; ++k)
            at.nondeterministic |= notes[static_cast<size_t>(k)] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
        std::array<cudnnBackendBehaviorNote_t, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT> behaviors{};
        if (api.BackendGetAttribute(engine_raw, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                    static_cast<int64_t>(behaviors.size()), &n, behaviors.data()) == CUDNN_STATUS_SUCCESS)
          for (int64_t k = 0; k < n; ++k)
            at.runtime_compiled |= behaviors[static_cast<size_t>(k)] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION;
      }
      std::vector<BackendDescriptor> knobs;
      std::vector<cudnnBackendDescriptor_t> knobs_raw;
      for (int k = 0; k < CUDNN_KNOB_TYPE_COUNTS; ++k) {
        knobs.emplace_back(lib, CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, "knob choice");
        knobs_raw.push_back(knobs.back().get());
      }
      if (api.BackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                  static_cast<int64_t>(knobs_raw.size()), &n, knobs_raw.data()) == CUDNN_STATUS_SUCCESS) {
        for (int64_t k = 0; k < n; ++k) {
          cudnnBackendKnobType_t type{};
          int64_t value = 0, m = 0;
          api.BackendGetAttribute(knobs_raw[static_cast<size_t>(k)], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE,
                                  1, &m, &type);
          api.BackendGetAttribute(knobs_raw[static_cast<size_t>(k)], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1,
                                  &m, &value);
          const char* name = knob_name(type);
          at.knobs += fmt::format("{}{}={}", at.knobs.empty() ? "" : " ",
                                  name ? std::string(name) : fmt::format("knob{}", static_cast<int>(type)), value);
        }
      }
      auto record = [&](PlanAttempt a) {
        answers += "; " + a.describe();
        if (attempts) attempts->push_back(std::move(a));
      };
      if (deterministic_only && at.nondeterministic) {
        at.skipped = true;
        at.status = CUDNN_STATUS_NOT_SUPPORTED;
        record(at);
        continue;
      }
      BackendDescriptor plan(lib, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
                             fmt::format("execution plan (engine {})", at.engine));
      if (handle != nullptr) {
        plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
      } else if (device != nullptr) {
        plan.set_desc(CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, *device);
      }
      plan.set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
      at.status = plan.try_finalize();
      if (at.status == CUDNN_STATUS_SUCCESS)
        at.status = api.BackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                            &p.workspace_bytes);
      at.text = lib.error_text(at.status);
      if (at.status != CUDNN_STATUS_SUCCESS) {
        record(at);
        continue;
      }
      p.engine = at.engine;
      p.knobs = at.knobs;
      p.nondeterministic = at.nondeterministic;
      p.runtime_compiled = at.runtime_compiled;
      p.plan = std::move(plan);
      p.config = std::move(configs[static_cast<size_t>(i)]);  // the plan refers to it
      p.tried = tried;
      if (attempts) attempts->push_back(std::move(at));
      return p;
    }
  }
  throw CudnnBuildError(fmt::format("no engine for this graph ({} config(s) tried{})", tried, answers));
}

}  // namespace shardtrain::ops::cuda
