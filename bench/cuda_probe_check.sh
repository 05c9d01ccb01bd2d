#!/usr/bin/env bash
# Measured mode on CUDA: probe every distinct call of resnet18's and BERT's training steps on the GPU in
# float32, float16 and bfloat16 (float64 CPU reference, TF32 off), plus the crafted low-precision op,
# and print a summary of each report. Run from anywhere on a machine with a CUDA GPU:
#
#     bench/cuda_probe_check.sh [OUT_DIR]        (default reports/cuda-check; env PYTHON, default python)
#
# DEVICE=cpu bench/cuda_probe_check.sh runs the same checks on the CPU (a dry run of this script).
# Needs torch with CUDA, torchvision and transformers installed with opscan (pip install -e ".[dev]").
# Exit status: 0 when every row of every report was measured, no probe was unknown, no row measured `error` that
# the prediction lacks (bench/probe_summary.py: error against not-error, never the messages; CUDA is a proxy) and
# the examples (which must run clean on a Mac) measured no error at all.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-reports/cuda-check}
PY=${PYTHON:-python}
DEVICE=${DEVICE:-cuda}
export HF_HUB_OFFLINE=1
mkdir -p "$OUT"
if [ "$DEVICE" = cuda ]; then
  "$PY" -c "import torch; assert torch.cuda.is_available(), 'CUDA is not available'; \
print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" || exit 2
fi
status=0
run() {  # summary-flags label target [opscan flags...]
  local check=$1 label=$2 target=$3; shift 3
  local start=$SECONDS
  "$PY" -m opscan "$target" --device "$DEVICE" -o "$OUT/$label" -f json -q "$@" > "$OUT/$label.json" || true
  if [ ! -s "$OUT/$label.json" ]; then echo "== $label: opscan failed (see above)"; status=1; return; fi
  "$PY" bench/probe_summary.py $check "$OUT/$label.json" "$label ($((SECONDS - start)) s)" || status=1
}
for dtype in float32 float16 bfloat16; do
  flags=(); [ "$dtype" = float32 ] || flags=(--dtype "$dtype")
  run --no-errors "resnet18-$dtype" examples/cnn.py:build_model "${flags[@]}"
  run --no-errors "bert-$dtype" examples/hf_bert.py:build_model "${flags[@]}"
done
run "" crafted-low-precision bench/crafted_low_precision.py:build
exit $status
