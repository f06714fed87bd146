"""`python -m raftsched.shard_process`: one data shard's process (docs/shards.md).

Started by its node process (`raftsched.shard_processes`), never by hand. It
reads its configuration (`NodeConfig.for_shard`, as JSON) from its standard
input, then runs the same node code as the node process, in shard mode: a
member of shard k's Raft group whose data directory is `<data>/shards/<k>/`,
which draws `<prefix><k>_` identifiers and serves its HTTP API only on the
Unix socket in that directory, to its node process. It dies with its parent.
Its exit status is the node's (`raftsched node`): 2 for a configuration that
cannot start, 65 for a corrupt journal, 77 or 78 when its group refuses it.
"""

from __future__ import annotations

import json
import os
import sys

from raftsched import child_processes


def main() -> int:
    child_processes.die_with_parent()
    from raftsched.cli._common import EXIT_USAGE
    from raftsched.cli._node import run_config
    from raftsched.config import ConfigError, config_from_json

    try:
        document = json.loads(sys.stdin.buffer.read())
        config = config_from_json(document)
        config.validate()
    except (ValueError, TypeError, ConfigError) as error:
        print(f"error: shard process configuration: {error}", file=sys.stderr)
        return EXIT_USAGE
    if config.shard < 1:
        print("error: a shard process runs a shard of 1 or more", file=sys.stderr)
        return EXIT_USAGE
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return run_config(config)


if __name__ == "__main__":
    sys.exit(main())
