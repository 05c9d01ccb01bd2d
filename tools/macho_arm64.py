"""The one arm64 Mach-O decoder the knowledge tools share (macho_checks.py, build_composite_callees.py).

A macOS arm64 libtorch_cpu.dylib is parsed just far enough (no torch import, no LLVM): its sections, its
symbol table (local symbols ship in the wheels), the imported names behind the __stubs section. Its __text
section is decoded with numpy, one array per question, computed on first use and cached on the Image:

* `addresses()`: the address an instruction computes for a later use — an ADD from the nearest preceding ADRP
  of its register (PAIR instructions back), or an ADR, the single instruction the linker relaxes an ADRP+ADD
  pair into when the target lies within 1 MiB (the 2.5-2.9 wheels load many C strings and kernel addresses
  that way; a decoder of ADRP+ADD alone misses them);
* `movz()`: MOVZ immediates (a check's __LINE__), with `registers()` the destination registers;
* `calls()`: BL targets;
* `branches()`: every direct control transfer — BL, B, B.cond, CBZ/CBNZ, TBZ/TBNZ — and which are calls.

`CallGraph` adds what a call graph needs: function extents (a function runs to the next symbol), and the
functions one calls or tail-jumps into. Calls through registers (virtual calls, std::function, DispatchStub
function pointers) are invisible to it. ~20-100 M instructions decode in seconds.
"""

from __future__ import annotations

import bisect
import functools
import struct
from dataclasses import dataclass, field

import numpy as np

PAIR = 8  # how far back an ADD looks for the ADRP of its register


