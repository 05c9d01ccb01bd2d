"""Memory stage: will the step fit on a given Mac, at what batch size, and is it leaking.

- `tracker.py` (trace stage, torch): a TorchDispatchMode that records when each storage the step makes
  is allocated and freed (weakref callbacks on the storages, as PyTorch's own MemTracker does);
- `estimate.py` (pure): peak per phase and category, the module holding it, the steady-state step;
- `batch.py` (torch): the same step on meta (else fake) tensors at two larger batches, for sizing;
- `sizing.py` (pure): Macs from 8 to 512 GB: verdicts and the largest batch that fits;
- `bf16.py`: which rows bfloat16 would make worse (the MPS view classified again);
- `section.py` (pure): the report's `memory` section, its console line and its lane effect;
- `stage.py`: composes them for scan.py;
- `live.py`, `counters.py` (torch): `--memory --device D`, a few real iterations and their counters.

This package's __init__ imports nothing: report.py and the renderers read the section as plain data.
"""
