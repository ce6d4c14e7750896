#!/usr/bin/env bash
# The whole product on a bare GPU machine (the device tool's H100/H200), as a user runs it:
#   1. `bertflow run configs/default.yaml` (`make run`'s flow: Prefect's temporary server, Beam, DeepSpeed
#      on the GPU, the fine-tuning fan-out, the report), timed;
#   2. exact resume on the GPU (benchmarks/gpu_resume_check.py on the flow's shards);
#   3. the flow's model opened by transformers (fill-mask on the GPU) and `bertflow evaluate` on it;
#   4. the same flow command again (every stage reused).
# Needs .gpu_carry/flow from `make gpu-flow-prep` (here, where the registries are reachable):
#   run(command="bash benchmarks/gpu_flow_check.sh", carry=[".gpu_carry/flow"], timeout_s=540)
# Writes $OUT/gpu_flow_check.log (all of it), flow.log, resume_check.json, evaluate.json, scorecard.md.
set -u
cd "$(dirname "$0")/.."
CARRY="${GPU_CARRY:-.gpu_carry/flow}"
OUT_DIR="${OUT:-runs/gpu_flow_check}"
SITE=/tmp/bertflow-flow-site
RUNS=/tmp/bertflow-flow-runs
PY="${PYTHON:-python3}"
mkdir -p "$OUT_DIR" "$SITE"
exec > >(tee "$OUT_DIR/gpu_flow_check.log") 2>&1
started=$(date +%s)
elapsed() { echo "$(( $(date +%s) - started )) s"; }
tar xJf "$CARRY/site.tar.xz" -C "$SITE" || exit 2
export PYTHONPATH="$PWD:$SITE" BERTFLOW_DATA="$PWD/$CARRY/data" PREFECT_HOME=/tmp/bertflow-prefect \
  PREFECT_SERVER_ANALYTICS_ENABLED=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch, deepspeed, prefect, apache_beam, wandb; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__, 'prefect', prefect.__version__, 'beam', apache_beam.__version__, 'wandb', wandb.__version__)" 2>&1 | tail -1

echo "== 1. bertflow run configs/default.yaml ($(elapsed))"
timeout 300 "$PY" -m pipelines.cli run configs/default.yaml --set run_dir=$RUNS > "$OUT_DIR/flow.log" 2>&1
echo "exit $? after $(elapsed)"
sed -n '/^  verify /,$p' "$OUT_DIR/flow.log"
cp "$RUNS/latest/finetune/scorecard.md" "$OUT_DIR/" 2>/dev/null
SHARDS=$(ls -d $RUNS/preprocess/*/ | head -1) TOKENIZER=$(ls -d $RUNS/tokenizer/*/ | head -1)

echo "== 2. exact resume on the GPU ($(elapsed))"
timeout 240 "$PY" benchmarks/gpu_resume_check.py "$SHARDS" "$TOKENIZER" /tmp/bertflow-resume | tail -40
cp /tmp/bertflow-resume/resume_check.json "$OUT_DIR/" 2>/dev/null

echo "== 3. transformers and bertflow evaluate on the flow's model ($(elapsed))"
timeout 60 "$PY" - "$RUNS/latest/model" <<'PY' 2>&1 | grep -v -i warn | tail -3
import sys
from transformers import BertForPreTraining, pipeline
model = BertForPreTraining.from_pretrained(sys.argv[1])
print("BertForPreTraining:", sum(p.numel() for p in model.parameters()), "parameters")
fill = pipeline("fill-mask", model=sys.argv[1], device=0)
print("fill-mask:", [(x["token_str"], round(x["score"], 3)) for x in fill("the city is the [MASK] of the country.")[:3]])
PY
timeout 90 "$PY" -m pipelines.cli evaluate "$RUNS/latest/model" --shards "$SHARDS" --json "$OUT_DIR/evaluate.json" 2>&1 | tail -3

echo "== 4. the same flow command again ($(elapsed))"
timeout 90 "$PY" -m pipelines.cli run configs/default.yaml --set run_dir=$RUNS > "$OUT_DIR/flow_again.log" 2>&1
echo "exit $? after $(elapsed)"
sed -n '/^  verify /,/^  report /p' "$OUT_DIR/flow_again.log"
echo "done after $(elapsed)"
