"""Predict stage: the verdict of a Python API that the trace records as a call of its own (rule `amp-api`).

A mixed-precision API that does not exist on a Mac in some release is recorded by the trace as a call without
tensors (opscan/trace/amp.py): `torch::autocast.mps` (torch.autocast("mps"), before 2.5.0) and
`torch::amp.GradScaler` (torch.amp.GradScaler, before 2.3.0). Their verdict for a release comes from the
AutocastMPS table (opscan/knowledge/autocast_mps.txt): `error` where the API raises, `native` where it exists,
so the report's first-native release and upgrade advice read as for any op.

Rule `fft-half`: the torch.fft composites (`aten::fft_*`) refuse float16 and bfloat16 input on every device but
CUDA, MPS included, in every release (SpectralOps.cpp promote_type_fft): no AutocastMPS rule casts an FFT, so a
half-precision activation reaches one under MPS autocast and the step raises there. Pure: no torch, no I/O beyond
the cached table.
"""

from __future__ import annotations

from opscan.knowledge.autocast import AutocastPolicy, load_table, policy_of
from opscan.opkey import OpKey
from opscan.predict.dtype_rules import result
from opscan.verdict import Classification, Verdict

SRC_FFT = ("aten/src/ATen/native/SpectralOps.cpp promote_type_fft: `maybe_support_half = device.is_cuda() || "
           "device.is_meta()`, else TORCH_CHECK(type == kFloat || type == kDouble, \"Unsupported dtype \", type) "
           "(pytorch/pytorch, search tool file id 38108024; 2.0's version refused half everywhere); checked on the "
           "installed torch with FakeTensors on device mps: float16 and bfloat16 torch.fft.rfft raise")
_NOT_TRANSFORMS = frozenset({"fft_fftfreq", "fft_rfftfreq", "fft_fftshift", "fft_ifftshift"})
AUTOCAST_API = OpKey("torch", "autocast", "mps")
SCALER_API = OpKey("torch", "amp", "GradScaler")


def amp_api(c) -> Classification | None:
    """Rule `amp-api`: torch.autocast("mps") / torch.amp.GradScaler in the predicted-for release."""
    if c.op not in (AUTOCAST_API, SCALER_API):
        return None
    policy = policy_of(c.release)
    if policy is None:
        return None
    return _autocast(c, policy) if c.op == AUTOCAST_API else _scaler(c, policy)


def _autocast(c, policy: AutocastPolicy) -> Classification:
    since = _first(lambda group: group.fields.get("available") == "yes")
    if policy.available:
        fields = policy.group.fields
        text = (f"torch.autocast('mps') exists in torch {c.release}: its AutocastMPS policy casts "
                f"{len(policy.group.ops)} ops, dtypes {fields.get('dtypes')} (default {policy.default_dtype})")
        return result(Verdict.NATIVE, "amp-api", text, policy.source)
    text = (f"torch.autocast('mps') raises on a Mac in torch {c.release} ({policy.group.fields.get('raises')}): "
            f"MPS autocast arrived in torch {since}")
    remedy = (f"upgrade to torch {since} or later (float16; bfloat16 from 2.6.0), or train the region in float32 "
              "(drop the autocast)")
    return result(Verdict.ERROR, "amp-api", text, policy.source, remedy)


def _scaler(c, policy: AutocastPolicy) -> Classification:
    since = _first(lambda group: group.fields.get("gradscaler", "absent") != "absent")
    fixed = _first(lambda group: group.fields.get("gradscaler", "").startswith("mps-branch"))
    if policy.gradscaler != "absent":
        how = "a float32 reciprocal" if policy.gradscaler == "mps-branch" else \
            "self._scale.double(), which MPS refuses (see the float64 rows)"
        text = f"torch.amp.GradScaler exists in torch {c.release}; its unscale_ inverts an MPS scale with {how}"
        return result(Verdict.NATIVE, "amp-api", text, policy.source)
    text = (f"torch.amp.GradScaler does not exist in torch {c.release} (AttributeError on a Mac; it arrived in torch "
            f"{since}), and torch.cuda.amp.GradScaler disables itself without CUDA")
    remedy = (f"upgrade to torch {fixed} or later (torch.amp.GradScaler from {since}; its unscale_ runs on MPS from "
              f"{fixed}), or train without a scaler (bfloat16 needs none)")
    return result(Verdict.ERROR, "amp-api", text, policy.source, remedy)


def _first(test) -> str:
    return next((group.releases[0] for group in load_table() if test(group)), "?")


def fft_half(c) -> Classification | None:
    """Rule `fft-half` (see the module docstring)."""
    if c.op.namespace != "aten" or not c.op.name.startswith("fft_") or c.op.name in _NOT_TRANSFORMS:
        return None
    half = [d for d in c.dtypes[:1] if d in ("float16", "bfloat16")]
    if not half:
        return None
    name = {"float16": "Half", "bfloat16": "BFloat16"}[half[0]]
    text = (f"{c.op} refuses {half[0]} input on MPS in torch {c.release}: its composite allows half precision on "
            f"CUDA only ('Unsupported dtype {name}'); no AutocastMPS rule casts an FFT, so under MPS autocast a "
            "half-precision activation reaches it")
    remedy = "cast the FFT's input to float32 (x.float()) inside the autocast region, or run the FFT outside it"
    return result(Verdict.ERROR, "fft-half", text, SRC_FFT, remedy)
