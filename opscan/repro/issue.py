"""Repro stage: ISSUE.md for one cause worth an upstream report (repro/__init__.py), in the shape of PyTorch's bug
report template. Pure.

Title (the cause's first op), "🐛 Describe the bug" (what happens, and to which other ops of the same line; a minimal
snippet of at most 15 lines a maintainer can paste, snippet.py, which exits 2 "cannot run here" where the device is
missing — off a Mac it reproduces nothing; the opscan command; "Called from": the lines of the scanned code that
caused the calls, with their source text (the findings' sites, paths relative to the project); every op, dtype
signature and shape affected; the first repro script, attached
beside ISSUE.md rather than inlined, and its output — the real one when given, else the outcome opscan's probe recorded
on that device; a script that could not run where it was run (exit 2 "cannot run here": a bundle for MPS run off a Mac)
is said to be not run, with the reason it printed, never shown as the device's output), "Expected behavior", and
"Versions": a placeholder for `python -m torch.utils.collect_env` plus what it does not show for MPS (macOS, chip,
PYTORCH_ENABLE_MPS_FALLBACK, torch: "predicted for torch R" when nothing ran on the device, never the scanning
machine's own build). A missing kernel links PyTorch's MPS op-coverage tracking issue. Drafted for a cause opscan
would not file (`opscan repro --draft`), it opens with why and the links to follow instead. Text from the
report (the command line, PyTorch's messages, script output) only ever appears inside fenced code blocks whose
fence is longer than any backtick run in it; the rest (the opscan version in the header comment, the op and device
in the title) goes through opscan/trust/text.py: nothing ends the comment or the line early, and every value from
the report or a Mac outside a fence (op, device, dtypes, shapes, verdicts, macOS, chip, versions) is one code span
(markdown_text): no HTML, link, mention or heading can be injected, the title line included.
"""

from __future__ import annotations

import re

from opscan.opkey import TORCH_NAMESPACES
from opscan.repro.cause_text import called_from, cause_lines, not_for_filing, others
from opscan.repro.script import measured_environment
from opscan.repro.snippet import snippet_text
from opscan.trust.text import comment_text, inline_code, markdown_text

TRACKING_ISSUE = "https://github.com/pytorch/pytorch/issues/141287"
OLD_TRACKING_ISSUE = "https://github.com/pytorch/pytorch/issues/77764"  # the text of torch 2.0-2.5
DEVICE_NAMES = {"mps": "MPS", "cpu": "CPU", "cuda": "CUDA"}
CANNOT_RUN = 2  # a repro script's exit code for "cannot run here" (repro/runtime.py's contract)
RANKS = {"native": 0, "unknown": 1, "cpu_fallback": 2, "unsupported": 3, "unsupported_dtype": 3, "mismatch": 4,
         "error": 4, "crash": 5, "timeout": 5}
WHAT = {  # verdict: (title words, what happens, expected behaviour)
    "unsupported": ("is not implemented for the {dev} device",
                    "raises NotImplementedError on {dev} with PYTORCH_ENABLE_MPS_FALLBACK unset (and runs on the CPU, "
                    "slowly, with it set): there is no {dev} kernel for it",
                    "The op runs on the {dev} device, as it does on the CPU."),
    "unsupported_dtype": ("fails for {dtypes} on {dev}",
                          "raises a dtype error on {dev} for these dtypes",
                          "The op runs for these dtypes, or fails with a message naming the supported ones."),
    "cpu_fallback": ("falls back to the CPU on {dev}",
                     "runs, but PyTorch warns that it falls back to the CPU even with PYTORCH_ENABLE_MPS_FALLBACK "
                     "unset, copying its inputs to the host and back",
                     "The op runs on the {dev} device without a round trip through the CPU."),
    "error": ("raises on {dev} for these inputs",
              "raises on {dev} for these inputs, whatever PYTORCH_ENABLE_MPS_FALLBACK says",
              "The op gives the same result as on the CPU."),
    "mismatch": ("gives results that disagree with the CPU on {dev}",
                 "runs on {dev} but its outputs disagree with the CPU reference (floating inputs widened to float64) "
                 "beyond the tolerance of the dtype",
                 "The outputs agree with the CPU within the dtype's tolerance."),
    "crash": ("crashes the process on {dev}", "kills the process on {dev}",
              "The op runs, or raises a Python exception."),
    "timeout": ("hangs on {dev}", "does not finish on {dev} within the probe's time limit",
                "The op finishes in about the time it takes on the CPU."),
    "unknown": ("may not run on {dev}", "could not be judged by opscan on {dev}",
                "The op runs on the {dev} device."),
}


