"""A running process's memory read from outside (/proc/PID/mem, as py-spy reads it with
process_vm_readv): never written, never stopped for. Each read is counted with its bytes and the
time it took, so what naming frames and holders cost is reported as measured, not guessed: the
target pays for it only as the kernel's page-table walk under its mm lock (no trap, no stop)."""

from __future__ import annotations

import os
import struct
import time

from memdiag.system import identity

ADDRESS_LIMIT = 1 << 57  # above every user address x86-64 has (5-level page tables: 2^56): no pointer


class Memory:
    """Reads of one process's memory. A read that fails (unmapped, the process gone) is None."""

    def __init__(self, pid: int, max_bytes: int = 64 << 20):
        self.pid = pid
        self.reads = 0
        self.bytes = 0
        self.failed = 0
        self.seconds = 0.0
        self.max_bytes = max_bytes  # a bound on what one run may read (a runaway walk stops there)
        self.capped = 0  # reads refused at that bound
        try:
            self._fd: int | None = identity.open_mem(pid)
        except OSError:
            self._fd = None

    @property
    def usable(self) -> bool:
        return self._fd is not None

    def read(self, address: int, size: int) -> bytes | None:
        if self._fd is None or size <= 0 or not 0 < address < ADDRESS_LIMIT:
            return None
        if self.bytes + size > self.max_bytes:
            self.capped += 1
            return None
        t = time.perf_counter()
        try:
            data = os.pread(self._fd, size, address)
        except OSError:
            data = b""
        finally:
            self.seconds += time.perf_counter() - t
            self.reads += 1
        if len(data) != size:
            self.failed += 1
            return None
        self.bytes += size
        return data

    def u64(self, address: int) -> int | None:
        data = self.read(address, 8)
        return struct.unpack("<Q", data)[0] if data is not None else None

    def i64(self, address: int) -> int | None:
        data = self.read(address, 8)
        return struct.unpack("<q", data)[0] if data is not None else None

    def u32(self, address: int) -> int | None:
        data = self.read(address, 4)
        return struct.unpack("<I", data)[0] if data is not None else None

    def i32(self, address: int) -> int | None:
        data = self.read(address, 4)
        return struct.unpack("<i", data)[0] if data is not None else None

    def words(self, address: int, count: int) -> list[int] | None:
        data = self.read(address, 8 * count)
        return list(struct.unpack(f"<{count}Q", data)) if data is not None else None

    def cost(self) -> dict[str, float]:
        """What was read, for a probe's result: reads, bytes, failed reads, seconds."""
        return {"reads": self.reads, "bytes": self.bytes, "failed": self.failed, "seconds": round(self.seconds, 6)}

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
