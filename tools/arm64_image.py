"""Just enough of a macOS arm64 Mach-O image to read registration code (used by build_autocast_mps.py).

The research decoder (issue 24, research/cxx/arm64_calls.py), cut to what reading a TORCH_LIBRARY_IMPL body
needs, and decoding only the functions asked for (a body is a few thousand instructions; the whole text
section of libtorch_cpu.dylib is ~100 M):

* the function containing an address and its extent (up to the next text symbol: local symbols ship);
* per instruction of a function: the target of a BL, and the address an ADRP+ADD pair **or an ADR**
  computes (the linker relaxes ADRP+ADD into ADR+NOP when the target is within 1 MiB: 2.5-2.9 wheels);
* the C string at an address, and the address of a data symbol by the end of its name.

It reuses tools/macho_checks.py's Mach-O parser (sections, symbols, stubs). The i24-cxx branch merges the
full research decoder into tools/macho_checks.py; this module should fold into it after that merge.
No torch import.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass

import numpy as np

from macho_checks import _load

PAIR = 8  # how far back an ADD looks for the ADRP of its register


@dataclass
class Image:
    """A parsed image: its bytes, sections and text symbols (sorted by address)."""

    data: bytes
    sections: dict  # name -> (addr, size, offset, reserved1, reserved2)
    starts: list[int]
    names: list[str]  # mangled name per start (leading underscore removed)

    @property
    def text(self) -> tuple[int, int, int]:
        """(address, size, file offset) of the __text section."""
        addr, size, offset, _, _ = self.sections["__text,__TEXT"]
        return addr, size, offset

    def function_at(self, address: int) -> int:
        """Index of the text symbol containing `address` (-1 before the first)."""
        return bisect.bisect_right(self.starts, address) - 1

    def extent(self, fn: int) -> tuple[int, int]:
        """[start, end) addresses of function `fn`."""
        addr, size, _ = self.text
        end = self.starts[fn + 1] if fn + 1 < len(self.starts) else addr + size
        return self.starts[fn], end

    def decode(self, fn: int) -> tuple[np.ndarray, np.ndarray]:
        """Per instruction of function `fn`: (BL target or -1, ADRP+ADD / ADR address or -1)."""
        start, end = self.extent(fn)
        addr, _, offset = self.text
        insn = np.frombuffer(self.data, dtype="<u4", count=(end - start) // 4,
                             offset=offset + start - addr).astype(np.int64)
        pc = start + 4 * np.arange(insn.size, dtype=np.int64)
        is_call = (insn & 0xFC000000) == 0x94000000
        calls = np.where(is_call, pc + 4 * _signed(insn & 0x3FFFFFF, 26), -1)
        return calls, _addresses(insn, pc)

    def cstring(self, address: int) -> str | None:
        """The C string at `address` when it lies in __cstring (or __TEXT,__const)."""
        for section in ("__cstring,__TEXT", "__const,__TEXT"):
            if section not in self.sections:
                continue
            start, size, offset, _, _ = self.sections[section]
            if start <= address < start + size:
                pos = offset + address - start
                end = self.data.find(b"\0", pos, pos + 4096)
                return None if end < 0 else self.data[pos:end].decode("utf-8", "replace")
        return None

    def byte_at(self, address: int) -> int | None:
        """The byte at a data address (None outside every section with file contents)."""
        for start, size, offset, _, _ in self.sections.values():
            if start <= address < start + size and offset:
                return self.data[offset + address - start]
        return None

    def data_symbol(self, suffix: str) -> int | None:
        """Address of the symbol (any section) whose name ends with `suffix`, from the raw symbol table."""
        symoff, nsyms, stroff = _symtab(self.data)
        target = suffix.encode() + b"\0"
        raw = np.frombuffer(self.data, dtype=np.dtype([("strx", "<u4"), ("type", "u1"), ("sect", "u1"),
                                                       ("desc", "<u2"), ("value", "<u8")]),
                            count=nsyms, offset=symoff)
        pos = self.data.find(target, stroff)
        while pos >= 0:
            begin = self.data.rfind(b"\0", stroff, pos) + 1
            hits = np.nonzero(raw["strx"] == begin - stroff)[0]
            if hits.size:
                return int(raw["value"][hits[0]])
            pos = self.data.find(target, pos + 1)
        return None


def load(data: bytes) -> Image:
    """Parse one dylib's bytes."""
    raw = _load(data)
    by_addr: dict[int, str] = {}
    for address, name in raw.symbols:  # sorted: the last name at an address wins
        by_addr[address] = name.removeprefix("_")
    starts = sorted(by_addr)
    return Image(data, raw.sections, starts, [by_addr[a] for a in starts])


def _symtab(data: bytes) -> tuple[int, int, int]:
    ncmds = struct.unpack_from("<I", data, 16)[0]
    off = 32
    for _ in range(ncmds):
        cmd, size = struct.unpack_from("<II", data, off)
        if cmd == 0x2:
            symoff, nsyms, stroff, _ = struct.unpack_from("<IIII", data, off + 8)
            return symoff, nsyms, stroff
        off += size
    raise ValueError("no LC_SYMTAB")


def _signed(value: np.ndarray, bits: int) -> np.ndarray:
    return np.where(value >= 1 << (bits - 1), value - (1 << bits), value)


def _addresses(insn: np.ndarray, pc: np.ndarray) -> np.ndarray:
    """The address an ADD computes from the nearest preceding ADRP of its register, or an ADR computes."""
    rd, rn = insn & 0x1F, (insn >> 5) & 0x1F
    imm21 = _signed((((insn >> 5) & 0x7FFFF) << 2) | ((insn >> 29) & 3), 21)
    is_adrp = (insn & 0x9F000000) == 0x90000000
    page = np.where(is_adrp, (pc & ~0xFFF) + (imm21 << 12), -1)
    is_add = (insn & 0xFF800000) == 0x91000000
    target = np.full(insn.size, -1, dtype=np.int64)
    for back in range(PAIR, 0, -1):  # the nearest ADRP of the same register wins
        prev_page = np.concatenate([np.full(back, -1), page[:-back]])[:insn.size]
        prev_rd = np.concatenate([np.full(back, -1), rd[:-back]])[:insn.size]
        hit = is_add & (prev_page >= 0) & (prev_rd == rn)
        target = np.where(hit, prev_page + ((insn >> 10) & 0xFFF), target)
    is_adr = (insn & 0x9F000000) == 0x10000000
    return np.where(is_adr, pc + imm21, target)
