"""Bundle: fold a finished results file back into the report a direct measured scan would have made.

`merged_report` re-traces the target with the bundle's own scan flags, re-plans its probes, requires the
bundle's plan fingerprint (same torch, opscan and model), and runs the ordinary `scan()` with a
`ReplaySession` whose outcomes are the results file's: nothing is probed here, and the report is built by
the same code as `opscan TARGET --probe --device D`'s. The target must import where merge runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from opscan.bundle import EARLIER_FORMATS, FORMAT, MANIFEST, PROBES
from opscan.bundle.results import Results, bundle_problem
from opscan.errors import OpscanError
from opscan.probe.stage import ProbeSession
from opscan.trust.read import SMALL_BYTES


class BundleError(OpscanError):
    """A bundle folder that cannot be used, or a target that no longer traces as it did."""


@dataclass(frozen=True)
class Bundle:
    """A bundle folder as merge sees it: its manifest, hash and probe calls."""

    folder: Path
    manifest: dict
    hash: str
    probes: tuple

    @property
    def on_pass(self) -> str:
        """Which probes get the fallback-on pass (the runner's option)."""
        return self.manifest["runner"]["on_pass"]


def load_bundle(folder: Path) -> Bundle:
    """Read a bundle folder as received (the one reader, opscan/trust/read.py); its files must be the ones its
    manifest lists. Nothing here is trusted yet: `trusted` swaps the manifest for the record made here."""
    from opscan.trust.read import read_bytes, read_json

    fix = "pass --bundle with the folder `opscan bundle -o` wrote"
    if not (folder / MANIFEST).is_file():
        raise BundleError(f"{folder} is not an opscan bundle (no {MANIFEST} in it) — {fix}")
    manifest = read_json(folder / MANIFEST, "the bundle manifest", fix, expected="a bundle manifest",
                         error=BundleError, max_bytes=SMALL_BYTES)
    if isinstance(manifest, dict) and manifest.get("format") in EARLIER_FORMATS:
        raise BundleError(f"{folder} was made by an earlier opscan (bundle format {manifest['format']}; this opscan "
                          f"reads format {FORMAT}) — make the bundle again with `opscan bundle`, rerun it, then merge")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or "files" not in manifest:
        raise BundleError(f"{folder}/{MANIFEST} is not a bundle manifest of format {FORMAT} — make the bundle "
                          "again with this opscan")
    problem = bundle_problem(folder, manifest)
    if problem:
        raise BundleError(f"{folder} was modified after it was made ({problem}) — unpack the bundle again, or make "
                          "a new one")
    data = read_bytes(folder / PROBES, f"the bundle's {PROBES}", fix, error=BundleError)
    return Bundle(folder, manifest, manifest["bundle_hash"], _probes(folder / PROBES, data))


def _probes(path: Path, data: bytes) -> tuple:
    """The ProbeCalls of probes.jsonl (plain JSON data); BundleError naming the first line that is not one."""
    from opscan.probe.protocol import ProbeCall
    from opscan.trust.read import Malformed, json_value

    probes = []
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            probes.append(ProbeCall.from_dict(json_value(line)))
        except (Malformed, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BundleError(f"{path}, line {number} is not a probe call ({type(exc).__name__}: {str(exc)[:80]}) "
                              "— unpack the bundle again, or make a new one") from None
    return tuple(probes)


def trusted(bundle: Bundle) -> Bundle:
    """The bundle with the manifest recorded on this machine when it was made (opscan/bundle/record.py) in place
    of the received one; UntrustedBundleError (exit 2, naming what changed) when they differ or there is none."""
    from opscan.bundle.record import trusted_manifest

    return replace(bundle, manifest=trusted_manifest(bundle.manifest, bundle.folder))


class ReplaySession(ProbeSession):
    """A probe session whose outcomes come from a results file: it opens nothing and runs nothing."""

    probes_here = False

    def __init__(self, results: Results, fingerprint: str, journal_name: str):
        super().__init__(lambda _name: Path("."))
        self.results, self.fingerprint, self.journal_name = results, fingerprint, journal_name

    def open(self, plan, model_name: str) -> tuple[dict, dict]:
        """The results' outcomes and pass environments, for a plan equal to the bundle's."""
        if plan.fingerprint != self.fingerprint:
            raise BundleError(f"the target traced differently from the bundle (plan {plan.fingerprint}, bundle "
                              f"{self.fingerprint}) — same torch/opscan/model needed: merge where the bundle was made")
        self.name = self.journal_name
        return dict(self.results.outcomes), dict(self.results.environments)

    def pass_started(self, pass_name: str, total: int) -> None:
        """Never reached for a complete results file: merge probes nothing."""
        raise BundleError(f"{total} probes of pass {pass_name} have no outcome in the results — rerun ./run.sh on "
                          "the Mac and copy results/results.jsonl again")


def merged_report(bundle: Bundle, results: Results, target: str | None = None, ctx=None):
    """The measured Report of the bundle's target, its outcomes taken from `results` (validated); `ctx`: the
    run's RunContext (target/run.py)."""
    from opscan.bundle.options import options_from_data
    from opscan.probe.stage import ProbeOptions
    from opscan.scan import scan

    manifest, header = bundle.manifest, results.header
    probe = ProbeOptions(device=manifest["device"], max_elements=manifest["max_elements"],
                         workers=header["workers"], timeout=header["timeout_s"], isolation=header["isolation"],
                         on_pass=header["on_pass"])
    session = ReplaySession(results, manifest["fingerprint"], "results.jsonl")
    overrides = {"target": target} if target else {}
    return scan(options_from_data(manifest["scan"], probe=probe, **overrides), session, ctx=ctx)


def differences(report) -> list[str]:
    """One line per row whose measured verdict differs from its prediction."""
    found = (report.measurement or {}).get("disagreements") or []
    return [f"≠ {d['op']} [{','.join(d['dtypes'])}]: predicted {d['predicted']}, measured {d['measured']}"
            for d in found]


def real_outputs(results: Results) -> dict:
    """What each repro script printed on the Mac, keyed by the probe id of the call it replays (the repro
    section's `findings[].calls[].probe.id`), for opscan.repro.render_files."""
    collect_env = results.host.get("collect_env")  # run.sh's `python -m torch.utils.collect_env`, when recorded
    return {line["probe"]: {"device": line.get("device"), "exit_code": line.get("exit_code"),
                            "output": line.get("output"),
                            "environment": {**(line.get("environment") or {}),
                                            **({"collect_env": collect_env} if collect_env else {})}}
            for line in results.repro.values() if line.get("probe")}


def repro_files(report, device: str) -> tuple[dict[str, str], dict[str, str]]:
    """(opscan.repro.render_files of the report: a script per finding call and an ISSUE.md per op; each script's
    probe id) — ({}, {}) for a report without a `repro` section."""
    from opscan.bundle.make import script_probes
    from opscan.repro import render_files

    if report.repro is None:
        return {}, {}
    data = report.to_dict()
    files, probes = render_files(data, device=device), script_probes(data)
    scripts = {k for k in files if k.endswith(".py")}
    if scripts != set(probes):  # opscan.repro numbers its scripts otherwise: a bug here, not the user's
        raise AssertionError(f"repro scripts {sorted(scripts ^ set(probes))[:3]} have no probe id")
    return files, probes
