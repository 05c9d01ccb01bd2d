"""Bundle: measure a step on a Mac that has only Python and torch, then fold the results back in.

`opscan bundle TARGET ... -o DIR` (cli/bundle.py, make.py) traces the step here, plans its probes and writes
DIR/ and DIR.zip: manifest.json, probes.jsonl, src/ (the opscan modules the runner needs: stdlib and
torch only), run.sh, README.txt and repro/. On the Mac, `./run.sh` (remote.py) runs both fallback
passes and the repro scripts into results/results.jsonl (results.py); `opscan merge RESULTS`
(merge.py) validates that file and rebuilds the measured report exactly as `opscan TARGET --probe`
would have. This module is vendored into every bundle: it imports nothing.
"""

FORMAT = 2  # the bundle layout (manifest.json's "format"); 2: the scan options as data ("scan"), not argv
EARLIER_FORMATS = (1,)  # refused with a request to make the bundle again
MANIFEST = "manifest.json"
PROBES = "probes.jsonl"
RESULTS = "results/results.jsonl"
