"""Tenant isolation (api.scope) on real core states: what a principal sees of
jobs, schedules, workflows, effects, events and the audit trail, which checks
refuse it, and who the actor of an operator action is.

Authentication is not on this branch (the middleware sets principals), so
these tests make the principals themselves; the same functions serve every
handler, which asks the request's principal and never a header."""

from __future__ import annotations

import msgpack
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from raftsched.api import scope
from raftsched.api.errors import ApiError
from raftsched.api.events import scoped_events
from raftsched.api.principal import ANONYMOUS, Principal, Role, set_principal
from raftsched.api.requests import actor
from raftsched.core import State, apply_entry, list_jobs, new_state
from raftsched.core.jobs.commands import (
    CancelJob,
    ClaimJobs,
    RecordEffect,
    StartJob,
    SubmitJobs,
)
from raftsched.core.kernel.commands import Command, Entry, JobSpec, TakeOver
from raftsched.core.kernel.outbox import OutboxEvent, events_after
from raftsched.core.kernel.results import Claimed
from raftsched.core.schedules.commands import CreateSchedule, ScheduleSpec
from raftsched.core.schedules.queries import get_schedule, list_schedules
from raftsched.core.workflows.commands import StepSpec, SubmitWorkflow
from raftsched.core.workflows.model import table

ACME = Principal("tok_1", "acme-ops", Role.OPERATOR, frozenset({"acme"}), None)
TWO = Principal("tok_2", "two", Role.VIEWER, frozenset({"acme", "initech"}), None)
WORKER = Principal("tok_3", "w", Role.WORKER, None, frozenset({"payments"}))
NOBODY = Principal("tok_4", "none", Role.VIEWER, frozenset(), None)
T0 = 1_000_000


class Story:
    """A real core state, changed by applying entries as a leader would."""

    def __init__(self) -> None:
        self.state: State = new_state()
        self.run(TakeOver())

    def run(self, *commands: Command) -> list[object]:
        return list(apply_entry(self.state, Entry(1, T0, commands)))

    def submit(self, job_id: str, tenant: str, queue: str = "q") -> str:
        self.run(SubmitJobs((JobSpec(queue, tenant=tenant),), (job_id,)))
        return job_id


@pytest.fixture
def story() -> Story:
    story = Story()
    for number in range(12):
        tenant = ("acme", "globex", "initech")[number % 3]
        story.submit(f"job_{number:02}", tenant, "payments" if number % 2 else "email")
    return story


def test_the_unrestricted_are_recognised_once() -> None:
    assert scope.unrestricted(ANONYMOUS)
    assert scope.unrestricted(Principal("t", "admin", Role.ADMIN, None, None))
    assert not scope.unrestricted(ACME) and not scope.unrestricted(WORKER)


def test_a_job_is_visible_within_the_tenants_and_the_queues(story: Story) -> None:
    jobs = story.state.jobs
    acme_email, globex_payments = jobs["job_00"], jobs["job_01"]
    assert scope.visible_job(ANONYMOUS, acme_email) and scope.visible_job(
        ANONYMOUS, globex_payments
    )
    assert scope.visible_job(ACME, acme_email) and not scope.visible_job(ACME, globex_payments)
    assert scope.visible_job(WORKER, globex_payments) and not scope.visible_job(WORKER, acme_email)
    assert not scope.visible_job(NOBODY, acme_email)


def test_a_tenant_of_none_is_only_for_callers_of_every_tenant() -> None:
    assert scope.visible_tenant(ANONYMOUS, None) and scope.visible_tenant(WORKER, None)
    assert not scope.visible_tenant(ACME, None)
    assert scope.visible_tenant(ACME, "acme") and not scope.visible_tenant(ACME, "globex")


def pages(story: Story, principal: Principal, limit: int, **filters: str) -> list[list[str]]:
    """Every page of a list, following the cursor."""
    found: list[list[str]] = []
    cursor = None
    while True:
        jobs, cursor = list_jobs(
            story.state,
            limit=limit,
            cursor=cursor,
            tenants=principal.tenants,
            queues=principal.queues,
            **filters,  # type: ignore[arg-type]
        )
        found.append([job.id for job in jobs])
        if cursor is None:
            return found


def test_lists_leave_out_other_tenants_and_pages_follow_on(story: Story) -> None:
    everything = [job_id for page in pages(story, ANONYMOUS, 100) for job_id in page]
    assert everything == [f"job_{n:02}" for n in range(11, -1, -1)]
    acme = [f"job_{n:02}" for n in (9, 6, 3, 0)]
    assert pages(story, ACME, 100) == [acme]
    assert pages(story, ACME, 3) == [acme[:3], acme[3:]]
    two = [f"job_{n:02}" for n in range(11, -1, -1) if n % 3 != 1]
    assert [job_id for page in pages(story, TWO, 3) for job_id in page] == two


def test_filters_within_a_scope(story: Story) -> None:
    # A tenant outside the scope matches nothing, as an unknown tenant would.
    assert pages(story, ACME, 100, tenant="globex") == [[]]
    assert pages(story, ACME, 100, tenant="acme", queue="payments") == [["job_09", "job_03"]]
    assert pages(story, WORKER, 100, queue="email") == [[]]
    assert pages(story, WORKER, 100, tenant="acme") == [["job_09", "job_03"]]
    assert pages(story, NOBODY, 100) == [[]]


