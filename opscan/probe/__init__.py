"""Probe stage: measure what each distinct call of the step does on a device, in isolated processes.

Parent side: calls.py (the plan: one ProbeCall per distinct signature; groups.py rebuilds the ops MPS
runs for the lens rows, feeds.py attaches the forward that makes a call's saved inputs, shrink.py proposes
capped shapes), runner.py and launch.py (worker pools, both
fallback passes, crash/timeout isolation; zygote.py forks workers where that is safe), decide.py (the
contract's decision table), reconcile.py (probe outcomes -> row measurements and the report's
`measurement` section), journal.py (outcomes as they arrive, --resume), progress.py (the stderr bar),
stage.py (the entry point scan.py calls).
Child side: worker.py, replay.py, rebuild.py, comparison.py, backends.py, texts.py, protocol.py, shrink.py — they
import only torch, op_probes and each other (never rich, networkx or yaml; tested).
"""
