"""The --data folder of `memdiag serve`, opened once and then reached only through descriptors.

At start the folder and every folder above it must be safe from other users (outfiles: root's or
this user's, not writable by others; sticky folders such as /tmp above it are fine) and on storage,
not a filesystem of kernel objects (under cgroupfs a mkdir makes a cgroup): checked before
anything is created. The folder itself is held open (O_NOFOLLOW) for the life of the server, and
every name in it is opened relative to that descriptor, the report tree through a descriptor of
`reports` opened again for each use without following a link: a `reports` replaced by a symbolic
link while the server runs is refused with the reason, never written through. SQLite opens its
database by path: the path is the folder's, links resolved at start, under folders only root or
this user can change."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path

from ..outfiles import kernel_filesystem, on_kernel_filesystem, unsafe_ancestors, unsafe_folder

NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
LOCK_NAME = "serve.lock"
REPORTS = "reports"
_DIR = os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW


class DataInUse(Exception):
    """Another server holds the data folder's lock."""

    def __init__(self, folder: Path, pid: str | None):
        other = f"another memdiag serve (pid {pid})" if pid else "another memdiag serve"
        super().__init__(f"--data {folder}: {other} is using this folder; one server per data folder")


class UnsafeData(Exception):
    """The data folder, a folder above it or something in it is one memdiag will not follow or trust."""


class DataDir:
    """The data folder, checked and open, and locked: one server per folder."""

    def __init__(self, given: Path):
        self.given = given
        self.path = _checked(given)
        if os.path.islink(self.path):
            raise UnsafeData(f"--data {given}: is a symbolic link; name the folder itself ({os.path.realpath(given)})")
        os.makedirs(self.path, 0o700, exist_ok=True)
        self.fd = os.open(self.path, _DIR)  # a link put there meanwhile: ELOOP
        try:
            if problem := unsafe_folder(os.fstat(self.fd), self.path, "data folder"):
                raise UnsafeData(f"--data {given}: {problem}")
            self.lockfd = self._lock()  # before anything in the folder is modified
            os.fchmod(self.fd, 0o700)
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        os.close(self.lockfd)
        os.close(self.fd)

    def _lock(self) -> int:
        try:
            fd = os.open(LOCK_NAME, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600, dir_fd=self.fd)
        except OSError as e:
            if e.errno == errno.ELOOP:  # a symlink planted as the lock file
                link = f"--data {self.given}: {LOCK_NAME} is a symbolic link"
                raise UnsafeData(f"{link}: refusing to follow it") from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            raise DataInUse(self.given, other if other.isdigit() else None) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        os.fchmod(fd, 0o600)
        return fd

    # -- files of the folder itself --------------------------------------------------------------

    def no_symlink(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISLNK(os.lstat(name, dir_fd=self.fd).st_mode):
                raise UnsafeData(f"{self.path / name} is a symbolic link: refusing to follow it (remove it)")

    def create(self, name: str) -> None:
        """The file `name` made (mode 600) if missing, without following a link."""
        os.close(os.open(name, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600, dir_fd=self.fd))

    def owner_only(self, name: str) -> None:
        """Mode 600 for a file the folder has (a link is refused), whatever it was."""
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW, dir_fd=self.fd)
            try:
                os.fchmod(fd, 0o600)
            finally:
                os.close(fd)

    def probe(self, name: str, size: int) -> None:
        """Write `size` bytes to a new file and remove it; OSError if the folder refuses."""
        remove(name, self.fd)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o600, dir_fd=self.fd)
        try:
            os.write(fd, b"\0" * size)
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self.fd)

    def free_bytes(self) -> int:
        room = os.fstatvfs(self.fd)
        return room.f_bavail * room.f_frsize

    # -- the report tree -------------------------------------------------------------------------

    def prepare_reports(self) -> None:
        """`reports` as a real folder (a link or file planted there before the start is removed, never
        followed), everything in it owner-only whatever it was."""
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISDIR(os.lstat(REPORTS, dir_fd=self.fd).st_mode):
                os.unlink(REPORTS, dir_fd=self.fd)
        with contextlib.suppress(FileExistsError):
            os.mkdir(REPORTS, 0o700, dir_fd=self.fd)
        with self.reports() as rfd:
            _tighten(rfd)

    def reports_problem(self) -> str | None:
        """Why reports cannot be written now (its folder replaced by a link or a file), or None."""
        try:
            mode = os.lstat(REPORTS, dir_fd=self.fd).st_mode
        except FileNotFoundError:
            return f"{self.path / REPORTS} is gone (removed while the server runs)"
        if stat.S_ISLNK(mode):
            return (
                f"{self.path / REPORTS} was replaced by a symbolic link while the server runs: not followed, "
                "no report is written through it (remove it and restart memdiag serve)"
            )
        return None if stat.S_ISDIR(mode) else f"{self.path / REPORTS} is no longer a folder"

    @contextlib.contextmanager
    def reports(self) -> Iterator[int]:
        """A descriptor of `reports`, opened now without following a link (OSError with the reason)."""
        try:
            rfd = os.open(REPORTS, _DIR, dir_fd=self.fd)
        except OSError as e:
            problem = self.reports_problem()
            if problem is None:
                raise
            raise OSError(e.errno, problem) from None
        try:
            yield rfd
        finally:
            os.close(rfd)

    def write_report(self, iid: str, files: Mapping[str, str | bytes]) -> int:
        """reports/<iid>/<name> for each file, made anew; the bytes written. OSError on any failure,
        with nothing half-written left."""
        with self.reports() as rfd:
            try:
                remove(iid, rfd)
                os.mkdir(iid, 0o700, dir_fd=rfd)
                ifd = os.open(iid, _DIR, dir_fd=rfd)
                try:
                    return sum(_write_new(ifd, name, _raw(text)) for name, text in files.items())
                finally:
                    os.close(ifd)
            except OSError:
                with contextlib.suppress(OSError):
                    remove(iid, rfd)
                raise

    def read_report(self, iid: str, name: str) -> bytes:
        with self.reports() as rfd:
            ifd = os.open(iid, _DIR, dir_fd=rfd)
            try:
                fd = os.open(name, os.O_RDONLY | NOFOLLOW, dir_fd=ifd)
            finally:
                os.close(ifd)
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def remove_report(self, iid: str) -> None:
        with self.reports() as rfd:
            remove(iid, rfd)


