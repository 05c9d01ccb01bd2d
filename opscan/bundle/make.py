"""Bundle: the files of a bundle, as data (relative path -> bytes); opscan/cli/bundle.py writes them.

A bundle holds manifest.json, probes.jsonl (one ProbeCall JSON a line, no pickles), src/ (a copy of
the opscan modules the runner and its workers import: the standard library and torch only, listed in
VENDORED), run.sh, README.txt and repro/. The manifest lists every other file with its sha256 and each
repro script with the probe id of its call; the bundle hash is the sha256 of the canonical manifest
(results.bundle_hash: every field but itself), and every results header carries it.
"""

from __future__ import annotations

import io
import json
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path

from opscan import __version__
from opscan.bundle import FORMAT, MANIFEST, PROBES, RESULTS
from opscan.bundle.results import bundle_hash, digest
from opscan.bundle.templates import README_TXT, RUN_SH, quoted
from opscan.opkey import Release
from opscan.trust.text import strict_json

# what the bundle's runner imports, and nothing else: tests/test_bundle.py checks both ways
PROBE_MODULES = ("runner", "launch", "protocol", "worker", "zygote", "replay", "rebuild", "comparison", "backends",
                 "texts", "shrink", "journal")
VENDORED = ("opscan/__init__.py", "opscan/errors.py", "opscan/opkey.py", "opscan/probe/__init__.py",
            *(f"opscan/probe/{m}.py" for m in PROBE_MODULES),
            "opscan/bundle/__init__.py", "opscan/bundle/remote.py", "opscan/bundle/results.py")
EXECUTABLE = ("run.sh",)


@dataclass(frozen=True)
class BundleSpec:
    """What a bundle is made from: the target, the scan flags, the plan and how its probes run."""

    target: str
    model_name: str
    scan: dict  # bundle/options.py options_to_data(): what merge scans again
    plan: object  # opscan.probe.calls.Plan
    workers: int | None  # None: min(4, cores) of the Mac
    timeout: float
    on_pass: str = "when-needed"  # noqa: S105 - a probe pass's name ('on'/'off'), not a password
    repro: dict | None = None  # "repro/..." -> text (opscan.repro.render_files), or None
    repro_probes: dict | None = None  # "repro/....py" -> the probe id of its call (script_probes)
    repro_timeout: float = 120.0


def vendored_sources() -> dict[str, bytes]:
    """src/...: the runner's modules, read from this installation (op_probes: every module of it)."""
    import op_probes

    import opscan

    root = Path(opscan.__file__).resolve().parent.parent
    files = {f"src/{rel}": (root / rel).read_bytes() for rel in VENDORED}
    probes_root = Path(op_probes.__file__).resolve().parent
    for path in sorted(probes_root.glob("*.py")):
        files[f"src/op_probes/{path.name}"] = path.read_bytes()
    return files


def bundle_files(spec: BundleSpec, name: str) -> dict[str, bytes]:
    """Every file of the bundle (folder `name`), manifest.json included."""
    plan = spec.plan
    files = {PROBES: "".join(json.dumps(p.to_dict(), separators=(",", ":"), allow_nan=False) + "\n"
                             for p in plan.probes).encode()}
    files.update(vendored_sources())
    repro_probes = spec.repro_probes or {}
    scripts = [{"script": k, "probe": repro_probes[k]} for k in sorted(spec.repro or {}) if k.endswith(".py")]
    files.update({k: v.encode() for k, v in (spec.repro or {}).items()})
    files["run.sh"] = RUN_SH.format(results=RESULTS).encode()  # no user text in the script: nothing to inject
    words = dict(probes=len(plan.probes), model=spec.model_name, device=plan.device, name=name,
                 qname=quoted(name), target=spec.target, opscan_version=__version__, torch=plan.torch,
                 torch_release=quoted(Release.drop_local(plan.torch)), repro_timeout=f"{spec.repro_timeout:g}")
    files["README.txt"] = README_TXT.format(**words).encode()
    listed = {path: digest(data) for path, data in files.items()}
    manifest = {
        "format": FORMAT, "opscan_version": __version__, "target": spec.target, "model_name": spec.model_name,
        "scan": spec.scan, "device": plan.device, "fingerprint": plan.fingerprint,
        "torch": plan.torch, "probes": len(plan.probes), "max_elements": plan.max_elements,
        "runner": {"workers": spec.workers, "timeout": spec.timeout, "on_pass": spec.on_pass},
        "repro": scripts, "repro_timeout": spec.repro_timeout, "files": dict(sorted(listed.items())),
    }
    manifest["bundle_hash"] = bundle_hash(manifest)
    files[MANIFEST] = (strict_json(manifest, indent=2) + "\n").encode()
    return files


def script_probes(report: dict) -> dict[str, str]:
    """"repro/<op>/repro_N.py" -> the probe id of the call it replays, numbered as opscan.repro.render_op
    numbers them (the repro section's `findings[].calls[]`, unbuildable calls skipped)."""
    from opscan.repro import findings_by_op, folder_of

    out: dict[str, str] = {}
    for op, findings in findings_by_op(report).items():
        calls = [call for finding in findings for call in finding.get("calls") or [] if not call.get("unbuildable")]
        out.update({f"repro/{folder_of(op)}/repro_{i}.py": call["probe"]["id"] for i, call in enumerate(calls, 1)})
    return out


def zip_bytes(files: dict[str, bytes], name: str) -> bytes:
    """The bundle as a zip whose one top folder is `name` (run.sh keeps its executable bit)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for rel, data in sorted(files.items()):
            info = zipfile.ZipInfo(f"{name}/{rel}", date_time=(2020, 1, 1, 0, 0, 0))
            mode = 0o755 if rel in EXECUTABLE else 0o644
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    return buffer.getvalue()
