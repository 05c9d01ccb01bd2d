#!/usr/bin/env bash
# `opscan accept` on CUDA against the CPU reference: resnet18 and BERT pass in float32; a 1e-3 perturbation
# of one weight on the target is caught at that tensor; float16 shows a measured divergence named at its first
# tensor; a buffer left out of the state dict fails the checkpoint round trip, named; a step whose backward
# raises PyTorch's missing-kernel text on the target (simulated: examples/accept_unsupported.py) is a finding
# naming the op; a model that runs one layer on the CPU mid-forward gets lane dual-track, not mac-first.
# Run from the repository root on a machine with a CUDA GPU (torch, torchvision, transformers; no network):
#
#     export PYTHONPATH=$PWD HF_HUB_OFFLINE=1; bash bench/accept_cuda_check.sh OUT_DIR
#
# One summary line per case, then `accept_cuda: N/M cases as expected`. Exit status 0 when all are.
# DEVICE=cpu bash bench/accept_cuda_check.sh OUT_DIR runs the same cases on the CPU (a dry run of this script).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-reports/accept-cuda}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
export HF_HUB_OFFLINE=1
mkdir -p "$OUT"
if [ "$DEVICE" = cuda ]; then
  "$PY" -c "import torch; assert torch.cuda.is_available(), 'CUDA is not available'; \
print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" || exit 2
fi
RESNET=examples/accept_resnet18.py:build_model
BERT=examples/hf_bert.py:build_model
passed=0; total=0

case_() {  # label expectation target [opscan accept flags...]
  # expectation: pass | diverge[:TENSOR] | roundtrip:TENSOR | stopped:OP (the target run fails on OP) | lane:NAME
  local label=$1 expect=$2 target=$3; shift 3
  local start=$SECONDS code
  "$PY" -m opscan accept "$target" --device "$DEVICE" --reference cpu -o "$OUT/$label" -q "$@" \
    > "$OUT/$label.txt" 2> "$OUT/$label.err"
  code=$?
  total=$((total + 1))
  if "$PY" - "$OUT/$label" "$expect" "$code" "$label" "$((SECONDS - start))" <<'EOF'
import json, sys
folder, expect, code, label, seconds = sys.argv[1:]
try:
    verdict = json.load(open(f"{folder}/verdict.json"))
    comparison = json.load(open(f"{folder}/comparison.json"))
except OSError:
    print(f"{label}: exit {code}, no package written ({seconds} s) — see {folder}.err: NOT as expected")
    sys.exit(1)
first, trip = comparison["first_divergence"], comparison["round_trip_failure"]
worst = {row["kind"]: row["worst_rel"] for row in comparison["kinds"] if row["pair"] == "target-vs-reference"}
def where(c):
    return "none" if c is None else (f"iteration {c['iteration']} {c['kind']} {c['name']} (module {c['module']}, "
                                     f"rel {c['rel_err']}, rms {c['abs_err']})")
kind, _, tensor = expect.partition(":")
if kind == "pass":
    ok = code == "0" and first is None and trip is None
elif kind == "diverge":
    ok = code == "1" and first is not None and (not tensor or first["name"] == tensor)
elif kind == "stopped":  # the target run fails on an op: a finding (exit 1) naming it, lane linux-gpu-first
    ok = code == "1" and tensor in str(verdict.get("target_failure")) and verdict["lane"]["name"] == "linux-gpu-first"
elif kind == "lane":  # runs and compares fine, but the lane is this one (the CPU-layer model: dual-track)
    ok = code == "0" and first is None and verdict["lane"]["name"] == tensor
else:
    ok = code == "1" and trip is not None and trip["name"] == tensor
worst_text = ", ".join(f"{k} {v:.1e}" if isinstance(v, float) else f"{k} {v}" for k, v in worst.items())
print(f"{label}: exit {code}, lane {verdict['lane']['name']}, first divergence: {where(first)}; round trip: "
      f"{where(trip)}; worst rel: {worst_text} ({seconds} s): {'as expected' if ok else 'NOT as expected'}")
sys.exit(0 if ok else 1)
EOF
  then passed=$((passed + 1)); fi
}

case_ resnet18-float32 pass "$RESNET"
case_ bert-float32 pass "$BERT"
case_ resnet18-perturb diverge:layer3.0.conv1.weight "$RESNET" --perturb layer3.0.conv1.weight=1e-3
case_ bert-perturb diverge:bert.encoder.layer.0.attention.self.query.weight "$BERT" \
  --perturb bert.encoder.layer.0.attention.self.query.weight=1e-3
case_ resnet18-float16 diverge "$RESNET" --dtype float16
case_ bert-float16 diverge "$BERT" --dtype float16
case_ buffer-round-trip roundtrip:norm.scale examples/accept_buffer.py:build_model
if [ "$DEVICE" = cpu ]; then  # the reference runs on the CPU too: tell the target apart by its dtype
  case_ unsupported-op stopped:aten::put_ examples/accept_unsupported.py:build_model --dtype bfloat16 \
    --arg unsupported_on=bfloat16
else
  case_ unsupported-op stopped:aten::put_ examples/accept_unsupported.py:build_model --arg "unsupported_on=$DEVICE"
fi
case_ cpu-layer lane:dual-track examples/accept_cpu_layer.py:build_model
echo "accept_cuda: $passed/$total cases as expected"
[ "$passed" = "$total" ]
