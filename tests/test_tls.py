"""The store over TLS (rediss://) to a real server whose certificate the test made."""

from __future__ import annotations

import pytest

from airlock_redis import RedisEffectStore, StoreUnavailable
from airlock_redis.cli.doctor_cmd import diagnose

from .topo_helpers import Counted, assert_replays_across_two_stores, fresh_id, namespace
from .topologies import TLSServer, make_certificates, shared_tls

pytestmark = pytest.mark.redis_server


@pytest.fixture(scope="module")
def tls(pytestconfig: pytest.Config) -> TLSServer:
    return shared_tls(pytestconfig)


def test_a_call_replays_across_two_store_objects_sync_and_async(tls: TLSServer) -> None:
    assert_replays_across_two_stores(tls.url)


def test_plain_tcp_to_the_tls_port_fails_closed(tls: TLSServer) -> None:
    tool = Counted(RedisEffectStore(tls.plain_url, namespace=namespace(), socket_timeout=2))
    with pytest.raises(StoreUnavailable):
        tool.call(fresh_id(), "acct")
    assert tool.runs["acct"] == 0


def test_a_certificate_from_another_ca_is_rejected(tls: TLSServer, tmp_path: object) -> None:
    from pathlib import Path

    other = make_certificates(Path(str(tmp_path)) / "other")
    url = tls.url.replace(str(tls.files.ca), str(other.ca))
    tool = Counted(RedisEffectStore(url, namespace=namespace(), socket_timeout=2))
    with pytest.raises(StoreUnavailable, match=r"(?i)certificate"):
        tool.call(fresh_id(), "acct")
    assert tool.runs["acct"] == 0


def test_doctor_reports_tls(tls: TLSServer) -> None:
    checks = {c.name: c for c in diagnose(tls.url)}
    assert checks["tls"].status == "ok" and "TLS" in checks["tls"].summary
    assert checks["reachability"].status == "ok"
