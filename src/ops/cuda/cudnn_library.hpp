// cuDNN loaded at run time: dlopen of libcudnn.so.9 (else libcudnn_graph.so.9) and a table of the backend-API
// functions resolved from it, so that shardtrain never links cuDNN and starts where none is installed (CPU CI,
// the host CUDA emulator, machines without cuDNN). On top: owned backend descriptors, the realization of an
// SdpaGraph (cudnn_sdpa_graph.hpp) into finalized descriptors, and the choice of an engine and execution plan.
// cuDNN's headers give the enums and types only.
#pragma once

#include <cudnn_graph.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cudnn_sdpa_graph.hpp"

namespace shardtrain::ops::cuda {

// A failure while describing, realizing or planning a graph (an attribute cuDNN refuses, a graph no engine
// takes): the caller turns its message into an unsupported reason and falls back. Failures while executing a
// built plan are LibraryErrors (exit code Device) instead.
class CudnnBuildError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class CudnnLibrary {
 public:
  // The library, or null with the reason in *why: "libcudnn.so.9 not found: <dlerror>; libcudnn_graph.so.9 not
  // found: <dlerror>", or a missing function.
  static std::unique_ptr<CudnnLibrary> load(std::string* why);
  ~CudnnLibrary();
  CudnnLibrary(const CudnnLibrary&) = delete;
  CudnnLibrary& operator=(const CudnnLibrary&) = delete;

  int64_t version() const { return version_; }  // cudnnGetVersion(): 91900 for 9.19.0
  std::string version_text() const;             // "9.19.0"
  const std::string& soname() const { return soname_; }
  // "<status name> (<code>): <cuDNN's last error message>" (the message when cudnnGetLastErrorString exists and
  // has one). Call right after the failing call: the message is the calling thread's latest.
  std::string error_text(cudnnStatus_t status) const;
  // Throws LibraryError ("cuDNN", exit code Device) naming `what` and error_text(status) unless status is success.
  void check(cudnnStatus_t status, const char* what, const char* file, int line) const;

  struct Api {
    size_t (*GetVersion)();
    const char* (*GetErrorString)(cudnnStatus_t);
    void (*GetLastErrorString)(char*, size_t);  // null where the library has none
    cudnnStatus_t (*Create)(cudnnHandle_t*);
    cudnnStatus_t (*Destroy)(cudnnHandle_t);
    cudnnStatus_t (*SetStream)(cudnnHandle_t, cudaStream_t);
    cudnnStatus_t (*BackendCreateDescriptor)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t*);
    cudnnStatus_t (*BackendDestroyDescriptor)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*BackendSetAttribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                                         int64_t, const void*);
    cudnnStatus_t (*BackendGetAttribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                                         int64_t, int64_t*, void*);
    cudnnStatus_t (*BackendFinalize)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*BackendExecute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
  };
  const Api& api() const { return api_; }

 private:
  CudnnLibrary() = default;
  void* handle_ = nullptr;  // dlopen's
  std::string soname_;
  int64_t version_ = 0;
  Api api_{};
};

#define ST_CHECK_CUDNN(lib, stmt) (lib).check((stmt), #stmt, __FILE__, __LINE__)

// An owned backend descriptor. Move-only; destroyed (cudnnBackendDestroyDescriptor) with the object. Every
// setter and finalize throws CudnnBuildError naming the descriptor's `what`, the attribute and cuDNN's text.
class BackendDescriptor {
 public:
  BackendDescriptor() = default;
  BackendDescriptor(const CudnnLibrary& lib, cudnnBackendDescriptorType_t type, std::string what);
  ~BackendDescriptor();
  BackendDescriptor(BackendDescriptor&& o) noexcept;
  BackendDescriptor& operator=(BackendDescriptor&& o) noexcept;
  BackendDescriptor(const BackendDescriptor&) = delete;
  BackendDescriptor& operator=(const BackendDescriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return desc_; }
  const std::string& what() const { return what_; }
  void set(cudnnBackendAttributeName_t attr, cudnnBackendAttributeType_t type, int64_t count, const void* values) const;
  void set_int64(cudnnBackendAttributeName_t attr, int64_t v) const { set(attr, CUDNN_TYPE_INT64, 1, &v); }
  void set_desc(cudnnBackendAttributeName_t attr, const BackendDescriptor& d) const;
  void finalize() const;
  // cudnnBackendFinalize's status, without throwing (plans that may not finalize).
  cudnnStatus_t try_finalize() const;

 private:
  const CudnnLibrary* lib_ = nullptr;
  cudnnBackendDescriptor_t desc_ = nullptr;
  std::string what_;
};

// An SdpaGraph realized: a finalized descriptor per tensor and per operation (plus the matmul, pointwise and
// reduction descriptors those reference), and the operation graph over the operations.
struct RealizedGraph {
  std::vector<BackendDescriptor> tensors;     // in SdpaGraph::tensors order
  std::vector<BackendDescriptor> parameters;  // matmul / pointwise / reduction descriptors
  std::vector<BackendDescriptor> operations;  // in SdpaGraph::ops order
  BackendDescriptor graph;                    // set by finalize_graph
};

// Creates and finalizes every tensor and operation descriptor of `g`. Needs neither a handle nor a device: it
// catches wrong attribute types, counts and inconsistent dims. Throws CudnnBuildError.
RealizedGraph realize_operations(const CudnnLibrary& lib, const SdpaGraph& g);
// The operation graph over the realized operations, tied to `handle` when one is given (older cuDNN 9 releases
// want it; deviceless planning has none). Throws CudnnBuildError.
void finalize_graph(const CudnnLibrary& lib, RealizedGraph& r, cudnnHandle_t handle);

// A described device for deviceless planning (cuDNN 9.11 and later take its properties as JSON, as cudnn-frontend's
// DeviceProperties serializes them). Throws CudnnBuildError.
BackendDescriptor device_properties(const CudnnLibrary& lib, const std::string& json);

struct ExecutionPlan {
  BackendDescriptor plan;
  BackendDescriptor config;  // the engine config the plan was finalized from
  int64_t workspace_bytes = 0;
  int64_t engine = -1;            // the engine's global index
  std::string knobs;              // "TILE_M=2 STAGES=4 ..." (knob type numbers where no name is known)
  bool nondeterministic = false;  // the engine carries CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC
  bool runtime_compiled = false;  // CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION
  int tried = 0;                  // engine configs tried before this one finalized
  std::string describe() const;   // "engine 8 (knobs ...), runtime-compiled, deterministic"
};

// One engine config the heuristics proposed, and what became of it.
struct PlanAttempt {
  int64_t engine = -1;
  std::string knobs;
  bool nondeterministic = false, runtime_compiled = false;
  bool skipped = false;                         // nondeterministic where a deterministic engine was wanted
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;  // of the execution plan's finalize
  std::string text;                             // CudnnLibrary::error_text(status)
  std::string describe() const;
};

// Asks the heuristics (mode A, then FALLBACK) for engine configs of a finalized operation graph and returns the
// first whose plan finalizes, skipping engines noted nondeterministic when `deterministic_only`. With `handle`
// the plan is the device's; without, it is built for `device` (deviceless). Throws CudnnBuildError listing what
// each config answered when none finalizes. Every config tried is appended to *attempts when given.
ExecutionPlan choose_plan(const CudnnLibrary& lib, const BackendDescriptor& graph, cudnnHandle_t handle,
                          const BackendDescriptor* device, bool deterministic_only,
                          std::vector<PlanAttempt>* attempts = nullptr);

}  // namespace shardtrain::ops::cuda
