"""opscan: operator-coverage scanner for PyTorch training steps on Apple Silicon (MPS).

Importing this package must stay cheap: torch is imported lazily by the stages that need it,
so `opscan --help` answers without loading torch.
"""

__version__ = "0.1.0"
