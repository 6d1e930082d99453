#!/usr/bin/env bash
# The main job on a fresh machine: install, build, and run shardtrain end to end on several ranks.
# Today that is the runtime and the device mesh (`shardtrain env` on 4 ranks as 2 simulated nodes);
# it grows into the full pretraining run as the training job lands.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$ROOT"

"$ROOT/scripts/setup.sh"
configure_and_build

say "4 ranks as 2 simulated nodes of 2: the HYBRID_SHARD mesh"
mpirun --oversubscribe -np 4 "$BUILD_DIR/bin/shardtrain" env --strategy HYBRID_SHARD --ranks-per-node 2

say "the same job, as JSON for scripts"
mpirun --oversubscribe -np 4 "$BUILD_DIR/bin/shardtrain" env --strategy HYBRID_SHARD --ranks-per-node 2 --json \
  --log-level warn >"$BUILD_DIR/env.json"
echo "    written to $BUILD_DIR/env.json"

say "done. Binary: $BUILD_DIR/bin/shardtrain (try: $BUILD_DIR/bin/shardtrain --help)"
