"""Keep the Mooncake client's listening sockets on one address (Linux, x86-64 and aarch64 ELF).

The store client opens two listeners in this process: the transfer engine's P2P handshake daemon and its
TCP transport. Mooncake 0.3.x binds both to the wildcard address (0.0.0.0 and the dual-stack ::) with no
setting to change it (MC_TCP_BIND_ADDRESS does not reach them), so an engine whose master is on loopback
would still accept connections from any host. `listen_only_on(host)` rewrites the wildcard in every
`bind` the Mooncake libraries make to `host` (an IPv6 socket gets `host` as an IPv4-mapped address), by
pointing their GOT entries for `bind` at a wrapper; binds to a specific address pass through unchanged.

Invariant: once `listen_only_on` has returned True, no socket bound by code in a Mooncake library of this
process is bound to a wildcard address. Other libraries' binds are untouched.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import socket
import struct
import threading

logger = logging.getLogger("flashstate.host")

_BIND_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32)
_R_GLOB_DAT = {62: 6, 183: 1025}  # e_machine → R_*_GLOB_DAT (x86-64, aarch64)
_R_JUMP_SLOT = {62: 7, 183: 1026}
_SHT_RELA, _SHT_DYNSYM = 4, 11

_lock = threading.Lock()
_target: dict[int, bytes] = {}  # address family → the packed address a wildcard bind becomes
_patched: set[str] = set()  # libraries whose GOT entries point at the wrapper
_libc = ctypes.CDLL(None, use_errno=True)
_real_bind = _libc.bind
_real_bind.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32]
_real_bind.restype = ctypes.c_int
_errno_location = _libc.__errno_location
_errno_location.restype = ctypes.POINTER(ctypes.c_int)


def _bind(fd: int, addr: int, addrlen: int) -> int:
    """bind(2) with a wildcard address replaced by the target of its family (the caller's sockaddr is
    left as it was: the call gets a copy)."""
    arg: int | ctypes.Array = addr
    family = ctypes.c_ushort.from_address(addr).value if addr and addrlen >= 2 else -1
    where = {socket.AF_INET: (4, 4), socket.AF_INET6: (8, 16)}.get(family)
    target = _target.get(family)
    if where is not None and target is not None and addrlen >= where[0] + where[1]:
        start, size = where
        if ctypes.string_at(addr + start, size) == bytes(size):
            raw = bytearray(ctypes.string_at(addr, addrlen))
            raw[start : start + size] = target
            arg = ctypes.create_string_buffer(bytes(raw), addrlen)
    rc = _real_bind(fd, arg, addrlen)
    if rc != 0:  # the caller reads errno: hand it the real one (ctypes kept it aside)
        _errno_location()[0] = ctypes.get_errno()
    return rc


_BIND_FN = _BIND_TYPE(_bind)  # kept alive for as long as any GOT entry points at it
_BIND_ADDRESS = ctypes.cast(_BIND_FN, ctypes.c_void_p).value


def _targets(host: str) -> dict[int, bytes]:
    try:
        v4 = socket.inet_pton(socket.AF_INET, host)
    except OSError:
        return {socket.AF_INET6: socket.inet_pton(socket.AF_INET6, host)}
    return {socket.AF_INET: v4, socket.AF_INET6: b"\0" * 10 + b"\xff\xff" + v4}


def _bind_slots(path: str) -> tuple[list[int], int] | None:
    """The GOT offsets (from the load base) of `path`'s relocations against `bind`, and the virtual address
    its first loadable segment starts at; None when it is not an ELF file this understands."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:  # 64-bit little-endian only
        return None
    machine = struct.unpack_from("<H", data, 0x12)[0]
    if machine not in _R_JUMP_SLOT:
        return None
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    first_load = min(
        struct.unpack_from("<Q", data, phoff + i * phentsize + 16)[0]
        for i in range(phnum)
        if struct.unpack_from("<I", data, phoff + i * phentsize)[0] == 1  # PT_LOAD
    )
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    slots = []
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != _SHT_RELA or not entsize or sections[link][1] != _SHT_DYNSYM:
            continue
        sym_off, strtab = sections[link][4], sections[sections[link][6]][4]
        for r in range(size // entsize):
            r_offset, r_info = struct.unpack_from("<QQ", data, offset + r * entsize)
            if r_info & 0xFFFFFFFF not in (_R_GLOB_DAT[machine], _R_JUMP_SLOT[machine]):
                continue
            name_off = struct.unpack_from("<I", data, sym_off + (r_info >> 32) * 24)[0]
            end = data.index(b"\0", strtab + name_off)
            if data[strtab + name_off : end] == b"bind":
                slots.append(r_offset)
    return slots, first_load & ~(mmap.PAGESIZE - 1)


def _mappings() -> dict[str, list[tuple[int, int, str, int]]]:
    """Mapped files of this process: path → [(start, end, perms, file offset)]."""
    out: dict[str, list[tuple[int, int, str, int]]] = {}
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) < 6 or not parts[5].startswith("/"):
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.setdefault(parts[5].strip(), []).append((lo, hi, parts[1], int(parts[2], 16)))
    return out


def _write_pointer(address: int, value: int, maps: list[tuple[int, int, str, int]]) -> None:
    page = address & ~(mmap.PAGESIZE - 1)
    perms = next((p for lo, hi, p, _ in maps if lo <= address < hi), "r--p")
    prot = (1 if "r" in perms else 0) | (2 if "w" in perms else 0)
    mprotect = _libc.mprotect
    mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if "w" not in perms and mprotect(page, mmap.PAGESIZE, prot | 2) != 0:
        raise OSError(ctypes.get_errno(), "mprotect")
    ctypes.c_void_p.from_address(address).value = value
    if "w" not in perms:
        mprotect(page, mmap.PAGESIZE, prot)


def listen_only_on(host: str, marker: str = "mooncake") -> bool:
    """Make every later wildcard bind by a loaded library whose path contains `marker` bind `host` instead
    (the last call's host wins). True when every such library that calls `bind` now goes through the
    wrapper; False where this cannot be done (not Linux, an unknown binary), with a warning."""
    if host in ("0.0.0.0", "::", ""):
        with _lock:
            _target.clear()
        return True
    try:
        targets = _targets(host)
    except OSError:
        logger.warning("host tier: %r is not an IP address: Mooncake listens on every interface", host)
        return False
    try:
        with _lock:
            _target.clear()
            _target.update(targets)
            maps = _mappings()
            for path, ranges in maps.items():
                if marker not in path or path in _patched or not os.path.exists(path):
                    continue
                found = _bind_slots(path)
                if found is None:
                    continue
                slots, first_load = found
                base = min(lo for lo, _, _, off in ranges if off == 0) - first_load
                for slot in slots:
                    _write_pointer(base + slot, _BIND_ADDRESS, ranges)
                _patched.add(path)
        return True
    except (OSError, ValueError, struct.error) as e:
        logger.warning(
            "host tier: cannot keep Mooncake's listeners on %s (%s): it listens on every interface", host, e
        )
        return False
