"""The zoo's shipped families: every model of a library, as ZooModels (targets in zoo/factories.py).

- torchvision: torchvision.models.list_models per module — classification, detection, segmentation, video,
  optical flow (the quantized models are left out: their int8 kernels are CPU-only by design, not a training
  step) — at real size with small inputs; fake tensors first (nothing allocated), real ones for detection (its
  box sampling is data-dependent, which fake tensors cannot follow).
- timm: timm.list_models(), full size at the pretrained config's input size, fake tensors first.
- transformers: for every model type of the auto-model mappings (causal LM, masked LM, sequence and image
  classification), the auto class from its default config shrunk to 2 layers of width 32 (factories.SMALL).
Each model's name is unique in its family; the order is the library's (a --limit keeps a stable prefix).
"""

from __future__ import annotations

from opscan.errors import UsageError
from opscan.zoo.models import ZooModel

FAMILIES = ("torchvision", "timm", "transformers")
FACTORIES = "opscan.zoo.factories"
TORCHVISION_KINDS = (("classification", ""), ("detection", "detection"), ("segmentation", "segmentation"),
                     ("video", "video"), ("optical_flow", "optical_flow"))
HF_MAPPINGS = (("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"), ("masked-lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
               ("classify", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
               ("image", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"))


def family(name: str) -> tuple[ZooModel, ...]:
    """Every model of the family `name` (UsageError for an unknown family or a library that is missing)."""
    builders = {"torchvision": torchvision_models, "timm": timm_models, "transformers": transformers_models}
    if name not in builders:
        raise UsageError(f"unknown zoo family {name!r}: pass one of {', '.join(FAMILIES)} or a manifest file "
                         "(.yaml)")
    try:
        return builders[name]()
    except ImportError as exc:
        if not installed(name):
            raise UsageError(f"the {name} family needs {name} installed (pip install {name})") from None
        # installed, but it (or what it imports) failed: say what failed, not that it is missing
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise UsageError(f"the {name} family: {name} is installed but importing it failed ({type(exc).__name__}: "
                         f"{first}) — install a {name} release built for this torch") from None


def installed(library: str) -> bool:
    """Whether `library` is installed (found on the path; not imported)."""
    import importlib.util

    try:
        return importlib.util.find_spec(library) is not None
    except (ImportError, ValueError):
        return False


def torchvision_models() -> tuple[ZooModel, ...]:
    import torchvision.models as tvm

    out = []
    for kind, module in TORCHVISION_KINDS:
        where = getattr(tvm, module) if module else tvm
        for name in tvm.list_models(module=where):
            out.append(ZooModel(name, f"{FACTORIES}:torchvision", {"name": name, "kind": kind},
                                fake="false" if kind == "detection" else "auto", source=f"torchvision/{kind}"))
    return tuple(out)


def timm_models() -> tuple[ZooModel, ...]:
    import timm

    return tuple(ZooModel(name, f"{FACTORIES}:timm_model", {"name": name}, source="timm")
                 for name in timm.list_models())


def transformers_models() -> tuple[ZooModel, ...]:
    from transformers.models.auto import modeling_auto

    out = []
    for head, mapping in HF_MAPPINGS:
        for model_type in getattr(modeling_auto, mapping):
            out.append(ZooModel(f"{model_type}-{head}", f"{FACTORIES}:hf_auto", {"model_type": model_type,
                                                                                  "head": head},
                                fake="false", source=f"transformers/{head}"))
    return tuple(out)
