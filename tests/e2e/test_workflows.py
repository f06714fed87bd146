"""Workflows end to end: a payment saga on a real three-node cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from raftsched.client import Client
from raftsched.client._errors import ApiError as ClientApiError


def _run_one(
    client: Client, queue: str, result: Any = None, fail: str | None = None
) -> dict[str, Any]:
    (lease,) = client.claim("w1", [queue], wait_s=10, lease_s=30)
    client.start(lease["job_id"], lease["fencing_token"])
    if fail is None:
        client.complete(lease["job_id"], lease["fencing_token"], result)
    else:
        client.fail(lease["job_id"], lease["fencing_token"], kind="permanent", message=fail)
    return lease


PAYMENT = {
    "idempotency_key": "order:77",
    "tenant": "acme",
    "timeout_s": 600,
    "on_failure": "fail_fast",
    "steps": [
        {"name": "reserve", "queue": "inventory", "payload": {"sku": "A"},
         "compensation": {"queue": "inventory-undo", "payload": {"op": "release"}}},
        {"name": "charge", "queue": "payments", "payload": {"amount": 1200},
         "depends_on": ["reserve"],
         "compensation": {"queue": "payments-undo", "payload": {"op": "refund"}}},
        {"name": "ship", "queue": "shipping", "payload": {}, "depends_on": ["charge"]},
    ],
}  # fmt: skip


def test_charge_fails_permanently_and_compensations_run_in_reverse_with_inputs(
    client: Client,
) -> None:
    workflow = client.submit_workflow(PAYMENT)
    assert workflow["status"] == "running"
    assert workflow["steps"]["reserve"]["status"] == "active"
    assert workflow["steps"]["charge"]["status"] == "waiting"
    # The same key and request answers the same workflow.
    assert client.submit_workflow(PAYMENT)["id"] == workflow["id"]

    reserve = _run_one(client, "inventory", {"hold_id": "h1"})
    assert reserve["workflow_id"] == workflow["id"] and reserve["step"] == "reserve"
    (charge,) = client.claim("w1", ["payments"], wait_s=10)
    assert charge["inputs"] == {"reserve": {"hold_id": "h1"}}
    client.start(charge["job_id"], charge["fencing_token"])
    client.fail(charge["job_id"], charge["fencing_token"], kind="permanent", message="declined")

    # Only the reserve step succeeded, so only its compensation runs, with its result.
    undo = _run_one(client, "inventory-undo", {"released": True})
    assert undo["inputs"] == {"reserve": {"hold_id": "h1"}}
    assert client.claim("w1", ["payments-undo"], wait_s=0.5) == []

    final = client.get_workflow(workflow["id"])
    assert final["status"] == "failed"
    assert final["steps"]["charge"]["status"] == "failed"
    assert final["steps"]["ship"]["status"] == "skipped"
    assert final["steps"]["reserve"]["compensation"]["status"] == "succeeded"
    assert final["steps"]["reserve"]["compensation"]["result"] == {"released": True}
    assert final["compensation_order"] == ["reserve"]
    history = [e["event"] for e in client.workflow_history(workflow["id"])]
    assert history.index("compensation_started") > history.index("step_failed")
    types = [e["type"] for e in client.events(0, types=["workflow.*"])["events"]]
    assert types == ["workflow.compensated", "workflow.failed"]
    listed = client.list_workflows(status="failed")["workflows"]
    assert [w["id"] for w in listed] == [workflow["id"]]


def test_compensations_run_in_reverse_completion_order(client: Client) -> None:
    steps = [
        {"name": n, "queue": "q", "payload": n, "compensation": {"queue": "undo", "payload": n}}
        for n in ("a", "b", "c")
    ]
    steps.append({"name": "d", "queue": "last", "depends_on": ["a", "b", "c"]})
    workflow = client.submit_workflow({"steps": steps})
    order = []
    for _ in range(3):
        lease = _run_one(client, "q", None)
        order.append(lease["step"])
    _run_one(client, "last", fail="no")
    undone = [_run_one(client, "undo")["step"] for _ in range(3)]
    assert undone == list(reversed(order))
    assert client.get_workflow(workflow["id"])["status"] == "failed"


def test_cancel_a_running_workflow(client: Client) -> None:
    workflow = client.submit_workflow({"steps": [{"name": "a", "queue": "slow"}]})
    (lease,) = client.claim("w1", ["slow"], wait_s=10)
    cancelled = client.cancel_workflow(workflow["id"], "changed my mind")
    assert cancelled["status"] == "compensating"
    beat = client.heartbeat(lease["job_id"], lease["fencing_token"])
    assert beat["cancel_requested"] is True
    client.fail(lease["job_id"], lease["fencing_token"], kind="cancelled")
    assert client.get_workflow(workflow["id"])["status"] == "cancelled"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"steps": [{"name": "a", "queue": "q"}, {"name": "a", "queue": "q"}]}, "steps[1].name"),
        ({"steps": [{"name": "a", "queue": "q", "depends_on": ["b"]}]}, "steps[0].depends_on"),
        (
            {"steps": [{"name": "a", "queue": "q", "depends_on": ["b"]},
                       {"name": "b", "queue": "q", "depends_on": ["a"]}]},
            "steps[0].depends_on",
        ),
        ({"steps": [{"name": "a", "queue": "q", "colour": 1}]}, "steps[0].colour"),
        ({"steps": [], "tenant": "t"}, "steps"),
        ({"steps": [{"name": "a", "queue": "q"}], "on_failure": "maybe"}, "on_failure"),
    ],
)  # fmt: skip
def test_bad_workflows_are_rejected_naming_the_field(
    client: Client, body: dict[str, Any], field: str
) -> None:
    with pytest.raises(ClientApiError) as caught:
        client.submit_workflow(body)
    assert caught.value.status == 400
    assert caught.value.details["field"] == field
    assert client.list_workflows()["workflows"] == []


def test_cli_submit_get_list_cancel_and_tail(
    client: Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from raftsched.cli import main

    urls = ["--url", ",".join(client.urls)]
    request = tmp_path / "wf.json"
    request.write_text(json.dumps({"steps": [{"name": "only", "queue": "cli"}]}))
    assert main(["workflows", "submit", str(request), *urls]) == 0
    out = capsys.readouterr().out
    workflow_id = out.split()[0]
    assert workflow_id.startswith("wf_") and "only" in out and "active" in out
    assert main(["workflows", "list", "--status", "running", *urls]) == 0
    assert workflow_id in capsys.readouterr().out
    assert main(["workflows", "cancel", workflow_id, *urls]) == 0
    capsys.readouterr()
    assert main(["--json", "workflows", "get", workflow_id, *urls]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "cancelled"
    assert main(["events", "tail", "--after", "0", "--no-follow", *urls]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    assert [e["type"] for e in lines][-2:] == ["job.cancelled", "workflow.cancelled"]
