"""What every ``airlock-redis doctor`` check is made of: the :class:`Check` it answers, its
:data:`Status` (ordered by :data:`EXIT`), and the server nodes it reads (:class:`Node`,
:func:`nodes_of`, :func:`server_info`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import redis
from redis.cluster import RedisCluster

from ..stores.url import SyncClient

Status = Literal["ok", "warn", "unsafe"]
EXIT = {"ok": 0, "warn": 1, "unsafe": 2}


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    summary: str
    detail: str = ""


@dataclass(frozen=True)
class Node:
    name: str
    client: redis.Redis
    primary: bool


def nodes_of(client: SyncClient) -> list[Node]:
    if isinstance(client, RedisCluster):
        return [
            Node(n.name, client.get_redis_connection(n), n.server_type == "primary")
            for n in client.get_nodes()
        ]
    assert isinstance(client, redis.Redis)
    return [Node("server", client, True)]


def server_info(node: Node, section: str) -> dict[str, Any]:
    info: dict[str, Any] = node.client.info(section)
    return info
