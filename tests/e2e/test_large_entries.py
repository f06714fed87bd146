"""Batches of 1,000 jobs of about 1 KB each: Raft entries of about a megabyte,
sent to the followers in 64 KiB parts, from several clients at once.

Before the adapter relabelled those parts (`raftsched.raft._TransmissionLabels`)
both followers logged `failed _onTick` with `pickle data was truncated` during
such a load. The autouse fixture fails the test on any error-level node log
line; the test also checks that the replicas converge.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from raftsched.testing import LocalCluster, http_json

pytestmark = pytest.mark.timeout(180)

BATCHES = 6
CONCURRENT_CLIENTS = 3
JOBS_PER_BATCH = 1000  # the API's maximum
PAYLOAD_CHARS = 900  # a batch stays under the 1 MiB request limit


def test_concurrent_megabyte_batches_replicate_without_errors(cluster: LocalCluster) -> None:
    rng = random.Random(5)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    bodies = [
        {
            "jobs": [
                {
                    "queue": "bulk",
                    "payload": {
                        "batch": batch,
                        "n": n,
                        "blob": "".join(rng.choices(alphabet, k=PAYLOAD_CHARS)),
                    },
                }
                for n in range(JOBS_PER_BATCH)
            ]
        }
        for batch in range(BATCHES)
    ]
    leader_url = cluster.nodes[cluster.wait_for_leader()].http_url

    def submit(body: dict[str, object]) -> tuple[int, dict[str, object]]:
        status, answer, _ = http_json("POST", leader_url + "/v1/jobs/batch", body, timeout_s=60)
        return status, answer

    with ThreadPoolExecutor(CONCURRENT_CLIENTS) as pool:
        answers = list(pool.map(submit, bodies))
    for status, answer in answers:
        assert status == 200, answer
        results = answer["results"]
        assert isinstance(results, list) and len(results) == JOBS_PER_BATCH
        assert all("job" in result for result in results)

    cluster.wait_converged(timeout_s=60)
    digests = cluster.digests()
    assert len(digests) == 3 and len(set(digests.values())) == 1, digests
    errors = cluster.unexpected_log_errors()
    assert not errors, "\n".join(error.describe() for error in errors)
