#!/usr/bin/env bash
# The GPU machine's checks, in one script (README "Benchmarks": what to run and how long it takes).
#
#   benchmarks/device_check.sh [--dry-run] [--wheels DIR] [--out DIR] [-- extra device_check.py options]
#
# On the GPU machine (no network; Python 3.12 with torch, transformers, accelerate, peft,
# safetensors, opencv-python-headless, onnxruntime and pyarrow already there), it first installs
# what is missing from the wheels in DIR (default .whl/ at the repository root): every *.whl there,
# without dependencies and without an index, into a venv that sees the system's packages, then
# counterfactory itself from this tree. Then benchmarks/device_check.py runs every step:
# the full-size Qwen-Image-Edit and Edit-Plus pipelines with random bf16 weights built on the
# GPU, gpu_qwen.py at batch 1 and 2 (editor vs plain diffusers, peak memory, busy share), one
# CPU-offload edit, the Ray path with num_gpus=1, and workers_scaling.py at 1, 2, 4, 8 workers.
#
# Everything goes to OUT/device_check.json (rewritten after each step) and OUT/device_check.txt;
# stop it at any point and both hold what was measured so far. OUT defaults to $OUT when set (the
# device tool's folder that comes back), else out/device-check.
#
# --dry-run: the same steps with the tiny random pipeline on the CPU (no install; the current
# Python), in under 3 minutes; the JSON has the same keys.
set -uo pipefail
cd "$(dirname "$0")/.."

dry=0
wheels=.whl
out=${OUT:-out/device-check}
extra=()
while [ $# -gt 0 ]; do
    case $1 in
        --dry-run) dry=1 ;;
        --wheels) wheels=${2:?--wheels needs a folder}; shift ;;
        --out) out=${2:?--out needs a folder}; shift ;;
        --) shift; extra=("$@"); break ;;
        *) echo "usage: benchmarks/device_check.sh [--dry-run] [--wheels DIR] [--out DIR] [-- options]" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$out"
log() { echo "[device_check.sh $(date -u +%H:%M:%S)] $*" | tee -a "$out/install.log"; }

if [ "$dry" = 1 ]; then
    py=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
    log "dry run with $py"
    exec "$py" benchmarks/device_check.py --dry-run --out "$out" ${wheels:+--wheels "$wheels"} "${extra[@]}"
fi

base=${PYTHON:-python3}
venv=${VENV:-/tmp/cf-device-venv}
started=$(date +%s)
if [ ! -x "$venv/bin/python" ]; then
    "$base" -m venv --system-site-packages "$venv" >>"$out/install.log" 2>&1 || {
        log "no venv module: installing into $venv/site with --target instead"
        mkdir -p "$venv/site"
    }
fi
if [ -x "$venv/bin/python" ]; then
    py=$venv/bin/python
    pip=("$py" -m pip install --no-index --no-deps --disable-pip-version-check)
else
    py=$base
    export PYTHONPATH="$venv/site${PYTHONPATH:+:$PYTHONPATH}"
    pip=("$base" -m pip install --no-index --no-deps --disable-pip-version-check --target "$venv/site")
fi
shopt -s nullglob
carried=("$wheels"/*.whl)
if [ ${#carried[@]} -gt 0 ]; then
    log "installing ${#carried[@]} wheel(s) from $wheels ($(du -shc "${carried[@]}" | tail -1 | cut -f1))"
    "${pip[@]}" "${carried[@]}" >>"$out/install.log" 2>&1 || log "some wheels did not install (see install.log)"
else
    log "no wheels in $wheels: only what the machine already has"
fi
# counterfactory from this tree (setuptools must be there or among the wheels)
"${pip[@]}" --no-build-isolation . >>"$out/install.log" 2>&1 || log "counterfactory did not install (see install.log)"
log "install: $(($(date +%s) - started)) s"
"$py" benchmarks/device_check.py --out "$out" --wheels "$wheels" "${extra[@]}"
rc=$?
log "done in $(($(date +%s) - started)) s (exit $rc)"
exit $rc
