#!/usr/bin/env bash
# The main job on built-in defaults (what `make run` shows).
set -euo pipefail
build=${1:-build}
"$build/nanolm" formats
"$build/nanolm" plan train --model llama-2-7b --gpus 8 --gpu h100 && echo && "$build/nanolm" plan train --model llama-2-7b --gpus 512 --gpu h100
