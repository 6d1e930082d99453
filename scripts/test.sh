#!/usr/bin/env bash
# The whole test suite: installs what is missing, fetches the pinned test data, configures,
# builds, and runs every test through ctest. Extra arguments go to ctest (e.g. -L mpi, -R fsdp).
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$ROOT"

"$ROOT/scripts/setup.sh"
mkdir -p "$BUILD_DIR"
# The pinned corpora and tokenizers, and PyTorch and transformers (Debian's CPU builds, in a Debian root of their
# own) for the tests labelled torch: shardtrain against LlamaForCausalLM, its export through from_pretrained,
# bench-vs-pytorch.py's PyTorch side. Both wait on the network and the disk more than on the cores, and the build
# needs neither: they run beside it (on a clean clone, minutes), their output kept for when they are needed (the
# PyTorch environment only by the tests labelled torch, which run last).
# Where the PyTorch environment cannot be made (no root, no network), the tests labelled torch skip and say why.
fetch_log="$BUILD_DIR/fetch-data.log" torch_log="$BUILD_DIR/torch-env.log"
fetch_pid="" torch_pid=""
if [[ -x "$ROOT/scripts/fetch-data.sh" ]]; then
  say "fetching pinned corpora and tokenizers (beside the build; $fetch_log)"
  "$ROOT/scripts/fetch-data.sh" >"$fetch_log" 2>&1 &
  fetch_pid=$!
fi
say "PyTorch and transformers for the reference tests (scripts/torch-env.sh, beside the build; $torch_log)"
"$ROOT/scripts/torch-env.sh" setup >"$torch_log" 2>&1 &
torch_pid=$!
# A failed build stops here: leave nothing running behind it.
trap '[[ -n "$fetch_pid" ]] && kill "$fetch_pid" 2>/dev/null; kill "$torch_pid" 2>/dev/null; true' EXIT

CMAKE_EXTRA=()
configure_and_build

# The GPU tests once more, on the host CUDA emulator (docs/gpu.md): the CUDA backend's host code, launchers and
# kernels, the engine's streams in an adversarial order, device memory the host cannot touch. A second build
# tree (same objects through ccache, the emulator and host-compiled kernels instead of the CUDA libraries),
# built before any test runs. Skipped when ctest was asked for a subset (arguments given) or
# SHARDTRAIN_SKIP_EMULATED=1.
# A failed emulated build fails the run but still lets the first tree's tests run.
status=0 emulated=0
EMULATED_BUILD_DIR="${SHARDTRAIN_EMULATED_BUILD_DIR:-$ROOT/build-emulated}"
if [[ $# -eq 0 && "${SHARDTRAIN_SKIP_EMULATED:-0}" != 1 ]]; then
  if (BUILD_DIR="$EMULATED_BUILD_DIR" && CMAKE_EXTRA=(-DSHARDTRAIN_CUDA=EMULATED) && configure_and_build gpu_tests); then
    emulated=1
  else
    say "the CUDA-emulated build failed (above): its GPU tests will not run"
    status=1
  fi
fi

if [[ -n "$fetch_pid" ]]; then
  if wait "$fetch_pid"; then tail -n 3 "$fetch_log"; else
    cat "$fetch_log"
    say "fetching the test data failed (above)"
    exit 1
  fi
fi
wait_torch_env() {
  if wait "$torch_pid"; then tail -n 1 "$torch_log"; else
    tail -n 5 "$torch_log"
    say "no PyTorch environment: the tests labelled torch will skip"
  fi
  trap - EXIT
}

if [[ $# -gt 0 ]]; then
  wait_torch_env
  say "running the tests"
  ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$JOBS" "$@" || status=$?
  exit $status
fi
# The whole suite: the tests that need no PyTorch first, so that a PyTorch environment still being made (a clean
# clone's debootstrap) is made beside them; then the GPU tests on the emulator; then those labelled torch.
say "running the tests (those labelled torch last)"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$JOBS" -LE torch || status=$?
if ((emulated)); then
  say "running the GPU tests on the CUDA emulator"
  ctest --test-dir "$EMULATED_BUILD_DIR" --output-on-failure -j"$JOBS" -L gpu || status=$?
fi
wait_torch_env
say "running the tests labelled torch"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$JOBS" -L torch || status=$?
exit $status