def fenced(text: str, lang: str = "") -> str:
    """A Markdown code block that `text` cannot close: the fence is longer than its longest backtick run (a value
    that is not text, from a report or a Mac, is shown as text; None as nothing)."""
    text = "" if text is None else text if isinstance(text, str) else str(text)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text.rstrip()}\n{fence}\n"


def issue_device(findings: list[dict], device: str, measured_on: str | None, real_devices: list[str]) -> str:
    """The device the issue is about: where its real output ran; else the measured device when the findings
    fail there (a measurement on cpu or cuda is about that device); else `device` (mps)."""
    if real_devices:
        return real_devices[0]
    if measured_on and any(RANKS.get(f.get("measured_verdict") or "native", 0) > 0 for f in findings):
        return measured_on
    return device


def issue_verdict(findings: list[dict], device: str, measured_on: str | None) -> str:
    """The verdict the issue is about: measured on `device` when the report measured there, else predicted."""
    def about(f):
        if measured_on == device and f.get("measured_verdict"):
            return f["measured_verdict"]
        return f["verdict"] if device == "mps" else (f.get("measured_verdict") or "unknown")
    return max((about(f) for f in findings), key=lambda v: RANKS.get(v, 0))


def real_output(call: dict, real_outputs: dict | None) -> dict | None:
    """The real run of this call's script: `real_outputs` is keyed by the call's probe id."""
    return (real_outputs or {}).get((call.get("probe") or {}).get("id"))


def could_not_run(real: dict) -> bool:
    """The script exited "cannot run here" (no such device there, the op or a dtype missing from that torch):
    its output says why, it is no output of the op on the device."""
    return real.get("exit_code") == CANNOT_RUN


def issue_text(report: dict, op: str, findings: list[dict], scripts: list[tuple[str, str, dict]], device: str,
               real_outputs: dict | None = None, cause=None) -> str:
    """ISSUE.md for one cause led by `op`: `findings` its rows' repro findings, `scripts` (path relative to the
    ISSUE.md, text, call entry) in order; `real_outputs` maps a call's probe id to its script's real run ({"device",
    "exit_code", "output", "environment"}); `cause` (repro.Cause): the user's lines and the upstream decision."""
    repro = report.get("repro") or {}
    reals = [r for _, _, call in scripts if (r := real_output(call, real_outputs)) and r.get("device")]
    device = issue_device(findings, device, repro.get("measured_on"), [r["device"] for r in reals])
    ran_on = [r["device"] for r in reals if not could_not_run(r)]  # "cannot run here" confirms nothing
    verdict = issue_verdict(findings, device, repro.get("measured_on"))
    dev = DEVICE_NAMES.get(device) or markdown_text(device)
    dtypes = "; ".join(", ".join(map(markdown_text, f["dtypes"])) for f in findings)
    title_words, what, expected = (part.format(dev=dev, dtypes=dtypes) for part in WHAT.get(verdict, WHAT["unknown"]))
    parts = [f"<!-- Generated by opscan {comment_text(report.get('opscan_version'))}: review it, then file it at "
             "https://github.com/pytorch/pytorch/issues/new?template=bug-report.yml -->\n",
             not_for_filing(cause),
             f"# [{dev}] {markdown_text(op)} {title_words}\n", "### 🐛 Describe the bug\n",
             f"{markdown_text(op)} {what}.{_basis(findings, device, repro.get('measured_on'), ran_on)}"
             f"{_not_torchs(op)}{others(op, findings)}\n",
             *snippet_block(findings, scripts, device),
             "opscan found it while scanning a training step with:\n", fenced(repro.get("command") or ""),
             cause_lines(cause) if cause is not None and cause.sites else called_from(report, findings),
             _affected(findings, device, repro.get("measured_on")), _tracking(verdict)]
    parts += _repro_block(scripts, device, real_outputs or {}, report)
    parts += ["### Expected behavior\n", f"{expected}\n", _versions(report, device, scripts, real_outputs or {})]
    return "\n".join(p for p in parts if p)


