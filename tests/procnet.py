"""The TCP sockets a process listens on, from /proc (no `ss`, which CI images may lack)."""

from __future__ import annotations

import os
import socket


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    # /proc/net/tcp6 prints the address as four 32-bit words in host order
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that process `pid` holds (any of its threads).
    An IPv4-mapped IPv6 address is given as its IPv4 form."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    out = []
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: TCP_LISTEN
                continue
            hex_addr, hex_port = fields[1].split(":")
            address = _address(hex_addr)
            if address.startswith("::ffff:") and "." in address:
                address = address[len("::ffff:") :]
            out.append((address, int(hex_port, 16)))
    return sorted(out)


def is_loopback(address: str) -> bool:
    return address.startswith("127.") or address == "::1"
