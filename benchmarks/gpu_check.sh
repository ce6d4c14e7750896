#!/usr/bin/env bash
# The GPU check on a bare GPU machine (the device tool's H100/H200): install the carried wheels the
# image lacks into /tmp, then run benchmarks/gpu_check.py with this script's arguments. The summary
# (gpu_check.json, gpu_check.md) and the full log (gpu_check.log) go to $OUT (else runs/gpu_check).
#   bash benchmarks/gpu_check.sh --parts base,hf,ops,kernels
# Needs .gpu_carry/ from `make gpu-check-prep` (run here, where the registries are reachable).
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY="${GPU_CARRY:-.gpu_carry}"
SITE="${GPU_CHECK_SITE:-/tmp/bertflow-site}"
OUT_DIR="${OUT:-runs/gpu_check}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT_DIR"
"$PY" benchmarks/install_wheels.py "$CARRY/wheels" "$SITE"
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
"$PY" benchmarks/gpu_check.py --carry "$CARRY" --out "$OUT_DIR" "$@" 2>&1 | tee "$OUT_DIR/gpu_check.log"