def snippet_block(findings: list[dict], scripts, device: str) -> list[str]:
    """The minimal snippet (snippet.py) of the call the first script replays (else the first call), with how to
    run it; [] when none can be written."""
    calls = [call for _, _, call in scripts[:1]] or [c for f in findings for c in f.get("calls") or []][:1]
    text = snippet_text(calls[0], device) if calls else None
    if text is None:
        return []
    return [f"Minimal repro (save it as `repro.py`; `python repro.py` runs it on {_device(device)}, `python "
            "repro.py cpu` on "
            "the CPU): it prints the error the call raises, or compares its result with the CPU's, and exits 1 when "
            f"the failure reproduces, 0 when it does not, 2 when it cannot run here (no "
            f"{DEVICE_NAMES.get(device) or _device(device)} on this machine: it reproduces nothing there).\n",
            fenced(text, "python")]


def _not_torchs(op: str) -> str:
    namespace = op.partition("::")[0]
    if namespace in TORCH_NAMESPACES:
        return ""
    return (f" {markdown_text(op)} is not one of PyTorch's operators (namespace {markdown_text(namespace)}): the "
            "scanned code registers it, "
            "so this is not for PyTorch's tracker unless a torch op it calls fails; run the snippet after importing "
            "that code.")


def _basis(findings: list[dict], device: str, measured_on: str | None, real_devices: list[str]) -> str:
    """Says when the verdict is a prediction, not a run on the device."""
    if real_devices or measured_on == device:
        return ""
    return (f" (Predicted by opscan from PyTorch's {DEVICE_NAMES.get(device) or markdown_text(device)} kernel "
            "tables for this release; the repro below checks it.)")


def _affected(findings: list[dict], device: str, measured_on: str | None) -> str:
    several = len({f.get("op") for f in findings}) > 1
    lines = [f"Affected {'ops, ' * several}dtype signatures and the input shapes the step used:\n",
             f"|{' op |' * several} dtypes | shapes | predicted for MPS | measured |",
             f"|{'---|' * several}---|---|---|---|"]
    for f in findings:
        measured = (f"{_verdict(f['measured_verdict'])} on {_device(measured_on)}"
                    if f.get("measured_verdict") else "—")
        shapes = ", ".join(markdown_text(s) for s in f.get("shapes") or []) or "—"
        op = f" {markdown_text(f.get('op'))} |" if several else ""
        lines.append(f"|{op} {', '.join(map(markdown_text, f['dtypes']))} | {shapes} | {_verdict(f['verdict'])} | "
                     f"{measured} |")
    return "\n".join(lines) + "\n"


def _tracking(verdict: str) -> str:
    if verdict != "unsupported":
        return ""
    return (f"There is no MPS kernel for this op: PyTorch's MPS op-coverage tracking issue is {TRACKING_ISSUE} "
            f"(torch 2.0-2.5 pointed to {OLD_TRACKING_ISSUE}). Setting `PYTORCH_ENABLE_MPS_FALLBACK=1` runs it "
            "on the CPU meanwhile.\n")


def _repro_block(scripts, device: str, real_outputs: dict, report: dict) -> list[str]:
    if not scripts:
        return ["No standalone repro could be generated for this op (its calls cannot be replayed).\n"]
    name, text, call = scripts[0]  # paths relative to this ISSUE.md's folder
    parts = [f"The full check is `{name}`, beside this file (attach it; {text.count(chr(10))} lines, needs only "
             f"torch): `python {name} --device {inline_code(device)}` replays the step's exact call of "
             f"{markdown_text(call['probe']['op'])} with {_inputs(call)} — its inputs rebuilt from a seed and the "
             "recorded values — and compares it with "
             "a float64 CPU reference; it exits 1 when the failure reproduces, 0 when it does not, 2 when it cannot "
             "run there.\n"]
    if call.get("minimized"):
        parts.append(f"The shapes were minimised: {_boundary(call['minimized'])}\n")
    parts += _output(call, real_outputs, device)
    more = [p for p, _, _ in scripts[1:]]
    if more:
        parts.append("Other calls of the step with these ops, as scripts (paths from this file's folder): " +
                     ", ".join(markdown_text(o) for o in more) + ".\n")
    return parts


def _inputs(call: dict) -> str:
    return ", ".join(markdown_text(f"{t['dtype']}{list(t['shape'])}") for t in call["probe"]["tensors"]) or "no tensors"


def _boundary(minimized: dict) -> str:
    fails, passes = minimized.get("fails_at"), minimized.get("passes_at")
    text = f"it still fails at input shapes {markdown_text(fails)}"
    sizes = "; ".join(f"size {markdown_text(size)} fails at {markdown_text(v['fails'])} and passes at "
                      f"{markdown_text(v['passes'])}" for size, v in (minimized.get("sizes") or {}).items())
    return (text + (f" and passes at {markdown_text(passes)}" if passes else "") +
            f" (originally {markdown_text(minimized.get('original'))}"
            + (f"; {sizes}" if sizes else "") + ").")


