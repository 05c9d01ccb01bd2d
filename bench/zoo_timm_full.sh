#!/usr/bin/env bash
# timm's FULL model list through `opscan zoo` on a many-core host (written for the 16-core H200 host, which has
# torch, timm, transformers, networkx, pyyaml and rich but no Ray: the local pool runs it). Resumable: each call
# runs for at most SECONDS (default 540), the journal keeps every finished model, and the next call with the same
# folder and releases continues where the last stopped; run it until it prints "zoo_timm_full: done".
#
#     bash bench/zoo_timm_full.sh DIR [SECONDS]     # from the repository root; PYTHON=..., RELEASES=... optional
#
# ZOO_ARGS adds flags (e.g. "--match vit_*"). RELEASES (default all 27 the knowledge base holds; pass e.g. RELEASES=2.0.0,2.6.0,2.14.1 while one model's
# releases still cost a trace each) must stay the same across the calls of one DIR. When $OUT is set (the device
# tool's folder that comes back), the leaderboard, its journal and the log are copied there after each call.
set -u
cd "$(dirname "$0")/.."
dir=${1:?usage: bash bench/zoo_timm_full.sh DIR [SECONDS]}
limit=${2:-540}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
PY=${PYTHON:-python}
releases=()
[ -n "${RELEASES:-}" ] && releases=(--releases "$RELEASES")
mkdir -p "$dir"
start=$(date +%s)
before=$(($(grep -c '"kind": "model"' "$dir/zoo.jsonl" 2>/dev/null || echo 0)))
timeout --signal=INT --kill-after=30 "$limit" $PY -m opscan zoo timm -o "$dir" --workers "$(nproc)" \
    --timeout 600 "${releases[@]}" ${ZOO_ARGS:-} -q >/dev/null 2>>"$dir/zoo.log"
rc=$?
after=$(($(grep -c '"kind": "model"' "$dir/zoo.jsonl" 2>/dev/null || echo 0)))
took=$(( $(date +%s) - start ))
echo "zoo_timm_full: $((after - before)) models in ${took} s on $(nproc) cores ($after in the journal), exit $rc"
[ "$took" -gt 0 ] && echo "zoo_timm_rate: $(( (after - before) * 60 / took )) models/min"
if [ -n "${OUT:-}" ]; then cp "$dir"/zoo.jsonl "$dir"/zoo.log "$OUT"/ 2>/dev/null; cp "$dir"/leaderboard.* "$OUT"/ 2>/dev/null; fi
case $rc in 0|1) echo "zoo_timm_full: done ($dir/leaderboard.html)";; 124|130) echo "zoo_timm_full: stopped at ${limit} s: run it again";; *) exit $rc;; esac
