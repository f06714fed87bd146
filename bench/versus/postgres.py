"""The Postgres side: its two configurations and the queue's SQL.

"pg_quorum" is a primary with two streaming standbys, s1 and s2, and
`synchronous_standby_names = 'ANY 1 (s1, s2)'` with `synchronous_commit =
on`: a commit returns once it is flushed on the primary and on at least one
standby, two disks of three, which is what a raftsched majority gives.
"pg_single" is one node. Both have `fsync = on` (and full page writes).

Each server runs as the `postgres` user (initdb refuses root) in the
foreground as a child of the benchmark, on its own loopback port, with its
data directory under the benchmark's directory. The kernel sends it SIGQUIT
(immediate shutdown) if the benchmark dies without stopping it.

The queue is one table and the SQL an ordinary Postgres queue would use:
the claim is one statement, a CTE that picks the oldest due pending rows
`FOR UPDATE SKIP LOCKED` through an index of the claimable rows (partial by
default) and an UPDATE ... RETURNING that leases them; the completion is one
UPDATE fenced by the attempt number (the lease's fencing token), and batches
use multi-row statements over arrays. Statements are prepared on first use
(psycopg `prepare=True`) unless the benchmark says otherwise.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# -- the queue's SQL ------------------------------------------------------------

SCHEMA = """
CREATE TABLE jobs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    status text NOT NULL DEFAULT 'pending',
    payload jsonb NOT NULL,
    run_at timestamptz NOT NULL DEFAULT now(),
    attempts integer NOT NULL DEFAULT 0,
    worker_id text,
    lease_expires_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    result jsonb
)
"""

# The index the claim walks: only the claimable rows ("partial"), or every
# row with the status as a leading key column ("full").
INDEXES = {
    "partial": "CREATE INDEX jobs_claimable ON jobs (queue, run_at, id) WHERE status = 'pending'",
    "full": "CREATE INDEX jobs_claimable ON jobs (queue, status, run_at, id)",
}

INSERT = "INSERT INTO jobs (queue, payload) VALUES (%s, %s) RETURNING id"
INSERT_AT = "INSERT INTO jobs (queue, payload, run_at) VALUES (%s, %s, %s) RETURNING id"
INSERT_MANY = (
    "INSERT INTO jobs (queue, payload) SELECT %s, p FROM unnest(%s::jsonb[]) AS p RETURNING id"
)
PRELOAD = "INSERT INTO jobs (queue, payload) SELECT %s, %s::jsonb FROM generate_series(1, %s)"

CLAIM = """
WITH picked AS (
    SELECT id FROM jobs
    WHERE status = 'pending' AND queue = %s AND run_at <= now()
    ORDER BY run_at, id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs SET status = 'running', attempts = jobs.attempts + 1, worker_id = %s,
    lease_expires_at = now() + interval '30 seconds'
FROM picked WHERE jobs.id = picked.id
RETURNING jobs.id, jobs.attempts, jobs.payload
"""

COMPLETE = """
UPDATE jobs SET status = 'succeeded', result = %s, finished_at = now(), lease_expires_at = NULL
WHERE id = %s AND attempts = %s AND status = 'running'
"""

COMPLETE_MANY = """
UPDATE jobs SET status = 'succeeded', result = %s, finished_at = now(), lease_expires_at = NULL
FROM unnest(%s::bigint[], %s::integer[]) AS done(id, attempts)
WHERE jobs.id = done.id AND jobs.attempts = done.attempts AND jobs.status = 'running'
"""

# -- servers --------------------------------------------------------------------

USER = "postgres"
PR_SET_PDEATHSIG = 1


def default_bin_dir() -> Path | None:
    """The newest /usr/lib/postgresql/<major>/bin (Debian's layout)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/postgres"),
        key=lambda path: int(Path(path).parts[-3]) if Path(path).parts[-3].isdigit() else 0,
    )
    return Path(found[-1]).parent if found else None


def _run_as_postgres() -> dict[str, Any]:
    """subprocess arguments that run a command as the postgres user when we
    are root (initdb and postgres refuse root), else as ourselves."""
    if os.geteuid() != 0:
        return {}
    entry = pwd.getpwnam(USER)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def give_to_postgres(path: Path) -> None:
    """Make `path` (a directory we created) the postgres user's, mode 0700."""
    path.chmod(0o700)
    if os.geteuid() == 0:
        entry = pwd.getpwnam(USER)
        os.chown(path, entry.pw_uid, entry.pw_gid)


def _die_with_us() -> Callable[[], None]:
    """preexec_fn: the kernel sends the server SIGQUIT (immediate shutdown)
    when the benchmark process dies. Run after the change of user, so it
    survives it; the benchmark starts servers from its only thread."""
    libc = ctypes.CDLL(None, use_errno=True)

    def set_death_signal() -> None:
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGQUIT), 0, 0, 0)

    return set_death_signal


