// Built without CUDA: no NCCL backend.
#include "shardtrain/comm/mesh_comms.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain {
bool nccl_built() { return false; }
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm, MeshAxis) {
  throw Error(ExitCode::Device, "the NCCL backend needs a build with CUDA (SHARDTRAIN_CUDA=ON)");
}
}  // namespace shardtrain
