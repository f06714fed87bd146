"""The coordinator process: the composition root above `node` and `api`.

`run_node(config)` builds the node, the leader's webhook deliverer and the
HTTP application, serves them until SIGTERM or SIGINT, then closes them. It is
the one module that knows every layer of the shell, so that the arrows
between them point down only: `api` uses `node`, and `node` knows nothing of
HTTP. The CLI's `raftsched node` calls `run_node`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
import stat
import sys
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from raftsched import tls, tracing
from raftsched.config import ConfigError, NodeConfig
from raftsched.logs import configure_logging
from raftsched.node import gc_tuning
from raftsched.node.service import Node
from raftsched.node.shard_settings import ShardSettings
from raftsched.node.webhooks import WebhookDelivery
from raftsched.shard_processes import ShardProcesses
from raftsched.shards import SOCKET_NAME, ShardCountMismatch, internal_key, settle_shards

# The largest request header a shard process takes (its node's principal header).
INTERNAL_HEADER_BYTES_MAX = 64 * 1024

log = logging.getLogger("raftsched.node")
server_log = logging.getLogger("aiohttp.server")


class NodeRefused(Exception):
    """The cluster refused this node (node.identity): it stopped cleanly and
    the process exits with `exit_status`."""

    def __init__(self, exit_status: int, message: str) -> None:
        super().__init__(message)
        self.exit_status = exit_status


class ClientFaultsAsWarnings(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's request handler reports a request it cannot parse (a header
    with a NUL byte, a bad request line) with `logger.exception`, at error
    level, and answers it 400 itself. That is the client's fault, not the
    node's: it is logged as a warning with the parser's message, and every
    other error stays an error."""

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        error = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if isinstance(error, HttpProcessingError) and 400 <= error.code < 500:
            self.warning("%s: %s", str(msg) % args if args else msg, error, **kwargs)
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)


def run_node(config: NodeConfig) -> None:
    """Run a node until SIGTERM or SIGINT. Must be called on the main thread:
    pysyncobj's tick thread stops when the thread that created it exits.
    Raises ConfigError, before binding anything, for a configuration that
    cannot start (TLS files that do not load, see raftsched.tls), and
    NodeRefused once it has stopped because the cluster refused it."""
    config.validate()
    # A shard process serves its node process on a Unix socket, without TLS.
    server_ssl = None if config.shard else tls.server_context(config)
    tls.peer_context(config)  # its files load, or the node does not start
    name = f"{config.node_id}/s{config.shard}" if config.shard else config.node_id
    configure_logging(config.log_format, node_id=name)
    try:
        tracing.configure("raftsched-node", otlp_endpoint=config.otlp_endpoint, instance_id=name)
    except tracing.TracingConfigError as error:
        raise ConfigError(str(error)) from None
    prepare_data_dir(config.data_dir)
    if not config.shard:
        try:
            settle_shards(config.data_dir, config.shards, durable=config.durability == "fsync")
        except ShardCountMismatch as error:
            raise ConfigError(str(error)) from None
    try:
        asyncio.run(_serve(config, server_ssl))
    finally:
        tracing.shutdown()  # the spans still buffered go out


def prepare_data_dir(data_dir: Path) -> None:
    """Create the data directory for the node's user only (0700, as etcd
    does): it holds every payload, result and token hash. One made by an
    operator is left as it is, with a warning if others may read it."""
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        data_dir.mkdir(mode=0o700)
    except FileExistsError:
        mode = stat.S_IMODE(data_dir.stat().st_mode)
        if mode & 0o077:
            log.warning(
                "data directory %s has mode %o: other users may read the jobs and tokens "
                "in it; chmod 700 it",
                data_dir,
                mode,
            )


def assemble(
    config: NodeConfig,
    loop: asyncio.AbstractEventLoop,
    shard_processes: ShardProcesses | None = None,
) -> tuple[Node, web.Application]:
    """The node with its leader duties and its HTTP application, not started.
    A node of several shards routes requests to its `shard_processes`; a
    shard process (`config.shard` > 0) takes the principal its node sends."""
    # Imported only now, once logging is configured: api.unsafe logs its
    # warning when it is imported.
    from raftsched.api.app import create_app
    from raftsched.api.shard_routing import ShardRouter

    node = Node(config, loop)
    policy = config.webhook_policy()
    # Every group's leader delivers its own outbox; in a sharded cluster an
    # event's id and envelope name the shard (docs/shards.md).
    shard = config.shard if config.shards > 1 else None
    delivery = WebhookDelivery(node, policy=policy, shard=shard)
    node.add_leader_duty(delivery)
    router = None
    if shard_processes is not None:
        # Settings, subscriptions and quotas in every shard (node.shard_settings).
        duty = ShardSettings(node, config.shards, config.data_dir, internal_key(config.secret))
        router = ShardRouter(
            node,
            config.shards,
            config.data_dir,
            pid_of=shard_processes.pid,
            peer_ssl=tls.peer_context(config),
            stride=config.shard_port_stride,
        )
    app = create_app(
        node,
        max_body_bytes=config.max_body_bytes,
        webhook_targets=policy,
        auth_failures_per_minute=config.auth_failures_per_minute,
        traced=tracing.enabled(),
        shard_router=router,
        shard_process=config.shard > 0,
        internal_key=internal_key(config.secret) if config.shard > 0 else None,
        relay_status=delivery.status,
    )
    if shard_processes is not None:
        app.on_startup.append(lambda _: _started(duty))
        app.on_cleanup.append(lambda _: duty.close())
    return node, app


async def _started(duty: ShardSettings) -> None:
    duty.start()


async def _serve(config: NodeConfig, server_ssl: ssl.SSLContext | None) -> None:
    gc_tuning.configure()
    loop = asyncio.get_running_loop()
    children = ShardProcesses(config) if config.shards > 1 and not config.shard else None
    node, app = assemble(config, loop, children)
    node.start()
    if children is not None:
        children.start(loop)
    options: dict[str, Any] = {}
    if config.shard:
        # The principal a node sends its shard process names up to 100
        # tenants and 100 queues: more than aiohttp's 8 KiB a header.
        options["max_field_size"] = INTERNAL_HEADER_BYTES_MAX
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        logger=ClientFaultsAsWarnings(server_log),
        **options,
    )
    await runner.setup()
    site: web.BaseSite
    if config.shard:
        path = config.data_dir / SOCKET_NAME
        site = web.UnixSite(runner, str(path))
        await site.start()
        os.chmod(path, 0o600)  # its node process's user only (the directory is 0700 too)
        where = str(path)
    else:
        site = web.TCPSite(
            runner, config.http_host, config.http_port, reuse_address=True, ssl_context=server_ssl
        )
        await site.start()
        where = config.advertised_http_url
    log.info(
        "shard process started" if config.shard else "node started",
        extra={
            "http": where,
            "raft": config.raft_address,
            "tls": "mutual" if config.tls_client_ca_file else "on" if server_ssl else "off",
            **({"shards": config.shards} if config.shards > 1 else {}),
        },
    )
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    gc_task = loop.create_task(gc_tuning.freeze_periodically())
    refused = loop.create_task(node.refused_event.wait())
    try:
        await asyncio.wait(
            [loop.create_task(stop.wait()), refused], return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        gc_task.cancel()
        refused.cancel()
        log.info("node stopping")
        await runner.cleanup()
        if children is not None:
            await children.stop()
        await node.close()
    if node.refused is not None:
        raise NodeRefused(node.refused.exit_status, node.refused.message)
