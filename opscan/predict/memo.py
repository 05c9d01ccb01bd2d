"""Predict stage: what it has judged of one trace, kept while that trace is judged for several releases
(opscan/zoo/releases.py scans one trace for every release; scan.Prepared carries one PredictMemo).

Each knowledge base's verdicts by call question (predict.calls.predict_call's cache: a release's judgement of a
call is made once, by the scan and by its since/upgrade history alike), and each release's view of the step as
its own Python code runs it (predict/python_paths.py). Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opscan.knowledge import Knowledge


@dataclass(eq=False)
class PredictMemo:
    """The predict stage's memo of one trace (see the module docstring)."""

    by_kb: dict[int, tuple[Knowledge, dict]] = field(default_factory=dict)  # id(kb) -> (kb, its verdicts)
    release_paths: dict[str, object] = field(default_factory=dict)  # release -> python_paths.ReleasePaths

    def verdicts(self, kb: Knowledge) -> dict:
        """predict_call's cache for `kb` (keyed by id(kb); the entry holds kb, so the id stays its own)."""
        return self.by_kb.setdefault(id(kb), (kb, {}))[1]

    def paths(self, trace, view, kb: Knowledge):
        """The ReleasePaths of kb's release for this trace (python_paths.release_paths), made once."""
        if kb.release not in self.release_paths:
            from opscan.predict.python_paths import release_paths

            self.release_paths[kb.release] = release_paths(trace, view, kb)
        return self.release_paths[kb.release]
