"""An HTTP client's retries hide a read timeout (issue 22, scenario 2), on a real local backend.

A tool charges through a ``requests.Session`` whose urllib3 ``Retry`` also retries reads. The first try
reaches the backend, which never answers it within the read timeout, and then stops listening: the
next try is refused. What reaches the guard is ``requests.ConnectionError <- MaxRetryError <-
NewConnectionError``, the error of the LAST try; the read timeout of the first one is only in urllib3's
record of its tries (``Retry.history``). Before the fix the guard read that chain as "never left",
released the record, and the agent's retry charged a second time.

| the client                                           | backend sees | record   | the agent's retry     |
|------------------------------------------------------|--------------|----------|-----------------------|
| Retry(total=2, allowed_methods=None), POST            | 1 request    | unknown  | refused (in memory)   |
|   ... on a real redis-server store                   | 1 request    | unknown  | refused               |
| Retry(total=2), PUT and DELETE                        | 1 request    | unknown  | refused               |
| Retry(total=2), then a 500 answer, raise_for_status() | 2 requests   | unknown  | refused               |
| tenacity around requests' default adapter            | 1 request    | unknown  | refused               |
| Retry(total=2, allowed_methods=None), nothing listens | 0 requests   | released | runs again (control)  |

The backend is a thread on 127.0.0.1 that holds the unanswered connection until the test ends (or for
at most ``HOLD`` seconds) and then stops by itself. No sleeps: the tests wait on events.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from airlock_redis import (
    EffectGuard,
    EffectRefused,
    EffectStore,
    InMemoryEffectStore,
    RedisEffectStore,
    Status,
    tool_call_context,
)
from airlock_redis.core.ambiguity import explain
from airlock_redis.embedded import EmbeddedRedis

requests = pytest.importorskip("requests", reason="requests is not installed (the test extra has it)")
HTTPAdapter = requests.adapters.HTTPAdapter
Retry = pytest.importorskip("urllib3.util.retry").Retry

READ_TIMEOUT = 0.5  # the client's: the first try waits this long for an answer that never comes
CONNECT_TIMEOUT = 2.0
HOLD = 10.0  # the longest the backend holds the unanswered connection or waits for a connection
ANSWER_500 = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class SilentBackend:
    """An HTTP backend on 127.0.0.1, in a thread. It accepts the first connection, reads its request and
    never answers it. ``then="refuse"``: right after that first accept it stops listening, so every
    later try is refused. ``then="answer-500"``: it answers the next request 500. The first connection
    is held open until :meth:`close` (or ``HOLD`` seconds), then the thread ends."""

    def __init__(self, then: str) -> None:
        self.then = then
        self.requests: list[str] = []  # the request line of each request the backend read
        self.first_seen = threading.Event()
        self.done = threading.Event()  # the backend handled every connection it will ever handle
        self._release = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(HOLD)
        self.port: int = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._serve, name=f"silent-backend-{then}", daemon=True)
        self._thread.start()

    def _read_request(self, conn: socket.socket) -> None:
        conn.settimeout(HOLD)
        data = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
        if data:
            self.requests.append(data.split(b"\r\n", 1)[0].decode("latin-1"))

    def _serve(self) -> None:
        try:
            try:
                first, _ = self._listener.accept()
            except OSError:
                return
            with first:
                if self.then == "refuse":
                    self._listener.close()  # stop listening before the client can try again
                self._read_request(first)
                self.first_seen.set()
                if self.then == "answer-500":
                    with contextlib.suppress(OSError):
                        second, _ = self._listener.accept()
                        with second:
                            self._read_request(second)
                            second.sendall(ANSWER_500)
                self.done.set()
                self._release.wait(HOLD)  # the first request stays unanswered
        finally:
            self.done.set()
            self._listener.close()

    def close(self) -> None:
        self._release.set()
        self._listener.close()
        self._thread.join(timeout=HOLD + 5)
        assert not self._thread.is_alive(), "the backend thread did not stop"


@pytest.fixture
def refusing_backend() -> Iterator[SilentBackend]:
    backend = SilentBackend("refuse")
    yield backend
    backend.close()


@pytest.fixture
def answering_backend() -> Iterator[SilentBackend]:
    backend = SilentBackend("answer-500")
    yield backend
    backend.close()


@pytest.fixture
def closed_url() -> str:
    """A local address where nothing listens."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def session_with(retry: Any) -> Any:
    session = requests.Session()
    session.trust_env = False  # straight to 127.0.0.1, whatever proxy the environment names
    adapter = HTTPAdapter(max_retries=retry)
    session.mount("http://", adapter)
    return session


