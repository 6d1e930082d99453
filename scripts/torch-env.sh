#!/usr/bin/env bash
# PyTorch and Hugging Face transformers on this machine, for the checks that hold shardtrain to them
# (docs/reference-checks.md): Debian's own CPU builds (python3-torch, python3-transformers and the C++
# toolchain torch.compile's CPU backend needs), in a Debian root of their own under the git-ignored
# .deps/torch-env. The host keeps its Debian 12; Debian 12 packages neither a torch with FSDP2 nor
# transformers, the unstable suite packages both.
#
#   scripts/torch-env.sh setup          make it (debootstrap + apt; about 2.5 minutes and 2.7 GB), or bring its
#                                       packages up to the list below; nothing to do when it is complete
#   scripts/torch-env.sh status         exit 0 when it is complete and usable, else 77 and one line saying why
#   scripts/torch-env.sh versions       the versions of what it holds
#   scripts/torch-env.sh run CMD [ARG...]
#                                       CMD inside it, in the same working directory: the checkout and /tmp sit
#                                       at the same paths inside as outside, so paths pass through unchanged
#
# Needs root (chroot and a private mount namespace; CI and the containers here run as root). A machine
# where that or the network is missing gets exit 77 and the reason from every verb, which the tests
# that use it turn into a skip with that reason.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENV_DIR="${SHARDTRAIN_TORCH_ENV:-$ROOT/.deps/torch-env}"
SUITE="${SHARDTRAIN_TORCH_ENV_SUITE:-sid}"
MIRROR="${SHARDTRAIN_TORCH_ENV_MIRROR:-http://deb.debian.org/debian}"
STAMP="$ENV_DIR/.shardtrain-torch-env"
# The mirrors here serve a fixed copy of the suite, so its Release file's Valid-Until may have passed.
APT_OPTS=(-o Acquire::Check-Valid-Until=false -o APT::Install-Recommends=false -o Dpkg::Use-Pty=0)

packages=(
  python3-torch python3-transformers   # the references: FSDP2, torch.compile, LlamaForCausalLM
  python3-accelerate                   # how Accelerate and Transformers read FSDP config files (tests/torch/fsdp_configs_test.py)
  python3-safetensors python3-h5py python3-numpy
  libopenblas0-pthread                 # torch's f32 GEMMs through OpenBLAS (Debian's default BLAS is the reference one)
  libtorch-dev g++ python3-dev         # torch.compile's CPU code generation compiles C++ against torch's headers
  python3-pyarrow                      # Parquet files as fineweb's were written (tests/torch/parquet_pyarrow_test.py)
)

unavailable() {
  echo "torch-env: unavailable: $*" >&2
  exit 77
}

list_key() { printf '%s\n' "${packages[@]}" | sort | tr '\n' ' '; }

check_host() {
  [[ $(id -u) -eq 0 ]] || unavailable "needs root (chroot and a mount namespace); run as root or skip these checks"
  command -v unshare >/dev/null || unavailable "unshare (util-linux) not found"
  command -v chroot >/dev/null || unavailable "chroot (coreutils) not found"
}

complete() { [[ -f "$STAMP" && "$(cat "$STAMP")" == "$(list_key)" ]]; }

# What status, versions and run need first: a host that can enter the root, and the root complete.
require_ready() {
  check_host
  complete || unavailable "not set up (run scripts/torch-env.sh setup)"
}

# enter CMD...: runs CMD inside the root, with the checkout, /tmp and /proc mounted in a private namespace
# (the mounts vanish with the process), in the caller's working directory.
enter() {
  local cwd="$PWD"
  unshare --mount --propagation private -- /bin/sh -ec '
    r=$1 root=$2 cwd=$3; shift 3
    mkdir -p "$r$root" "$r/tmp" "$r/proc"
    mount --rbind "$root" "$r$root"
    mount --bind /tmp "$r/tmp"
    mount -t proc proc "$r/proc"
    [ -r /etc/resolv.conf ] && cp /etc/resolv.conf "$r/etc/resolv.conf" 2>/dev/null || true
    exec chroot "$r" /usr/bin/env -u LD_LIBRARY_PATH -u PYTHONPATH -u PYTHONHOME -u VIRTUAL_ENV \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
      /bin/sh -c "cd \"\$0\" && exec \"\$@\"" "$cwd" "$@"
  ' sh "$ENV_DIR" "$ROOT" "$cwd" "$@"
}

setup() {
  check_host
  if complete; then
    echo "torch-env: ready in $ENV_DIR"
    return 0
  fi
  if [[ ! -x "$ENV_DIR/usr/bin/apt-get" ]]; then
    if ! command -v debootstrap >/dev/null; then
      echo "torch-env: installing debootstrap"
      apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null ||
        unavailable "debootstrap could not be installed"
    fi
    # A root made half-way (a killed setup) is never used: it is made beside and renamed when whole.
    local partial="$ENV_DIR.partial"
    rm -rf "$partial"
    mkdir -p "$(dirname "$ENV_DIR")"
    echo "torch-env: debootstrap $SUITE from $MIRROR into $ENV_DIR"
    debootstrap --variant=minbase "$SUITE" "$partial" "$MIRROR" >"$ENV_DIR.log" 2>&1 || {
      tail -n 5 "$ENV_DIR.log" >&2
      unavailable "debootstrap of $SUITE failed (log: $ENV_DIR.log)"
    }
    rm -rf "$ENV_DIR"
    mv "$partial" "$ENV_DIR"
  fi
  echo "torch-env: apt-get install ${packages[*]}"
  if ! enter /bin/sh -c 'export DEBIAN_FRONTEND=noninteractive; apt-get "$@" update -qq &&
         apt-get "$@" install -y -qq '"${packages[*]}"' >/dev/null' sh "${APT_OPTS[@]}" >>"$ENV_DIR.log" 2>&1; then
    tail -n 5 "$ENV_DIR.log" >&2
    unavailable "apt-get inside $ENV_DIR failed (log: $ENV_DIR.log)"
  fi
  enter apt-get clean
  list_key >"$STAMP"
  echo "torch-env: ready in $ENV_DIR ($(versions | tr '\n' ' '))"
}

versions() {
  enter python3 -c 'import sys, torch, transformers, accelerate; print(f"python {sys.version.split()[0]}"); print(f"torch {torch.__version__}"); print(f"transformers {transformers.__version__}"); print(f"accelerate {accelerate.__version__}")' 2>/dev/null
}

verb="${1:-}"
[[ $# -gt 0 ]] && shift
case "$verb" in
  setup) setup ;;
  status)
    require_ready
    enter /bin/true 2>/dev/null || unavailable "$ENV_DIR cannot be entered here (unshare, mount or chroot refused)"
    ;;
  versions)
    require_ready
    versions
    ;;
  run)
    [[ $# -gt 0 ]] || { echo "usage: scripts/torch-env.sh run CMD [ARG...]" >&2; exit 2; }
    require_ready
    enter "$@"
    ;;
  *)
    echo "usage: scripts/torch-env.sh setup | status | versions | run CMD [ARG...]" >&2
    exit 2
    ;;
esac
