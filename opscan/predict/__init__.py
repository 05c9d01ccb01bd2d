"""Predict stage: each MPS-view call's verdict on MPS from the knowledge base of one torch release.

rules.py (an op overload and its dtypes -> a verdict, rule by rule), dtype_rules.py (the dtype layer),
calls.py (a call of the MPS view -> its verdict, shape rules included), history.py (the same step against
every release: `since` and the upgrade advice), coverage.py (a whole release as rows: `opscan coverage`).
"""
