"""The dashboard shows a membership change (issue 16), in real chromium.

Its own module, so its own cluster (the fixture is module-scoped): the
change grows the cluster, which the other dashboard tests do not expect.
n4 is added and not started: the Nodes table shows it `joining` and the
page names the change in progress; once n4 is started with `--join` and
has caught up, the change line goes, by the page's own polling.
"""

from __future__ import annotations

from typing import Any

import pytest
from browser_support import login, shot

from raftsched.core import COMMAND_VERSION_MAX
from raftsched.testing import LocalCluster, http_json, wait_for

pytestmark = pytest.mark.e2e


def test_nodes_show_a_joining_member_and_the_change(cluster: LocalCluster, page: Any) -> None:
    def version_raised() -> bool:
        view = cluster.cluster_view(cluster.wait_for_leader())
        return view is not None and view["cluster_version"] == COMMAND_VERSION_MAX

    assert wait_for(version_raised, 30)
    leader_url = cluster.nodes[cluster.wait_for_leader()].http_url
    n4 = cluster.new_node("n4")
    body = {"id": "n4", "raft_address": n4.raft_address, "http_url": n4.http_url}
    status, answer, _ = http_json(
        "POST", leader_url + "/v1/cluster/nodes", body, timeout_s=20, token=cluster.admin_token
    )
    assert status == 202, answer

    login(page, leader_url + "/", cluster.admin_token)
    rows = page.locator("#nodes tbody tr")
    rows.first.wait_for()
    page.locator("#nodes tbody tr", has_text="n4").get_by_text("joining").wait_for()
    assert rows.count() == 4
    change = page.locator("#membership-change")
    change.get_by_text("catching_up").wait_for()
    assert "n4" in change.inner_text()
    shot(page, "membership-joining")

    cluster.start_joining("n4", leader_url)
    change.wait_for(state="detached", timeout=60_000)
    assert page.locator("#nodes tbody tr", has_text="n4").get_by_text("joining").count() == 0
    shot(page, "membership-done")
