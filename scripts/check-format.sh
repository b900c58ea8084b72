#!/bin/sh
# Checks that the C lines changed since BASE follow .clang-format, without reformatting anything
# else. Prints the fix as a diff and exits 1 when a changed line is off.
#   scripts/check-format.sh [BASE]       e.g. scripts/check-format.sh origin/main
#   scripts/check-format.sh --fix [BASE] rewrites only the changed lines in place
# Without BASE (as .ci/run calls it) the base is chosen so that it also works in a fresh clone:
#   1. origin/main, then main, when HEAD has commits of its own beyond it (a branch);
#   2. else HEAD~1: on main itself, the lines that the last commit (and the working tree) changed;
#   3. else (a single commit, or a shallow clone of depth 1) nothing to compare with: it says so
#      and exits 0.
# FORMAT_BASE=REF in the environment overrides the choice.
set -eu
fix=""
if [ "${1:-}" = "--fix" ]; then fix="-i"; shift; fi
base="${1:-${FORMAT_BASE:-}}"
cd "$(git rev-parse --show-toplevel)"
cfd=""
for c in clang-format-diff clang-format-diff-14 /usr/share/clang/clang-format-14/clang-format-diff.py; do
    if command -v "$c" >/dev/null 2>&1; then cfd="$c"; break; fi
done
if [ -z "$cfd" ]; then
    echo "check-format: clang-format-diff not found (Debian package clang-format: scripts/setup-deps.sh format)" >&2
    exit 2
fi
head=$(git rev-parse HEAD)
if [ -z "$base" ]; then
    for b in origin/main main; do
        if git rev-parse --verify --quiet "$b^{commit}" >/dev/null &&
            mb=$(git merge-base "$b" HEAD 2>/dev/null) && [ "$mb" != "$head" ]; then
            base="$b"
            break
        fi
    done
fi
if [ -z "$base" ]; then
    if git rev-parse --verify --quiet "HEAD~1^{commit}" >/dev/null; then
        base="HEAD~1"
        echo "check-format: HEAD is on main: checking the lines changed by the last commit"
    else
        echo "check-format: no parent commit to compare with (single commit or shallow clone): nothing to check"
        exit 0
    fi
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
