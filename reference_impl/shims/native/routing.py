"""Route a compiled AOTInductor program's ``aoti_torch_cuda_mm_out`` calls to the native shim.

Why renaming, and why in the object. AOTInductor links every CUDA program against libtorch (``-ltorch
-ltorch_cpu -ltorch_cuda``) and loads it with ``dlopen(RTLD_LOCAL | RTLD_NOW)``. The undefined symbol
``aoti_torch_cuda_mm_out`` is looked up in the global scope first, then in the program's own dependency
tree (libtorch_cuda). Providing a second *definition* of that name therefore either loses to libtorch (our
library in the program's local scope comes after libtorch_cuda) or, preloaded ``RTLD_GLOBAL``, silently takes
over every AOTI program in the process, including those meant to use libtorch's (the A/B bench, other users).
``aot_inductor.custom_op_libs`` only appends ``-l<name>`` after libtorch (same precedence problem), and
inductor has no config for extra compile flags (a ``-D`` rename) in the AOT build. So the program itself is
changed to call another name: its undefined dynamic symbol ``aoti_torch_cuda_mm_out`` is renamed in place to
``refimpl_cuda_mm_out_v1`` (same length, so only bytes of ``.dynstr`` change: no section moves, no hash
table to rebuild — the GNU hash table holds defined symbols only). The native library, loaded
``RTLD_GLOBAL`` by the runtime, is the only object in the process defining that name. A routed program
loaded without it fails at ``dlopen`` with ``undefined symbol: refimpl_cuda_mm_out_v1``: never a silent
fallback to libtorch.

Content caching: the artifact cache keeps what inductor compiled (one compile serves both routes); routing
is a pure, deterministic function of those bytes applied after the cache, and the blob records it
(``extra["mm_out_route"]``), so the blob's content hashes differ by route.

The package (a zip written by torch's ``PyTorchFileWriter``) stores members uncompressed; the ``.so`` is
patched where it lies and its CRC-32 updated in the local header, the data descriptor and the central
directory. Everything else keeps its bytes (including miniz's alignment padding).
"""

from __future__ import annotations

import functools
import io
import re
import struct
import zipfile
import zlib
from dataclasses import dataclass

from reference_impl.format.cpp_source import strip_cpp_comments, without_string_literals

__all__ = [
    "ABI_SYMBOL",
    "ROUTED_SYMBOL",
    "RoutingError",
    "RoutingResult",
    "count_call_sites",
    "rename_undefined_symbol",
    "route_package",
]

ABI_SYMBOL = "aoti_torch_cuda_mm_out"
ROUTED_SYMBOL = "refimpl_cuda_mm_out_v1"
assert len(ABI_SYMBOL) == len(ROUTED_SYMBOL)

_SHT_DYNSYM, _SHT_DYNAMIC, _SHT_VERDEF, _SHT_VERNEED = 11, 6, 0x6FFFFFFD, 0x6FFFFFFE
_DT_STRING_TAGS = {1, 14, 15, 29}  # DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH


class RoutingError(ValueError):
    """The program cannot be routed safely (not an ELF64 LE object, a shared string, a compressed member)."""


@dataclass(frozen=True)
class RoutingResult:
    """The routed package and what was changed."""

    package: bytes
    patched_members: tuple[str, ...]
    call_sites: int


def _sections(elf: bytes) -> list[tuple[int, int, int, int, int]]:
    """``(type, offset, size, link, entsize)`` of every section header of an ELF64 little-endian object."""
    if elf[:4] != b"\x7fELF":
        raise RoutingError("not an ELF object")
    if elf[4] != 2 or elf[5] != 1:
        raise RoutingError("only 64-bit little-endian ELF objects are supported")
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    if shoff == 0 or shentsize < 64 or shoff + shnum * shentsize > len(elf):
        raise RoutingError("the ELF object has no readable section headers")
    out = []
    for i in range(shnum):
        base = shoff + i * shentsize
        sh_type = struct.unpack_from("<I", elf, base + 4)[0]
        offset, size = struct.unpack_from("<QQ", elf, base + 24)
        link = struct.unpack_from("<I", elf, base + 40)[0]
        entsize = struct.unpack_from("<Q", elf, base + 56)[0]
        out.append((sh_type, offset, size, link, entsize))
    return out


def _cstring(data: bytes, start: int) -> bytes:
    end = data.index(b"\0", start)
    return data[start:end]