def call(guarded: Callable[..., Any], tool_call_id: str, *args: Any) -> Any:
    with tool_call_context(tool_call_id):
        return guarded(*args)


def chain_of(error: BaseException) -> list[str]:
    """The qualified names down the chain requests builds: the error, its context, MaxRetryError.reason."""
    names: list[str] = []
    current: BaseException | None = error
    while current is not None and len(names) < 10:
        names.append(f"{type(current).__module__}.{type(current).__qualname__}")
        below = current.__cause__ or current.__context__
        reason = getattr(current, "reason", None)
        current = below if below is not None else reason if isinstance(reason, BaseException) else None
    return names


def assert_unknown_and_refused(
    store: EffectStore,
    retry: Callable[[], Any],
    tool_call_id: str,
    error: BaseException,
    because: str = "an earlier try that ended urllib3.exceptions.ReadTimeoutError",
) -> None:
    why = explain(error)
    record = store.get(tool_call_id)
    assert record is not None and record.status is Status.UNKNOWN, f"record {record!r}; {why}"
    with pytest.raises(EffectRefused) as refused:
        retry()  # the agent's retry, under the same tool_call_id
    assert refused.value.reason == "effect_status_unknown"
    record = store.get(tool_call_id)
    assert record is not None and record.status is Status.UNKNOWN
    assert why.startswith("in doubt") and because in why, why


def charge_through(session: Any, method: str, url: str) -> tuple[Callable[[str, int], int], list[int]]:
    runs: list[int] = []

    def charge(account: str, cents: int) -> int:
        runs.append(cents)
        response = session.request(
            method, f"{url}/charge/{account}", json={"cents": cents}, timeout=(CONNECT_TIMEOUT, READ_TIMEOUT)
        )
        response.raise_for_status()
        status: int = response.status_code
        return status

    return charge, runs


# -- the reviewer's reproduction: a read timeout, then refused, hidden by urllib3's Retry ---------------


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis_server)])
def store(request: pytest.FixtureRequest, namespace: str) -> Iterator[EffectStore]:
    if request.param == "memory":
        yield InMemoryEffectStore()
        return
    server: EmbeddedRedis = request.getfixturevalue("redis_server")
    redis_store = RedisEffectStore(server.url, namespace=namespace)
    yield redis_store
    redis_store.close()


def test_a_post_retried_after_a_read_timeout_is_unknown_and_the_agent_retry_is_refused(
    store: EffectStore, refusing_backend: SilentBackend
) -> None:
    session = session_with(Retry(total=2, allowed_methods=None, backoff_factor=0))
    charge, runs = charge_through(session, "POST", refusing_backend.url)
    guarded = EffectGuard(store=store).wrap(charge)
    with session, pytest.raises(requests.ConnectionError) as raised:
        call(guarded, "retried-post", "acct", 500)
    assert chain_of(raised.value)[:3] == [
        "requests.exceptions.ConnectionError",
        "urllib3.exceptions.MaxRetryError",
        "urllib3.exceptions.NewConnectionError",
    ]  # the chain of a plain "connection refused": nothing in it says the first try was sent
    assert refusing_backend.first_seen.wait(HOLD)
    assert_unknown_and_refused(
        store, lambda: call(guarded, "retried-post", "acct", 500), "retried-post", raised.value
    )
    assert refusing_backend.requests == ["POST /charge/acct HTTP/1.1"]  # exactly one execution
    assert runs == [500]


