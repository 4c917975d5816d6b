#!/usr/bin/env bash
# scripts/gpu_check.sh: the one prepared check for a lent GPU machine (issue 10).
#
#   bash scripts/gpu_check.sh            # run it (steps capped at 9 min together; a full pass took ~100 s on an H200)
#   bash scripts/gpu_check.sh --dry-run  # list what it would run, run nothing
#   bash scripts/gpu_check.sh --fetch-wheels   # HERE (a machine with pip access): fetch
#                                              # the wheels the GPU machine lacks into .whl/
#
# Steps, in order, each under its own time limit:
#   1. environment: GPU, driver, Python, torch, triton versions
#   2. the GPU-marked tests (pytest -m gpu): kernels against their PyTorch references in
#      bf16/fp16/fp32, the engine on CUDA against the CPU reference's greedy tokens (eager
#      and with CUDA graphs), bf16 logits against the fp32 reference
#   3. a short `perfdiag run` on CUDA with the Triton kernels and a profiler window, and
#      one with CUDA graphs,
#      and an open-loop run of mixed prompt lengths in 256-token chunks (160 requests at
#      40/s), whose steps price a prefill slice beside decodes (issue 35)
#   4. `perfdiag calibrate` (measured matmul FLOP/s and copy bandwidth), then
#      `perfdiag timeline` on the first run: every kernel on the roofline of those ceilings,
#      and scripts/step_cost_check.py: which step cost model (additive or roofline) the
#      runs' steps choose, what one more prompt slice costs, and how many steps were left
#      out because a Triton kernel JIT-compiled in them (issue 35)
#   5. kernel micro-benchmarks (triton.testing.do_bench): achieved GB/s and FLOP/s against
#      the measured ceilings (the Q4_1/Q8_0 dequant GEMV/GEMM beside the dense one among
#      them), and a decode step with and without CUDA graphs at batch 1
#   6. one summary table, printed last (targets: decode attention >= 60% of the measured
#      bandwidth at large batch x context; CUDA graphs >= 1.5x faster decode at batch 1)
# Logs go to $OUT when set (the device tool brings back at most 8 files), else to
# ./gpu_check_logs: checks.log, pytest.log, pytest.xml, calibrate.json, bench.json,
# runs.tar.gz, summary.txt.
#
# The machine has Python 3.12, torch 2.11, triton 3.6, pandas, pyarrow, typer, rich, numpy,
# nvidia-ml-py, pytest, but not textual or perfetto (only the TUI and the exporters need
# them; their tests are collected, so they travel as wheels). perfdiag needs triton>=3.7
# only for the CPU interpreter; 3.6 compiles these kernels: never reinstall torch or triton
# there. perfdiag itself is not pip-installed: a symlink on PYTHONPATH makes the checkout
# importable as `perfdiag` with no dependency resolution.
# Wheels, once, on a machine with pip access (this writes .whl/ and ignores it in git):
#   bash scripts/gpu_check.sh --fetch-wheels
# then call the device tool's `run` with carry [".whl"] and the command
#   bash scripts/gpu_check.sh
# (without .whl the check still runs; the TUI/exporter test files then fail to import,
# which pytest reports and skips past: --continue-on-collection-errors).

set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
LOG=${OUT:-$ROOT/gpu_check_logs}
WHEELS=$ROOT/.whl
WHEEL_PINS="textual==8.2.8 mdit-py-plugins==0.7.0 platformdirs==4.14.8 linkify-it-py==2.2.0 perfetto==0.59.1 msgspec==0.23.0 isal==1.9.1 plotly==7.1.0 kneed==0.9.0"
MODE=${1:-run}

if [[ $MODE == --fetch-wheels ]]; then
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    exec $PY -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d "$WHEELS" $WHEEL_PINS
fi

