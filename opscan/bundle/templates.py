"""Bundle: the text of run.sh and README.txt (filled in by make.py; pure data). run.sh holds no user text."""

from __future__ import annotations

import shlex


def quoted(text: str) -> str:
    """`text` as one shell word (README.txt's commands are copied into a shell)."""
    return shlex.quote(text)

RUN_SH = r"""#!/usr/bin/env bash
# opscan bundle runner: probes the calls of probes.jsonl (manifest.json says which model and device) with both
# fallback passes, then the repro scripts, into results/results.jsonl. Needs Python 3.10+ and torch only
# (PYTHON=... to choose the interpreter; default python3). Safe to rerun: it resumes where a killed run stopped.
#   ./run.sh            run here, logs in results/logs/ (ignores SIGHUP: a dropped SSH session does not stop it)
#   ./run.sh --detach   the same in the background under nohup (and setsid where present); pid in results/run.pid
# OPSCAN_SKIP_COLLECT_ENV=1 skips `python -m torch.utils.collect_env` (slow; the rest of the environment is kept)
# No text from the command that made the bundle is in this script: names and flags stay in manifest.json.
set -u
trap '' HUP
BUNDLE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
cd "$BUNDLE" || exit 2
PY="${{PYTHON:-python3}}"
export PYTHONPATH="$BUNDLE/src${{PYTHONPATH:+:$PYTHONPATH}}"
export PYTHONUNBUFFERED=1

# refused at once, one line, nothing written: no torch, a file that differs from manifest.json, a device torch
# cannot use here, another run.sh running on this bundle
if ! INFO="$("$PY" -m opscan.bundle.remote "$BUNDLE" --check)"; then
  exit 2
fi
mkdir -p results/logs results/env
LOG="$BUNDLE/results/logs/run.log"

if [ "${{1:-}}" = "--detach" ]; then
  shift
  if command -v setsid >/dev/null 2>&1; then
    nohup setsid bash "$BUNDLE/run.sh" "$@" >>"$LOG" 2>&1 </dev/null &
  else
    nohup bash "$BUNDLE/run.sh" "$@" >>"$LOG" 2>&1 </dev/null &
  fi
  echo $! >results/run.pid
  echo "opscan bundle: running in the background (pid $!); follow it with: tail -f $LOG"
  echo "opscan bundle: when it says done, copy back $BUNDLE/{results}"
  exit 0
fi

printf '%s\n' "$INFO" >results/env/python_torch.txt
record() {{  # record NAME COMMAND...: one environment file, never fatal
  local name="$1"; shift
  "$@" >"results/env/$name.txt" 2>&1 || echo "(exit $?: $*)" >>"results/env/$name.txt"
}}
if [ ! -s "{results}" ]; then  # a fresh run (a resumed one keeps the first run's records)
  if [ -z "${{OPSCAN_SKIP_COLLECT_ENV:-}}" ]; then record collect_env "$PY" -m torch.utils.collect_env; fi
  record uname uname -a
  if command -v sw_vers >/dev/null 2>&1; then record sw_vers sw_vers; fi
  if command -v sysctl >/dev/null 2>&1; then record chip sysctl -n machdep.cpu.brand_string; fi
fi

echo "opscan bundle: probing; log: $LOG"
"$PY" -m opscan.bundle.remote "$BUNDLE" "$@" >>"$LOG" 2>&1
rc=$?
if [ "$rc" -eq 0 ]; then
  echo "opscan bundle: done — copy back $BUNDLE/{results} and run: opscan merge results.jsonl --bundle DIR" \
    "(DIR: this bundle's folder where it was made)"
else
  echo "opscan bundle: the run stopped (exit $rc); see $LOG — rerun ./run.sh to continue" >&2
fi
exit "$rc"
"""

README_TXT = """opscan bundle: {model} ({target}), {probes} probes on {device}
Made by opscan {opscan_version} with torch {torch}; its hash is manifest.json's bundle_hash.

On the Mac (Apple Silicon; nothing but Python 3.10+ and torch is needed, and no network beyond
installing torch):

  1. unzip {qname}.zip && cd {qname}
  2. python3 -m pip install torch=={torch_release}     (the release that traced the step; another one
                                                       measures that release instead)
  3. nohup ./run.sh &        or  ./run.sh --detach       (survives a dropped SSH session)
     tail -f results/logs/run.log                        (progress; ends with "done")
     A killed run continues where it stopped: run ./run.sh again. PYTHON=/path/to/python to choose one.
  4. copy results/results.jsonl back, then on the machine that made the bundle (the target must import
     there, with the same torch and opscan):

       opscan merge results.jsonl --bundle {qname}

What run.sh writes: results/env/ (python, torch, torch.utils.collect_env, sw_vers, chip, uname),
results/logs/ (run.log; workers.log, the probe processes' stderr), results/results.jsonl (the
outcomes as they arrive, the repro scripts' outputs, and an end line with a digest: an edited file
is refused by merge). run.sh and merge both refuse a bundle whose manifest.json does not match its
bundle_hash or whose listed files (run.sh, README.txt, probes.jsonl, src/, repro/) differ from their sha256.

Contents: manifest.json (what was traced, with a sha256 for every file), probes.jsonl (one probe
call per line, plain JSON), src/ (the opscan modules the runner needs: standard library and torch
only), repro/ (a script per predicted finding; run.sh runs each with a {repro_timeout} s limit).
"""
