#!/usr/bin/env bash
# Real-NCCL validation of railover through PyTorch: two ranks share GPU 0, each in its own host
# namespace of railover's test bed, with a real link fault (a switch port set down) mid-run.
# What it checks and how to read the results: docs/VALIDATION.md. Budget: under 5 minutes,
# at most 8 small files in $OUT.
#
#   GPU machine (root):   bash scripts/gpu_validate.sh
#   CPU only (harness):   DRY=1 bash scripts/gpu_validate.sh        (gloo on the CPU, same phases)
#
# Environment: OUT (results, default /tmp/gpuval-out), WORK (scratch, default /tmp/gpuval),
# PLUGIN_SO (default: build/libnccl-net-railover.so, built with cmake if missing), PY (python),
# NETNS=0 (no test bed: both ranks on loopback, no fault), PLUGIN_ENV ("K=V K=V" for both ranks),
# DRY_MAX_BYTES / DRY_SKIP (shorter dry runs for the test suite).
# Exit status: 0 only when every run passed AND every expected output is in $OUT (fault.csv
# whenever a test bed was up and the fault phase ran); a test bed that does not come up is a
# failure (NETNS=0 is the way to run without one). Sourcing the file only defines the functions.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
OUT=${OUT:-/tmp/gpuval-out}; WORK=${WORK:-/tmp/gpuval}
PY=${PY:-python3}; export PYTHONUNBUFFERED=1
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
PREFIX=""

cleanup() {  # main runs in a pipeline (a subshell): the bed's prefix comes back through a file
  local p; p=$(cat "$WORK/testbed.prefix" 2>/dev/null)
  if [ -n "$p" ]; then
    $PY -m railover.cli testbed down --prefix "$p" >/dev/null 2>&1 || \
      echo "warning: could not remove test bed $p (railover testbed down --prefix $p)"
  fi
}
testbed_up() {  # a 2-host x 3-NIC bed: NICs 0,1 = railover rails, NIC 2 = out-of-band (bootstrap, store)
  [ "${NETNS:-1}" = 0 ] && { echo "NETNS=0: no test bed, ranks on loopback, no fault"; return 0; }
  # railover picks the prefix (random, never one in use) and prints it. A prefix made here from
  # /dev/urandom was sometimes shorter than 4 characters (about 1 run in 70): the bed was refused
  # and the run went on without namespaces and without the fault, and still passed.
  if $PY -m railover.cli testbed up --detach --layout 2x3 --base 77 > "$WORK/testbed.txt" 2>&1; then
    PREFIX=$(sed -n 's/^prefix: \(ro[a-z0-9]\{4\}\)$/\1/p' "$WORK/testbed.txt" | head -1)
  fi
  if [ -z "$PREFIX" ]; then
    echo "FAIL: the test bed did not come up (NETNS=0 runs on loopback without it and without the fault):"
    tail -5 "$WORK/testbed.txt"
    return 2
  fi
  echo "$PREFIX" > "$WORK/testbed.prefix"; echo "test bed $PREFIX up (2 hosts x 3 NICs)"
}

expected_outputs() {  # the files $OUT must hold after this run
  local out=(summary.json bench.txt run.log)
  if [ -s "$WORK/testbed.prefix" ]; then
    if [ "${DRY:-0}" = 1 ]; then
      case ",${DRY_SKIP:-}," in *,fault,*) ;; *) out+=(fault.csv) ;; esac
    else
      out+=(fault.csv events.jsonl)
    fi
  fi
  echo "${out[@]}"
}

check_outputs() {  # 0 when every expected output is in $OUT and not empty; names each missing one
  local f missing=0
  for f in $(expected_outputs); do
    if [ ! -s "$OUT/$f" ]; then echo "FAIL: expected output $OUT/$f is missing or empty"; missing=1; fi
  done
  return $missing
}

