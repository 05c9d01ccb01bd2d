#!/usr/bin/env bash
# The four benchmarks on a GPU host (written for one H200 with 16 cores: about 7 minutes), each table in full,
# then their headline lines together. From the repository root, with the Python that has torch (cuda),
# torchvision and transformers:
#
#     bash bench/gpu_host.sh            # PYTHON=python3 bash bench/gpu_host.sh for another interpreter
#
# The scan and trace benchmarks run alone (the trace benchmark times the default thread count, which other jobs
# would disturb); then the memory benchmark (each case in fresh processes, 4 at a time) and the probe benchmark,
# which use every core, one after the other.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
PY=${PYTHON:-python}
out=$(mktemp -d)
echo "opscan benchmarks on $(hostname): $(nproc) cores, $($PY -c 'import torch; print("torch", torch.__version__,
"cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")'), logs in $out"
start=$(date +%s)
$PY bench/scan_scale.py --rounds 2 > "$out/scan_scale.txt" 2>&1
$PY bench/trace_overhead.py > "$out/trace_overhead.txt" 2>&1
$PY bench/memory_accuracy.py --jobs 4 > "$out/memory_accuracy.txt" 2>&1
$PY bench/probe_throughput.py --sample 24 > "$out/probe_throughput.txt" 2>&1
for name in scan_scale trace_overhead probe_throughput memory_accuracy; do
    echo; echo "=== bench/$name.py"; grep -v "^\[transformers\]" "$out/$name.txt"
done
echo; echo "=== headlines ($(( $(date +%s) - start )) s in all)"
for name in scan_scale trace_overhead probe_throughput memory_accuracy; do
    lines=2; [ "$name" = trace_overhead ] && lines=3  # default threads, one thread, per call against FlopCounterMode
    tail -n "$lines" "$out/$name.txt"
done
