#!/usr/bin/env bash
# The remote-Mac round trip, --device cpu standing in for the Mac, with run.sh in a FRESH venv that has only
# torch (no opscan, no PYTHONPATH): bundle -> run.sh -> SIGKILL after K outcome lines -> rerun -> merge, and the
# merged report must equal a direct `opscan TARGET --probe --device cpu --repro` run (canonical JSON without
# measurement.run and measurement.journal); a corrupted, tampered and truncated results file must be refused.
#
#   bash tests/roundtrip/torch_only.sh WORK      (with opscan's venv active: python -m opscan works, torch 2.13.0)
#
# Env: TORCH_SPEC (torch==2.13.0), VENV_PYTHON (python3.11, else python3: makes the torch-only venv),
# TARGET (examples/custom_step.py:build_model), K (10), REUSE_VENV=1 (keep WORK/roundtrip/torchonly from an earlier
# run instead of making it afresh). Exits non-zero on any difference.
set -euo pipefail
WORK="${1:?usage: bash tests/roundtrip/torch_only.sh WORK_DIR}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TARGET="${TARGET:-$REPO/examples/custom_step.py:build_model}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
VENV_PYTHON="${VENV_PYTHON:-$(command -v python3.11 || command -v python3)}"
K="${K:-10}"
T="$WORK/roundtrip"
mkdir -p "$T" && find "$T" -mindepth 1 -maxdepth 1 ! -name torchonly -exec rm -rf {} +
export HF_HUB_OFFLINE=1
# merge trusts only bundles recorded where they were made (opscan/bundle/record.py): this run's own store
export XDG_STATE_HOME="$T/state"
now() { date +%s.%N; }
took() { python -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f} s')" "$1" "$(now)"; }
outcomes() { local n; n=$(grep -c '"kind":"outcome"' "$1" 2>/dev/null) || true; echo "${n:-0}"; }

t=$(now)
if [ -z "${REUSE_VENV:-}" ] || [ ! -x "$T/torchonly/bin/python" ]; then
  rm -rf "$T/torchonly"
  "$VENV_PYTHON" -m venv "$T/torchonly"
  env -u PYTHONPATH "$T/torchonly/bin/pip" install -q "$TORCH_SPEC"
fi
if (cd / && env -u PYTHONPATH "$T/torchonly/bin/python" -c "import opscan" 2>/dev/null); then
  echo "FAIL: the torch-only venv can import opscan"; exit 1
fi
echo "== torch-only venv ($TORCH_SPEC): $(took "$t")"

t=$(now)
python -m opscan bundle "$TARGET" --device cpu --workers 1 -o "$T/bundle" -q
echo "== bundle: $(took "$t")"

RESULTS="$T/bundle/results/results.jsonl"
t=$(now)
env -u PYTHONPATH PYTHON="$T/torchonly/bin/python" setsid bash "$T/bundle/run.sh" >"$T/run1.out" 2>&1 &
pid=$!
while kill -0 "$pid" 2>/dev/null && [ "$(outcomes "$RESULTS")" -lt "$K" ]; do sleep 0.01; done
kill -KILL -- "-$pid" 2>/dev/null || { echo "FAIL: run.sh ended before $K outcome lines"; cat "$T/run1.out"; exit 1; }
wait "$pid" 2>/dev/null || true
before=$(outcomes "$RESULTS")
echo "== run.sh killed after $before outcome lines: $(took "$t")"

t=$(now)
env -u PYTHONPATH PYTHON="$T/torchonly/bin/python" bash "$T/bundle/run.sh" >"$T/run2.out" 2>&1 || {
  echo "FAIL: the rerun of run.sh failed"; cat "$T/run2.out" "$T/bundle/results/logs/run.log"; exit 1; }
echo "== run.sh rerun: $(took "$t") ($(outcomes "$RESULTS") outcome lines)"

t=$(now)
python -m opscan merge "$RESULTS" -o "$T/merged" -f json -q >"$T/merged.json"
echo "== merge: $(took "$t")"
t=$(now)
python -m opscan "$TARGET" --probe --device cpu --workers 1 --repro -o "$T/direct" -f json -q >"$T/direct.json"
echo "== direct measured run: $(took "$t")"

python - "$T" "$before" <<'PY'
import json, sys
from pathlib import Path

T, before = Path(sys.argv[1]), int(sys.argv[2])
lines = [json.loads(x) for x in (T / "bundle/results/results.jsonl").read_text().splitlines()]
seen = [(e["probe"], e["pass_name"]) for e in lines if e["kind"] == "outcome"]
assert len(seen) == len(set(seen)), "a probe ran twice"
assert lines[-1]["kind"] == "end" and lines[-1]["counts"]["reused"] == before, lines[-1]
runners = [e for e in lines if e["kind"] == "runner"]
assert len(runners) == 2 and all(p.startswith("src/") for r in runners for p in r["modules"].values()), runners
assert all("torchonly" in r["python"] for r in runners), [r["python"] for r in runners]


def canonical(path):
    doc = json.loads(path.read_text())
    doc["measurement"].pop("run")  # wall time, outcomes reused
    doc["measurement"].pop("journal")  # probes.jsonl (direct) / results.jsonl (merge)
    return doc


merged, direct = canonical(T / "merged/report.json"), canonical(T / "direct/report.json")
if merged != direct:
    keys = sorted(k for k in set(merged) | set(direct) if merged.get(k) != direct.get(k))
    sys.exit(f"FAIL: the merged report differs from the direct run in {keys}")
print(f"merged == direct ({len(merged['ops'])} rows, {merged['measurement']['probes']} probes, "
      f"{len(seen)} outcomes, {before} kept across the kill)")
PY

refuse() {  # refuse NAME FILE: merge must exit 2 with one line naming what is wrong
  set +e
  err=$(python -m opscan merge "$2" --bundle "$T/bundle" -o "$T/refused" -q 2>&1 >/dev/null)
  rc=$?
  set -e
  if [ "$rc" -ne 2 ] || ! grep -q "$1" <<<"$err"; then echo "FAIL: $1 results: exit $rc, $err"; exit 1; fi
  echo "refused ($1): $(tail -n 1 <<<"$err")"
}
sed '3s/.*/{not json/' "$RESULTS" >"$T/corrupted.jsonl" && refuse corrupted "$T/corrupted.jsonl"
sed '0,/"status":"ran"/s//"status":"crash"/' "$RESULTS" >"$T/tampered.jsonl" && refuse tampered "$T/tampered.jsonl"
head -n -1 "$RESULTS" >"$T/truncated.jsonl" && refuse truncated "$T/truncated.jsonl"
echo "== round trip OK"