class Server:
    """One Postgres server: its data directory, port and process."""

    def __init__(self, bin_dir: Path, home: Path, name: str, port: int) -> None:
        self.bin_dir = bin_dir
        self.home = home  # owned by postgres; holds the data dir, socket dir and log
        self.name = name
        self.port = port
        self.data_dir = home / name
        self.socket_dir = home / "sockets"
        self.log_path = home / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user={USER} dbname=postgres"

    def _run(self, *args: str) -> None:
        with self.log_path.open("ab") as log:
            subprocess.run(
                [str(self.bin_dir / args[0]), *args[1:]],
                check=True,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                timeout=300,
                **_run_as_postgres(),
            )

    def initdb(self) -> None:
        self._run(
            "initdb", "-D", str(self.data_dir), "-U", USER, "--auth=trust",
            "--encoding=UTF8", "--locale=C", "--no-instructions",
        )  # fmt: skip

    def base_backup(self, primary: Server) -> None:
        """A copy of the running primary that streams from it (standby.signal)."""
        self._run(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", USER,
            "-D", str(self.data_dir), "-R", "-X", "stream", "-c", "fast",
        )  # fmt: skip

    def configure(self, settings: dict[str, str]) -> None:
        """Append to postgresql.auto.conf (its last setting of a name wins)."""
        lines = [f"{name} = '{value}'" for name, value in settings.items()]
        with (self.data_dir / "postgresql.auto.conf").open("a") as handle:
            handle.write("\n# bench/versus_postgres.py\n" + "\n".join(lines) + "\n")

    def start(self) -> None:
        self.socket_dir.mkdir(exist_ok=True)
        give_to_postgres(self.socket_dir)
        log = self.log_path.open("ab")
        try:
            self.process = subprocess.Popen(
                [str(self.bin_dir / "postgres"), "-D", str(self.data_dir)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                preexec_fn=_die_with_us(),
                start_new_session=True,  # a Ctrl-C reaches us, and we stop it in order
                **_run_as_postgres(),
            )
        finally:
            log.close()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        import psycopg

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"postgres {self.name} exited; see {self.log_path}")
            try:
                with psycopg.connect(self.dsn, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                time.sleep(0.1)
        raise TimeoutError(f"postgres {self.name} not ready in {timeout_s}s; see {self.log_path}")

    def stop(self) -> None:
        """Fast shutdown (SIGINT), then immediate (SIGQUIT), then SIGKILL."""
        process, self.process = self.process, None
        if process is None:
            return
        for signum, wait_s in ((signal.SIGINT, 30), (signal.SIGQUIT, 10), (signal.SIGKILL, 10)):
            if process.poll() is not None:
                return
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(wait_s)


def server_settings(port: int, socket_dir: Path, quorum: bool) -> dict[str, str]:
    settings = {
        "listen_addresses": "127.0.0.1",
        "port": str(port),
        "unix_socket_directories": str(socket_dir),
        "fsync": "on",
        "synchronous_commit": "on",
        "full_page_writes": "on",
        "wal_level": "replica",
        "max_wal_senders": "10",
        "hot_standby": "on",
        # No checkpoint forced by WAL volume inside a phase (the default 1GB
        # is reached by a batched phase); time-based ones stay at 5 min.
        "max_wal_size": "4GB",
        "logging_collector": "off",
    }
    if quorum:
        settings["synchronous_standby_names"] = "ANY 1 (s1, s2)"
    return settings
