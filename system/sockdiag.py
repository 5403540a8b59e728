"""The memory a process's sockets hold in the kernel, from the kernel's socket diagnostics (netlink
NETLINK_SOCK_DIAG, what `ss -m` reads): for every socket of its network namespace, its state and
its buffers (SK_MEMINFO: bytes queued to receive, to send, reserved), matched to the process by the
inode its descriptors name (system/fds.py). Sockets no buffer holds still cost their kernel objects;
those are the slab's, counted there.

A process in another network namespace (a container's) has its sockets dumped from a thread that
joins that namespace for the time it takes to open the netlink socket, then leaves it: the socket
keeps the namespace it was made in, and no other thread of memdiag ever changes its own."""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import threading
from pathlib import Path

from ._parse import Fact
from .fds import fd_links

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
CLONE_NEWNET = 0x40000000

# linux/unix_diag.h
UDIAG_SHOW_PEER, UDIAG_SHOW_MEMINFO = 0x4, 0x20
UNIX_DIAG_PEER, UNIX_DIAG_MEMINFO = 2, 5
# linux/inet_diag.h: the extension bit asks for INET_DIAG_SKMEMINFO (7) in the reply
INET_DIAG_SKMEMINFO = 7
# linux/sock_diag.h SK_MEMINFO_* indices
RMEM_ALLOC, WMEM_ALLOC, FWD_ALLOC, WMEM_QUEUED = 0, 2, 4, 5
TCP_CLOSE_WAIT = 8

# A host may have hundreds of thousands of sockets: a dump stops after this many replies (said "partial").
MAX_SOCKETS = 262144
_HDR = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_UNIX_REQ = struct.Struct("=BBHIII8x")
_UNIX_MSG = struct.Struct("=BBBxI8x")
_INET_REQ = struct.Struct("=BBBxI48x")
_INET_MSG = struct.Struct("=BBBB48xIIIII")


class SocketMemory(Fact):
    """The process's sockets as the kernel's diagnostics see them."""

    sockets: int  # its socket descriptors the dump found
    unmatched: int = 0  # its socket descriptors the dump did not find (another family: netlink, packet)
    buffers: int = 0  # bytes their buffers hold: queued to receive and to send, and reserved
    by_kind: dict[str, int] = {}  # "unix stream", "tcp", "udp" ... -> count
    peer_gone: int = 0  # sockets whose peer has closed while it stays open (TCP CLOSE_WAIT, unix without a peer)
    partial: bool = False  # the dump stopped at MAX_SOCKETS


def _attrs(buf: bytes, off: int, end: int) -> dict[int, bytes]:
    out = {}
    while off + 4 <= end:
        length, kind = struct.unpack_from("=HH", buf, off)
        if length < 4:
            break
        out[kind & 0x7FFF] = buf[off + 4 : off + length]
        off += (length + 3) & ~3
    return out


def _meminfo(raw: bytes | None) -> list[int]:
    n = len(raw) // 4 if raw else 0
    return list(struct.unpack_from(f"={n}I", raw)) if raw and n else []


