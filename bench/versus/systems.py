"""The three systems under test behind one interface.

Each is set up fresh for its turn in a round and stopped at the end of it
(the benchmark then removes its directory), so that no idle system runs
beside the one being measured and every round starts from the same state.

- `roles()`: the server processes by role, for the CPU figures;
- `target()`: what a load process needs to reach the system;
- `settle()`: wait until every replica has applied what the primary or
  leader has (after a preload, before a measured phase);
- `before_phase()`: upkeep between phases that a real operator would have
  (Postgres: VACUUM ANALYZE of the queue table), outside the measurement.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any, Protocol

from cluster import settle as settle_replicas  # bench/cluster.py

from raftsched.testing import LocalCluster, free_port
from versus import postgres


class System(Protocol):
    name: str

    def start(self) -> None: ...
    def roles(self) -> dict[str, list[int]]: ...
    def target(self) -> dict[str, Any]: ...
    def settle(self) -> float: ...
    def before_phase(self) -> None: ...
    def notes(self) -> dict[str, Any]: ...
    def stop(self) -> None: ...


class RaftschedSystem:
    """A 3-node cluster, `LocalCluster(durability="fsync")` as bench/cluster.py."""

    name = "raftsched"

    def __init__(self, home: Path, src: Path | None) -> None:
        self.home = home
        self.env = {"PYTHONPATH": str(src.resolve())} if src else {}
        self.cluster: LocalCluster | None = None
        self.leader = ""

    def start(self) -> None:
        self.cluster = LocalCluster(self.home, size=3, durability="fsync", env=self.env)
        # The load processes carry it ($RAFTSCHED_TOKEN is the client's default).
        os.environ["RAFTSCHED_TOKEN"] = self.cluster.admin_token
        self.cluster.start()
        self.leader = self.cluster.wait_for_leader(timeout_s=60)
        time.sleep(1.0)  # let the take-over settle

    def _cluster(self) -> LocalCluster:
        if self.cluster is None:
            raise RuntimeError("raftsched is not started")
        return self.cluster

    def roles(self) -> dict[str, list[int]]:
        pids = {}
        for node_id, node in self._cluster().nodes.items():
            if node.process is None:
                raise RuntimeError(f"node {node_id} has no process")
            pids[node_id] = node.process.pid
        return {
            "leader": [pids[self.leader]],
            "followers": [pid for node_id, pid in sorted(pids.items()) if node_id != self.leader],
        }

    def target(self) -> dict[str, Any]:
        nodes = self._cluster().nodes
        urls = [nodes[self.leader].http_url]
        urls += [node.http_url for node_id, node in sorted(nodes.items()) if node_id != self.leader]
        return {"system": "raftsched", "urls": urls, "pythonpath": self.env.get("PYTHONPATH")}

    def settle(self) -> float:
        return asyncio.run(settle_replicas(self._cluster().urls))

    def before_phase(self) -> None:
        pass

    def notes(self) -> dict[str, Any]:
        """Whether the leader the figures were attributed to is still it."""
        now = self._cluster().leader_id()
        return {"leader": self.leader, "leader_changed": now != self.leader}

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        self.cluster = None


class PostgresSystem:
    """pg_quorum (a primary and two quorum-synchronous standbys) or pg_single."""

    def __init__(self, name: str, home: Path, bin_dir: Path, index: str) -> None:
        self.name = name
        self.home = home
        self.bin_dir = bin_dir
        self.index = index
        self.standby_count = 2 if name == "pg_quorum" else 0
        self.primary: postgres.Server | None = None
        self.standbys: list[postgres.Server] = []

    def _primary(self) -> postgres.Server:
        if self.primary is None:
            raise RuntimeError(f"{self.name} is not started")
        return self.primary

    def start(self) -> None:
        self.home.mkdir(parents=True)
        postgres.give_to_postgres(self.home)
        quorum = self.standby_count > 0
        primary = self.primary = postgres.Server(self.bin_dir, self.home, "primary", free_port())
        primary.initdb()
        primary.configure(postgres.server_settings(primary.port, primary.socket_dir, quorum))
        primary.start()
        primary.wait_ready()
        for number in range(1, self.standby_count + 1):
            standby = postgres.Server(self.bin_dir, self.home, f"s{number}", free_port())
            self.standbys.append(standby)
            standby.base_backup(primary)
            settings = postgres.server_settings(standby.port, standby.socket_dir, quorum)
            settings["primary_conninfo"] = (
                f"host=127.0.0.1 port={primary.port} user={postgres.USER} "
                f"application_name={standby.name}"
            )
            standby.configure(settings)
            standby.start()
            standby.wait_ready()
        self._wait_for_quorum()
        with self._admin() as conn:
            conn.execute(postgres.SCHEMA)
            conn.execute(postgres.INDEXES[self.index])

    def _admin(self) -> Any:
        import psycopg

        return psycopg.connect(self._primary().dsn, autocommit=True)

    def _wait_for_quorum(self, timeout_s: float = 60.0) -> None:
        """Both standbys stream and count for the quorum."""
        if not self.standby_count:
            return
        deadline = time.monotonic() + timeout_s
        with self._admin() as conn:
            while time.monotonic() < deadline:
                rows = conn.execute(
                    "SELECT application_name FROM pg_stat_replication "
                    "WHERE state = 'streaming' AND sync_state = 'quorum'"
                ).fetchall()
                if len(rows) == self.standby_count:
                    return
                time.sleep(0.1)
        raise TimeoutError(f"{self.name}: standbys not streaming in quorum in {timeout_s}s")

    def roles(self) -> dict[str, list[int]]:
        servers = [self._primary(), *self.standbys]
        if any(server.process is None for server in servers):
            raise RuntimeError(f"{self.name}: a server has no process")
        roles = {"primary": [self._primary().process.pid]}  # type: ignore[union-attr]
        if self.standbys:
            roles["standbys"] = [s.process.pid for s in self.standbys]  # type: ignore[union-attr]
        return roles

    def target(self) -> dict[str, Any]:
        return {"system": "postgres", "dsn": self._primary().dsn}

    def settle(self) -> float:
        """Wait until every standby has replayed the primary's WAL so far."""
        started = time.monotonic()
        if self.standby_count:
            with self._admin() as conn:
                lsn = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
                while time.monotonic() - started < 60:
                    caught_up = conn.execute(
                        "SELECT count(*) FROM pg_stat_replication WHERE replay_lsn >= %s::pg_lsn",
                        (lsn,),
                    ).fetchone()[0]
                    if caught_up == self.standby_count:
                        break
                    time.sleep(0.05)
        return round(time.monotonic() - started, 2)

    def before_phase(self) -> None:
        with self._admin() as conn:
            conn.execute("VACUUM ANALYZE jobs")
        self.settle()

    def notes(self) -> dict[str, Any]:
        return {}

    def stop(self) -> None:
        for server in [*self.standbys, *([self.primary] if self.primary else [])]:
            with contextlib.suppress(Exception):
                server.stop()
        self.primary, self.standbys = None, []
