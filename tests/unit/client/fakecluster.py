"""A fake cluster of aiohttp servers on loopback, scripted per test.

Each FakeNode answers every request with `node.script(seen)`, where `seen` is
the request as recorded (method, path, query, JSON body, headers). The
servers run on their own event loop in a background thread so both the
blocking and the async client can talk to them.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    headers: dict[str, str]  # names lower-cased


Script = Callable[[Seen], web.StreamResponse | Awaitable[web.StreamResponse]]


def reply(status: int = 200, body: Any = None, **headers: str) -> web.Response:
    text = json.dumps(body if body is not None else {})
    return web.Response(status=status, text=text, content_type="application/json", headers=headers)


def error(status: int, code: str, message: str = "", **headers: str) -> web.Response:
    body = {"error": {"code": code, "message": message, "details": {"field": "x"}}}
    return reply(status, body, **headers)


class FakeNode:
    def __init__(self, name: str) -> None:
        self.name = name
        self.url = ""
        self.seen: list[Seen] = []
        self.script: Script = lambda seen: reply(200, {"node": self.name})

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        seen = Seen(
            request.method,
            request.path,
            dict(request.query),
            json.loads(raw) if raw else None,
            {name.lower(): value for name, value in request.headers.items()},
        )
        self.seen.append(seen)
        answer = self.script(seen)
        if isinstance(answer, web.StreamResponse):
            return answer
        return await answer


class FakeCluster:
    def __init__(self, count: int) -> None:
        self.nodes = [FakeNode(f"n{i + 1}") for i in range(count)]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runners: list[web.AppRunner] = []

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def start(self) -> None:
        self._thread.start()
        for node in self.nodes:
            asyncio.run_coroutine_threadsafe(self._serve(node), self._loop).result(5)

    async def _serve(self, node: FakeNode) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", node.handle)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        node.url = f"http://{host}:{port}"
        self._runners.append(runner)

    def stop(self) -> None:
        async def cleanup() -> None:
            for runner in self._runners:
                await runner.cleanup()
            await finish_pending_tasks()

        asyncio.run_coroutine_threadsafe(cleanup(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()


async def finish_pending_tasks() -> None:
    """Cancel the loop's other tasks (handlers of requests a test abandoned)
    and let them end, so none is destroyed while pending when the loop goes:
    asyncio logs that at error level."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def dead_url() -> str:
    """A loopback URL where nothing listens (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
