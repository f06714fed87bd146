"""What HTTP alone costs on this machine: the floor under bench/cluster.py (not a test).

A trivial aiohttp server (one POST route that parses a submit-sized JSON body
and answers a small JSON object, no Raft, no state) in a child process,
driven by the same aiohttp client bench/cluster.py uses, 64 requests in
flight. It measures the CPU time each side spends per request and derives
what that alone allows here:

- server_cpu_us_per_request, client_cpu_us_per_request: user + system CPU.
- requests_per_s: what the pair sustained.
- single_jobs_per_s_ceiling: the cluster benchmark's one-job-per-request
  pipeline is 4 requests per job (submit, claim, start, complete). With
  every core of the machine doing nothing but this trivial HTTP, jobs/s
  cannot exceed cores * 1e6 / (4 * (server + client) us). The real leader
  does Raft, fsync and the job logic on top, and two followers apply every
  command on the same cores, so the real figure is lower still.

    .venv/bin/python bench/http_floor.py
    .venv/bin/python bench/http_floor.py --requests 50000

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web

BODY = json.dumps(
    {"queue": "floor", "payload": {"order": "ord_000000000001", "amount": 1200, "currency": "EUR"}}
).encode()
REQUESTS_IN_FLIGHT = 64
WARM_UP_REQUESTS = 500


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serve(port: int) -> None:
    async def submit(request: web.Request) -> web.Response:
        body = await request.json()
        answer = {"job": {"id": "job_0", "queue": body["queue"], "status": "pending"}}
        return web.json_response(answer, status=201)

    app = web.Application(client_max_size=1 << 20)
    app.router.add_post("/v1/jobs", submit)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_until_listening(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return
    raise RuntimeError(f"the floor server did not listen on port {port}")


async def drive(port: int, server_pid: int, requests: int) -> dict[str, float]:
    await wait_until_listening(port)
    url = f"http://127.0.0.1:{port}/v1/jobs"
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=REQUESTS_IN_FLIGHT)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            async with session.post(url, data=BODY, headers=headers) as response:
                await response.read()
                if response.status != 201:
                    raise RuntimeError(f"unexpected status {response.status}")

        for _ in range(WARM_UP_REQUESTS):
            await one()
        left = requests

        async def sender() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await one()

        server_before, client_before = cpu_s(server_pid), time.process_time()
        started = time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(REQUESTS_IN_FLIGHT)))
        elapsed = time.perf_counter() - started
        server_cpu = cpu_s(server_pid) - server_before
        client_cpu = time.process_time() - client_before
    cores = os.cpu_count() or 1
    per_request_us = (server_cpu + client_cpu) / requests * 1e6
    return {
        "cpus": cores,
        "requests": requests,
        "requests_per_s": round(requests / elapsed),
        "server_cpu_us_per_request": round(server_cpu / requests * 1e6, 1),
        "client_cpu_us_per_request": round(client_cpu / requests * 1e6, 1),
        "single_jobs_per_s_ceiling": round(cores * 1e6 / (4 * per_request_us)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=20_000)
    args = parser.parse_args()
    port = free_port()
    server = multiprocessing.Process(target=serve, args=(port,), daemon=True)
    server.start()
    try:
        assert server.pid is not None
        result = asyncio.run(drive(port, server.pid, max(1, args.requests)))
    finally:
        server.terminate()
        server.join(5)
    print(json.dumps(result), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
