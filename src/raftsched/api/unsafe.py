"""NEGATIVE CONTROL for the chaos harness -- never enable in production.

With `RAFTSCHED_UNSAFE_IGNORE_FENCING=1` in a node's environment, the lease
and effect endpoints replace whatever fencing token a request carries with
the job's current token (read from this replica's state), so a worker that
was paused past its lease still gets its start, heartbeat, completion and
effect accepted. This deliberately breaks guarantee 3 (effectively-once
effects) so that `chaos/` can prove its checkers catch a stale lease winning
(docs/chaos.md). The switch needs the exact value "1" and logs a warning at
every start.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from raftsched import core
from raftsched.node.view import NodeView

ENV = "RAFTSCHED_UNSAFE_IGNORE_FENCING"
ENABLED = os.environ.get(ENV) == "1"

log = logging.getLogger("raftsched.api.unsafe")
if ENABLED:
    log.warning(
        "UNSAFE: %s=1 -- this node accepts stale fencing tokens; it is a negative "
        "control for the chaos harness and breaks effectively-once effects",
        ENV,
    )


def ignore_fencing(node: NodeView, job_id: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
    """The request body, with its token replaced by the job's current one when
    the switch is on (otherwise `body` unchanged)."""
    if not ENABLED or "fencing_token" not in body:
        return body
    with node.reading() as state:
        job = core.get_job(state, job_id)
        if job is None:
            return body
        if job.lease is not None:
            current = job.lease.fencing_token
        elif job.attempts:
            current = job.attempts[-1].fencing_token
        else:
            return body
    return {**body, "fencing_token": current}
