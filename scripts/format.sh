#!/usr/bin/env bash
# Formats the tracked C++ and CUDA sources with clang-format and the repository's .clang-format (written for
# Debian 12's clang-format 14: another version may place a few line breaks differently).
#   scripts/format.sh                  rewrite every tracked .cpp .hpp .h .cc .cu .cuh in place
#   scripts/format.sh --check          change nothing; list the files that differ, exit 1 if one does
#   scripts/format.sh [--check] FILE...  only those files
# CLANG_FORMAT names another binary. Nothing else in scripts/ needs clang-format.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

clang_format="${CLANG_FORMAT:-clang-format}"
command -v "$clang_format" >/dev/null 2>&1 ||
  { echo "format: $clang_format not found (apt-get install clang-format)" >&2; exit 2; }
check=0
if [[ "${1:-}" == "--check" ]]; then
  check=1
  shift
fi
if (($#)); then
  files=("$@")
else
  mapfile -t files < <(git ls-files -- '*.cpp' '*.hpp' '*.h' '*.cc' '*.cu' '*.cuh')
fi
((${#files[@]})) || exit 0

if ((!check)); then
  printf '%s\0' "${files[@]}" | xargs -0 -n 64 "$clang_format" --style=file -i
  exit 0
fi
differ=0
for f in "${files[@]}"; do
  if ! "$clang_format" --style=file "$f" | cmp -s - "$f"; then
    echo "$f"
    differ=1
  fi
done
if ((differ)); then
  echo "format: the files above differ from clang-format's output (scripts/format.sh formats them)" >&2
fi
exit "$differ"
