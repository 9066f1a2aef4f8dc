"""The effect store shared through Redis: one string per tool call (see :mod:`.layout`), every
transition one Lua script.

Every script is safe to re-send (the store re-sends a command after a dropped connection or a
timeout, see :mod:`.tries`): the attempt's owner token makes a second ``begin`` or ``commit`` by the
same attempt a no-op, and fences off an attempt that was superseded.

A transition that gives a record back (a release, an operator's verdict) travels as ``EVAL`` with the
script's source, never as ``EVALSHA``: one that lands after its sender stopped waiting (delayed in the
network, or a re-send) still runs on a server whose script cache a restart, a failover or ``SCRIPT
FLUSH`` emptied, where an ``EVALSHA`` would fail with NOSCRIPT and nobody would send it again; so does
every re-send of any transition. The first try of a begin, a commit or a settle to unknown is an
``EVALSHA`` (a NOSCRIPT answer is sent again with the source at once): one lost that way leaves the
record as it was (no record, or pending), which refuses retries and never runs a tool twice, and its
re-sends carry the source.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis
from redis.exceptions import NoScriptError

from ..core.errors import CorruptRecordError, StoreError
from ..core.records import (
    BeginKind,
    BeginOutcome,
    BeginRequest,
    Holder,
    Record,
    Settlement,
    Status,
    TransitionResult,
)
from ..core.stepping import Plan, adrive, drive
from ..redaction import redact, without_password
from .blocking_wire import BlockingWire, blocking_wire_for
from .durability import ReplicaWait
from .keys import DEFAULT_NAMESPACE, check_namespace, index_key, record_key
from .layout import pack_holder, parse_holder
from .loop_clients import LoopClients
from .redis_clients import async_factory, decodes_responses, is_factory, url_of_client
from .redis_io import (
    REDIS_FAILURES,
    Command,
    Facts,
    MaxBulk,
    Op,
    Pause,
    Read,
    Waited,
    async_io,
    blocking_io,
    one,
    tried,
)
from .renewals import renew_all
from .replies import parse_begin, parse_record, parse_transition
from .script_args import SHAS, ScriptArgs, ScriptCommand
from .scripts import SCRIPT_NAMES, script_source
from .server_facts import DEFAULT_MAX_BULK, ServerFacts, max_bulk_of
from .server_facts import report as report_facts
from .tries import RETRIES, Tries, makes_one_try, never_sent
from .ttl import DEFAULT_COMMITTED_TTL, DEFAULT_PENDING_TTL, DEFAULT_UNKNOWN_TTL, StatusTTLs
from .url import (
    AsyncClient,
    SyncClient,
    parse_url,
    sync_client,
)
from .wakeups import AFTER_LEASE, Listener
from .write_behind import CLOSE_TIMEOUT, WriteBehind, WriteBehindListener

T = TypeVar("T")

FACTS_POLL = 0.005  # seconds between a waiting begin's looks at the first begin's read of the facts
# at most this many seconds a begin waits for another's read of the facts before it reads them itself:
# the read is four commands, each bounded by the socket timeout (5 s by default)
FACTS_WAIT = 20.0

DEFAULT_URL = "redis://localhost:6379/0"
# the URL a store made with no url and no client connects to (the CLI's --url default too)
URL_ENV = "AIRLOCK_REDIS_URL"
# the --url a refusal shows for a client= whose connection gives no URL
CLIENT_URL_UNKNOWN = "<the URL of the Redis that the application's client= connects to>"
# a key that holds a list, a hash, a set...: refused as corrupt, never overwritten (as lua/begin.lua says)
_NOT_A_STRING = "holds another Redis type, not a string: not a record"
log = logging.getLogger("airlock_redis")


_STARTED_FIRST = BeginOutcome(BeginKind.STARTED, attempt=1)


class RedisEffectStore:
    """Records in Redis, shared by every process and machine that points at the same server.

    ``url`` picks the server (``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://h:p,h:p``,
    ``redis+sentinel://h:p,h:p/<service>[/db]``: see :mod:`.url`); ``client=`` takes an existing
    redis-py client (``Redis`` or ``RedisCluster``) instead (it must not decode responses). Coroutine
    operations use a ``redis.asyncio`` client made for the running event loop (or ``async_client=``).

    ``wait_replicas=N`` (with ``wait_timeout`` seconds) makes every started attempt wait until N
    replicas hold its pending record before the tool runs (see :mod:`.durability`).

    ``auto_pipeline`` (on by default): asyncio calls that reach the store while an earlier command of
    the same loop is on its way are sent together, one pipeline round trip for the lot (see
    :mod:`.autopipe`); a call that finds nothing on its way is sent at once, alone. Blocking calls are
    always sent one by one.

    ``write_behind=True`` (off by default): a commit, and a settle to unknown, is queued for a
    background sender and the caller goes on without waiting for its reply (see
    :mod:`.write_behind`): a call costs one round trip. A write that never lands (the process dies, or
    Redis stays unreachable) leaves the record pending: retries are refused, the tool is never run
    again. :meth:`flush` waits for the queued writes; :meth:`close` and interpreter exit flush them;
    :meth:`add_write_behind_listener` hears what became of each.

    Every command goes through redis-py's public API: ``execute_command`` and pipelines, and, for the
    auto-pipelined commands of the asyncio client the store builds from ``url``, the connections'
    own ``send_packed_command``/``read_response`` (see :mod:`.exchange`). Clients the
    store builds from ``url`` make one try per command and the store re-sends, seeing every try (see
    :mod:`.tries`); a client passed in keeps its own retry policy.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        committed_ttl: float = DEFAULT_COMMITTED_TTL,
        pending_ttl: float = DEFAULT_PENDING_TTL,
        unknown_ttl: float = DEFAULT_UNKNOWN_TTL,
        client: SyncClient | None = None,
        async_client: AsyncClient | Callable[[], AsyncClient] | None = None,
        socket_timeout: float | None = 5.0,
        socket_connect_timeout: float | None = 5.0,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
        auto_pipeline: bool = True,
        write_behind: bool = False,
    ) -> None:
        self.namespace = check_namespace(namespace)
        self.ttls = StatusTTLs(committed=committed_ttl, pending=pending_ttl, unknown=unknown_ttl)
        self._args = ScriptArgs(self.ttls)
        if url is not None and client is not None:
            raise ValueError(
                "RedisEffectStore takes url or client=, not both: with client= the store uses that "
                "client and nothing else, so the URL would be shown (in repr and in refusals) but never "
                "used. Pass only client= (the store derives the URL it shows from the client's "
                "connection), or only url."
            )
        if url is None and client is None and async_client is None:
            url = os.environ.get(URL_ENV) or DEFAULT_URL
        self._parsed_url = parse_url(url) if url is not None else None
        # redis+unix:// is stored as the unix:// URL it names: the one redis-py and the CLI take
        self.url = self._parsed_url.url if self._parsed_url is not None else None
        self.wait_replicas = wait_replicas
        self._replica_wait = ReplicaWait(wait_replicas, wait_timeout) if wait_replicas else None
        self._facts: ServerFacts | None = None
        self._facts_checked = False
        # a begin reads them now, until this time.monotonic(): the others wait for it (see _first_facts)
        self._facts_reading_until = 0.0
        self._scripts_run = False  # until a begin ran the begin script, begins go by script (see begin)
        if wait_replicas and socket_timeout is not None and socket_timeout <= wait_timeout:
            # WAIT holds its connection up to wait_timeout: a read timeout no longer than that cuts
            # every WAIT that must wait, and begin fails with a socket timeout after it wrote a pending
            # record that is then never released (the tool did not run, yet retries are refused).
            socket_timeout = wait_timeout + 1.0
        self._timeouts: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": socket_connect_timeout,
        }
        for given in (client, async_client):
            if given is not None and not is_factory(given) and decodes_responses(given):
                raise ValueError(
                    "the Redis client decodes responses to str; the effect store needs bytes "
                    "(create the client with decode_responses=False)"
                )
        self._client: SyncClient | None = client
        # the store re-sends by itself only on clients that make one try (see .tries): those it builds
        # from the URL (one server, a Sentinel primary), and a blocking client= set to one try (its
        # asyncio twin keeps redis-py's default retry, so asyncio calls stay blind there)
        builds_one_try = (
            client is None and self._parsed_url is not None and self._parsed_url.kind != "cluster"
        )
        self._own_tries = builds_one_try or (client is not None and makes_one_try(client))
        self._async_own_tries = builds_one_try and async_client is None
        # the asyncio client of each event loop (see .loop_clients); the ones it makes, it closes
        self._loops = LoopClients(
            async_factory(async_client, self._parsed_url, self._timeouts, self._client),
            owned=async_client is None or is_factory(async_client),
            direct=self._async_own_tries,
        )
        # how the operations' plans are carried out: the blocking client (a command on the store's
        # own client through its wire, see .blocking_wire), or the running loop's
        self._wire: BlockingWire | None = None  # made with the client the store builds (see client)
        self._io = blocking_io(lambda: self.client, self._blocking_wire)
        self.auto_pipeline = auto_pipeline
        self._aio = async_io(self.async_client, self._pipelined if auto_pipeline else None)
        # write_behind: commits and settles to unknown go to a background sender (see .write_behind),
        # and every operation on a record first waits for this process's queued writes of it
        self.write_behind = write_behind
        self._behind = (
            WriteBehind(lambda: self.client, self.async_client, self._blocking_wire) if write_behind else None
        )
        self._wakeups: Listener | None = None  # made on the first wait (see .wakeups)
        if self._behind is not None:
            self._io = self._behind.guard_blocking(self._io)
            self._aio = self._behind.guard_async(self._aio)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisEffectStore:
        """``RedisEffectStore.from_url(url, namespace=..., ...)``: the same as
        ``RedisEffectStore(url, **options)``, spelled as redis-py's ``Redis.from_url``. ``options`` are
        this class's keyword options (``namespace``, the TTLs, timeouts, ``wait_replicas``, ...)."""
        return cls(url, **options)

    def __enter__(self) -> RedisEffectStore:
        """``with RedisEffectStore(url) as store:`` closes the blocking client when the block ends
        (as :meth:`close` does, a client passed as ``client=`` included)."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> RedisEffectStore:
        """``async with RedisEffectStore(url) as store:`` closes the running event loop's asyncio
        client when the block ends (as :meth:`aclose` does)."""
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def operator_target(self) -> str:
        """``--url <url without its password> --namespace <namespace>``: what ``airlock-redis``
        needs to reach these records (the operator supplies the password, if any).

        A store given ``client=`` shows the URL of that client's connection (``redis://host:port/db``,
        ``rediss://``, ``unix://path?db=N``, ``redis+cluster://``, ``redis+sentinel://``, user kept,
        password left out); for a client whose connection it cannot read, the ``--url`` value says
        that the URL is the one the application's client connects to."""
        if self.url:
            url = without_password(self.url)
        else:
            derived = url_of_client(self._client) if self._client is not None else None
            url = derived or CLIENT_URL_UNKNOWN
        return f"--url {shlex.quote(url)} --namespace {shlex.quote(self.namespace)}"

    def __repr__(self) -> str:
        if self.url:
            where = redact(self.url)
        elif self._client is not None:
            derived = url_of_client(self._client)
            where = f"client={type(self._client).__name__}" + (f" at {derived}" if derived else "")
        else:
            where = "async_client only"
        return f"RedisEffectStore({where!s}, namespace={self.namespace!r})"

    @property
    def max_value_bytes(self) -> int:
        """The largest result the server takes (``proto-max-bulk-len`` of the primaries, once read):
        a larger one is committed without its value, and replays are refused (result_not_stored)."""
        return self._args.max_value_bytes

    # -- clients ---------------------------------------------------------------------------------
    @property
    def client(self) -> SyncClient:
        """The blocking redis-py client: the one passed as ``client=``, else made from the URL on
        first use."""
        client = self._client
        return client if client is not None else self._build_client()

    def _build_client(self) -> SyncClient:
        if self.url is None:
            raise StoreError(
                "this RedisEffectStore was given only an async client: blocking calls need a url "
                "or client= (a redis-py client)"
            )
        assert self._parsed_url is not None
        retries = 0 if self._own_tries else RETRIES
        client = sync_client(self._parsed_url, retries=retries, **self._timeouts)
        # the store's own client (one try per command, but on Cluster): its commands go on its wire
        self._wire = blocking_wire_for(client)
        self._client = client
        return client

    def _blocking_wire(self) -> BlockingWire | None:
        """The wire of the blocking client the store built (see .blocking_wire); None for a client
        passed in, or a Cluster's."""
        if self._client is None:
            self._build_client()
        return self._wire

    def _tries(self) -> Tries:
        return Tries(RETRIES) if self._own_tries else Tries.blind()

    def _async_tries(self) -> Tries:
        return Tries(RETRIES) if self._async_own_tries else Tries.blind()

    def _tried(self, attempt: Callable[[], Plan[T]] | Op, tries: Tries) -> Plan[T]:
        """``attempt()`` re-sent after a dropped connection or a timeout (see :func:`.redis_io.tried`)."""
        return tried(attempt, tries, _failure, _unexpected)

    def _command(self, args: tuple[Any, ...], tries: Tries) -> Plan[Any]:
        """One command through the client (raw reply), with the store's tries."""
        return self._tried(Command(args), tries)

    def _script(
        self, name: str, tool_call_id: str, args: list[Any], with_source: bool, tries: Tries
    ) -> Plan[Any]:
        """Run a transition script on the record's key (see the module docstring for EVAL vs EVALSHA)."""
        return self._script_on(name, self.key(tool_call_id), args, with_source, tries)

    def _script_on(
        self, name: str, key: bytes, args: list[Any], with_source: bool, tries: Tries
    ) -> Plan[Any]:
        """Run a script on ``key`` (a record's, or an index entry's)."""
        command = ScriptCommand(name, key, args, with_source)

        def attempt() -> Plan[Any]:
            try:
                return (yield Command(command.next_try()))
            except NoScriptError:  # the cache was emptied: the source loads it again
                return (yield Command(command.with_source()))

        return self._tried(attempt, tries)

    # -- server facts and durability (wait_replicas) ----------------------------------------------
    @property
    def server_facts(self) -> ServerFacts | None:
        """Version, eviction policy and AOF of the primaries, once read (on the first begin)."""
        return self._facts

    def _learn_server(self, facts: ServerFacts | None) -> None:
        self._facts, self._facts_checked = facts, True
        if facts is not None:
            report_facts(facts, repr(self))

    def check_server(self) -> ServerFacts | None:
        """Read the server facts now (a logged warning if the eviction policy can delete records),
        and the largest argument the primaries take (``proto-max-bulk-len``, where CONFIG is allowed)."""
        return drive(self._checking(), self._io)

    async def acheck_server(self) -> ServerFacts | None:
        """Coroutine form of :meth:`check_server`, through the running loop's client."""
        return await adrive(self._checking(), self._aio)

    def _checking(self) -> Plan[ServerFacts | None]:
        try:
            facts: ServerFacts | None = yield Facts()
        except REDIS_FAILURES as exc:  # INFO refused (ACL) or the server is down: begin will tell
            log.info("airlock_redis: could not read the server's settings (%s)", exc)
            if not isinstance(exc, redis.ResponseError):
                return None  # unreachable now: try again on the next begin
            facts = None
        try:
            self._args.max_value_bytes = max_bulk_of((yield MaxBulk()))
        except REDIS_FAILURES:  # CONFIG refused or renamed (managed services): Redis' default
            self._args.max_value_bytes = DEFAULT_MAX_BULK
        self._learn_server(facts)
        return facts

    def _first_facts(self) -> Plan[None]:
        """The server facts, read by one begin of a burst of first begins: while one reads them, the
        others wait for its answer (each reading them would send hundreds of INFO commands at a
        busy service's start). A read that fails lets the next waiter try. None waits longer than
        ``FACTS_WAIT``: a reader cancelled mid-read (whose plan may not be closed at once, so that
        its ``finally`` has not run) holds nobody up for longer than that."""
        while not self._facts_checked:
            if time.monotonic() >= self._facts_reading_until:
                self._facts_reading_until = time.monotonic() + FACTS_WAIT
                try:
                    yield from self._checking()
                finally:
                    self._facts_reading_until = 0.0
                return
            yield Pause(FACTS_POLL)

    def ensure_durable(self, request: BeginRequest) -> None:
        """After a started begin: raise (a StoreError) unless wait_replicas replicas hold the record."""
        if self._replica_wait is not None:
            self._replica_wait.ensure(request.token)

    async def aensure_durable(self, request: BeginRequest) -> None:
        """Coroutine form of :meth:`ensure_durable`."""
        if self._replica_wait is not None:
            self._replica_wait.ensure(request.token)

    def _begin_waited(self, request: BeginRequest, tries: Tries) -> Plan[BeginOutcome]:
        wait = self._replica_wait
        assert wait is not None
        args = self._args.begin(request)
        op = Waited(
            wait, self.key(request.tool_call_id), SHAS["begin"], script_source("begin"), args, self._facts
        )
        try:
            reply, acks = yield from self._tried(lambda: one(op), tries)
        except StoreError as exc:
            # begin and WAIT share one round trip: an error in it may follow an applied begin
            exc.maybe_applied = exc.maybe_applied or not isinstance(exc, CorruptRecordError)
            raise
        outcome = parse_begin(reply)
        if outcome.kind is BeginKind.STARTED:
            wait.remember(request.token, acks)
        return outcome

    def async_client(self) -> AsyncClient:
        """The asyncio client for the running event loop (one per loop: asyncio clients are loop-bound)."""
        return self._loops.current().client

    @property
    def async_client_loops(self) -> frozenset[asyncio.AbstractEventLoop]:
        """The event loops whose asyncio client the store holds now (a client the store made is
        closed, and let go, when its loop shuts down)."""
        return self._loops.loops

    def _pipelined(self, args: tuple[Any, ...]) -> Awaitable[Any]:
        """Send one command through the running loop's auto-pipeline (see :mod:`.autopipe`)."""
        return self._loops.current().pipeline.execute(args)

    def key(self, tool_call_id: str) -> bytes:
        """The Redis key that holds the record of ``tool_call_id`` in this store's namespace."""
        return record_key(self.namespace, tool_call_id)

    # -- operations: each a plan (written once), carried out by either driver -------------------
    # A begin first tries SET NX: it lands only where the key holds nothing, and writes exactly what
    # the script writes there, so "it landed" is the script's {"started", 1}. Anything else (a record,
    # a tombstone, a re-sent begin of this attempt, a key of another type) goes to the script, which
    # decides as before. Not with wait_replicas: a WAIT would be sent for a SET that may not land.
    # Not before a begin of this store has run a script either: until then the begin is the script,
    # sent with its source (EVAL), so that a Redis user who may SET but not run scripts finds out
    # before a tool runs, not at the commit after it (see acl.py for what a user needs).
    def begin(self, request: BeginRequest) -> BeginOutcome:
        """Record the call pending for ``request.token``, or report what an earlier attempt left
        (STARTED, COMMITTED with the value, MISMATCH, or the status in doubt), in one atomic step on
        the server. The contract: :meth:`airlock_redis.EffectStore.begin`."""
        return drive(self._beginning(request, self._tries), self._io)

    async def abegin(self, request: BeginRequest) -> BeginOutcome:
        """Coroutine form of :meth:`begin`, through the running loop's client."""
        return await adrive(self._beginning(request, self._async_tries), self._aio)

    def _beginning(self, request: BeginRequest, new_tries: Callable[[], Tries]) -> Plan[BeginOutcome]:
        if not self._facts_checked:
            yield from self._first_facts()
        if self._replica_wait is not None:
            return (yield from self._begin_waited(request, new_tries()))
        key = self.key(request.tool_call_id)
        proven = self._scripts_run
        if proven:
            landed = yield from self._command(
                ("SET", key, self._args.first_record(request), "NX", "PX", self._args.pending_ms), new_tries()
            )
            if landed:
                return _STARTED_FIRST
        reply = yield from self._script(
            "begin", request.tool_call_id, self._args.begin(request), not proven, new_tries()
        )
        self._scripts_run = True
        return parse_begin(reply)

    def commit(
        self, request: BeginRequest, attempt: int, value: bytes | None, mac: bytes | None
    ) -> TransitionResult:
        """The attempt that owns the record marks it committed with the tool's encoded ``value`` (None:
        ran, result not stored) and ``mac``. The contract: :meth:`airlock_redis.EffectStore.commit`.

        With ``write_behind``: queued, and OK at once (see :mod:`.write_behind`)."""
        args = self._args.commit(request, attempt, value, mac)
        if self._behind is not None and self._behind.put(
            *self._behind_write(request, "commit", args), self._tries()
        ):
            return TransitionResult.OK
        return parse_transition(drive(self._committing(request, args, self._tries()), self._io))

    async def acommit(
        self, request: BeginRequest, attempt: int, value: bytes | None, mac: bytes | None
    ) -> TransitionResult:
        """Coroutine form of :meth:`commit`."""
        args = self._args.commit(request, attempt, value, mac)
        if self._behind is not None and self._behind.aput(
            *self._behind_write(request, "commit", args), self._async_tries()
        ):
            return TransitionResult.OK
        return parse_transition(await adrive(self._committing(request, args, self._async_tries()), self._aio))

    def _committing(self, request: BeginRequest, args: list[Any], tries: Tries) -> Plan[Any]:
        return self._script("commit", request.tool_call_id, args, False, tries)

    def settle(self, request: BeginRequest, attempt: int, settlement: Settlement) -> TransitionResult:
        """The owning attempt marks its pending record unknown, or releases it (a release is sent with
        its script: it applies even when it lands late). The contract:
        :meth:`airlock_redis.EffectStore.settle`.

        With ``write_behind``: a settle to unknown is queued, and OK at once; a release is always
        sent and waited for (a retry it allows must be able to run at once, on any replica)."""
        if self._behind is not None and settlement is Settlement.UNKNOWN:
            args = self._args.settle(request, attempt, settlement)
            if self._behind.put(*self._behind_write(request, "settle", args), self._tries()):
                return TransitionResult.OK
        return parse_transition(drive(self._settling(request, attempt, settlement, self._tries()), self._io))

    async def asettle(self, request: BeginRequest, attempt: int, settlement: Settlement) -> TransitionResult:
        """Coroutine form of :meth:`settle`."""
        if self._behind is not None and settlement is Settlement.UNKNOWN:
            args = self._args.settle(request, attempt, settlement)
            if self._behind.aput(*self._behind_write(request, "settle", args), self._async_tries()):
                return TransitionResult.OK
        plan = self._settling(request, attempt, settlement, self._async_tries())
        return parse_transition(await adrive(plan, self._aio))

    def _settling(
        self, request: BeginRequest, attempt: int, settlement: Settlement, tries: Tries
    ) -> Plan[Any]:
        args = self._args.settle(request, attempt, settlement)
        return self._script("settle", request.tool_call_id, args, settlement is Settlement.RELEASE, tries)

    def _behind_write(
        self, request: BeginRequest, name: str, args: list[Any]
    ) -> tuple[BeginRequest, str, bytes, ScriptCommand]:
        """What a write-behind transition is queued as (its first try an EVALSHA, as sent directly)."""
        key = self.key(request.tool_call_id)
        what = "commit" if name == "commit" else "settle to unknown"
        return request, what, key, ScriptCommand(name, key, args, False)

    def flush(self, timeout: float | None = None) -> bool:
        """With ``write_behind``: wait until every write queued so far has landed (or was given up
        and logged), at most ``timeout`` seconds (None: no bound); True when they all have. Without
        it there is nothing to wait for: True. In a coroutine, use :meth:`aflush`."""
        return self._behind is None or self._behind.flush(timeout)

    async def aflush(self, timeout: float | None = None) -> bool:
        """Coroutine form of :meth:`flush`: the loop keeps running (its own sender included)."""
        return self._behind is None or await self._behind.aflush(timeout)

    def add_write_behind_listener(self, listener: WriteBehindListener) -> None:
        """With ``write_behind``: call ``listener(outcome)`` for every queued write once it has landed
        (``outcome.result``: the server's answer) or was given up (``outcome.error``; logged as well),
        a :class:`~airlock_redis.stores.write_behind.WriteBehindOutcome`, before :meth:`flush` hears of
        it. It runs on the sender (its thread, or the event loop's task): keep it short, never block;
        an exception it raises is logged and ignored. A write sent synchronously (past the queue's
        bound) answers its caller instead, and without ``write_behind`` it is never called."""
        if self._behind is not None:
            self._behind.listeners.append(listener)

    def resolve(
        self,
        tool_call_id: str,
        verdict: Status | Settlement,
        *,
        expect_key: str | None = None,
        expect_status: Status | None = None,
        expect_owner: str | None = None,
        value: bytes | None = None,
        mac: bytes | None = None,
    ) -> TransitionResult:
        """An operator's verdict (committed with ``value``, unknown, or release), applied only when the
        record still matches what the operator was shown (``expect_*``). The contract:
        :meth:`airlock_redis.EffectStore.resolve`."""
        args = self._args.resolve(verdict, expect_key, expect_status, expect_owner, value, mac)
        return parse_transition(
            drive(self._script("resolve", tool_call_id, args, True, self._tries()), self._io)
        )

    async def aresolve(
        self,
        tool_call_id: str,
        verdict: Status | Settlement,
        *,
        expect_key: str | None = None,
        expect_status: Status | None = None,
        expect_owner: str | None = None,
        value: bytes | None = None,
        mac: bytes | None = None,
    ) -> TransitionResult:
        """Coroutine form of :meth:`resolve`."""
        args = self._args.resolve(verdict, expect_key, expect_status, expect_owner, value, mac)
        plan = self._script("resolve", tool_call_id, args, True, self._async_tries())
        return parse_transition(await adrive(plan, self._aio))

    def get(self, tool_call_id: str) -> Record | None:
        """The record of ``tool_call_id`` (with its remaining TTL), or None; a key that holds no
        well-formed record raises :class:`~airlock_redis.core.errors.CorruptRecordError`."""
        return drive(self._getting(tool_call_id, self._tries()), self._io)

    async def aget(self, tool_call_id: str) -> Record | None:
        """Coroutine form of :meth:`get`."""
        return await adrive(self._getting(tool_call_id, self._async_tries()), self._aio)

    def _getting(self, tool_call_id: str, tries: Tries) -> Plan[Record | None]:
        key = self.key(tool_call_id)
        data, pttl = yield from self._tried(lambda: one(Read(key)), tries)
        if isinstance(data, BaseException):
            raise _not_a_string(tool_call_id, data)
        return parse_record(tool_call_id, data, int(pttl))

    # -- waiting for a running attempt (see .wakeups) -------------------------------------------
    @property
    def can_wait(self) -> bool:
        """Whether a call can wait here for a running attempt: the listener runs in a thread, on the
        blocking client, which a store given only an asyncio client lacks."""
        return self.keeps_leases

    def _listener(self) -> Listener:
        if self._wakeups is None:
            self._wakeups = Listener(lambda: self.client.pubsub())  # noqa: PLW0108 - the client is made lazily
        return self._wakeups

    def wait_running(self, request: BeginRequest, seconds: float) -> BeginOutcome:
        """Wait up to ``seconds`` for the attempt that runs ``request``'s call to end (woken by its
        end, or when its lease would lapse unrenewed), then begin again: what begin answers then."""
        self.wait_ended(request.tool_call_id, seconds)
        return self.begin(request)  # the store's own begin: a subclass that watches begins sees it

    async def await_running(self, request: BeginRequest, seconds: float) -> BeginOutcome:
        """Coroutine form of :meth:`wait_running`. Cancelled, it leaves nothing but the record's
        flag that someone waits (the attempt's end then publishes once to nobody)."""
        await self.await_ended(request.tool_call_id, seconds)
        return await self.abegin(request)

    def wait_ended(self, tool_call_id: str, seconds: float) -> None:
        """Wait up to ``seconds`` for the running attempt of ``tool_call_id`` to end (woken by its
        end, or when its lease would lapse unrenewed); the record is only watched, never begun."""
        waiter = self._listener().join(self.key(tool_call_id))
        try:
            if waiter.listening.wait(seconds):
                lease_left = drive(self._waiting(tool_call_id), self._io)
                if lease_left is not None:
                    waiter.woken.wait(min(seconds, lease_left + AFTER_LEASE))
        finally:
            self._listener().leave(waiter)

    async def await_ended(self, tool_call_id: str, seconds: float) -> None:
        """Coroutine form of :meth:`wait_ended`; cancelled, it leaves nothing but the record's flag
        that someone waits."""
        waiter = self._listener().join(self.key(tool_call_id), asyncio.get_running_loop())
        try:
            if await waiter.listening.await_(seconds):
                lease_left = await adrive(self._waiting(tool_call_id), self._aio)
                if lease_left is not None:
                    await waiter.woken.await_(min(seconds, lease_left + AFTER_LEASE))
        finally:
            self._listener().leave(waiter)

    # -- dedupe: the index from idempotency key to the tool_call_id that holds it -----------------
    def index_key(self, idempotency_key: str) -> bytes:
        """The Redis key of ``idempotency_key``'s index entry (in a slot of its own)."""
        return index_key(self.namespace, idempotency_key)

    def claim(self, request: BeginRequest, expected: Holder | None = None) -> Holder | None:
        """Make the key's index entry name this attempt (lua/claim.lua; see
        :meth:`airlock_redis.stores.base.DedupingEffectStore.claim`): None when claimed, else the
        holder."""
        return _claim_reply(drive(self._claiming(request, expected, self._tries()), self._io))

    async def aclaim(self, request: BeginRequest, expected: Holder | None = None) -> Holder | None:
        """Coroutine form of :meth:`claim`."""
        return _claim_reply(await adrive(self._claiming(request, expected, self._async_tries()), self._aio))

    def _claiming(self, request: BeginRequest, expected: Holder | None, tries: Tries) -> Plan[Any]:
        """The claim script's reply. With ``wait_replicas`` the script and WAIT go in one pipeline on
        one connection to the entry's primary (as begin's, see :mod:`.durability`), and a claim that
        did not reach enough replicas raises (the tool does not run; the entry is given back)."""
        mine = pack_holder(request.tool_call_id, request.token)
        args = [mine, self._args.pending_ms, expected.raw if expected is not None else b""]
        key = self.index_key(request.idempotency_key)
        wait = self._replica_wait
        if wait is None:
            return (yield from self._script_on("claim", key, args, False, tries))
        op = Waited(wait, key, SHAS["claim"], script_source("claim"), args, self._facts)
        try:
            reply, acks = yield from self._tried(lambda: one(op), tries)
        except StoreError as exc:
            exc.maybe_applied = exc.maybe_applied or not isinstance(exc, CorruptRecordError)
            raise
        if reply == b"claimed":
            wait.check(acks, "the claim of the idempotency key", landed=True)
        return reply

    def unclaim(self, request: BeginRequest, keep: Status | None) -> bool:
        """End this attempt's index entry (lua/unclaim.lua, sent with its source: it applies even when
        it lands late): kept as long as a record in status ``keep`` lives, or deleted (None)."""
        return bool(drive(self._unclaiming(request, keep, self._tries()), self._io))

    async def aunclaim(self, request: BeginRequest, keep: Status | None) -> bool:
        """Coroutine form of :meth:`unclaim`."""
        return bool(await adrive(self._unclaiming(request, keep, self._async_tries()), self._aio))

    def _unclaiming(self, request: BeginRequest, keep: Status | None, tries: Tries) -> Plan[Any]:
        mine = pack_holder(request.tool_call_id, request.token)
        ttl = b"" if keep is None else str(self.ttls.millis(keep)).encode()
        return self._script_on("unclaim", self.index_key(request.idempotency_key), [mine, ttl], True, tries)

    def _waiting(self, tool_call_id: str) -> Plan[float | None]:
        """Flag the record as waited for while its attempt runs (lua/wait.lua): the seconds its lease
        has left, or None when it no longer runs (begin again at once)."""
        reply = yield from self._script("wait", tool_call_id, [], False, self._tries())
        if isinstance(reply, list) and reply and reply[0] == b"waiting":
            return max(0.0, int(reply[1]) / 1000)
        return None

    # -- leases (see airlock_redis.lease) ---------------------------------------------------------
    @property
    def keeps_leases(self) -> bool:
        """Whether leases can be renewed: they are sent from a thread, through the blocking client,
        which a store given only an asyncio client lacks."""
        return self._client is not None or self.url is not None

    def renew_leases(self, requests: Sequence[BeginRequest]) -> list[TransitionResult | StoreError]:
        """Renew the lease of each running attempt (``lua/renew.lua``), in one pipeline round trip:
        OK, SUPERSEDED (the record is no longer the attempt's, or it ended), MISSING, or the
        StoreError that kept it from being renewed (the next renewal is the retry)."""
        return renew_all(self.client, [(self.key(r.tool_call_id), self._args.renew(r)) for r in requests])

    def ping(self) -> bool:
        """Whether the server answers PING (a StoreError when it cannot be reached)."""
        return bool(drive(self._command(("PING",), self._tries()), self._io))

    def load_scripts(self) -> None:
        """Load every script into the server's cache now (they load on first use otherwise)."""
        for name in SCRIPT_NAMES:
            drive(self._command(("SCRIPT", "LOAD", script_source(name)), self._tries()), self._io)

    def close(self) -> None:
        """Close the blocking client's connections (``with store:`` does this when the block ends);
        a later call connects again. With ``write_behind``, first wait for the queued writes to land
        (at most ``write_behind.CLOSE_TIMEOUT``, 5 seconds; what is left is sent later, or at exit)."""
        if self._behind is not None:
            self._behind.close(CLOSE_TIMEOUT)
        if self._wakeups is not None:  # its thread and connection; a later wait starts another
            self._wakeups.stop()
            self._wakeups = None
        if self._client is not None:
            self._client.close()

    # -- closing ----------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Close the asyncio client of the running loop now (``asyncio.run`` closes the ones the store
        made by itself when its loop ends). With ``write_behind``, the queued writes are flushed first
        (at most ``write_behind.CLOSE_TIMEOUT``, 5 seconds)."""
        if self._behind is not None:
            await self.aflush(CLOSE_TIMEOUT)
        await self._loops.aclose_current()


def _claim_reply(reply: Any) -> Holder | None:
    """lua/claim.lua's answer: None for "claimed", else the holder its entry names."""
    if isinstance(reply, list) and len(reply) == 2 and reply[0] == b"held":
        return parse_holder(bytes(reply[1]))
    if reply == b"claimed":
        return None
    raise StoreError(f"the claim script answered {reply!r}", maybe_applied=True)


