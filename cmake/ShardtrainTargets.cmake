# Helpers that give every layer and test the same shape.
#
#   shardtrain_add_layer(NAME SOURCES ... [DEPS ...] [PRIVATE_DEPS ...])
#     -> static library shardtrain_NAME, alias shardtrain::NAME, public include/ directory.
#   shardtrain_add_test(NAME SOURCES ... LIBS ... LABELS cpu|mpi|gpu|slurm|torch [RANKS n ...]
#                       [RANKS_PER_NODE n] [TIMEOUT s] [MPI_MAIN] [ENV VAR=value ...])
#     -> one gtest binary, registered with ctest once per rank count (NAME.npN when RANKS is given).
#   shardtrain_add_test(NAME TARGET binary LABELS ... [RANKS n ...] [RANKS_PER_NODE n] [TIMEOUT s] [ENV ...])
#     -> the gtest binary of an earlier call registered again under NAME (another environment, say).
#   shardtrain_add_test(NAME COMMAND cmd arg ... LABELS ... [TIMEOUT s] [PROCESSORS n] [ENV ...]
#                       [SKIP_RETURN_CODE n])
#     -> a script test, registered once as NAME (it starts mpirun itself where it needs ranks). PROCESSORS: the
#        cores it keeps busy on average (measured, e.g. in a cpuacct cgroup), not the ranks it starts: an end-to-end
#        script mostly waits (mpirun's start, a timeout, a stalled rank, Slurm), and ctest -j2 packs tests by this
#        number, so an inflated one leaves a core idle. Default 1.
#   Every test runs with SHARDTRAIN_MPI_TEST_ENV (and SHARDTRAIN_RANKS_PER_NODE, ENV); TIMEOUT defaults to 300.

set(SHARDTRAIN_WARNINGS -Wall -Wextra -Wpedantic -Wno-unused-parameter)