@dataclass
class Image:
    """A parsed image: the raw bytes, sections by 'sect,SEG', the text symbols and the stubs' imported names."""

    data: bytes
    sections: dict  # name -> (addr, size, offset, reserved1, reserved2)
    symbols: list  # (addr, name) of __text, sorted
    stubs: dict  # stub address -> imported symbol name
    cache: dict = field(default_factory=dict, repr=False)

    def text(self) -> tuple[int, np.ndarray]:
        """(address of the first instruction, every __text instruction as int64)."""
        if "text" not in self.cache:
            addr, size, offset, _, _ = self.sections["__text,__TEXT"]
            insn = np.frombuffer(self.data, dtype="<u4", count=size // 4, offset=offset).astype(np.int64)
            self.cache["text"] = (addr, insn)
        return self.cache["text"]

    def _pc(self) -> np.ndarray:
        base, insn = self.text()
        return base + 4 * np.arange(insn.size, dtype=np.int64)

    def addresses(self) -> np.ndarray:
        """Per instruction: the address an ADRP+ADD pair or an ADR computes, else -1 (see the module docstring)."""
        if "addresses" not in self.cache:
            self.cache["addresses"] = _addresses(self.text()[1], self._pc())
        return self.cache["addresses"]

    def movz(self) -> np.ndarray:
        """Per instruction: a MOVZ's 16-bit immediate, else -1."""
        if "movz" not in self.cache:
            insn = self.text()[1]
            self.cache["movz"] = np.where((insn & 0xFF800000) == 0x52800000, (insn >> 5) & 0xFFFF, -1)
        return self.cache["movz"]

    def registers(self) -> np.ndarray:
        """Per instruction: its Rd field (the destination register of a MOVZ, ADD, ADR...)."""
        return self.text()[1] & 0x1F

    def calls(self) -> np.ndarray:
        """Per instruction: a BL's target address, else -1."""
        if "calls" not in self.cache:
            insn = self.text()[1]
            is_bl = (insn & 0xFC000000) == 0x94000000
            self.cache["calls"] = np.where(is_bl, self._pc() + 4 * _signed(insn & 0x3FFFFFF, 26), -1)
        return self.cache["calls"]

    def branches(self) -> tuple[np.ndarray, np.ndarray]:
        """(per instruction the target of a direct branch or -1, per instruction whether it is a BL)."""
        if "branches" not in self.cache:
            self.cache["branches"] = _branches(self.text()[1], self._pc())
        return self.cache["branches"]

    def cstring(self, address: int, sections=("__cstring,__TEXT",)) -> str | None:
        """The C string at `address` when it lies in one of `sections` (some literals live in __TEXT,__const)."""
        for section in sections:
            if section not in self.sections:
                continue
            start, size, offset, _, _ = self.sections[section]
            if start <= address < start + size:
                pos = offset + address - start
                end = self.data.find(b"\0", pos, pos + (1 << 16))
                return None if end < 0 else self.data[pos:end].decode("utf-8", "replace")
        return None


def _signed(value: np.ndarray, bits: int) -> np.ndarray:
    return np.where(value >= 1 << (bits - 1), value - (1 << bits), value)


def _addresses(insn: np.ndarray, pc: np.ndarray) -> np.ndarray:
    """Image.addresses' body."""
    rd, rn = insn & 0x1F, (insn >> 5) & 0x1F
    imm21 = _signed((((insn >> 5) & 0x7FFFF) << 2) | ((insn >> 29) & 3), 21)
    page = np.where((insn & 0x9F000000) == 0x90000000, (pc & ~0xFFF) + (imm21 << 12), -1)  # ADRP
    is_add = (insn & 0xFF800000) == 0x91000000  # ADD Xd, Xn, #imm12 (no shift)
    target = np.full(insn.size, -1, dtype=np.int64)
    for back in range(PAIR, 0, -1):  # the nearest ADRP of the same register wins
        prev_page = np.concatenate([np.full(back, -1), page[:-back]])
        prev_rd = np.concatenate([np.full(back, -1), rd[:-back]])
        hit = is_add & (prev_page >= 0) & (prev_rd == rn)
        target = np.where(hit, prev_page + ((insn >> 10) & 0xFFF), target)
    return np.where((insn & 0x9F000000) == 0x10000000, pc + imm21, target)  # ADR: one instruction


def _branches(insn: np.ndarray, pc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Image.branches' body."""
    is_call = (insn & 0xFC000000) == 0x94000000
    uncond = (insn & 0xFC000000) == 0x14000000
    dest = np.where(is_call | uncond, pc + 4 * _signed(insn & 0x3FFFFFF, 26), -1)
    imm19 = _signed((insn >> 5) & 0x7FFFF, 19)
    cond = ((insn & 0xFF000010) == 0x54000000) | ((insn & 0x7E000000) == 0x34000000)  # B.cond, CBZ/CBNZ
    dest = np.where(cond, pc + 4 * imm19, dest)
    tbz = (insn & 0x7E000000) == 0x36000000  # TBZ/TBNZ
    return np.where(tbz, pc + 4 * _signed((insn >> 5) & 0x3FFF, 14), dest), is_call


def load(data: bytes) -> Image:
    """Parse the Mach-O load commands: sections, the symbol table and the stubs' names."""
    magic, _, _, _, ncmds, _, _, _ = struct.unpack_from("<IiiIIIII", data, 0)
    if magic != 0xFEEDFACF:
        raise ValueError("not a 64-bit Mach-O image")
    off, sections, order, symtab, dysym = 32, {}, [], None, None
    for _ in range(ncmds):
        cmd, size = struct.unpack_from("<II", data, off)
        if cmd == 0x19:  # LC_SEGMENT_64
            nsects = struct.unpack_from("<I", data, off + 64)[0]
            for s in range(nsects):
                so = off + 72 + 80 * s
                name = data[so:so + 16].rstrip(b"\0").decode() + "," + data[so + 16:so + 32].rstrip(b"\0").decode()
                addr, sz, offset, _, _, _, _, r1, r2, _ = struct.unpack_from("<QQIIIIIIII", data, so + 32)
                sections[name] = (addr, sz, offset, r1, r2)
                order.append(name)
        elif cmd == 0x2:  # LC_SYMTAB
            symtab = struct.unpack_from("<IIII", data, off + 8)
        elif cmd == 0xB:  # LC_DYSYMTAB
            dysym = struct.unpack_from("<18I", data, off + 8)
        off += size
    names, symbols = _symbols(data, symtab, order.index("__text,__TEXT") + 1)
    return Image(data, sections, symbols, _stubs(data, sections, names, dysym))


def _symbols(data: bytes, symtab, text_index: int) -> tuple[list[str], list]:
    """(every symbol's name by index, sorted (addr, name) of the text section's symbols)."""
    symoff, nsyms, stroff, _ = symtab
    names, text = [], []
    for i in range(nsyms):
        strx, ntype, nsect, _, value = struct.unpack_from("<IBBHQ", data, symoff + 16 * i)
        end = data.index(b"\0", stroff + strx)
        name = data[stroff + strx:end].decode("latin-1")
        names.append(name)
        if ntype & 0x0E == 0x0E and nsect == text_index and not ntype & 0xE0:
            text.append((value, name))
    return names, sorted(text)


def _stubs(data: bytes, sections, names: list[str], dysym) -> dict:
    """Stub address -> the imported symbol it jumps to."""
    addr, size, _, first, stride = sections["__stubs,__TEXT"]
    indirectoff = dysym[12]
    out = {}
    for i in range(size // stride):
        index = struct.unpack_from("<I", data, indirectoff + 4 * (first + i))[0]
        if index < len(names):
            out[addr + i * stride] = names[index]
    return out


class CallGraph:
    """The functions of an Image and the direct transfers between them."""

    def __init__(self, image: Image):
        self.image = image
        self.base, insn = image.text()
        self.size = int(insn.size)
        by_addr = {a: name.removeprefix("_") for a, name in image.symbols}  # the last name at an address wins
        self.starts = sorted(by_addr)
        self.names = [by_addr[a] for a in self.starts]
        self.dest, self.is_call = image.branches()

    @functools.cached_property
    def index_of(self) -> dict[str, int]:
        """mangled name (without the leading underscore) -> function index (first occurrence)."""
        out: dict[str, int] = {}
        for i, n in enumerate(self.names):
            out.setdefault(n, i)
        return out

    def function_at(self, address: int) -> int:
        """Index of the function containing `address` (-1 before the first)."""
        return bisect.bisect_right(self.starts, address) - 1

    def extent(self, fn: int) -> tuple[int, int]:
        """Instruction index range [lo, hi) of function `fn`."""
        end = self.starts[fn + 1] if fn + 1 < len(self.starts) else self.base + 4 * self.size
        return (self.starts[fn] - self.base) // 4, (end - self.base) // 4

    def transfers(self, fn: int) -> list[int]:
        """Every function `fn` calls or jumps into (tail calls, `.cold.N` parts, outlined functions), in address
        order. Imported targets (stubs), branches inside `fn` and jumps into another function's middle (a cold
        part going back to its parent) are left out."""
        lo, hi = self.extent(fn)
        seg = self.dest[lo:hi]
        start, end, top = self.starts[fn], self.base + 4 * hi, self.base + 4 * self.size
        out = []
        for k in np.nonzero(seg >= 0)[0].tolist():
            target = int(seg[k])
            if (not self.is_call[lo + k] and start <= target < end) or not self.base <= target < top:
                continue
            callee = self.function_at(target)
            if self.starts[callee] == target:
                out.append(callee)
        return out


def nested_names(mangled: str) -> list[str]:
    """The leading <length><identifier> components of an Itanium-mangled nested name, without a demangler
    (`_ZN2at4_ops11softmax_int4callE...` -> ['at', '_ops', 'softmax_int', 'call'])."""
    s = mangled[1:] if mangled.startswith("__Z") else mangled
    pos = next((len(p) for p in ("_ZZ", "_Z") if s.startswith(p)), 0)
    if not pos:
        return []
    while pos < len(s) and s[pos] in "NKLS":
        if s[pos] == "S" and s[pos:pos + 2] != "St":
            break
        pos += 2 if s[pos:pos + 2] == "St" else 1
    out = []
    while pos < len(s) and s[pos].isdigit():
        end = pos
        while end < len(s) and s[end].isdigit():
            end += 1
        size = int(s[pos:end])
        out.append(s[end:end + size])
        pos = end + size
        while pos < len(s) and s[pos] == "L":  # internal-linkage marker before a component
            pos += 1
    return out