def _string_references(elf: bytes, sections: list[tuple[int, int, int, int, int]], dynstr: int) -> list[int]:
    """Every offset into the dynamic string table used by anything but dynsym (DT_*, version records)."""
    refs: list[int] = []
    for sh_type, offset, size, link, _ in sections:
        if link != dynstr:
            continue
        if sh_type == _SHT_DYNAMIC:
            for pos in range(offset, offset + size - 15, 16):
                tag, value = struct.unpack_from("<qQ", elf, pos)
                if tag in _DT_STRING_TAGS:
                    refs.append(value)
        elif sh_type == _SHT_VERNEED:
            pos, end = offset, offset + size
            while pos < end:
                _, cnt, file_, aux, nxt = struct.unpack_from("<HHIII", elf, pos)
                refs.append(file_)
                apos = pos + aux
                for _ in range(cnt):
                    _, _, _, name, anext = struct.unpack_from("<IHHII", elf, apos)
                    refs.append(name)
                    if not anext:
                        break
                    apos += anext
                if not nxt:
                    break
                pos += nxt
        elif sh_type == _SHT_VERDEF:
            pos, end = offset, offset + size
            while pos < end:
                _, _, _, cnt, _, aux, nxt = struct.unpack_from("<HHHHIII", elf, pos)
                apos = pos + aux
                for _ in range(cnt):
                    name, anext = struct.unpack_from("<II", elf, apos)
                    refs.append(name)
                    if not anext:
                        break
                    apos += anext
                if not nxt:
                    break
                pos += nxt
    return refs


def rename_undefined_symbol(elf: bytes, old: str, new: str) -> tuple[bytes, int]:
    """``elf`` with its undefined dynamic symbol ``old`` renamed to ``new`` (same length); and how many
    dynsym entries referred to it (0: the object does not call ``old``; returned unchanged).

    Refuses (``RoutingError``) when the object *defines* ``old`` or when another string of the table
    shares the bytes of ``old`` (a linker may store ``foo`` as the tail of ``barfoo``).
    """
    old_b, new_b = old.encode(), new.encode()
    if len(old_b) != len(new_b) or b"\0" in new_b:
        raise RoutingError(f"{new!r} must be as long as {old!r} and contain no NUL")
    sections = _sections(elf)
    dynsym = next(((i, s) for i, s in enumerate(sections) if s[0] == _SHT_DYNSYM), None)
    if dynsym is None:
        return elf, 0
    _, (_, sym_off, sym_size, dynstr_index, entsize) = dynsym
    entsize = entsize or 24
    str_off, str_size = sections[dynstr_index][1], sections[dynstr_index][2]
    table = elf[str_off : str_off + str_size]
    targets: set[int] = set()
    others: list[int] = []
    for pos in range(sym_off, sym_off + sym_size - entsize + 1, entsize):
        name, _, _, shndx = struct.unpack_from("<IBBH", elf, pos)
        if name < len(table) and _cstring(table, name) == old_b:
            if shndx != 0:
                raise RoutingError(f"the object defines {old}; only a reference can be routed")
            targets.add(name)
        else:
            others.append(name)
    if not targets:
        return elf, 0
    others += _string_references(elf, sections, dynstr_index)
    for start in targets:
        shared = [ref for ref in others if start <= ref <= start + len(old_b)]
        if shared:
            raise RoutingError(
                f"the string of {old} is shared with other names of the object (offsets {shared})"
            )
    patched = bytearray(elf)
    for start in targets:
        patched[str_off + start : str_off + start + len(new_b)] = new_b
    return bytes(patched), len(targets)


def count_call_sites(package: bytes, symbol: str = ABI_SYMBOL) -> int:
    """How many ``symbol(...)`` calls (``aoti_torch_cuda_mm_out``) the package's generated code makes.

    The generated code of a static-shape program has no loops around extern kernels, so this is also the
    number of calls one run makes.
    """
    call = re.compile(r"\b" + re.escape(symbol) + r"\s*\(")
    total = 0
    with zipfile.ZipFile(io.BytesIO(package)) as archive:
        for name in archive.namelist():
            if "/aotinductor/" in f"/{name}" and name.endswith(".cpp"):
                text = strip_cpp_comments(archive.read(name).decode("utf-8", errors="replace"))
                total += len(call.findall(without_string_literals(text)))
    return total