def _not_a_string(tool_call_id: str, error: BaseException) -> StoreError:
    """What ``get`` raises when the GET of the record failed: CorruptRecordError for a key that holds
    another Redis type (WRONGTYPE), as the begin script refuses it; else the failure as it is."""
    if isinstance(error, redis.exceptions.ResponseError) and "WRONGTYPE" in str(error):
        return CorruptRecordError(f"the key of the record of {tool_call_id!r} {_NOT_A_STRING}")
    return _failure(error)


def _unexpected(exc: Exception) -> StoreError:
    """An error redis-py raised that is none of its own (seen: an AttributeError from its Cluster
    client on an ASK to a node it does not know). Whether the command landed is unknown."""
    return StoreError(
        f"Redis did not complete the operation: the client failed unexpectedly: {type(exc).__name__}: {exc}",
        maybe_applied=True,
    )


def _failure(exc: BaseException, maybe_applied: bool | None = None) -> StoreError:
    message = f"Redis did not complete the operation: {type(exc).__name__}: {exc}"
    if isinstance(exc, redis.exceptions.ResponseError) and "WRONGTYPE" in str(exc):
        return CorruptRecordError(f"the key of the record {_NOT_A_STRING} ({exc})")
    if isinstance(exc, redis.exceptions.NoPermissionError):
        message += (
            " (the Redis user's ACL does not allow this key or command: check that the store's "
            "namespace matches the user's key pattern, and the user's command list)"
        )
    if maybe_applied is None:
        maybe_applied = not never_sent(exc)
    return StoreError(message, maybe_applied=maybe_applied)
