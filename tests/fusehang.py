"""A FUSE file system that never answers (not even INIT), for the tests of what a target can do to
memdiag with one in its root: mounted at a folder in a mount namespace of its own server process,
reached as memdiag reaches a target's files (/proc/<server>/root/<folder>). hold: a thread of the
server waits in a lookup there too, holding the folder's lock, so anyone else's lookup waits on that
lock uninterruptibly (D, SIGKILL pending). Killing the server aborts the connection and every
waiting lookup returns."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest

_SERVER = """
import ctypes, os, sys, threading, time
fd = os.open("/dev/fuse", os.O_RDWR)
libc = ctypes.CDLL(None, use_errno=True)
if libc.mount(b"hang", sys.argv[1].encode(), b"fuse", 0, f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()):
    raise OSError(ctypes.get_errno(), "mount fuse")
if sys.argv[2] == "hold":
    threading.Thread(target=lambda: os.path.exists(sys.argv[1] + "/held"), daemon=True).start()
    time.sleep(0.3)
print("mounted", flush=True)
time.sleep(3600)
"""


@contextlib.contextmanager
def never_answering(folder: Path, hold: bool = False):
    """The mount's folder as memdiag reaches it (a path through the server's root); the server is
    killed on the way out, whatever happened."""
    if not Path("/dev/fuse").exists():
        pytest.skip("no /dev/fuse")
    folder.mkdir(exist_ok=True)
    server = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", _SERVER, str(folder),
         "hold" if hold else "-"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert server.stdout.readline() == "mounted\n"
        yield f"/proc/{server.pid}/root{folder}"
    finally:
        server.kill()
        server.wait()
        server.stdout.close()