main() {
  echo "== environment"
  uname -r; ldd --version 2>&1 | head -1
  $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())' \
    || { echo "FAIL: PyTorch is not importable"; return 2; }
  testbed_up || return $?
  local bedargs=(); [ -n "$PREFIX" ] && bedargs=(--testbed "$PREFIX")

  if [ "${DRY:-0}" = 1 ]; then
    echo "== dry run: gloo on the CPU (tests this harness, not NCCL)"
    timeout 150 $PY "$HERE/gpu_validate.py" --mode dry --work "$WORK" ${bedargs[@]+"${bedargs[@]}"} \
      --max-bytes "${DRY_MAX_BYTES:-$((8<<20))}" --skip "${DRY_SKIP:-}" \
      --fault-at 3 --heal-at 6 --fault-duration 9 --fault-bytes $((1<<20)) --deadline 140
    return $?
  fi

  local so rc=0
  so=${PLUGIN_SO:-$ROOT/build/libnccl-net-railover.so}
  if [ ! -f "$so" ]; then
    echo "== building the plugin (no $so)"
    cmake -S "$ROOT" -B "$ROOT/build-gpuval" -DCMAKE_BUILD_TYPE=Release -DRAILOVER_BUILD_TESTS=OFF >/dev/null \
      && cmake --build "$ROOT/build-gpuval" --target nccl-net-railover -j >/dev/null || { echo "FAIL: build"; return 2; }
    so=$ROOT/build-gpuval/libnccl-net-railover.so
  fi
  so=$(readlink -f "$so")
  nvidia-smi --query-gpu=name,driver_version,compute_mode,memory.total --format=csv,noheader
  $PY -c 'import torch; print("nccl", torch.cuda.nccl.version())'
  if nvidia-smi --query-gpu=compute_mode --format=csv,noheader | grep -qi exclusive; then
    echo "FAIL: GPU compute mode is exclusive; two processes cannot share it"; return 2; fi
  echo "== plugin file"
  ls -l "$so" || return 2
  command -v nm >/dev/null && echo "exports: $(nm -D --defined-only "$so" | grep -oE 'nccl(Net|CollNet)Plugin_v[0-9]+' | sort -u | tr '\n' ' ')"
  command -v objdump >/dev/null && echo "newest glibc symbol needed: $(objdump -T "$so" | grep -oE 'GLIBC_[0-9.]+' | sort -uV | tail -1)"
  if ldd "$so" | grep 'not found'; then echo "FAIL: unresolved libraries"; return 2; fi
  $PY -c 'import ctypes,sys; ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_LOCAL); print("dlopen ok")' "$so" || return 2

  echo "== control: NCCL's own Socket transport (proves the two-ranks-one-GPU trick here)"
  timeout 70 $PY "$HERE/gpu_validate.py" --mode control --work "$WORK" ${bedargs[@]+"${bedargs[@]}"} --max-bytes $((16<<20)) \
    --skip fault,reinit --deadline 65 || rc=1

  echo "== plugin: correctness, sweep, collectives, port down at 8 s, up at 16 s, re-init"
  local extra=() kv
  for kv in ${PLUGIN_ENV:-}; do extra+=(--plugin-env "$kv"); done
  timeout 170 $PY "$HERE/gpu_validate.py" --mode plugin --work "$WORK" --plugin-so "$so" ${bedargs[@]+"${bedargs[@]}"} \
    ${extra[@]+"${extra[@]}"} --max-bytes $((128<<20)) --fault-at 8 --heal-at 16 --fault-duration 26 --deadline 160 || rc=1
  return $rc
}

[ "${BASH_SOURCE[0]}" = "$0" ] || return 0   # sourced (tests): functions only

rm -rf "$WORK"; mkdir -p "$OUT" "$WORK"
trap cleanup EXIT
main 2>&1 | tee "$WORK/run.log"
rc=${PIPESTATUS[0]}

# At most 8 files back: summary.json, bench.txt, run.log, fault.csv, events.jsonl, plugin.r0.log,
# plugin.r1.log, control.r0.log; NCCL logs keep their head (proof lines) and tail (failures).
$PY - "$WORK" "$OUT" "$HERE" <<'PYEOF'
import json, os, sys
work, out, here = sys.argv[1:4]
sys.path.insert(0, here)
import gpu_validate as gv
summ = {}
for m in ("control", "plugin", "dry"):
    p = os.path.join(work, "summary-%s.json" % m)
    if os.path.exists(p):
        summ[m] = json.load(open(p))
json.dump(summ, open(os.path.join(out, "summary.json"), "w"), indent=1)
open(os.path.join(out, "bench.txt"), "w").write(gv.bench_text(summ))
for name, head, tail in (("run.log", 200000, 200000), ("fault.csv", 300000, 0), ("events.jsonl", 300000, 100000),
                         ("plugin.r0.log", 600000, 200000), ("plugin.r1.log", 300000, 100000),
                         ("control.r0.log", 200000, 50000)):
    p = os.path.join(work, name)
    if os.path.exists(p):
        open(os.path.join(out, name), "w").write(gv.trim(open(p, errors="replace").read(), head, tail))
PYEOF
ls "$OUT"
check_outputs || { [ "$rc" = 0 ] && rc=1; }
exit $rc
