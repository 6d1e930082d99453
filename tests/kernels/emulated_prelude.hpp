// Included first by every translation unit that compiles a kernels/*.cu file for the SIMT emulator (generated
// by tests/kernels/CMakeLists.txt: one per .cu file, since each keeps its helpers in an anonymous namespace),
// and by the tests before the launchers' headers. It selects the emulator branch of kernels/simt.cuh and
// renames namespace shardtrain::kernels to shardtrain::kernels_emulated, so the emulated launchers link beside
// the CUDA library that shardtrain::ops brings (same function names, other namespace): the tests call
// kernels_emulated::rmsnorm_forward(...) with host pointers and the kernels' own source runs, launcher and
// all, one fiber per GPU thread. Include it after every other header of the translation unit.
#pragma once

#ifndef SHARDTRAIN_SIMT_EMULATOR
#define SHARDTRAIN_SIMT_EMULATOR 1
#endif

#include <stdexcept>
#include <string>

#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/dtype.hpp"
#include "shardtrain/runtime/error.hpp"

// The launchers' CUDA checks: the emulator's runtime stand-ins return 0 or throw themselves, and a launch has
// run to completion (or thrown) when simt::launch returns.
#undef ST_CHECK_CUDA
#define ST_CHECK_CUDA(stmt)                                                                       \
  do {                                                                                            \
    if (static_cast<int>(stmt) != 0) throw std::runtime_error(std::string("emulated: ") + #stmt); \
  } while (0)
#undef ST_CHECK_KERNEL
#define ST_CHECK_KERNEL(name) ((void)(name))

#define kernels kernels_emulated
