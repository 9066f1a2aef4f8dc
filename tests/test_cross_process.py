"""A result committed in one process is replayed in another, equal and of the same types.

Each call runs in a fresh ``spawn`` process that builds its own guard and tools (tests/procs.py)
and shares nothing with the others but the redis-server. Pydantic models and dataclasses come back
through the tool's return annotation.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
from pydantic import BaseModel

from airlock_redis import RedisEffectStore, Status
from airlock_redis.embedded import EmbeddedRedis
from tests.procs import (
    Invoice,
    Receipt,
    call_result_tool,
    sample_invoice,
    sample_plain,
    sample_receipt,
    spawn,
)

EXPECTED: dict[str, Any] = {
    "plain": sample_plain(),
    "invoice": sample_invoice(),
    "receipt": sample_receipt(),
    "nothing": None,
    "pair": (7, b"\x01\x02"),
    "invoices": [sample_invoice(), sample_invoice().model_copy(update={"note": "copy"})],
}


def assert_same(got: Any, want: Any, where: str = "result") -> None:
    """Equal, and of exactly the same types all the way down (a tuple stays a tuple, ...)."""
    assert type(got) is type(want), f"{where}: {type(got).__name__} is not {type(want).__name__}"
    if isinstance(want, BaseModel):
        for name in type(want).model_fields:
            assert_same(getattr(got, name), getattr(want, name), f"{where}.{name}")
    elif dataclasses.is_dataclass(want):
        for spec in dataclasses.fields(want):
            assert_same(getattr(got, spec.name), getattr(want, spec.name), f"{where}.{spec.name}")
    elif isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for key in want:
            assert_same(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for index, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}[{index}]")
    elif isinstance(want, (dt.datetime, dt.time)):
        assert (got, got.utcoffset()) == (want, want.utcoffset()), where
    else:
        assert got == want, where


@pytest.fixture(scope="module")
def pools() -> Iterator[tuple[ProcessPoolExecutor, ProcessPoolExecutor]]:
    """Two worker processes (one each), reused by every test of this module."""
    first = ProcessPoolExecutor(max_workers=1, mp_context=spawn())
    second = ProcessPoolExecutor(max_workers=1, mp_context=spawn())
    yield first, second
    first.shutdown(cancel_futures=True)
    second.shutdown(cancel_futures=True)


@pytest.mark.parametrize("tool", list(EXPECTED))
def test_a_result_committed_in_one_process_replays_in_another(
    redis_server: EmbeddedRedis,
    namespace: str,
    pools: tuple[ProcessPoolExecutor, ProcessPoolExecutor],
    tool: str,
) -> None:
    first, second = pools
    tool_call_id = f"xproc-{tool}"
    pid_1, ran_1, value_1 = first.submit(
        call_result_tool, redis_server.url, namespace, tool, tool_call_id
    ).result(timeout=120)
    pid_2, ran_2, value_2 = second.submit(
        call_result_tool, redis_server.url, namespace, tool, tool_call_id
    ).result(timeout=120)
    assert pid_1 != pid_2
    assert (ran_1, ran_2) == (1, 0), "the second process ran the tool instead of replaying it"
    assert_same(value_1, EXPECTED[tool], "executed")
    assert_same(value_2, EXPECTED[tool], "replayed")

    store = RedisEffectStore(redis_server.url, namespace=namespace)
    record = store.get(tool_call_id)
    assert record is not None and record.status is Status.COMMITTED and record.value is not None
    # stored data is plain msgpack: it names no class to import
    for name in (b"Invoice", b"Receipt", b"Line", b"tests.procs", b"pydantic"):
        assert name not in record.value
    store.close()


def test_the_replaying_process_rebuilds_models_from_the_return_annotation(
    redis_server: EmbeddedRedis, namespace: str, pools: tuple[ProcessPoolExecutor, ProcessPoolExecutor]
) -> None:
    """The replay in a process that never ran the tool still yields the annotated classes."""
    first, second = pools
    second.submit(call_result_tool, redis_server.url, namespace, "receipt", "xproc-ann").result(timeout=120)
    _, ran, value = first.submit(
        call_result_tool, redis_server.url, namespace, "receipt", "xproc-ann"
    ).result(timeout=120)
    assert ran == 0
    assert isinstance(value, Receipt) and value == sample_receipt()
    _, _, invoice = second.submit(
        call_result_tool, redis_server.url, namespace, "invoice", "xproc-ann-2"
    ).result(timeout=120)
    _, ran, replayed = first.submit(
        call_result_tool, redis_server.url, namespace, "invoice", "xproc-ann-2"
    ).result(timeout=120)
    assert ran == 0 and isinstance(replayed, Invoice) and replayed == invoice