def _dump(sock: socket.socket, request: bytes, on_msg, budget: list[int]) -> bool:
    """Send one dump request and feed each reply's payload to on_msg; False if cut at the budget."""
    sock.send(_HDR.pack(_HDR.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + request)
    while True:
        data = sock.recv(1 << 16)
        if not data:
            return True
        off = 0
        while off + _HDR.size <= len(data):
            length, kind, _f, _s, _p = _HDR.unpack_from(data, off)
            if length < _HDR.size:
                return True
            if kind in (NLMSG_DONE, NLMSG_ERROR):
                return True
            if budget[0] <= 0:
                return False
            budget[0] -= 1
            on_msg(data, off + _HDR.size, off + length)
            off += (length + 3) & ~3


def _unix(sock: socket.socket, wanted: set[int], found: dict[int, tuple[str, int, bool]], budget) -> bool:
    kinds = {socket.SOCK_STREAM: "unix stream", socket.SOCK_DGRAM: "unix dgram"}
    kinds[socket.SOCK_SEQPACKET] = "unix seqpacket"

    def one(buf: bytes, off: int, end: int) -> None:
        _fam, typ, _state, ino = _UNIX_MSG.unpack_from(buf, off)
        if ino not in wanted:
            return
        attrs = _attrs(buf, off + _UNIX_MSG.size, end)
        mem = _meminfo(attrs.get(UNIX_DIAG_MEMINFO))
        peer = struct.unpack_from("=I", attrs[UNIX_DIAG_PEER])[0] if UNIX_DIAG_PEER in attrs else 0
        held = (mem[RMEM_ALLOC] + mem[WMEM_ALLOC]) if len(mem) > WMEM_ALLOC else 0
        # a connected stream socket whose peer has gone reports no peer; a listening one never has one
        gone = typ == socket.SOCK_STREAM and _state == 1 and peer == 0
        found[ino] = (kinds.get(typ, "unix"), held, gone)

    req = _UNIX_REQ.pack(socket.AF_UNIX, 0, 0, 0xFFFFFFFF, 0, UDIAG_SHOW_PEER | UDIAG_SHOW_MEMINFO)
    return _dump(sock, req, one, budget)


def _inet(sock, family: int, proto: int, wanted: set[int], found: dict, budget) -> bool:
    name = {socket.IPPROTO_TCP: "tcp", socket.IPPROTO_UDP: "udp"}[proto] + ("6" if family == socket.AF_INET6 else "")

    def one(buf: bytes, off: int, end: int) -> None:
        fields = _INET_MSG.unpack_from(buf, off)
        state, ino = fields[1], fields[-1]
        if ino not in wanted:
            return
        mem = _meminfo(_attrs(buf, off + _INET_MSG.size, end).get(INET_DIAG_SKMEMINFO))
        held = (mem[RMEM_ALLOC] + mem[WMEM_QUEUED] + mem[FWD_ALLOC]) if len(mem) > WMEM_QUEUED else 0
        found[ino] = (name, held, proto == socket.IPPROTO_TCP and state == TCP_CLOSE_WAIT)

    req = _INET_REQ.pack(family, proto, 1 << (INET_DIAG_SKMEMINFO - 1), 0xFFFFFFFF)
    return _dump(sock, req, one, budget)


def _socket_in(netns: str | None) -> socket.socket:
    """A sock_diag netlink socket of the namespace at `netns` (None: memdiag's own)."""
    if netns is None:
        return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
    made: list[socket.socket | BaseException] = []

    def inside() -> None:  # this thread alone joins the namespace, opens the socket, and ends
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
            finally:
                os.close(fd)
            made.append(socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG))
        except BaseException as e:  # handed to the caller
            made.append(e)

    t = threading.Thread(target=inside, daemon=True)
    t.start()
    t.join(5)
    if not made or isinstance(made[0], BaseException):
        raise OSError("could not open a socket diagnostics socket in the target's network namespace")
    return made[0]  # type: ignore[return-value]


def socket_inodes(pid: int, proc: Path = Path("/proc")) -> set[int]:
    """The inodes of the process's socket descriptors (as many as system/fds.py reads)."""
    links = fd_links(pid, proc)
    return {
        int(link[8:-1])
        for _fd, link in (links[0] if links else [])
        if link.startswith("socket:[") and link.endswith("]")
    }


def read_socket_memory(pid: int, proc: Path = Path("/proc")) -> SocketMemory | None:
    """The process's sockets' memory now; None when it is gone or the diagnostics cannot be asked."""
    wanted = socket_inodes(pid, proc)
    if not wanted:
        return SocketMemory(sockets=0) if (proc / str(pid)).exists() else None
    try:
        own, theirs = os.stat("/proc/self/ns/net").st_ino, os.stat(proc / str(pid) / "ns" / "net").st_ino
        sock = _socket_in(None if own == theirs else str(proc / str(pid) / "ns" / "net"))
    except OSError:
        return None
    found: dict[int, tuple[str, int, bool]] = {}
    budget = [MAX_SOCKETS]
    complete = True
    try:
        with sock:
            sock.settimeout(5)
            complete = _unix(sock, wanted, found, budget)
            for family in (socket.AF_INET, socket.AF_INET6):
                for proto in (socket.IPPROTO_TCP, socket.IPPROTO_UDP):
                    if len(found) < len(wanted) and complete:
                        complete = _inet(sock, family, proto, wanted, found, budget)
    except OSError:
        return None
    by_kind: dict[str, int] = {}
    for kind, _held, _gone in found.values():
        by_kind[kind] = by_kind.get(kind, 0) + 1
    return SocketMemory(
        sockets=len(found),
        unmatched=len(wanted) - len(found),
        buffers=sum(h for _k, h, _g in found.values()),
        by_kind=by_kind,
        peer_gone=sum(1 for _k, _h, g in found.values() if g),
        partial=not complete,
    )