RUN1=/tmp/perfdiag_gpu_check/run_eager
RUN2=/tmp/perfdiag_gpu_check/run_graphs
RUN3=/tmp/perfdiag_gpu_check/run_mixed
CEIL=/tmp/perfdiag_gpu_check/ceilings
STEPS=(
    "environment|30|nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; $PY -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, torch.version.cuda, triton.__version__, torch.cuda.get_device_name(0))'"
    "gpu tests|150|$PY -m pytest -m gpu tests/ -p no:cacheprovider -q -rs --continue-on-collection-errors --junitxml=$LOG/pytest.xml \$XDIST"
    "run eager|60|$PY -m perfdiag run --preset small --device cuda --kernel-backend triton -n 24 --closed -c 8 --prompt-len uniform:32:256 --output-len 32 --profile-steps 4:6 --no-device-sampling -q -o $RUN1"
    "run graphs|45|$PY -m perfdiag run --preset small --device cuda --kernel-backend triton --cuda-graphs -n 16 --closed -c 4 --prompt-len 64 --output-len 48 --no-device-sampling -q -o $RUN2"
    "run mixed|80|$PY -m perfdiag run --preset small --device cuda --kernel-backend triton -n 160 --rate 40 --prompt-len uniform:64:1024 --output-len uniform:16:64 --chunk-size 256 --no-device-sampling -q -o $RUN3"
    "calibrate|45|$PY -m perfdiag calibrate --ceilings-dir $CEIL --seconds 0.3 --json > $LOG/calibrate.json && cat $LOG/calibrate.json"
    "roofline|30|$PY -m perfdiag timeline $RUN1 --ceilings-dir $CEIL"
    "step cost|15|$PY scripts/step_cost_check.py $RUN1 --ceilings-dir $CEIL; $PY scripts/step_cost_check.py $RUN3 --ceilings-dir $CEIL"
    "benchmarks|85|$PY -m perfdiag.engine_ref.kernels.bench --json $LOG/bench.json --ceilings-dir $CEIL"
)

if [[ $MODE == --dry-run ]]; then
    echo "gpu_check: would run, logs under ${OUT:-./gpu_check_logs} (limit in seconds):"
    echo "  setup: pip install --no-index --no-deps --target /tmp/perfdiag_site .whl/*.whl (if .whl/ exists); PYTHONPATH=<symlink perfdiag -> checkout>; TRITON_INTERPRET=0"
    for s in "${STEPS[@]}"; do
        IFS='|' read -r name limit cmd <<< "$s"
        printf '  %-12s %4ss  %s\n' "$name" "$limit" "$cmd"
    done
    echo "  summary: one table from pytest.xml, the runs' manifests, calibrate.json, bench.json"
    exit 0
fi
[[ $MODE == run ]] || { echo "usage: $0 [--dry-run | --fetch-wheels]" >&2; exit 2; }

mkdir -p "$LOG" /tmp/perfdiag_gpu_check
rm -rf "$RUN1" "$RUN2" "$RUN3" "$CEIL"
exec > >(tee -a "$LOG/checks.log") 2>&1
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
SITE=/tmp/perfdiag_site
mkdir -p /tmp/perfdiag_path
ln -sfn "$ROOT" /tmp/perfdiag_path/perfdiag
export PYTHONPATH=/tmp/perfdiag_path${PYTHONPATH:+:$PYTHONPATH}
if compgen -G "$WHEELS/*.whl" > /dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$WHEELS"/*.whl && export PYTHONPATH=$PYTHONPATH:$SITE
else
    echo "note: no .whl/ carried: textual and perfetto are missing (see the header)"
fi
XDIST=""
$PY -c "import xdist" 2>/dev/null && XDIST="-n 4"  # compiles in parallel
export XDIST

declare -A STATUS SECONDS_TAKEN
for s in "${STEPS[@]}"; do
    IFS='|' read -r name limit cmd <<< "$s"
    echo; echo "=== $name (limit ${limit}s): $cmd"
    t0=$(date +%s)
    if [[ $name == "gpu tests" ]]; then
        timeout "$limit" bash -c "$cmd" 2>&1 | tee "$LOG/pytest.log" > /dev/null
        rc=${PIPESTATUS[0]}
        tail -n 40 "$LOG/pytest.log"
    else
        timeout "$limit" bash -c "$cmd"
        rc=$?
    fi
    STATUS[$name]=$rc
    SECONDS_TAKEN[$name]=$(( $(date +%s) - t0 ))
done
tar czf "$LOG/runs.tar.gz" -C /tmp/perfdiag_gpu_check run_eager run_graphs run_mixed 2>/dev/null

STEP_RESULTS=""
for s in "${STEPS[@]}"; do
    IFS='|' read -r name _ _ <<< "$s"
    STEP_RESULTS+="$name|${STATUS[$name]}|${SECONDS_TAKEN[$name]};"
