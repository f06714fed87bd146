"""Benchmark of backup and restore at a million jobs (not a test). Prints one
JSON object as its last line.

    .venv/bin/python bench/backup.py                 # 1,000,000 jobs
    .venv/bin/python bench/backup.py --jobs 50000

The state is built in this process the way bench/core.py builds it (SubmitJobs
entries of 1,000 jobs, ~200-byte payloads) into the node's own
`ReplicatedState`; then the real code paths run:

- backup: `node.backup.Backups.start` forks the writer exactly as
  `GET /v1/backup` does, and the parent copies the pipe to a file, as the
  HTTP handler copies it to the socket. backup_s is from the fork to the
  last byte; backup_child_peak_rss_bytes is the child's peak resident set
  (it shares the parent's pages copy-on-write, so most of it is not new
  memory); backup_child_private_dirty_bytes_max is what it had written or
  copied (Private_Dirty of /proc/PID/smaps_rollup, sampled every 32 MB
  sent): the memory the backup really adds. parent_rss_bytes is the
  node's own.
- restore: `raftsched restore FILE --data-dir DIR --id n1` in a new process
  (check the file whole, decode the state, write the snapshot and the
  identity, fsync): restore_s is its wall time, restore_peak_rss_bytes its
  peak resident set (from wait4).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from core import fill, rss_bytes  # noqa: E402  (bench/core.py)
from raftsched.node.backup import Backups  # noqa: E402
from raftsched.node.machine import ReplicatedState  # noqa: E402


def private_dirty_bytes(pid: int) -> int:
    """The pages a process has written (copied on write, or its own)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Private_Dirty:"):
            return int(line.split()[1]) * 1024
    return 0


async def take_backup(replica: ReplicatedState, out: Path) -> tuple[float, int, int]:
    started = time.perf_counter()
    stream = await Backups(replica, "n1").start()
    written = private_max = 0
    try:
        with open(out, "wb") as handle:
            handle.write(stream.head)
            async for chunk in stream.chunks():
                handle.write(chunk)
                written += len(chunk)
                if written % (32 << 20) < len(chunk):
                    private_max = max(private_max, private_dirty_bytes(stream._pid))
    finally:
        await stream.close()
    return time.perf_counter() - started, len(stream.head) + written, private_max


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1_000_000)
    args = parser.parse_args()
    replica = ReplicatedState(on_applied=lambda: None)
    started = time.perf_counter()
    fill(replica.state, args.jobs, 0, None, "bulk")
    fill_s = time.perf_counter() - started
    print(f"filled {args.jobs} jobs in {fill_s:.1f} s", file=sys.stderr)
    parent_rss = rss_bytes()
    with tempfile.TemporaryDirectory(prefix="raftsched-bench-backup-") as scratch:
        backup_file = Path(scratch) / "state.backup"
        backup_s, backup_bytes, private_max = asyncio.run(take_backup(replica, backup_file))
        child_peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        print(f"backup: {backup_bytes} bytes in {backup_s:.1f} s", file=sys.stderr)
        del replica
        data_dir = Path(scratch) / "restored"
        command = [sys.executable, "-m", "raftsched", "restore", str(backup_file)]
        command += ["--data-dir", str(data_dir), "--id", "n1"]
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        _, status, usage = os.wait4(process.pid, 0)
        restore_s = time.perf_counter() - started
        assert process.stdout is not None
        restored = json.loads(process.stdout.read())
        assert os.waitstatus_to_exitcode(status) == 0, status
        assert restored["jobs"] == args.jobs, restored
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "fill_s": round(fill_s, 2),
                "parent_rss_bytes": parent_rss,
                "backup_bytes": backup_bytes,
                "backup_s": round(backup_s, 2),
                "backup_child_peak_rss_bytes": child_peak_kib * 1024,
                "backup_child_private_dirty_bytes_max": private_max,
                "restore_s": round(restore_s, 2),
                "restore_peak_rss_bytes": usage.ru_maxrss * 1024,
                "digest": restored["digest"],
            }
        )
    )


if __name__ == "__main__":
    main()
