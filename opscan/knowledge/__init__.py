"""Knowledge stage: everything opscan knows about MPS support in one torch release, as one immutable object.

`load_knowledge(yaml_path=None, release=None, macos=None)` builds the `Knowledge` of a release (loader.py) from
the shipped knowledge base: the release's entry (releases/, entry.py), facts.yaml and torchvision.yaml
(facts.py), opinfo_map.txt (opinfo.py), and the MPS kernels' runtime checks (kernel_checks.py, kernel_rules.py).
No torch import.
"""

from opscan.knowledge.loader import (
    Knowledge,
    KnowledgeError,
    default_yaml_path,
    installed_release,
    kb_releases,
    load_knowledge,
)

__all__ = ["Knowledge", "KnowledgeError", "load_knowledge", "installed_release", "default_yaml_path",
           "kb_releases"]
