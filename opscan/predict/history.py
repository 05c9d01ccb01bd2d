"""Predict stage: the same step judged against every release of the knowledge base.

For each report row, `since` is the first covered torch release where every call of the row is
predicted `native`; the upgrade advice names the smallest release after the predicted-for one where
every row is native (the newest patch of that release series, which shares its entry). The calls
are the MPS view traced with the installed torch for the predicted-for release: decompositions and
the view's rewrites can differ in other releases (the report says so). A row whose op the
predicted-for release does not declare (the installed torch's own decomposition) says nothing about
what that release runs, so it never decides the advice, and the advice says how many such rows it set
aside — unless facts.yaml's `earlier_paths` knows the op that release ran in its place (`_safe_softmax`
before 2.5: `_softmax`), which predict.rules judges instead. Releases that share an entry and a facts series get the
same verdicts, so each such group is judged once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from opscan.knowledge import Knowledge, load_knowledge
from opscan.knowledge.entry import load_store
from opscan.opkey import Release, macos_text
from opscan.predict.memo import PredictMemo
from opscan.verdict import Classification, Verdict

OpDtypes = tuple  # (OpKey, dtypes)


@dataclass(frozen=True)
class ReleaseGroup:
    """Covered releases with one entry and one facts series: first and newest release."""

    first: str
    newest: str
    releases: tuple[str, ...]


@dataclass(frozen=True)
class Upgrade:
    """The upgrade advice of one scan."""

    release: str  # predicted for
    target: str | None  # the release to upgrade to (newest patch of the first all-native series)
    first: str | None  # the first release of that group
    checked: tuple[str, ...]  # newer releases looked at
    blocking: tuple[str, ...]  # rows still not native at the newest release, when no target
    text: str

    def to_dict(self) -> dict:
        """JSON form (the report's `upgrade` section)."""
        return {"release": self.release, "target": self.target, "first_native": self.first,
                "checked": list(self.checked), "blocking": list(self.blocking), "text": self.text}


def release_groups() -> tuple[ReleaseGroup, ...]:
    """Covered releases grouped by (entry, series), oldest first."""
    groups: dict[tuple[str, str], list[str]] = {}
    for line in load_store().index:
        groups.setdefault((line.entry, Release.parse(line.release).series), []).append(line.release)
    ordered = sorted(groups.values(), key=lambda rs: Release.parse(rs[0]))
    return tuple(ReleaseGroup(rs[0], max(rs, key=Release.parse), tuple(rs)) for rs in ordered)


def native_by_release(rows: dict[OpDtypes, list], classify: Callable[[object, Knowledge], Classification],
          macos: str | None, chip: str | None = None) -> dict[str, dict[OpDtypes, bool]]:
    """For each group's first release: row -> every distinct call native. `rows` holds distinct calls."""
    out = {}
    for group in release_groups():
        kb = load_knowledge(release=group.first, macos=macos, chip=chip)
        out[group.first] = {key: all(classify(call, kb).verdict == Verdict.NATIVE for call in calls)
                            for key, calls in rows.items()}
    return out


def since_of(native: dict[str, dict[OpDtypes, bool]]) -> dict[OpDtypes, str | None]:
    """Row -> the first release from which it is native in every later release (None: not native in the newest).
    A row that was native and regressed (a silent bug, predict/silent.py) is native since the release that fixed it."""
    keys = next(iter(native.values()), {}).keys()
    releases = list(native)
    out = {}
    for key in keys:
        since = None
        for r in reversed(releases):
            if not native[r][key]:
                break
            since = r
        out[key] = since
    return out


def advise(release: str, native: dict[str, dict[OpDtypes, bool]], current_native: bool,
           foreign: frozenset = frozenset()) -> Upgrade:
    """The smallest covered release after `release` where every row is native; rows in `foreign` (ops
    `release` does not declare) are set aside, and the advice says so."""
    native = {r: {k: ok for k, ok in rows.items() if k not in foreign} for r, rows in native.items()}
    found = _advise(release, native, current_native)
    if not foreign:
        return found
    n = len(foreign)
    aside = (f" ({n} {'row is an op' if n == 1 else 'rows are ops'} torch {release} does not declare: the installed "
             f"torch's own decomposition, whose path in {release} is not known, set aside)")
    return replace(found, text=found.text + aside)


def _advise(release: str, native: dict[str, dict[OpDtypes, bool]], current_native: bool) -> Upgrade:
    """advise() for the rows kept."""
    groups = {g.first: g for g in release_groups()}
    later = [r for r in native if Release.parse(groups[r].newest) > Release.parse(release)]
    checked = tuple(groups[r].newest for r in later)
    if current_native:
        return Upgrade(release, None, None, checked, (), f"every row is native in torch {release}")
    hit = next((r for r in later if all(native[r].values())), None)
    if hit is not None:
        target, first = groups[hit].newest, hit
        since = "" if target == first else f"; native from {first}"
        text = f"torch {target} makes every row of this step native (predicted{since})"
        return Upgrade(release, target, first, checked, (), text)
    newest = later[-1] if later else None
    blocking = tuple(f"{op.display} [{','.join(d)}]" for (op, d), ok in (native[newest] if newest else {}).items()
                     if not ok)
    text = (f"no covered release after torch {release} makes every row native"
            + (f" ({len(blocking)} {'row is' if len(blocking) == 1 else 'rows are'} not native in "
               f"{groups[newest].newest} either)" if newest else ""))
    return Upgrade(release, None, None, checked, blocking, text)


def history(rows: dict[OpDtypes, Sequence], classify: Callable[[object, Knowledge], Classification],
            kb: Knowledge, current: dict[OpDtypes, Verdict]) -> tuple[dict[OpDtypes, str | None], Upgrade]:
    """(row -> since, upgrade advice) for a scan predicted with `kb`.

    `rows`: row key -> its distinct calls; `classify(call, kb)` judges one call; `current`: each
    row's verdict for kb.release. An explicit --macos (kb.macos_source) is kept for every release.
    Rows of aten ops kb's release does not declare are set aside from the advice (module docstring)."""
    macos = macos_text(kb.macos) if kb.macos_source == "--macos" else None
    native = native_by_release(rows, classify, macos, kb.chip)
    foreign = frozenset(k for k in rows if k[0].namespace == "aten" and not kb.yaml.has(k[0])
                        and k[0] not in kb.facts.earlier_paths)
    current_native = all(v == Verdict.NATIVE for k, v in current.items() if k not in foreign)
    return since_of(native), advise(kb.release, native, current_native, foreign)


def distinct_calls(view, verdicts) -> tuple[dict[OpDtypes, list], dict[OpDtypes, Verdict]]:
    """(row key -> the row's calls that can be judged differently, row key -> its worst verdict).

    Calls that predict.predict_call answered from one cache entry ask one question, so one of them
    stands for all; the rest are never judged again (cheap on a trace of 10^4 calls)."""
    questions: dict[int, tuple] = {}
    for call, found in zip(view, verdicts):
        questions.setdefault(id(found), (call, found.hardware or found))  # MPS's, apart from placement
    rows: dict[OpDtypes, list] = {}
    worst: dict[OpDtypes, Verdict] = {}
    for call, found in questions.values():
        key = (call.op, call.dtypes)
        rows.setdefault(key, []).append(call)
        if key not in worst or found.verdict.rank > worst[key].rank:
            worst[key] = found.verdict
    return rows, worst


def call_classifier(memo: PredictMemo | None = None) -> Callable[[object, Knowledge], Classification]:
    """classify(call, kb) through predict.predict_call, with `memo`'s cache for each knowledge base (pass the
    scan's to share the answers between scans of the same trace for different releases)."""
    from opscan.predict.calls import predict_call

    memo = PredictMemo() if memo is None else memo

    def classify(call, kb: Knowledge) -> Classification:
        found = predict_call(call, kb, memo.verdicts(kb))
        return found.hardware or found  # since and upgrades are MPS's, apart from where the user's code puts tensors
    return classify


def since_and_upgrade(view, verdicts, kb: Knowledge, memo: PredictMemo | None = None
                      ) -> tuple[dict[OpDtypes, str | None], Upgrade]:
    """history() for a scan: `verdicts` are predict.predict_call's answers for the view's calls."""
    rows, current = distinct_calls(view, verdicts)
    return history(rows, call_classifier(memo), kb, current)


def with_since(found: Classification, since: str | None, release: str) -> Classification:
    """`found` with its row's `since`; a row native only in a later release gets that upgrade as remedy."""
    if since is None or found.verdict == Verdict.NATIVE or Release.parse(since) <= Release.parse(release):
        return replace(found, since=since)
    newest = next(g.newest for g in release_groups() if g.first == since)
    upgrade = f"upgrade to torch {newest} (native from {since})"
    return replace(found, since=since, remedy=f"{upgrade}, or {found.remedy}" if found.remedy else upgrade)
