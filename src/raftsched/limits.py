"""The shell's limits: how much a client may ask for, and what a node holds for it.

Everything a request can make the node take on has a bound (style.md: put a
limit on everything), and the bounds the shell sets are all here: request
bodies and batches, list pages, long-poll waits, durations, texts, the
proposer's queue and the metric series that client-chosen names create.
openapi.json states the request limits; tests/unit/test_openapi.py checks
that they agree.

The core's own limits (name and key lengths, labels, claim and batch sizes,
lease bounds, priorities) stay in `core/validate.py` and beside the features
that own them; `api/validation.py` re-imports them under the names requests
use, so that a request the API accepts is never rejected by the core after a
Raft round trip. This module imports nothing, so the CLI can read it without
loading the core.

What bounds the node's own work rather than a client's (Tick sizes, entry
sizes, webhook batches, the observer's memory) stays next to the code whose
pace it sets: node/service.py, node/proposer.py, node/webhooks.py,
node/observability.py.
"""

from __future__ import annotations

from typing import Final

DAY_S: Final = 86_400

# -- request bodies and batches ---------------------------------------------------

# A request body (NodeConfig.max_body_bytes, `max_body_bytes` in a node's
# config file); a larger one is answered 413 payload_too_large.
BODY_BYTES_MAX: Final = 1024 * 1024
# Operations in one POST /v1/leases/batch.
LEASE_BATCH_OPS_MAX: Final = 1000
# Schedules in one POST /v1/schedules/batch.
SCHEDULE_BATCH_MAX: Final = 1000
# Nesting of a JSON payload, result or progress value.
JSON_DEPTH_MAX: Final = 64

# -- reads ---------------------------------------------------------------------------

# `limit` of a page of jobs, workflows, schedules or occurrences.
LIST_LIMIT_MAX: Final = 1000
# `limit` of a page of outbox events.
EVENTS_LIMIT_MAX: Final = 1000
# `errors` of GET /v1/overview: recent errors shown (the observer keeps as many).
OVERVIEW_ERRORS_MAX: Final = 200
# How long a claim or an event read may long-poll.
WAIT_S_MAX: Final = 60.0

# -- durations and texts -------------------------------------------------------------

# A delay, deadline, workflow timeout, schedule interval, jitter or catch-up
# window: a year and a day.
DURATION_S_MAX: Final = 366 * DAY_S
# A backoff's initial delay or jitter.
BACKOFF_STEP_S_MAX: Final = DAY_S
# A backoff's maximum delay, or a failure's retry_after_s.
RETRY_DELAY_S_MAX: Final = 30 * DAY_S
# A failure's message is cut to this many characters.
MESSAGE_LENGTH_MAX: Final = 4096
# The reason given for a cancel or replay.
REASON_LENGTH_MAX: Final = 4096
# Raftsched-Actor, as job history and the audit log record it, is cut to this.
ACTOR_CHARS_MAX: Final = 200

# -- flow control settings -------------------------------------------------------------

RATE_PER_S_MIN: Final = 0.001  # one milli-claim per second, the core's unit
PROBE_S_MIN: Final = 0.001
PROBE_S_MAX: Final = float(DAY_S)

# -- what a node holds for its clients -------------------------------------------------

# The proposer's queue (node/proposer.py): commands waiting behind the Raft
# entry in flight. Four full entries' worth (an entry carries at most 4,000
# commands and 8 MiB of requests): sixteen 1,000-op lease batches, or 32
# max-size (1 MiB) submissions arriving at once, fit; beyond that a request is
# answered 503 unavailable with Retry-After rather than held in memory that
# would grow with the backlog. A request that finds the queue empty is always
# taken: one bigger than a (lowered) bound is refused only while others wait.
# A node's defaults; `--proposal-queue-commands-max` and `--proposal-queue-bytes-max`.
PROPOSAL_QUEUE_COMMANDS_MAX: Final = 16_000
PROPOSAL_QUEUE_BYTES_MAX: Final = 32 * 1024 * 1024
# Failed authentications one address may make within a minute before it is
# answered 429 rate_limited (api/auth.py); `--auth-failures-per-minute`.
AUTH_FAILURES_PER_MINUTE: Final = 10
# Metric label sets stay bounded: at most this many queues and tenants (the
# busiest by queued jobs) get series of their own; the rest are summed under
# "_other".
METRIC_SERIES_MAX: Final = 100
# Schedules with per-schedule metric series (the first by id).
METRIC_SCHEDULES_MAX: Final = 100
