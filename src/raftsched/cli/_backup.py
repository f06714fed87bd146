"""`raftsched backup` and `raftsched restore` (docs/operations.md, 'Backup'
and 'Restore').

`backup --out FILE` streams `GET /v1/backup` from the cluster (the leader,
after a barrier; `--stale` from the first node that answers) into
`FILE.part`, checks it whole (`raftsched.backup.open_backup`) and only then
renames it to FILE, so FILE is always a complete backup. `restore FILE
--data-dir DIR --id ID [--cluster-id ID]` writes the data directory of one
node of a new cluster (`raftsched.restore`). Both print one JSON object.

Exit statuses: 0 done; 1 the cluster or the network failed; 2 bad usage;
65 (EX_DATAERR) the backup file is damaged; 73 (EX_CANTCREAT) restore
refused a data directory that is not empty.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Final
from urllib.parse import urljoin, urlsplit

from raftsched.cli._common import (
    EXIT_ERROR,
    EXIT_USAGE,
    tls_options,
    token_from,
    urls_from,
)

EXIT_DAMAGED_BACKUP: Final = 65
EXIT_NOT_EMPTY: Final = 73
_CHUNK_BYTES: Final = 1 << 20
_REDIRECTS_MAX: Final = 3


def register(commands: argparse._SubParsersAction[Any], common: argparse.ArgumentParser) -> None:
    backup = commands.add_parser(
        "backup", parents=[common], help="save the cluster's whole state to a file (admin)"
    )
    backup.add_argument("--out", type=Path, required=True, help="the backup file to write")
    backup.add_argument(
        "--stale",
        action="store_true",
        help="take it from the first node that answers, at its applied index, "
        "instead of from the leader after a barrier",
    )
    backup.set_defaults(run=run_backup)
    restore = commands.add_parser(
        "restore", help="seed one node of a new cluster from a backup file"
    )
    restore.add_argument("file", type=Path, help="a file written by `raftsched backup`")
    restore.add_argument("--data-dir", type=Path, required=True, help="an empty data directory")
    restore.add_argument("--id", dest="node_id", required=True, help="the node's id, e.g. n1")
    restore.add_argument(
        "--cluster-id",
        help="the new cluster's id, as the first node's restore printed it "
        "(default: a new cluster, for the first node)",
    )
    restore.add_argument(
        "--durability", choices=["fsync", "none"], default="fsync", help="fsync what is written"
    )
    restore.set_defaults(run=run_restore)


def run_backup(args: argparse.Namespace) -> int:
    from raftsched.backup import BackupError, OpenBackup, open_any, sharded_summary, summary
    from raftsched.client import client_ssl_context

    started = time.monotonic()
    partial = args.out.with_name(args.out.name + ".part")
    try:
        context = client_ssl_context(**tls_options(args))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    query = "?consistency=stale" if args.stale else ""
    errors = []
    for base in urls_from(args):
        try:
            _download(base + "/v1/backup" + query, token_from(args), context, partial, args)
            break
        except (OSError, http.client.HTTPException, _HttpError) as error:
            errors.append(f"{base}: {error}")
    else:
        with contextlib.suppress(OSError):
            partial.unlink()
        print("error: no node gave a backup: " + "; ".join(errors), file=sys.stderr)
        return EXIT_ERROR
    try:
        with open_any(partial) as backup:
            if isinstance(backup, OpenBackup):
                described = summary(backup.header)
            else:  # a cluster of several shards: every group's part
                described = sharded_summary(backup.header)
    except BackupError as error:
        print(f"error: the backup received is damaged: {error}", file=sys.stderr)
        return EXIT_DAMAGED_BACKUP
    os.replace(partial, args.out)
    print(json.dumps({"file": str(args.out), **described, "seconds": _since(started)}))
    return 0


class _HttpError(Exception):
    pass


def _download(url: str, token: str, context: Any, partial: Path, args: argparse.Namespace) -> None:
    for _ in range(_REDIRECTS_MAX + 1):
        parts = urlsplit(url)
        if parts.scheme == "https":
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                parts.netloc, timeout=args.timeout_s, context=context
            )
        else:
            connection = http.client.HTTPConnection(parts.netloc, timeout=args.timeout_s)
        try:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            path = parts.path + (f"?{parts.query}" if parts.query else "")
            connection.request("GET", path, headers=headers)
            response = connection.getresponse()
            if response.status in (301, 302, 303, 307, 308):
                url = urljoin(url, response.getheader("Location") or "")
                continue
            if response.status != 200:
                raise _HttpError(
                    f"{response.status} {response.read(2048).decode(errors='replace')}"
                )
            expected = int(response.getheader("Content-Length") or -1)
            written = 0
            with open(partial, "wb") as handle:
                while chunk := response.read(_CHUNK_BYTES):
                    handle.write(chunk)
                    written += len(chunk)
                handle.flush()
                os.fsync(handle.fileno())
            if written != expected:
                raise _HttpError(f"the transfer stopped after {written} of {expected} bytes")
            return
        finally:
            connection.close()
    raise _HttpError("too many redirects")


def run_restore(args: argparse.Namespace) -> int:
    from raftsched.backup import BackupError
    from raftsched.restore import RestoreRefused, restore

    try:
        restored = restore(
            args.file,
            args.data_dir,
            args.node_id,
            args.cluster_id,
            durable=args.durability == "fsync",
        )
    except BackupError as error:
        print(f"error: the backup is refused: {error}", file=sys.stderr)
        return EXIT_DAMAGED_BACKUP
    except RestoreRefused as error:
        print(f"error: restore refused: {error}", file=sys.stderr)
        return EXIT_NOT_EMPTY
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(json.dumps(restored.as_json()))
    return 0


def _since(started: float) -> float:
    return round(time.monotonic() - started, 3)
