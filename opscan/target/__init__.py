"""Target stage: what to scan — `file.py:fn` or `pkg.mod:fn` loaded into a model, inputs and step hooks.

load.py (import the target, call its factory, find its hooks), inputs.py (`--input` and `--arg` parsing,
no torch).
"""