def test_schedules_and_workflows_belong_to_their_tenant(story: Story) -> None:
    for name, tenant in (("a-nightly", "acme"), ("g-nightly", "globex")):
        spec = ScheduleSpec(name, JobSpec("q", tenant=tenant), cron="0 2 * * *")
        story.run(CreateSchedule(spec))
    page, _ = list_schedules(story.state, 10, None, ACME.tenants)
    assert [schedule.id for schedule in page] == ["a-nightly"]
    page, _ = list_schedules(story.state, 10, None, ANONYMOUS.tenants)
    assert [schedule.id for schedule in page] == ["a-nightly", "g-nightly"]
    globex = get_schedule(story.state, "g-nightly")
    assert globex is not None and not scope.visible_schedule(ACME, globex)
    story.run(SubmitWorkflow("wf_1", (StepSpec("a", JobSpec("q")),), "globex"))
    workflow = table(story.state).workflows["wf_1"]
    assert scope.visible_workflow(ANONYMOUS, workflow)
    assert not scope.visible_workflow(ACME, workflow)


def test_an_effect_belongs_to_its_job(story: Story) -> None:
    (claimed,) = story.run(ClaimJobs("w1", ("payments",), 1))
    assert isinstance(claimed, Claimed)
    (lease,) = claimed.leases
    story.run(StartJob(lease.job_id, lease.fencing_token))
    story.run(RecordEffect("charge:1", lease.job_id, lease.fencing_token))
    owner = story.state.jobs[lease.job_id]
    assert owner.queue == "payments"
    mine = Principal("tok_5", "m", Role.SUBMITTER, frozenset({owner.tenant}), None)
    other = Principal("tok_6", "o", Role.SUBMITTER, frozenset({owner.tenant + "-not"}), None)
    assert scope.visible_effect(ANONYMOUS, story.state, "charge:1")
    assert scope.visible_effect(WORKER, story.state, "charge:1")
    assert scope.visible_effect(mine, story.state, "charge:1")
    assert not scope.visible_effect(other, story.state, "charge:1")
    assert not scope.visible_effect(ANONYMOUS, story.state, "no-such-key")


def event(seq: int, data: dict[str, object]) -> OutboxEvent:
    return OutboxEvent(seq, "job.cancelled", T0, msgpack.packb(data))


def test_events_without_a_tenant_are_left_out_for_a_scoped_caller() -> None:
    events = [
        event(1, {"job_id": "a", "tenant": "acme"}),
        event(2, {"job_id": "g", "tenant": "globex"}),
        event(3, {"schedule_id": "s"}),  # recorded before cluster version 3
    ]
    assert scope.filter_events(ANONYMOUS, events) == events
    assert scope.filter_events(WORKER, events) == events  # every tenant
    assert scope.filter_events(ACME, events) == events[:1]


def test_a_scoped_caller_reads_past_the_events_it_may_not_see(story: Story) -> None:
    # Cancelling emits job.cancelled with the job's tenant: 8 others, then acme.
    story.run(*(CancelJob(f"job_{n:02}") for n in range(12) if n % 3))
    story.run(CancelJob("job_00"), CancelJob("job_03"))
    assert len(events_after(story.state, 0, None, 100)) == 10
    found = scoped_events(ACME, story.state, 0, None, 2)
    assert [msgpack.unpackb(e.data)["job_id"] for e in found] == ["job_00", "job_03"]
    assert scoped_events(ACME, story.state, found[0].seq, None, 5) == found[1:]
    assert scoped_events(NOBODY, story.state, 0, None, 5) == []


def request_as(principal: Principal | None, headers: dict[str, str] | None = None) -> web.Request:
    request = make_mocked_request("POST", "/v1/jobs/job_1/cancel", headers=headers or {})
    if principal is not None:
        set_principal(request, principal)
    return request


def forbidden(check: object) -> ApiError:
    with pytest.raises(ApiError) as raised:
        check()  # type: ignore[operator]
    assert raised.value.status == 403 and raised.value.code == "forbidden"
    return raised.value


def test_cluster_wide_views_need_every_tenant() -> None:
    assert scope.require_all_tenants(request_as(None), "/metrics") is ANONYMOUS
    assert scope.require_all_tenants(request_as(WORKER), "/metrics") is WORKER
    error = forbidden(lambda: scope.require_all_tenants(request_as(ACME), "/metrics"))
    assert "tenants *" in error.message


def test_writing_for_another_tenant_or_claiming_another_queue_is_forbidden() -> None:
    scope.require_tenant(request_as(None), ["anything"])
    scope.require_tenant(request_as(TWO), ["acme", "initech"])
    forbidden(lambda: scope.require_tenant(request_as(TWO), ["acme", "globex"]))
    scope.require_queues(request_as(ACME), ["email"])  # every queue
    scope.require_queues(request_as(WORKER), ["payments"])
    forbidden(lambda: scope.require_queues(request_as(WORKER), ["payments", "email"]))


def test_the_actor_is_the_token_and_the_header_only_without_one() -> None:
    header = {"Raftsched-Actor": "dashboard"}
    assert actor(request_as(None, header), "api") == "dashboard"
    assert actor(request_as(None), "operator") == "operator"
    assert actor(request_as(ANONYMOUS, header), "api") == "dashboard"
    assert actor(request_as(ACME, header), "api") == "acme-ops (tok_1)"
    assert actor(request_as(ACME), "api") == "acme-ops (tok_1)"