done
export STEP_RESULTS LOG RUN1 RUN2 RUN3
$PY - <<'PYEOF' | tee "$LOG/summary.txt"
import json, os, xml.etree.ElementTree as ET
from pathlib import Path

log = Path(os.environ["LOG"])
rows = []  # (check, result, detail)
for item in filter(None, os.environ["STEP_RESULTS"].split(";")):
    name, rc, secs = item.split("|")
    rows.append((f"step: {name}", "ok" if rc == "0" else f"FAILED (exit {rc})", f"{secs} s"))
try:
    suite = ET.parse(log / "pytest.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    a = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    passed = a["tests"] - a["failures"] - a["errors"] - a["skipped"]
    rows.append(("gpu tests", "ok" if not (a["failures"] or a["errors"]) else "FAILED",
                 f"{passed} passed, {a['failures']} failed, {a['errors']} errors, {a['skipped']} skipped"))
except Exception as e:
    rows.append(("gpu tests", "no report", str(e)[:60]))
for key in ("RUN1", "RUN2", "RUN3"):
    try:
        from perfdiag import load_run
        r = load_run(os.environ[key])
        spans = r.spans
        tri = spans[spans["category"].astype(str) == "triton"]
        replays = int((spans["name"].astype(str) == "cuda_graph_replay").sum())
        kin = int((spans["category"].astype(str) == "kernel").sum())
        compiled = int(tri["args"].astype(str).str.contains('"compiled": true').sum())
        rows.append((f"perfdiag run ({Path(os.environ[key]).name})", r.status,
                     f"{len(r.steps)} steps, {len(tri)} triton launches ({compiled} compiled), "
                     f"{kin} profiler kernels, {replays} graph replays"))
    except Exception as e:
        rows.append((f"perfdiag run ({key})", "FAILED", str(e)[:60]))
ceil = None
try:
    cal = json.loads((log / "calibrate.json").read_text())
    gpu = [d for d in cal["devices"] if d["device"] != "cpu"][0]
    ceil = gpu
    rows.append(("ceilings (measured)", gpu["device"],
                 f"{gpu['bytes_per_s'] / 1e9:,.0f} GB/s, bf16 {gpu['flops_per_s'].get('bfloat16', 0) / 1e12:,.0f} TFLOP/s"))
except Exception as e:
    rows.append(("ceilings", "FAILED", str(e)[:60]))
try:
    bench = json.loads((log / "bench.json").read_text())
    for k in bench["kernels"]:
        rows.append((f"{k['kernel']} [{k['shape']}]", f"{k['ms'] * 1e3:,.1f} µs",
                     f"{k['gb_per_s']:,.0f} GB/s ({k.get('pct_of_bandwidth', 0):.0f}% bw), "
                     f"{k['tflop_per_s']:,.1f} TFLOP/s ({k.get('pct_of_peak_flops', 0):.0f}% peak)"))
    big = [k for k in bench["kernels"] if k["kernel"].startswith("decode_attention")][0]
    pct = big.get("pct_of_bandwidth", 0)
    rows.append(("target: decode attn >= 60% bw", "MET" if pct >= 60 else "MISSED", f"{pct:.0f}% at {big['shape']}"))
    one_row = {k["kernel"]: k for k in bench["kernels"] if k["shape"].startswith("M=1 ")}
    dense, q4 = one_row["dense_matmul"], one_row["dequant_matmul q4_1"]
    rows.append(("q4_1 GEMV vs dense (issue 20)", "FASTER" if q4["ms"] < dense["ms"] else "SLOWER",
                 f"{dense['ms'] / q4['ms']:.2f}x the dense GEMV's speed, {dense['bytes'] / q4['bytes']:.1f}x fewer bytes"))
    g = bench["cuda_graphs"]
    rows.append(("target: graphs >= 1.5x at batch 1", "MET" if g["speedup"] >= 1.5 else "MISSED",
                 f"eager {g['eager_ms']:.3f} ms, graphs {g['graph_ms']:.3f} ms: {g['speedup']:.2f}x"))
except Exception as e:
    rows.append(("benchmarks", "FAILED", str(e)[:60]))
w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
print("\n=== gpu_check summary")
for c, res, detail in rows:
    print(f"{c:<{w0}}  {res:<{w1}}  {detail}")
PYEOF
