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
configure_and_build
say "running the tests"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$JOBS" "$@"
