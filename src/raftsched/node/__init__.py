"""The coordinator process: `run_node(config)` starts Raft and the HTTP API."""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from raftsched.config import NodeConfig
from raftsched.logs import configure_logging

log = logging.getLogger("raftsched.node")


def run_node(config: NodeConfig) -> None:
    """Run a node until SIGTERM or SIGINT. Must be called on the main thread:
    pysyncobj's tick thread stops when the thread that created it exits."""
    config.validate()
    configure_logging(config.log_format, node_id=config.node_id)
    config.data_dir.mkdir(parents=True, exist_ok=True)
    asyncio.run(_serve(config))


async def _serve(config: NodeConfig) -> None:
    from raftsched.api.app import create_app
    from raftsched.node import gc_tuning
    from raftsched.node.service import Node

    gc_tuning.configure()
    loop = asyncio.get_running_loop()
    node = Node(config, loop)
    node.start()
    app = create_app(node)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, config.http_host, config.http_port, reuse_address=True)
    await site.start()
    log.info(
        "node started",
        extra={"http": config.advertised_http_url, "raft": config.raft_address},
    )
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    gc_task = loop.create_task(gc_tuning.freeze_periodically())
    try:
        await stop.wait()
    finally:
        gc_task.cancel()
        log.info("node stopping")
        await runner.cleanup()
        await node.close()
