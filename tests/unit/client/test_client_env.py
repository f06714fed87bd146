"""Where the clients and the worker connect without being told: `$RAFTSCHED_URL`
and `$RAFTSCHED_TOKEN`, the names the CLI reads; explicit arguments win, and
with no URLs anywhere the error says what to do."""

from __future__ import annotations

import asyncio

import pytest
from fakecluster import FakeCluster, Seen, dead_url, reply

from raftsched.client import AsyncClient, Client, resolve_urls
from raftsched.worker import WorkerConfig

JOB = {"id": "job_1", "status": "pending"}
SECRET = "rsk_" + "E" * 43


def answer_with_token(seen: Seen):  # type: ignore[no-untyped-def]
    return reply(200, {"job": {**JOB, "authorization": seen.headers.get("authorization")}})


def test_the_blocking_client_takes_urls_and_token_from_the_environment(
    cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second, _ = cluster.nodes
    second.script = answer_with_token
    # A comma-separated list, as for the CLI; the first node is down.
    down = dead_url()
    monkeypatch.setenv("RAFTSCHED_URL", f" {down}, {second.url} ")
    monkeypatch.setenv("RAFTSCHED_TOKEN", SECRET)
    with Client(timeout_s=2) as client:
        assert client.urls == [down, second.url]
        assert client.get_job("job_1")["authorization"] == f"Bearer {SECRET}"
    # Explicit arguments win over both variables.
    first.script = answer_with_token
    with Client([first.url], token="rsk_" + "F" * 43, timeout_s=2) as client:
        assert client.urls == [first.url]
        assert client.get_job("job_1")["authorization"] == "Bearer rsk_" + "F" * 43
    assert [seen.headers.get("authorization") for seen in second.seen] == [f"Bearer {SECRET}"]


def test_the_async_client_takes_urls_and_token_from_the_environment(
    cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second, _ = cluster.nodes
    first.script = answer_with_token
    second.script = answer_with_token
    monkeypatch.setenv("RAFTSCHED_URL", first.url)
    monkeypatch.setenv("RAFTSCHED_TOKEN", SECRET)

    async def scenario() -> tuple[object, object]:
        async with AsyncClient(timeout_s=2) as client:
            from_env = (await client.get_job("job_1"))["authorization"]
        async with AsyncClient(second.url, token="", timeout_s=2) as client:
            explicit = (await client.get_job("job_1"))["authorization"]
        return from_env, explicit

    assert asyncio.run(scenario()) == (f"Bearer {SECRET}", None)  # "": no token at all
    assert len(first.seen) == 1 and len(second.seen) == 1


@pytest.mark.parametrize("value", [None, "", "  "])
def test_without_urls_anywhere_the_error_names_both_ways(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("RAFTSCHED_URL", raising=False)
    else:
        monkeypatch.setenv("RAFTSCHED_URL", value)
    for make in (Client, AsyncClient, resolve_urls):
        with pytest.raises(ValueError, match=r"pass urls .* or set \$RAFTSCHED_URL"):
            make()
    with pytest.raises(ValueError, match=r"\$RAFTSCHED_URL"):
        WorkerConfig(queues=("q",)).validate()


def test_the_worker_config_takes_urls_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAFTSCHED_URL", "http://10.0.0.1:8080,http://10.0.0.2:8080")
    config = WorkerConfig(queues=("q",))
    config.validate()
    assert resolve_urls(config.urls) == ["http://10.0.0.1:8080", "http://10.0.0.2:8080"]
    # Given URLs win; malformed ones are refused wherever they come from.
    assert resolve_urls(WorkerConfig(["http://10.0.0.3:1"], ("q",)).urls) == ["http://10.0.0.3:1"]
    monkeypatch.setenv("RAFTSCHED_URL", "ftp://nope")
    with pytest.raises(ValueError, match="not an http"):
        WorkerConfig(queues=("q",)).validate()