def _crc_field_offsets(raw: bytes, info: zipfile.ZipInfo, data_start: int, old_crc: int) -> list[int]:
    """Where the member's CRC-32 is stored: local header (unless deferred), data descriptor, central dir."""
    where = []
    if struct.unpack_from("<I", raw, info.header_offset + 14)[0] == old_crc:
        where.append(info.header_offset + 14)
    end = data_start + info.compress_size
    if info.flag_bits & 0x08:
        if raw[end : end + 4] == b"PK\x07\x08" and struct.unpack_from("<I", raw, end + 4)[0] == old_crc:
            where.append(end + 4)
        elif struct.unpack_from("<I", raw, end)[0] == old_crc:
            where.append(end)
    return where


def _central_directory_crc(raw: bytes, start_dir: int, filename: str) -> int:
    pos = start_dir
    encoded = filename.encode("utf-8")
    while raw[pos : pos + 4] == b"PK\x01\x02":
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", raw, pos + 28)
        if raw[pos + 46 : pos + 46 + name_len] == encoded:
            return pos + 16
        pos += 46 + name_len + extra_len + comment_len
    raise RoutingError(f"central directory entry of {filename} not found")


def route_package(package: bytes, old: str = ABI_SYMBOL, new: str = ROUTED_SYMBOL) -> RoutingResult:
    """The package with every ``.so`` member's reference to ``old`` renamed to ``new`` (see module doc)."""
    raw = bytearray(package)
    try:
        archive = zipfile.ZipFile(io.BytesIO(package))
    except zipfile.BadZipFile as exc:
        raise RoutingError(f"not an AOTInductor package (not a zip: {exc})") from None
    patched: list[str] = []
    with archive:
        start_dir = getattr(archive, "start_dir", None)
        for info in archive.infolist():
            if not info.filename.endswith(".so"):
                continue
            if info.compress_type != zipfile.ZIP_STORED:
                raise RoutingError(
                    f"{info.filename} is compressed; only stored members can be patched in place"
                )
            name_len, extra_len = struct.unpack_from("<HH", package, info.header_offset + 26)
            data_start = info.header_offset + 30 + name_len + extra_len
            data = package[data_start : data_start + info.file_size]
            new_data, count = rename_undefined_symbol(data, old, new)
            if not count:
                continue
            old_crc, new_crc = info.CRC, zlib.crc32(new_data) & 0xFFFFFFFF
            raw[data_start : data_start + len(new_data)] = new_data
            fields = _crc_field_offsets(package, info, data_start, old_crc)
            if start_dir is None:
                raise RoutingError("cannot locate the central directory of the package")
            fields.append(_central_directory_crc(package, start_dir, info.filename))
            for offset in fields:
                struct.pack_into("<I", raw, offset, new_crc)
            patched.append(info.filename)
    routed = bytes(raw)
    with zipfile.ZipFile(io.BytesIO(routed)) as check:  # every CRC must verify after the patch
        bad = check.testzip()
        if bad is not None:
            raise RoutingError(f"patched package fails its CRC check at {bad}")
    return RoutingResult(routed, tuple(patched), count_call_sites(package, old) if patched else 0)


NATIVE = "native"
LIBTORCH = "libtorch"


@functools.lru_cache(maxsize=8)
def _routed(artifact: bytes) -> RoutingResult:
    """``route_package`` of an artifact this process routed before, again: a process lowers one program
    under many placements (the differential chapter's calls), each a memo hit of the same artifact, and
    scanning its code for call sites cost a warm GPU run 10 case-seconds."""
    return route_package(artifact)


def apply_route(artifact: bytes, device_type: str, requested: bool | None) -> tuple[bytes, dict[str, object]]:
    """Route ``artifact`` (a compiled package) as ``requested``; returns it and the blob's record of it.

    ``requested``: True routes to the native shim (an error if it cannot run here), False keeps libtorch's,
    None routes when the native shim is available (CUDA targets only), else keeps libtorch's with the reason.
    """
    if device_type != "cuda":
        return artifact, {
            "provider": LIBTORCH,
            "reason": f"{device_type} target: the native shim is CUDA only",
        }
    if requested is False:
        return artifact, {"provider": LIBTORCH, "reason": "native_mm_out=False"}
    from reference_impl.shims.native.build import build_library

    status = build_library()
    if not status.available:
        if requested:
            raise RoutingError(
                f"native_mm_out=True but the native mm_out shim is unavailable: {status.reason}"
            )
        return artifact, {"provider": LIBTORCH, "reason": status.reason}
    result = _routed(artifact)
    return result.package, {
        "provider": NATIVE,
        "symbol": ROUTED_SYMBOL,
        "replaces": ABI_SYMBOL,
        "call_sites": result.call_sites,
        "patched": list(result.patched_members),
    }
