#!/usr/bin/env bash
# The whole test suite: installs what is missing, fetches the pinned test data, configures,
# builds, and runs every test through ctest. Extra arguments go to ctest (e.g. -L mpi, -R fsdp).
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$ROOT"

"$ROOT/scripts/setup.sh"
if [[ -x "$ROOT/scripts/fetch-data.sh" ]]; then
  say "fetching pinned corpora and tokenizers"
  "$ROOT/scripts/fetch-data.sh"
fi
# PyTorch and transformers (Debian's CPU builds, in a Debian root of their own) for the tests labelled torch:
# shardtrain against LlamaForCausalLM, its export through from_pretrained, bench-vs-pytorch.py's PyTorch side.
# Where it cannot be made (no root, no network), those tests skip and say why.
say "PyTorch and transformers for the reference tests (scripts/torch-env.sh)"
"$ROOT/scripts/torch-env.sh" setup || say "no PyTorch environment: the tests labelled torch will skip"
CMAKE_EXTRA=()
configure_and_build
say "running the tests"
status=0
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$JOBS" "$@" || status=$?

# The GPU tests once more, on the host CUDA emulator (docs/gpu.md): the CUDA backend's host code, launchers and
# kernels, the engine's streams in an adversarial order, device memory the host cannot touch. A second build
# tree (same objects through ccache, the emulator and host-compiled kernels instead of the CUDA libraries).
# Skipped when ctest was asked for a subset (arguments given) or SHARDTRAIN_SKIP_EMULATED=1.
if [[ $# -eq 0 && "${SHARDTRAIN_SKIP_EMULATED:-0}" != 1 ]]; then
  BUILD_DIR="${SHARDTRAIN_EMULATED_BUILD_DIR:-$ROOT/build-emulated}"
  CMAKE_EXTRA=(-DSHARDTRAIN_CUDA=EMULATED)
  configure_and_build gpu_tests
  say "running the GPU tests on the CUDA emulator"
  ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$JOBS" -L gpu || status=$?
fi
exit $status
