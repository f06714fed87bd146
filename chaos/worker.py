"""A lean worker process (`python -m chaos.worker ...`), one per worker id.

A custom loop rather than raftsched.worker, so that every API call is an
operation in the history. Per lease: start; ask the effects ledger; if the
effect is not recorded, do the side effect in the fenced sink and record it in
the ledger; heartbeat; complete. A `lease_lost` anywhere abandons the job.
With probability `--stall-p` the worker sleeps past its lease after the claim
(a stall, like a GC pause); the nemesis also SIGSTOPs whole worker processes.

Jobs whose payload says `"fail": true` (a workflow step that fails on purpose,
chaos/features.py) are failed permanently after `start`, without an effect:
they dead-letter, and their workflow compensates. Every other job -- plain,
schedule occurrence, workflow step or compensation -- is run the same way.

Payments (chaos/payments.py) charge the fake provider instead of writing to
the sink: start; ask the ledger; heartbeat, and charge only if that
heartbeat was answered less than half a lease ago (a call must not start on
a lease close to expiry: docs/reconciliation.md, "What reconciliation cannot
do"); then, after the payment's first charge, the crash window the payment
asks for (`kill`: SIGKILL itself, noted first; `stall`: sleep past the
lease); record the charge in the ledger; complete. A reconciliation lease
(`"reconcile"` in the lease) asks the provider what happened to the payment
and answers `happened` (recording the charge as the effect, under the
reconciliation's token), `did_not_happen`, or `cannot_tell` when the
provider's lookup does not answer.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

from chaos.history import Recorder
from chaos.httpops import Outcome, Session, recorded_call, send
from chaos.payments import PAYMENTS_QUEUE
from chaos.provider import CHARGE_PREFIX, LOOKUP_PREFIX
from raftsched.child_processes import die_with_parent
from raftsched.shards import SHARD_HEADER

QUEUE = "chaos"
FAIL_ON_PURPOSE = {"kind": "permanent", "message": "chaos: this step fails on purpose"}
PROVIDER_TIMEOUT_S = 3.0


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.id = args.id
        self.lease_s = args.lease_s
        self.stall_p = args.stall_p
        self.sink_url = args.sink
        self.provider_url = args.provider
        self.rng = random.Random(args.seed)
        urls = args.urls.split(",")
        self.session = Session(urls, self.rng)
        # A sharded cluster (docs/shards.md section 4): claims go to each
        # shard in turn with `Raftsched-Shard: k`, and a lease's operations
        # and effects to the shard it was leased from (a job a schedule of
        # shard k fired has a `job_` id: its id does not name its shard).
        self.shards = int(args.shards)
        self.sessions = (
            [Session(urls, self.rng, {SHARD_HEADER: str(k)}) for k in range(self.shards)]
            if self.shards > 1
            else [self.session]
        )
        self.next_shard = self.rng.randrange(self.shards) if self.shards > 1 else 0
        self.history = Recorder(Path(args.history), self.id)
        self.running = True

    def op(self, f: str, method: str, path: str, body: Any, **kw: Any) -> Outcome:
        return recorded_call(self.history, self.session, f, method, path, body, **kw)

    def run(self) -> None:
        while self.running:
            claim = {"worker_id": self.id, "queues": [QUEUE, PAYMENTS_QUEUE], "max_jobs": 1}
            # Sharded: a shorter long-poll, since the shards are polled in turn.
            claim |= {"wait_s": 2 if self.shards == 1 else 1, "lease_s": self.lease_s}
            self.session = self.sessions[self.next_shard]
            outcome = self.op("claim", "POST", "/v1/leases", claim, idempotent=False)
            leases = outcome.body.get("leases", []) if outcome.kind == "ok" else []
            if not leases:
                # Sharded: the next shard once this one has nothing (or
                # failed); one that granted is asked again, so that a
                # shard's backlog drains as fast as one shard's would.
                self.next_shard = (self.next_shard + 1) % self.shards
            if outcome.kind != "ok":
                time.sleep(0.2)
                continue
            for lease in leases:
                self.work(lease)

    def work(self, lease: dict[str, Any]) -> None:
        job_id, token = lease["job_id"], lease["fencing_token"]
        base = f"/v1/leases/{job_id}"
        if self.rng.random() < self.stall_p:
            # Just past the lease: the job has usually been re-granted and the
            # successor is still at work when this worker wakes up.
            stall_s = self.rng.uniform(self.lease_s + 0.5, self.lease_s * 2 + 1)
            self.history.note("stall", {"job_id": job_id, "token": token, "s": stall_s})
            time.sleep(stall_s)
        if lease.get("reconcile") is not None:
            self.reconcile(lease)
            return
        fenced = {"fencing_token": token}
        if not self.ok(self.op("start", "POST", base + "/start", fenced, idempotent=True)):
            return
        if (lease.get("payload") or {}).get("fail") is True:
            failure = {"fencing_token": token, "error": FAIL_ON_PURPOSE}
            self.op("fail", "POST", base + "/fail", failure, idempotent=True)
            return
        if lease.get("queue") == PAYMENTS_QUEUE:
            self.pay(lease)
            return
        key = f"effect:{job_id}"
        found = self.op("effect_get", "GET", f"/v1/effects/{key}", None, idempotent=True)
        if found.kind == "fail" and found.status == 404:
            if not self.sink_write(job_id, token):
                return
            record = {"key": key, "job_id": job_id, "fencing_token": token}
            record["result"] = {"worker_id": self.id, "token": token}
            if not self.ok(self.op("effect", "POST", "/v1/effects", record, idempotent=True)):
                return
        elif found.kind != "ok":
            return
        time.sleep(self.rng.uniform(0.0, 0.3))
        beat = {"fencing_token": token, "extend_s": self.lease_s}
        if not self.ok(self.op("heartbeat", "POST", base + "/heartbeat", beat, idempotent=True)):
            return
        done = {"fencing_token": token, "result": {"worker_id": self.id, "token": token}}
        self.op("complete", "POST", base + "/complete", done, idempotent=True)

    def sink_write(self, job_id: str, token: int) -> bool:
        body = {"job_id": job_id, "fencing_token": token, "worker_id": self.id}
        op_id = self.history.invoke("sink", body)
        try:
            status, answer, _ = send("POST", self.sink_url + "/write", body, 3.0)
        except Exception as error:  # the sink is local; treat anything as unknown
            self.history.complete(op_id, "info", "sink", {"error": str(error)})
            return False
        kind = "ok" if status == 200 else "fail"
        self.history.complete(op_id, kind, "sink", {"status": status, "body": answer})
        return status == 200

    # -- payments (chaos/payments.py) ---------------------------------------------

    def pay(self, lease: dict[str, Any]) -> None:
        """Charge once per attempt, unless the ledger already has the charge."""
        job_id, token = lease["job_id"], lease["fencing_token"]
        payment = str((lease.get("payload") or {}).get("payment"))
        base = f"/v1/leases/{job_id}"
        key = f"effect:{job_id}"
        result: dict[str, Any] = {"worker_id": self.id, "token": token}
        found = self.op("effect_get", "GET", f"/v1/effects/{key}", None, idempotent=True)
        if found.kind == "fail" and found.status == 404:
            if not self.lease_fresh(base, token):
                return
            charged = self.provider("charge", "POST", CHARGE_PREFIX + payment, job_id, token)
            if charged is None or "charge" not in charged:
                return  # unknown: the lease expires after start, the outcome is unknown
            self.crash_window(lease, payment, charged)
            result["charge"] = charged["charge"]
            record = {"key": key, "job_id": job_id, "fencing_token": token, "result": result}
            if not self.ok(self.op("effect", "POST", "/v1/effects", record, idempotent=True)):
                return
        elif found.kind != "ok":
            return
        done = {"fencing_token": token, "result": result}
        self.op("complete", "POST", base + "/complete", done, idempotent=True)

    def lease_fresh(self, base: str, token: int) -> bool:
        """A heartbeat answered within half a lease: only then may a provider
        call start (a worker paused after this can still charge late; the
        window is the time between here and the provider's socket)."""
        asked = time.monotonic()
        beat = {"fencing_token": token, "extend_s": self.lease_s}
        if not self.ok(self.op("heartbeat", "POST", base + "/heartbeat", beat, idempotent=True)):
            return False
        if time.monotonic() - asked > self.lease_s / 2:
            self.history.note("charge_not_started", {"token": token, "reason": "late heartbeat"})
            return False
        return True

    def crash_window(self, lease: dict[str, Any], payment: str, charged: dict[str, Any]) -> None:
        """After the payment's first charge, what its payload asks for."""
        how = (lease.get("payload") or {}).get("crash_window")
        if how not in ("kill", "stall") or charged.get("number") != 1:
            return
        token = lease["fencing_token"]
        self.history.note(
            "crash_window",
            {"how": how, "job_id": lease["job_id"], "payment": payment, "token": token},
        )
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)  # the harness restarts this worker
        time.sleep(self.rng.uniform(self.lease_s * 2 + 0.5, self.lease_s * 2 + 1.5))

    def reconcile(self, lease: dict[str, Any]) -> None:
        """Ask the provider what happened to the payment, and say so."""
        job_id, token = lease["job_id"], lease["fencing_token"]
        payment = (lease.get("payload") or {}).get("payment")
        decision: dict[str, Any] = {"fencing_token": token}
        if not isinstance(payment, str):
            decision |= {"decision": "cannot_tell", "reason": "not a payment"}
        else:
            found = self.provider("provider_lookup", "GET", LOOKUP_PREFIX + payment, job_id, token)
            decision |= self.decide(job_id, token, payment, found)
        path = f"/v1/leases/{job_id}/reconcile"
        self.op("reconcile", "POST", path, decision, idempotent=True)

    def decide(
        self, job_id: str, token: int, payment: str, found: dict[str, Any] | None
    ) -> dict[str, Any]:
        if found is None or not isinstance(found.get("charges"), list):
            return {"decision": "cannot_tell", "reason": f"provider lookup failed: {found}"}
        charges = found["charges"]
        if not charges:
            return {"decision": "did_not_happen", "reason": f"the provider lists no {payment}"}
        result = {"worker_id": self.id, "token": token, "charge": charges[0]}
        return {
            "decision": "happened",
            "result": result,
            "effects": [{"key": f"effect:{job_id}", "result": result}],
            "reason": f"the provider lists {', '.join(charges)}",
        }

    def provider(
        self, f: str, method: str, path: str, job_id: str, token: int
    ) -> dict[str, Any] | None:
        """One provider call, recorded; its answer, or None when it was not
        a 200 (for a charge, a lost answer means an unknown outcome)."""
        body = {"job_id": job_id, "fencing_token": token, "worker_id": self.id}
        op_id = self.history.invoke(f, {"path": path, "body": body})
        try:
            status, answer, _ = send(method, self.provider_url + path, body, PROVIDER_TIMEOUT_S)
        except Exception as error:  # local, like the sink: anything is unknown
            self.history.complete(op_id, "info", f, {"error": str(error)})
            return None
        kind = "ok" if status == 200 else "fail"
        self.history.complete(op_id, kind, f, {"status": status, "body": answer})
        return answer if status == 200 else {"status": status, **answer}

    @staticmethod
    def ok(outcome: Outcome) -> bool:
        return outcome.kind == "ok"


def main() -> int:
    die_with_parent()  # the harness may be SIGKILLed (raftsched.child_processes)
    parser = argparse.ArgumentParser(prog="chaos.worker")
    parser.add_argument("--id", required=True)
    parser.add_argument("--urls", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--provider", required=True, help="the fake payment provider's URL")
    parser.add_argument("--history", required=True)
    parser.add_argument("--lease-s", type=float, default=2.0)
    parser.add_argument("--stall-p", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shards", type=int, default=1)
    worker = Worker(parser.parse_args())

    def stop(*_: Any) -> None:
        worker.running = False

    signal.signal(signal.SIGTERM, stop)
    worker.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
