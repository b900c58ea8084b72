#!/bin/sh
# Checks that the C lines changed since BASE (default: main) follow .clang-format, without
# reformatting anything else. Prints the fix as a diff and exits 1 when a changed line is off.
#   scripts/check-format.sh [BASE]       e.g. scripts/check-format.sh origin/main
#   scripts/check-format.sh --fix [BASE] rewrites only the changed lines in place
set -eu
fix=""
if [ "${1:-}" = "--fix" ]; then fix="-i"; shift; fi
base="${1:-main}"
cd "$(git rev-parse --show-toplevel)"
cfd=""
for c in clang-format-diff clang-format-diff-14 /usr/share/clang/clang-format-14/clang-format-diff.py; do
    if command -v "$c" >/dev/null 2>&1; then cfd="$c"; break; fi
done
if [ -z "$cfd" ]; then
    echo "check-format: clang-format-diff not found (Debian package clang-format)" >&2
    exit 2
fi
if ! git rev-parse --verify --quiet "$base^{commit}" >/dev/null; then
    echo "check-format: no such base '$base'" >&2
    exit 2
fi
# -U0: only the changed lines; the working tree against the merge base (committed and not).
out=$(git diff -U0 --no-color "$(git merge-base "$base" HEAD)" -- '*.c' '*.h' | "$cfd" -p1 $fix)
if [ -n "$out" ]; then
    printf '%s\n' "$out"
    echo "check-format: the lines above differ from .clang-format (scripts/check-format.sh --fix $base rewrites them)" >&2
    exit 1
fi
echo "check-format: changed lines since $base follow .clang-format"