@pytest.mark.parametrize("method", ["PUT", "DELETE"])
def test_put_and_delete_under_a_plain_retry_are_unknown_and_the_agent_retry_is_refused(
    method: str, refusing_backend: SilentBackend
) -> None:
    """``Retry(total=2)`` retries reads of the idempotent methods, PUT and DELETE among them."""
    store = InMemoryEffectStore()
    session = session_with(Retry(total=2, backoff_factor=0))
    charge, runs = charge_through(session, method, refusing_backend.url)
    guarded = EffectGuard(store=store).wrap(charge)
    tool_call_id = f"retried-{method.lower()}"
    with session, pytest.raises(requests.ConnectionError) as raised:
        call(guarded, tool_call_id, "acct", 500)
    assert "urllib3.exceptions.NewConnectionError" in chain_of(raised.value)
    assert refusing_backend.first_seen.wait(HOLD)
    assert_unknown_and_refused(
        store, lambda: call(guarded, tool_call_id, "acct", 500), tool_call_id, raised.value
    )
    assert refusing_backend.requests == [f"{method} /charge/acct HTTP/1.1"]
    assert runs == [500]


def test_an_answer_after_a_retried_read_timeout_is_unknown(answering_backend: SilentBackend) -> None:
    """The retry is answered 500 and the tool raises it (``raise_for_status``): an answer, but the first
    try, which timed out reading, was sent. urllib3 keeps the record on the response."""
    store = InMemoryEffectStore()
    session = session_with(Retry(total=2, allowed_methods=None, backoff_factor=0))
    charge, runs = charge_through(session, "POST", answering_backend.url)
    guarded = EffectGuard(store=store).wrap(charge)
    with session, pytest.raises(requests.HTTPError) as raised:
        call(guarded, "answered-after-retry", "acct", 500)
    assert raised.value.response.status_code == 500
    assert answering_backend.done.wait(HOLD)
    assert_unknown_and_refused(
        store,
        lambda: call(guarded, "answered-after-retry", "acct", 500),
        "answered-after-retry",
        raised.value,
    )
    assert answering_backend.requests == ["POST /charge/acct HTTP/1.1"] * 2  # the unanswered one, the 500
    assert runs == [500]


def test_tenacity_retrying_a_read_timeout_is_unknown(refusing_backend: SilentBackend) -> None:
    """tenacity around requests' default adapter (no urllib3 retries): the first attempt times out
    reading, the second is refused; tenacity raises RetryError from the refusal."""
    tenacity = pytest.importorskip("tenacity", reason="tenacity is not installed")
    store = InMemoryEffectStore()
    session = session_with(HTTPAdapter().max_retries)
    charge, runs = charge_through(session, "POST", refusing_backend.url)
    retrying = tenacity.retry(
        stop=tenacity.stop_after_attempt(2), retry=tenacity.retry_if_exception_type(requests.RequestException)
    )(charge)
    guarded = EffectGuard(store=store).wrap(retrying)
    with session, pytest.raises(tenacity.RetryError) as raised:
        call(guarded, "tenacity-retried", "acct", 500)
    assert isinstance(raised.value.__cause__, requests.ConnectionError)  # refused: proves that try only
    assert refusing_backend.first_seen.wait(HOLD)
    assert_unknown_and_refused(
        store,
        lambda: call(guarded, "tenacity-retried", "acct", 500),
        "tenacity-retried",
        raised.value,
        because="tenacity gave up after 2 attempts",
    )
    assert refusing_backend.requests == ["POST /charge/acct HTTP/1.1"]
    assert runs == [500, 500]  # tenacity's two attempts; the agent's retry never ran


# -- the control: retries that never reached the backend still release ------------------------------


def test_retries_that_were_all_refused_release_and_the_agent_retry_runs(closed_url: str) -> None:
    """urllib3's record shows every try refused: nothing was sent, so the record is released."""
    store = InMemoryEffectStore()
    session = session_with(Retry(total=2, allowed_methods=None, backoff_factor=0))
    charge, runs = charge_through(session, "POST", closed_url)
    guarded = EffectGuard(store=store).wrap(charge)
    with session:
        with pytest.raises(requests.ConnectionError) as raised:
            call(guarded, "all-refused", "acct", 500)
        line = explain(raised.value)
        assert line.startswith("released: urllib3.exceptions.NewConnectionError"), line
        assert store.get("all-refused") is None
        with pytest.raises(requests.ConnectionError):  # the agent's retry runs (and is refused again)
            call(guarded, "all-refused", "acct", 500)
    assert runs == [500, 500]
    assert store.get("all-refused") is None
