"""Which data shards a worker claims from (docs/shards.md, section 4).

A worker that names no shard (`WorkerConfig.shard` None) asks the cluster,
once at start, how many shards it has and which node hosts each shard's
leader: `GET /v1/cluster` lists them under `shards`. A cluster of one shard
lists none (or one), and the worker then claims exactly as before, from
group 0, without naming a shard. A token that may not read `/v1/cluster`
(a worker token: 403) reads the count from `GET /v1/time`, which is public
and names it on a node of several shards; the leaders are then learnt from
the redirects of the claims themselves. A node that has no `/v1/cluster`
(404) is taken to be of one shard.

The number of shards never changes; their leaders do. The worker reads the
map again when a claim fails (its shard's leader may have moved: the next
claim then goes straight to the new one), at most every `REFRESH_MIN_S`,
unless it names no leaders to learn (one shard, or a count from
`/v1/time`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

from raftsched.client import AsyncClient, Forbidden, JsonObject, NotFound

# The most shards a cluster may have (`raftsched node --shards`).
SHARDS_MAX: Final = 64
# The map is read again at most this often (claims that fail ask for it).
REFRESH_MIN_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class ShardMap:
    """`count` data shards (1: a cluster without shards), and the URL of the
    node hosting each shard's leader where it is known; `names_leaders`:
    read from `/v1/cluster`, which names them (`/v1/time` does not)."""

    count: int
    leaders: Mapping[int, str] = field(default_factory=dict)
    names_leaders: bool = True


ONE_SHARD: Final = ShardMap(1)


def shard_map_of(view: JsonObject) -> ShardMap:
    """The map in a `GET /v1/cluster` answer (`shards`: absent on a cluster of one)."""
    entries = view.get("shards")
    if not isinstance(entries, list) or len(entries) <= 1:
        return ONE_SHARD
    leaders: dict[int, str] = {}
    count = 0
    for entry in entries:
        shard = entry.get("shard") if isinstance(entry, dict) else None
        if type(shard) is not int or not 0 <= shard < SHARDS_MAX:
            continue
        count = max(count, shard + 1)
        url = _leader_url(entry.get("leader"))
        if url is not None:
            leaders[shard] = url
    return ShardMap(max(count, 1), leaders)


def _leader_url(leader: Any) -> str | None:
    url = leader.get("http_url") if isinstance(leader, dict) else None
    if not isinstance(url, str):
        return None
    parts = urlsplit(url)
    return url if parts.scheme in ("http", "https") and parts.netloc else None


async def read_shard_map(client: AsyncClient) -> ShardMap:
    """The cluster's shards, as the module doc says; raises the client's
    errors for anything else (unreachable, 401, 503...)."""
    try:
        return shard_map_of(await client.cluster())
    except NotFound:
        return ONE_SHARD
    except Forbidden:
        pass
    answer = (await client.request("GET", "/v1/time")).json()
    count = answer.get("shards") if isinstance(answer, dict) else None
    if type(count) is not int or not 1 < count <= SHARDS_MAX:
        return ONE_SHARD
    return ShardMap(count, names_leaders=False)
