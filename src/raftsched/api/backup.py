"""`GET /v1/backup`: the whole state at a committed index, streamed (admin).

Linearizable by default, like every read: the leader answers after a
barrier, so the backup holds every write acknowledged before the request
(a follower redirects). `?consistency=stale` takes it from the replica that
answers, at its applied index, which spares the leader. Either way the
state is encoded by a forked child (`node.backup`), and the response
starts once its header is known: `Raftsched-Applied-Index` and
`Raftsched-Digest` (the same digest as `/v1/debug/digest` at that index).
The body is the backup file (`raftsched.backup`), `Content-Length` exact: a
transfer cut short is visibly short, and `raftsched restore` refuses it.

On a node of several shards (docs/shards.md, section 5) the answer is one
file holding every group's backup (`raftsched.backup`, RSSHARDS): group 0's
taken here as above, and shard k's asked of this node's shard process
(which answers if it leads shard k, or if the read is stale) or, following
its 307, of the node hosting shard k's leader with `Raftsched-Shard: k`.
Every group's backup is started first (each at its own index), so the
container's header, which lists every part's index, digest and length, and
`Content-Length` are known before the first byte is sent; then the parts
are streamed one after another. The response's `Raftsched-Applied-Index`,
`Raftsched-Digest` and `Raftsched-Cluster-Id` are group 0's, and
`Raftsched-Shards` is S. With `Raftsched-Shard: k` the answer is shard k's
own backup file alone (how one node asks another for a part).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Final

import aiohttp
from aiohttp import web

import raftsched
from raftsched.api.errors import ApiError
from raftsched.api.requests import consistency, node_of, prepare_read
from raftsched.api.shard_routing import SHARD_ROUTER, ShardRouter
from raftsched.api.validation import reject_unknown
from raftsched.backup import PartListing, ShardedHeader
from raftsched.node.backup import BackupBusy, BackupFailed, BackupStream
from raftsched.shards import SHARD_HEADER

# A part asked of another node: how long its connection and each read may take.
PART_CONNECT_S: Final = 5.0
PART_READ_S: Final = 120.0
PART_CHUNK_BYTES: Final = 1 << 20

log = logging.getLogger("raftsched.api")
routes = web.RouteTableDef()


@routes.get("/v1/backup")
async def backup(request: web.Request) -> web.StreamResponse:
    reject_unknown(request.query, frozenset({"consistency"}))
    await prepare_read(request)
    node = node_of(request)
    router = request.app.get(SHARD_ROUTER)
    if router is not None and SHARD_HEADER not in request.headers:
        return await _sharded(request, router)
    stream = await _start(request)
    try:
        header = stream.header
        response = web.StreamResponse(
            headers={
                "Content-Type": "application/octet-stream",
                "Content-Disposition": f'attachment; filename="raftsched-{header.index}.backup"',
                "Raftsched-Applied-Index": str(header.index),
                "Raftsched-Digest": header.digest,
                "Raftsched-Cluster-Id": header.cluster_id or "",
            }
        )
        response.content_length = len(stream.head) + header.body_bytes
        await response.prepare(request)
        await response.write(stream.head)
        # The last chunk waits until the child is reaped (`chunks` ends
        # with that) and the node may take the next backup: a client that
        # has every byte and asks again at once is not told it is busy.
        last = b""
        async for chunk in stream.chunks():
            if last:
                await response.write(last)
            last = chunk
        node.backups.done()
        await response.write(last)
        await response.write_eof()
        log.info("backup at index %d sent (%d bytes)", header.index, response.content_length)
        return response
    except BackupFailed as error:
        # The status line is sent: the client sees a body shorter than its
        # Content-Length, and restore refuses it.
        log.error("backup at index %d failed: %s", stream.header.index, error)
        raise
    finally:
        await stream.close()
        node.backups.done()


async def _start(request: web.Request) -> BackupStream:
    try:
        return await node_of(request).backups.start()
    except BackupBusy:
        raise ApiError(
            "unavailable",
            "a backup is already being taken on this node; retry when it is done",
            headers={"Retry-After": "5"},
        ) from None
    except BackupFailed as error:
        log.error("backup failed before it started: %s", error)
        raise ApiError("internal_error", "the backup could not be started") from None


def _listing(shard: int, response: aiohttp.ClientResponse) -> PartListing:
    """A shard's part as its answer's headers describe it."""
    try:
        index = int(response.headers["Raftsched-Applied-Index"])
        digest = response.headers["Raftsched-Digest"]
        length = response.content_length
        if length is None or length <= 0:
            raise ValueError("no Content-Length")
    except (KeyError, ValueError) as error:
        raise ApiError(
            "unavailable",
            f"shard {shard}'s backup came without its index, digest or length ({error}): "
            "is every node of this release?",
            {"reason": "shard_part_failed", "shard": shard},
            headers={"Retry-After": "1"},
        ) from None
    return PartListing(
        shard, index, digest, length, response.headers.get("Raftsched-Cluster-Id") or None
    )


async def _sharded(request: web.Request, router: ShardRouter) -> web.StreamResponse:
    """Every group's backup in one file (docs/shards.md, section 5)."""
    node = node_of(request)
    path = "/v1/backup" + ("?consistency=stale" if consistency(request) == "stale" else "")
    remote = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=PART_CONNECT_S, sock_read=PART_READ_S
        )
    )
    answers: list[aiohttp.ClientResponse] = []
    stream: BackupStream | None = None
    try:
        stream = await _start(request)
        opened = await asyncio.gather(
            *(
                router.open_part_stream(request, shard, path, remote)
                for shard in range(1, router.count)
            ),
            return_exceptions=True,
        )
        answers = [answer for answer in opened if isinstance(answer, aiohttp.ClientResponse)]
        for failed in opened:
            if isinstance(failed, BaseException):
                raise failed
        header = stream.header
        parts = [
            PartListing(
                0,
                header.index,
                header.digest,
                len(stream.head) + header.body_bytes,
                header.cluster_id,
            )
        ]
        parts += [_listing(shard, answer) for shard, answer in enumerate(answers, start=1)]
        container = ShardedHeader(
            shards=router.count,
            cluster_id=header.cluster_id,
            created_at_ms=int(time.time() * 1000),
            node_id=node.node_id,
            release=raftsched.__version__,
            parts=tuple(parts),
        )
        head = container.encode()
        response = web.StreamResponse(
            headers={
                "Content-Type": "application/octet-stream",
                "Content-Disposition": f'attachment; filename="raftsched-{header.index}.backup"',
                "Raftsched-Applied-Index": str(header.index),
                "Raftsched-Digest": header.digest,
                "Raftsched-Cluster-Id": header.cluster_id or "",
                "Raftsched-Shards": str(router.count),
            }
        )
        response.content_length = len(head) + sum(part.bytes for part in parts)
        await response.prepare(request)
        await response.write(head)
        await response.write(stream.head)
        try:
            async for chunk in stream.chunks():
                await response.write(chunk)
            node.backups.done()
            for listed, answer in zip(parts[1:], answers, strict=True):
                sent = 0
                async for chunk in answer.content.iter_chunked(PART_CHUNK_BYTES):
                    sent += len(chunk)
                    await response.write(chunk)
                if sent != listed.bytes:
                    raise BackupFailed(
                        f"shard {listed.shard}'s part stopped after {sent} of {listed.bytes} bytes"
                    )
        except (BackupFailed, aiohttp.ClientError, OSError, TimeoutError) as error:
            # The status line is sent: the client sees a body shorter than
            # its Content-Length, and restore refuses it.
            log.error("backup of %d shards failed: %s", router.count, error)
            raise
        await response.write_eof()
        log.info(
            "backup of %d shards sent (%d bytes): %s",
            router.count,
            response.content_length,
            ", ".join(f"shard {part.shard} at {part.index}" for part in parts),
        )
        return response
    finally:
        for answer in answers:
            answer.release()
        await remote.close()
        if stream is not None:
            with contextlib.suppress(Exception):
                await stream.close()
            node.backups.done()
