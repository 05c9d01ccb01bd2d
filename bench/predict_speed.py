"""Benchmark: what prediction costs once the step is traced — the knowledge base loaded cold, every call of a
12,000-call MPS view predicted, `since` and the upgrade advice judged against every release — and what one
release's whole `opscan coverage` costs (composites decided at build time, not here).

The view: a 4-layer LLaMA step (examples/llama_big.py, tiny widths: 7B's ops, shapes aside) repeated 8 times,
the size of 7B's 32-layer step. Each figure is the best of `--rounds` cold runs (every cache cleared), in
process CPU seconds, so other jobs on shared cores do not count.

    python bench/predict_speed.py [--rounds 3]

Goals (were timed assertions in tests/test_coverage.py): predicting the view under 0.5 s; coverage for one
release, since included, in about two seconds. The last line is `predict_12k_calls: <s> s`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def clear_caches() -> None:
    """Every lru_cache between the knowledge files and a verdict."""
    import opscan.knowledge.loader as knowledge
    import opscan.predict.composite as composite
    from opscan.knowledge import entry, opinfo

    for cached in (knowledge._load, knowledge._entry_table, entry._materialise, entry._op_fields,
                   entry._read_entry, entry.load_store, opinfo.load_opinfo_map, composite._memo):
        cached.cache_clear()


def big_view():
    """The 12,000-call MPS view."""
    from opscan.knowledge import load_knowledge
    from opscan.mps_view import mps_view
    from opscan.scan import ScanOptions, run_trace
    from opscan.target.load import load_target

    target = load_target(f"{REPO / 'examples' / 'llama_big.py'}:build_model", {"size": "tiny", "layers": 4,
                                                                               "seq": 16}, [])
    return mps_view(run_trace(target, ScanOptions("x", fx=False), load_knowledge())) * 8


def predict_seconds(view) -> float:
    """One cold prediction of the view, since and upgrade included (CPU seconds)."""
    from opscan.knowledge import load_knowledge
    from opscan.predict.calls import predict_call
    from opscan.predict.history import since_and_upgrade

    clear_caches()
    start = time.process_time()
    kb = load_knowledge()
    cache: dict = {}
    verdicts = [predict_call(call, kb, cache) for call in view]
    since_and_upgrade(view, verdicts, kb)
    return time.process_time() - start


def coverage_seconds(release: str) -> float:
    """One cold `opscan coverage --torch-version RELEASE`, since included (CPU seconds)."""
    from opscan.predict.coverage import coverage

    clear_caches()
    start = time.process_time()
    coverage(release)
    return time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    """Run both measurements and print them; the headline last."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--release", default="2.12.0", help="the release whose coverage is timed (default 2.12.0)")
    args = p.parse_args(argv)
    view = big_view()
    predict = min(predict_seconds(view) for _ in range(args.rounds))
    cover = min(coverage_seconds(args.release) for _ in range(args.rounds))
    print(f"MPS view: {len(view)} calls; best of {args.rounds} cold rounds, process CPU time")
    print(f"coverage {args.release} (since included): {cover:.2f} s (goal: about 2 s)")
    print(f"predict_12k_calls: {predict:.3f} s (goal: under 0.5 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
