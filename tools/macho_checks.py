"""Find the runtime checks compiled into a macOS arm64 libtorch_cpu.dylib (used by build_kernel_checks.py).

A failing TORCH_CHECK calls `c10::detail::torchCheckFail(__func__, __FILE__, __LINE__, message)`;
TORCH_CHECK_NOT_IMPLEMENTED / _TYPE / _VALUE / _INDEX and AT_ERROR build a `c10::SourceLocation{__func__,
__FILE__, __LINE__}` and construct the matching c10 error. So every check site loads the address of its
source file's path (a C string of the __cstring section) next to its line (an immediate) and its message,
and then calls one of those functions. This module reads the arrays the shared decoder (macho_arm64.py) makes:

* the C-string addresses (file paths, `__func__` names, message literals) an ADRP + ADD pair or a single ADR
  computes;
* MOVZ immediates (the line; TORCH_CHECK passes it in w2);
* BL targets, named through the __stubs section and the indirect symbol table (the failure functions
  live in libc10.dylib, so they are imported).

A site is a reference to the path of a file under aten/src/ATen/native/mps/ followed, within WINDOW
instructions, by a call to a failure function. Its function is the symbol containing it (local symbols
ship in the wheels), its message the C strings referenced between the previous site (or the function
start) and the call, its line the MOVZ into w2 (else the nearest plausible MOVZ). TORCH_WARN sites
(calls to c10::warn) are kept apart as warnings; TORCH_INTERNAL_ASSERT sites are dropped.
No torch import; numpy decodes the 20-odd million instructions of the text section in seconds.
"""

from __future__ import annotations

import bisect
import functools
import os
import re
import sys
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from macho_arm64 import Image, load as _load  # noqa: E402  (the shared decoder)

MPS_PATH = b"aten/src/ATen/native/mps/"
SOURCE_EXTENSIONS = (b".mm", b".h", b".cpp", b".metal", b".hpp", b".cc")
BACK = 40  # instructions scanned before it for the message's strings
_FAIL = {
    "torchCheckFail": "TORCH_CHECK",
    "NotImplementedErrorC": "TORCH_CHECK_NOT_IMPLEMENTED",
    "TypeErrorC": "TORCH_CHECK_TYPE",
    "ValueErrorC": "TORCH_CHECK_VALUE",
    "IndexErrorC": "TORCH_CHECK_INDEX",
    "LinAlgErrorC": "TORCH_CHECK_LINALG",
    "3c105ErrorC": "C10_THROW_ERROR",
    "torchInternalAssertFail": "TORCH_INTERNAL_ASSERT",
    "warn": "TORCH_WARN",
    "c107Warning": "TORCH_WARN",
}


@dataclass(frozen=True)
class Site:
    """One check compiled into the binary."""

    macro: str  # TORCH_CHECK, TORCH_CHECK_NOT_IMPLEMENTED, ..., TORCH_WARN
    file: str  # path from aten/ on
    line: int | None
    symbol: str  # mangled name of the function containing the site
    parts: tuple[str, ...]  # the C strings referenced: message fragments (and __func__)


def _decode(image: Image):
    """The arrays the checks read (macho_arm64 caches them on the image): (text address, ADRP+ADD / ADR
    address targets, MOVZ immediates, destination registers, BL targets)."""
    return image.text()[0], image.addresses(), image.movz(), image.registers(), image.calls()


def _cstring(image: Image, address: int) -> str | None:
    """The C string at `address` when it lies in __cstring."""
    return image.cstring(address)


def _macro(name: str | None) -> str | None:
    """The check macro a failure function belongs to (None: not one)."""
    if not name:
        return None
    return next((macro for key, macro in _FAIL.items() if key in name), None)


def load(data: bytes) -> Image:
    """The parsed image of a dylib's bytes (pass it to find_sites and callers to parse once)."""
    return _load(data)


def find_sites(data: bytes, image=None) -> list[Site]:
    """Every check site of the MPS sources in one dylib's bytes (see the module docstring)."""
    image = image or _load(data)
    base, target, movz, rd, bl = _decode(image)
    paths = _source_paths(image)
    path_refs = np.nonzero(np.isin(target, np.fromiter(paths, dtype=np.int64)))[0].tolist()
    starts = [a for a, _ in image.symbols]
    calls = _all_failure_calls(image, bl)
    sites, previous = [], {}
    for j in calls:
        fn = bisect.bisect_right(starts, base + 4 * j) - 1
        first = (starts[fn] - base) // 4 if fn >= 0 else 0
        lo = max(j - BACK, previous.get(fn, -1) + 1, first)
        previous[fn] = j
        k = bisect.bisect_right(path_refs, j) - 1
        if k < 0 or path_refs[k] < first:
            continue  # no source path in this function before the call
        macro = _macro(image.stubs.get(int(bl[j])))
        path = paths[int(target[path_refs[k]])]
        strings = [_cstring(image, int(t)) for t in target[lo:j + 1] if t >= 0]
        message = _message(strings)
        if macro == "TORCH_INTERNAL_ASSERT" or not _concerns_mps(path, message):
            continue
        line = _line(movz, rd, max(path_refs[k], lo), j, macro == "TORCH_CHECK")
        sites.append(Site(macro, _short(path), line, _symbol(image.symbols[fn][1]) if fn >= 0 else "?", message))
    return sites