function(shardtrain_add_layer name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(shardtrain_${name} STATIC ${A_SOURCES})
  add_library(shardtrain::${name} ALIAS shardtrain_${name})
  target_include_directories(shardtrain_${name} PUBLIC ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(shardtrain_${name} PUBLIC ${A_DEPS} PRIVATE ${A_PRIVATE_DEPS})
  target_compile_options(shardtrain_${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${SHARDTRAIN_WARNINGS}>)
  if(SHARDTRAIN_NATIVE)
    target_compile_options(shardtrain_${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
    # Code that otherwise builds clones per instruction set (src/ops/cpu/rows_f32.cpp) builds one, for this CPU.
    target_compile_definitions(shardtrain_${name} PRIVATE SHARDTRAIN_NATIVE_ARCH=1)
  endif()
  set_target_properties(shardtrain_${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()

# Environment every MPI test runs with: root allowed (CI runs as root), shared-memory transport
# without CMA (containers forbid ptrace), ranks yield when idle (2 cores, up to 6 ranks).
set(SHARDTRAIN_MPI_TEST_ENV
  OMPI_ALLOW_RUN_AS_ROOT=1
  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  OMPI_MCA_btl_vader_single_copy_mechanism=none
  OMPI_MCA_mpi_yield_when_idle=1
  OMPI_MCA_rmaps_base_oversubscribe=1)

function(shardtrain_add_test name)
  cmake_parse_arguments(A "MPI_MAIN" "TARGET;RANKS_PER_NODE;TIMEOUT;PROCESSORS;SKIP_RETURN_CODE"
                        "SOURCES;LIBS;LABELS;RANKS;COMMAND;ENV" ${ARGN})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  set(env ${SHARDTRAIN_MPI_TEST_ENV})
  if(A_RANKS_PER_NODE)
    list(APPEND env SHARDTRAIN_RANKS_PER_NODE=${A_RANKS_PER_NODE})
  endif()
  list(APPEND env ${A_ENV})
  if(A_COMMAND)
    add_test(NAME ${name} COMMAND ${A_COMMAND})
    set_tests_properties(${name} PROPERTIES LABELS "${A_LABELS}" TIMEOUT ${A_TIMEOUT} ENVIRONMENT "${env}")
    if(A_PROCESSORS)
      set_tests_properties(${name} PROPERTIES PROCESSORS ${A_PROCESSORS})
    endif()
    if(A_SKIP_RETURN_CODE)
      set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE ${A_SKIP_RETURN_CODE})
    endif()
    return()
  endif()
  set(binary ${name})
  if(A_TARGET)
    set(binary ${A_TARGET})
  elseif(NOT TARGET ${name})  # a second call registers more rank counts for the same binary
    add_executable(${name} ${A_SOURCES})
    target_link_libraries(${name} PRIVATE ${A_LIBS} GTest::gtest)
    if(A_MPI_MAIN)
      target_link_libraries(${name} PRIVATE shardtrain_test_mpi_main)
    else()
      target_link_libraries(${name} PRIVATE GTest::gtest_main)
    endif()
    target_compile_options(${name} PRIVATE ${SHARDTRAIN_WARNINGS})
    target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})  # "tests/common/..." helpers
    set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  endif()
  if("gpu" IN_LIST A_LABELS)  # the `gpu_tests` target builds these (tests/CMakeLists.txt)
    set_property(GLOBAL APPEND PROPERTY SHARDTRAIN_GPU_TEST_TARGETS ${binary})
  endif()
  if(NOT A_RANKS)
    add_test(NAME ${name} COMMAND ${binary})
    set_tests_properties(${name} PROPERTIES LABELS "${A_LABELS}" TIMEOUT ${A_TIMEOUT} ENVIRONMENT "${env}"
                         SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
    return()
  endif()
  foreach(np IN LISTS A_RANKS)
    set(test_name ${name}.np${np})
    if(A_RANKS_PER_NODE)
      set(test_name ${name}.np${np}.rpn${A_RANKS_PER_NODE})
    endif()
    add_test(NAME ${test_name}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe $<TARGET_FILE:${binary}>)
    set(procs ${np})
    if(procs GREATER 2)
      set(procs 2)
    endif()
    set_tests_properties(${test_name} PROPERTIES LABELS "${A_LABELS}" TIMEOUT ${A_TIMEOUT}
                         ENVIRONMENT "${env}" PROCESSORS ${procs}
                         SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
  endforeach()
endfunction()

# The ops of kernels/, one <op>.cu each (kernels/CMakeLists.txt builds them; the SIMT emulator runs them too).
set(SHARDTRAIN_KERNELS adamw attention_bwd attention_fwd attention_mma attention_segments attention_sequences cast
    cross_entropy data_error elementwise embedding rmsnorm rope rope_qkv sum_squares swiglu)

# The kernels' host build uses the FMA instructions where the build machine has them: fmaf() is then one
# instruction instead of a call into libm, which also kept the kernels' register tiles in memory. The fp32
# attention kernels run 12x faster on the emulator (a 4-step run of the tiny model, 63 s -> 5 s), with the same
# results bit for bit: a fused multiply-add rounds once either way, and -ffp-contract=off (below) keeps every
# other a * b + c unfused. Checked by running, so that a machine without FMA builds the portable form.
include(CheckCXXSourceRuns)
set(CMAKE_REQUIRED_FLAGS -mfma)
check_cxx_source_runs("int main() { return __builtin_cpu_supports(\"fma\") ? 0 : 1; }" SHARDTRAIN_HOST_FMA)
unset(CMAKE_REQUIRED_FLAGS)
set(SHARDTRAIN_EMULATED_KERNEL_FLAGS -Wno-unknown-pragmas -ffp-contract=off)
if(SHARDTRAIN_HOST_FMA)
  list(APPEND SHARDTRAIN_EMULATED_KERNEL_FLAGS -mfma)
endif()

# shardtrain_emulated_kernel_sources(OUT PRELUDE): the kernels' source for the SIMT emulator, one generated
# translation unit per .cu file (each keeps its helpers in an anonymous namespace) that starts with the line
# PRELUDE; their list in OUT.
function(shardtrain_emulated_kernel_sources out prelude)
  set(sources)
  foreach(k IN LISTS SHARDTRAIN_KERNELS)
    set(f ${CMAKE_CURRENT_BINARY_DIR}/emulated/${k}.cpp)
    file(CONFIGURE OUTPUT ${f} CONTENT "// Generated (cmake/ShardtrainTargets.cmake): kernels/${k}.cu for the SIMT emulator.
${prelude}
#include \"kernels/${k}.cu\"
")
    list(APPEND sources ${f})
  endforeach()
  # #pragma unroll is nvcc's; no FMA contraction, so the _rn operations round as on the GPU.
  set_source_files_properties(${sources} PROPERTIES COMPILE_OPTIONS "${SHARDTRAIN_EMULATED_KERNEL_FLAGS}")
  set(${out} ${sources} PARENT_SCOPE)
endfunction()
