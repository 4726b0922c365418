#!/usr/bin/env bash
# Long fuzzing campaign, one target at a time on one core (docs/RELIABILITY.md):
#   native/fuzz/campaign.sh BUILD_DIR OUT_DIR RUNS MAX_SECONDS [target...]
# Each target starts from a copy of its seed corpus (native/fuzz/corpus/<target>) in
# OUT_DIR/<target>/corpus, stops after RUNS executions or MAX_SECONDS, and leaves its log
# (OUT_DIR/<target>/fuzz-0.log, with libFuzzer's final stats) and any crash-* file there.
set -euo pipefail
build=$(realpath "$1"); out=$(realpath -m "$2"); runs=$3; maxt=$4; shift 4
here=$(dirname "$(realpath "$0")")
targets=("$@"); [ ${#targets[@]} -gt 0 ] || targets=(handle hello frame probe recv send verbs)
for t in "${targets[@]}"; do
  d=$out/$t; mkdir -p "$d/corpus"
  cp -n "$here/corpus/$t/"* "$d/corpus/" 2>/dev/null || true
  maxlen=4096; case $t in recv|send) maxlen=1024 ;; esac
  start=$(date +%s)
  (cd "$d" && nice -n 10 "$build/fuzz_$t" -jobs=1 -workers=1 -runs="$runs" -max_total_time="$maxt" \
     -max_len=$maxlen -print_final_stats=1 -artifact_prefix="$d/" corpus >/dev/null 2>&1) || true
  echo "$t: $(( $(date +%s) - start )) s, exit $(grep -c 'ERROR\|contract violated' "$d/fuzz-0.log" || true) error lines" >>"$out/summary.txt"
done