def _concerns_mps(path: str, message: tuple[str, ...]) -> bool:
    """A check of an MPS source file, or one of shared code whose message names MPS."""
    if MPS_PATH.decode() in path:
        return True
    return "aten/src/ATen/native/" in path and any(_MPS_WORD.search(m) for m in message)


_MPS_WORD = re.compile(r"\bMPS\b|_mps\b|\bon mps\b", re.I)


def _symbol(name: str) -> str:
    """A symbol without the `.cold.N` suffix of an outlined cold path."""
    return re.sub(r"\.cold\.\d+$", "", name)


def _source_paths(image: Image) -> dict[int, str]:
    """Address -> text of every C string that is a source file's path (any directory: c10 headers
    inlined into a kernel carry their own, so their checks are not taken for the kernel's)."""
    start, size, offset, _, _ = image.sections["__cstring,__TEXT"]
    blob = image.data[offset:offset + size]
    out, pos = {}, 0
    for raw in blob.split(b"\0"):
        if raw.endswith(SOURCE_EXTENSIONS) and b"/" in raw and b" " not in raw:
            out[start + pos] = raw.decode("utf-8", "replace")
        pos += len(raw) + 1
    return out


def _message(strings) -> tuple[str, ...]:
    """The message fragments among a site's C strings (no paths, `__func__` names or assert texts)."""
    kept = (s for s in strings if s and "/" not in s[:1] and "INTERNAL ASSERT" not in s
            and not s.replace("_", "").replace("::", "").isalnum())
    return tuple(dict.fromkeys(kept))


def _all_failure_calls(image: Image, bl) -> list[int]:
    """Sorted indices of every call to a failure function (any source file)."""
    wanted = np.fromiter((a for a, name in image.stubs.items() if _macro(name)), dtype=np.int64)
    return np.nonzero(np.isin(bl, wanted))[0].tolist()


def _line(movz, rd, i: int, j: int, in_w2: bool) -> int | None:
    """The line: torchCheckFail takes it in w2; a SourceLocation gets it from the first MOVZ after the
    path's address (it is stored next to the path in the struct)."""
    after = [k for k in range(i, j + 1) if movz[k] > 0]
    if in_w2:
        after = [k for k in after if rd[k] == 2] or after
    return int(movz[after[0]]) if after else None


def _short(path: str) -> str:
    """The path from aten/ on."""
    return path[path.find("aten/"):] if "aten/" in path else path


def function_name(symbol: str) -> str | None:
    """The at::native (or at::native::mps) function a mangled symbol belongs to: `_lstm_mps`,
    `addmm_out_mps` for `structured_addmm_out_mps::impl`; lambdas and blocks give their enclosing
    function. None outside at::native."""
    match = _NATIVE.search(symbol)
    if match is None:
        return None
    size = int(match.group(1))
    name = symbol[match.end():match.end() + size]
    return name.removeprefix("structured_")


_NATIVE = re.compile(r"2at6native(?:3mps)?L?(\d+)")


def callers(data: bytes, symbols: tuple[str, ...], depth: int = 3, image=None) -> dict[str, set[str]]:
    """symbol -> the names (function_name) of the functions that call it, directly or through at most
    `depth` levels of other callers."""
    image = image or _load(data)
    base, _, _, _, bl = _decode(image)
    order = np.argsort(bl, kind="stable")
    sorted_bl = bl[order]
    starts = [a for a, _ in image.symbols]
    address = {name: a for a, name in image.symbols}

    @functools.lru_cache(maxsize=None)
    def direct(name: str) -> frozenset[str]:
        """Symbols with a BL to `name`."""
        if name not in address:
            return frozenset()
        lo, hi = np.searchsorted(sorted_bl, [address[name], address[name] + 1])
        hits = order[lo:hi].tolist()
        return frozenset(image.symbols[bisect.bisect_right(starts, base + 4 * i) - 1][1] for i in hits)

    out = {}
    for symbol in symbols:
        found, todo = set(), {symbol}
        for _ in range(depth):
            todo = {c for s in todo for c in direct(s)} - found
            found |= todo
        out[symbol] = {n for s in found if (n := function_name(s))}
    return out