def _output(call: dict, real_outputs: dict, device: str) -> list[str]:
    real = real_output(call, real_outputs)
    if real and not could_not_run(real):
        return [f"Output on {_device(real.get('device'))} (exit code {_code(real.get('exit_code'))}):\n",
                fenced(real.get("output", ""))]
    parts = []
    if real:
        parts += [f"Not run on {_device(real.get('device'))}: the script could not run where the bundle ran "
                  f"(exit code {CANNOT_RUN}, cannot run here), so this is no output of the op; it said why:\n",
                  fenced(real.get("output", ""))]
    recorded = (call.get("outcomes") or {}).get(device)
    if not recorded:
        return parts + [f"(Not run on {_device(device)} yet: paste the script's output here.)\n" if not real
                        else f"(Paste the script's output on {_device(device)} here.)\n"]
    return parts + [f"What opscan's probe recorded on {_device(device)} for this call (the script's own "
                    "output is not available):\n", fenced(recorded_text(recorded))]


def recorded_text(outcome: dict) -> str:
    """A recorded outcome in the script's own words."""
    lines = []
    if outcome.get("fallback_seen"):
        lines.append("fallback: PyTorch warned that the op runs on the CPU")
    if outcome["status"] == "raised":
        lines.append(f"result: raised {outcome.get('exc_type')}: {outcome.get('message')}")
    elif outcome["status"] == "ran":
        within = {True: "within", False: "BEYOND"}.get(outcome.get("within"), "UNCHECKED (nothing compared)")
        lines.append(f"result: ran; max abs difference {_num(outcome.get('max_abs'))} · max rel difference "
                     f"{_num(outcome.get('max_rel'))} vs the {outcome.get('reference')} CPU reference: {within}"
                     + (f": {outcome['detail']}" if outcome.get("detail") else ""))
    else:
        lines.append(f"result: {outcome['status']} {outcome.get('signal') or outcome.get('message') or ''}".rstrip())
    code = outcome.get("expected_exit")
    lines.append(f"exit code {code}" if code is not None else f"the process {outcome['status']}")
    return "\n".join(lines)


def _num(x) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _versions(report: dict, device: str, scripts, real_outputs: dict) -> str:
    env = next((r["environment"] for _, _, call in scripts
                if (r := real_output(call, real_outputs)) and r.get("environment")), None)
    if env is None and (report.get("repro") or {}).get("measured_on") == device:
        env = measured_environment(report)
    env = env or {}
    missing = "fill in: not measured on this device"
    collected = env.get("collect_env")  # recorded on the Mac by a bundle's run.sh
    lines = ["### Versions\n", fenced(collected or "Paste the output of `python -m torch.utils.collect_env` here."),
             "What collect_env does not show for MPS:\n",
             f"- macOS: {_value(env.get('macos'), missing)}",
             f"- chip: {_value(env.get('chip'), missing)}",
             f"- PYTORCH_ENABLE_MPS_FALLBACK: {_value(env.get('fallback_env'), missing)}",
             f"- torch: {_torch_line(report, env)}"]
    return "\n".join(lines) + "\n"


def _torch_line(report: dict, env: dict) -> str:
    """The torch the script ran with on the device; off it, the release the verdict was predicted for (the scanning
    machine's own build, a Linux or CUDA one, is not what the Mac runs)."""
    if env.get("torch"):
        return f"{markdown_text(env['torch'])} (git {markdown_text(env.get('torch_git'))})"
    release = (report.get("assumptions") or {}).get("torch_release")
    return (f"predicted for torch {markdown_text(release)}: opscan did not run it on the device (fill in the torch "
            "the repro ran with)")


def _device(device) -> str:
    """A device name as written in prose: opscan's own (mps, cpu, cuda) as they are, any other (from a report or
    a Mac) as one code span."""
    return device if device in DEVICE_NAMES else markdown_text(device)


def _verdict(verdict) -> str:
    """A verdict as written in prose: a verdict name as it is, anything else (an edited report) as a code span."""
    return verdict if verdict in RANKS else markdown_text(verdict)


def _code(code) -> str:
    """An exit code: a number as it is, anything else (what a Mac sent) as a code span."""
    return str(code) if isinstance(code, int) and not isinstance(code, bool) else markdown_text(code)


def _value(value, missing: str) -> str:
    """A value from the report or a Mac, as one code span; `missing` (opscan's own words) when there is none."""
    return markdown_text(value) if value else missing
