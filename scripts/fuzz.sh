#!/usr/bin/env bash
# Runs every libFuzzer target in BUILD (fuzz_<name>) for SECONDS each, one after the other
# (-jobs=1: one core), starting from the committed seeds fuzz/corpus/<name>/ and the corpus
# grown by earlier runs in BUILD/corpus/<name>/. Crash inputs land in BUILD/artifacts/<name>/.
# Prints one line per target: executions, exec/s, coverage (edges), features, corpus size.
# Usage: scripts/fuzz.sh BUILD SECONDS [target...]   Exit 1 when any target found a crash.
# FUZZ_RUNS=N also stops a target after N executions (whichever comes first).
set -uo pipefail
build=${1:?usage: scripts/fuzz.sh BUILD SECONDS [target...]}
secs=${2:?usage: scripts/fuzz.sh BUILD SECONDS [target...]}
shift 2
cd "$(dirname "$0")/.."
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  for b in "$build"/fuzz_*; do [[ -x $b ]] && targets+=("$(basename "$b" | sed 's/^fuzz_//')"); done
fi
status=0
summary=()
for t in "${targets[@]}"; do
  bin="$build/fuzz_$t"
  [[ -x $bin ]] || { echo "fuzz: no target $bin" >&2; status=1; continue; }
  mkdir -p "$build/corpus/$t" "$build/artifacts/$t"
  extra=()
  [[ -f fuzz/$t.dict ]] && extra+=("-dict=fuzz/$t.dict")
  [[ -n ${FUZZ_RUNS:-} ]] && extra+=("-runs=$FUZZ_RUNS")
  log="$build/fuzz_$t.log"
  echo "fuzz: $t for ${secs}s (log $log)"
  # -close_fd_mask=3: the targets' own output (CLI errors, tables) would flood the log; crash reports still print.
  "$bin" "$build/corpus/$t" "fuzz/corpus/$t" "${extra[@]}" -max_total_time="$secs" -timeout=10 \
    -rss_limit_mb=2560 -malloc_limit_mb=2048 -print_final_stats=1 -close_fd_mask=3 \
    -artifact_prefix="$build/artifacts/$t/" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9A-Za-z]*\).*/\1/p' <<<"$last")
  verdict=ok
  if [[ $rc -ne 0 ]]; then
    verdict="FOUND A CRASH (exit $rc): see $log and $build/artifacts/$t/"
    status=1
    grep -E 'ERROR|SUMMARY|runtime error' "$log" | head -5
  fi
  took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
  summary+=("$(printf '%-12s %5ss %12s execs %7s exec/s  cov %-6s ft %-6s corpus %-10s %s' \
               "$t" "${took:-$secs}" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$verdict")")
done
echo
printf '%s\n' "${summary[@]}"
exit $status
