"""One writer per run folder: an ``flock`` on the folder's :data:`LOCK_NAME` that every command using a
run folder takes, so none reads or writes what another is writing.

The rule: a command that writes into the run folder takes the lock *exclusively*; one that only reads it
takes it *shared*. ``mrtpo train`` (rank 0) holds it exclusively from before it judges the folder until it
ends; ``mrtpo report RUN`` holds it exclusively while it writes the report files; ``mrtpo export RUN`` holds
it shared while it reads ``model/`` or a checkpoint, and exclusively when it writes into the run (the
default ``RUN/export``). So a running training refuses a report and an export, either refuses the
training, and several exports written elsewhere read one finished run at once. The one refused gets a
:class:`RunLockError` naming the holder's command and pid and what to do; nothing waits.

``MRTPOTrainer.train`` (rank 0) takes it too, so a script on the Python API is one writer like ``mrtpo
train``; within one process the lock is re-entrant (``mrtpo train`` already holds it when it calls
``train``): a second take of a folder this process holds gets a handle whose release does nothing.

The kernel drops the lock when its process ends, so a killed command leaves no stale lock. The file lists
its holders, one ``pid command`` line each, and is emptied by the last to release it (a reader that ends
while another reads leaves its line, shown only while its pid is alive).
"""

from __future__ import annotations

import os
from pathlib import Path

#: The lock file in a run folder.
LOCK_NAME = ".mrtpo.lock"

#: The run folders this process holds (resolved path -> its lock), so a second take is re-entrant.
_HELD: dict[Path, RunLock] = {}


class RunLockError(ValueError):
    """A run folder's lock is held by another command (named, with its pid), or the folder cannot be written."""


class RunLock:
    """A held lock on a run folder's :data:`LOCK_NAME`, until :meth:`release` (or the process ends)."""

    def __init__(self, fd: int | None, shared: bool = False, folder: Path | None = None):
        self.fd, self.shared, self.folder = fd, shared, folder

    def release(self) -> None:
        """Empty the holders' list (a reader: only when it is the last one) and drop the lock."""
        import fcntl

        if self.fd is not None:
            _HELD.pop(self.folder, None)
            try:
                if self.shared:  # the last reader when nobody else holds it
                    fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.ftruncate(self.fd, 0)
            except BlockingIOError:
                pass  # other readers: their lines (and this one's, shown only while its pid lives) stay
            os.close(self.fd)  # closing the only descriptor drops the flock
            self.fd = None


def lock_run_folder(
    folder: Path,
    command: str = "mrtpo train",
    shared: bool = False,
    advice: str = "wait for it to end, or give another --output-dir",
) -> RunLock:
    """Take ``folder``'s lock (creating the folder) for ``command``, exclusively or ``shared``; a
    :class:`RunLockError` naming the holders and ``advice`` when another command holds it in a mode that
    excludes this one. Take it before reading or writing anything in the folder. A folder this process
    cannot write is read (``shared``) without a lock: no command of this user can be writing it."""
    import errno
    import fcntl

    folder = Path(folder)
    held = _HELD.get(folder.resolve())
    if held is not None and (shared or not held.shared):  # this process holds it already, in a mode that covers
        return RunLock(None, shared)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        if shared and exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM) and folder.is_dir():
            return RunLock(None, shared=True)
        raise RunLockError(f"cannot write to the output folder {folder}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        holders = _holders(os.pread(fd, 4096, 0).decode(errors="replace"))
        os.close(fd)
        raise RunLockError(f"{folder} is in use by {holders}: {advice}") from None
    line = f"{os.getpid()} {command}\n".encode()
    if shared:
        os.pwrite(fd, line, os.fstat(fd).st_size)
    else:
        os.ftruncate(fd, 0)
        os.pwrite(fd, line, 0)
    lock = _HELD[folder.resolve()] = RunLock(fd, shared, folder.resolve())
    return lock


def _holders(text: str) -> str:
    """``mrtpo train (pid 12)`` for each live holder listed in a lock file (a bare pid: an older mrtpo's run)."""
    found = []
    for line in text.splitlines():
        pid, _, command = line.strip().partition(" ")
        if pid.isdigit() and _alive(int(pid)):
            found.append(f"{command or 'another mrtpo run'} (pid {pid})")
    return ", ".join(dict.fromkeys(found)) or "another mrtpo command (pid unknown)"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


__all__ = ["LOCK_NAME", "RunLock", "RunLockError", "lock_run_folder"]
