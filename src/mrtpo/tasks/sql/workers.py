"""Worker processes that run sandboxed queries and are killed when they overrun.

SQLite checks its deadline (the progress handler, the interrupt flag) only between
virtual-machine instructions, never inside one function call or one sort, so an in-process
deadline is not a hard bound. Each query therefore runs in a child process; the caller waits for
the answer only until a hard deadline and then kills (SIGKILL) and reaps the child. Children are
reused between queries (one round trip costs far less than a process start), started lazily, one
per concurrent caller (a killed one is replaced at once, so the next query finds it started), with
``subprocess`` (fork+exec: safe in a threaded trainer, and the caller's
``__main__`` is never re-imported). A child exits on its own when its parent's end of the socket
closes, so none outlives the trainer.
"""

from __future__ import annotations

import atexit
import importlib
import os
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection, Pipe
from pathlib import Path
from typing import Any

# The folder holding the ``mrtpo`` package, so that children import the same code as the parent.
_SRC_ROOT = str(Path(__file__).resolve().parents[3])


def _child_env() -> dict[str, str]:
    """The parent's environment with this package's source folder first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_SRC_ROOT, env.get("PYTHONPATH")) if p)
    return env


class _Worker:
    """One child process answering requests for ``function`` (``"module:name"``) on its end of a socket pair."""

    def __init__(self, function: str) -> None:
        parent_end, child_end = Pipe()
        fd = child_end.fileno()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"from {__name__} import serve; serve({fd}, {function!r})"],
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            env=_child_env(),
        )
        child_end.close()
        self.conn = parent_end

    def kill(self) -> None:
        """Stop the child at once, wherever it is, and reap it."""
        self.conn.close()
        self.proc.kill()
        self.proc.wait()


class WorkerPool:
    """Idle workers to hand out; :meth:`call` runs one request of ``function`` on one of them.

    ``function`` is named, ``"module:name"``, not passed: each child imports it itself, and this
    module imports nothing of its callers.
    """

    def __init__(self, function: str) -> None:
        self._function = function
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        atexit.register(self.close)
        # A forked child (e.g. a data-loader process) must not share its parent's workers.
        os.register_at_fork(after_in_child=self._forget)

    def call(self, args: tuple[Any, ...], deadline: float, grace_s: float) -> Any | None:
        """``function(*args, timeout_s)`` in a worker, or None when it overran (worker killed).

        ``deadline`` is a ``time.monotonic()`` instant: the worker is sent the time left until
        then (its own, soft deadline; a worker still starting up reads it late) and is killed
        when no answer has come ``grace_s`` after it. Raises ``RuntimeError`` when it died.
        """
        worker = self._acquire()
        answered = False
        try:
            worker.conn.send((args, deadline - time.monotonic()))
            if worker.conn.poll(max(0.0, deadline + grace_s - time.monotonic())):
                answer = worker.conn.recv()
                answered = True
                return answer
            return None
        except (OSError, EOFError) as exc:
            raise RuntimeError(f"sandbox worker {worker.proc.pid} died: {exc!r}") from exc
        finally:
            if answered:
                with self._lock:
                    self._idle.append(worker)
            else:
                worker.kill()
                replacement = _Worker(self._function)  # starts up while the caller goes on
                with self._lock:
                    self._idle.append(replacement)

    def _acquire(self) -> _Worker:
        """A live idle worker, or a new one (a worker killed from outside is dropped here)."""
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.proc.poll() is None:
                    return worker
                worker.kill()
        return _Worker(self._function)

    def close(self) -> None:
        """Kill every idle worker (at exit; a later call starts new ones)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()

    def _forget(self) -> None:
        self._idle = []
        self._lock = threading.Lock()


def serve(fd: int, function: str) -> None:
    """The child's loop: answer each ``(args, timeout_s)`` with ``function(*args, timeout_s)``."""
    module, name = function.split(":")
    run = getattr(importlib.import_module(module), name)
    conn = Connection(fd)
    while True:
        try:
            args, timeout_s = conn.recv()
        except EOFError:
            return
        conn.send(run(*args, timeout_s))
