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
"""

from __future__ import annotations

import logging

from aiohttp import web

from raftsched.api.errors import ApiError
from raftsched.api.requests import node_of, prepare_read
from raftsched.api.validation import reject_unknown
from raftsched.node.backup import BackupBusy, BackupFailed

log = logging.getLogger("raftsched.api")
routes = web.RouteTableDef()


@routes.get("/v1/backup")
async def backup(request: web.Request) -> web.StreamResponse:
    reject_unknown(request.query, frozenset({"consistency"}))
    await prepare_read(request)
    node = node_of(request)
    try:
        stream = await node.backups.start()
    except BackupBusy:
        raise ApiError(
            "unavailable",
            "a backup is already being taken on this node; retry when it is done",
            headers={"Retry-After": "5"},
        ) from None
    except BackupFailed as error:
        log.error("backup failed before it started: %s", error)
        raise ApiError("internal_error", "the backup could not be started") from None
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
