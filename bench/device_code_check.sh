#!/usr/bin/env bash
# Code that picks a device (issue 33): on a host with a CUDA GPU, the scan of a step written for CUDA
# (tests/targets/cuda_step.py: "cuda" if torch.cuda.is_available() else "cpu", .cuda(), cudnn.benchmark, GradScaler
# and autocast for "cuda", pin_memory, torch.cuda.synchronize()) must give the report it gives without CUDA: opscan
# traces the user's code as a Mac runs it (docs/trace.md, "Code that picks a device"). Run from anywhere:
#
#     bench/device_code_check.sh [OUT_DIR]        (default reports/device-code-check; env PYTHON, default python)
#
# It scans the target twice — CUDA visible, then CUDA_VISIBLE_DEVICES="" (torch.cuda.is_available() False) — with
# the memory stage on, compares the two report.json files without `environment` and `model`, runs the simulated
# test (tests/test_device_code.py), and measures the step's probes on cuda (measured mode must still reach the GPU).
# Exit status: 0 when CUDA was there, the reports are equal, the tests pass and the probes ran on cuda.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-reports/device-code-check}
PY=${PYTHON:-python}
TARGET=tests/targets/cuda_step.py:build_model
export HF_HUB_OFFLINE=1
mkdir -p "$OUT"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'CUDA is not available'; \
print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" || exit 2
status=0
"$PY" -m opscan "$TARGET" -f json -q -o "$OUT/cuda" > "$OUT/cuda.json" || status=1
CUDA_VISIBLE_DEVICES="" "$PY" -m opscan "$TARGET" -f json -q -o "$OUT/no-cuda" > "$OUT/no-cuda.json" || status=1
"$PY" - "$OUT/cuda.json" "$OUT/no-cuda.json" <<'PYEOF' || status=1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for r in (a, b):
    r.pop("environment"), r.pop("model")
rules = sorted(f["rule"] for f in a.get("device_code", {}).get("findings", []))
print("findings on the CUDA host:", ", ".join(rules) or "none")
if a != b:
    diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    sys.exit(f"FAIL: the reports differ in {diff}")
print("ok: the report with CUDA equals the report without")
PYEOF
"$PY" -m pytest -q -p no:cacheprovider tests/test_device_code.py || status=1
"$PY" -m opscan "$TARGET" --device cuda -f json -q -o "$OUT/probes" > "$OUT/probes.json" || true
"$PY" -c "import json, sys; r = json.load(open(sys.argv[1])); d = r.get('measurement', {}).get('device'); \
print('probes measured on', d); sys.exit(0 if d == 'cuda' else 1)" "$OUT/probes.json" || status=1
exit $status