def _checked(given: Path) -> Path:
    """The folder's absolute path, links above it resolved, once it is known safe to create or use."""
    path = Path(os.path.realpath(given.parent)) / given.name if given.name else Path(os.path.realpath(given))
    if kind := kernel_filesystem(path):
        raise UnsafeData(f"--data {given}: {on_kernel_filesystem(kind)}")
    if problem := unsafe_ancestors(path):
        raise UnsafeData(f"--data {given}: {problem}")
    return path


def _raw(content: str | bytes) -> bytes:
    """A report file's bytes: text as UTF-8, a profile as it is."""
    return content if isinstance(content, bytes) else content.encode()


def _write_new(dfd: int, name: str, raw: bytes) -> int:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o600, dir_fd=dfd)
    try:
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    return len(raw)


def _tighten(dfd: int) -> None:
    """Owner-only modes for everything below a folder, whatever they were; links are left unfollowed
    (fwalk does not follow them, and each entry is opened with O_NOFOLLOW to change its mode)."""
    os.fchmod(dfd, 0o700)
    for _root, dirs, files, rootfd in os.fwalk(".", dir_fd=dfd):
        for name in dirs + files:
            with contextlib.suppress(OSError):  # gone meanwhile, or a link (ELOOP): nothing to change
                mode = os.lstat(name, dir_fd=rootfd).st_mode
                if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                    continue  # links, and nothing else belongs here: left as they are, never opened
                fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW, dir_fd=rootfd)
                try:
                    os.fchmod(fd, 0o700 if stat.S_ISDIR(mode) else 0o600)
                finally:
                    os.close(fd)


def remove(name: str, dfd: int) -> None:
    """Remove the file, link or folder `name` in the folder dfd (a link itself, never what it points to)."""
    try:
        mode = os.lstat(name, dir_fd=dfd).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(name, dir_fd=dfd)
    else:
        os.unlink(name, dir_fd=dfd)
