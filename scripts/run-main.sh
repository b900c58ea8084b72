#!/usr/bin/env bash
# The main job on built-in defaults (what `make run` shows).
set -euo pipefail
build=${1:-build}
"$build/nanolm" formats
