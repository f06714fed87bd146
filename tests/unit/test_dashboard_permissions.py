"""The dashboard's copy of the permission table (static/app.js) matches the
server's (api/permissions.py): the page hides exactly what the server refuses."""

from __future__ import annotations

import json
import re
from importlib import resources

from raftsched.api.permissions import (
    CLUSTER_NEEDS_ALL_TENANTS,
    ROLE_PERMISSIONS,
    ROUTE_PERMISSIONS,
)


def _app_js() -> str:
    return resources.files("raftsched").joinpath("static", "app.js").read_text("utf-8")


def _object(name: str) -> str:
    match = re.search(rf"^const {name} = \{{\n(.*?)^\}};", _app_js(), re.MULTILINE | re.DOTALL)
    assert match is not None, f"app.js has no const {name}"
    return match.group(1)


def test_the_role_table_is_the_servers() -> None:
    body = _object("ROLE_PERMISSIONS")
    copied = {
        role: set(json.loads(permissions))
        for role, permissions in re.findall(r"^\s*(\w+): (\[.*?\]),$", body, re.MULTILINE)
    }
    server = {str(role): {str(p) for p in perms} for role, perms in ROLE_PERMISSIONS.items()}
    # `public` needs no token: the page never asks about it.
    assert copied == {role: perms - {"public"} for role, perms in server.items()}
    match = re.search(r"^const CLUSTER_NEEDS_ALL_TENANTS = (\[.*?\]);", _app_js(), re.MULTILINE)
    assert match is not None
    assert set(json.loads(match.group(1))) == {str(role) for role in CLUSTER_NEEDS_ALL_TENANTS}


def test_each_action_needs_its_routes_permission() -> None:
    body = _object("ACTION_PERMISSIONS")
    rows = re.findall(r'^\s*"([\w-]+)": "([\w.]+)", // (GET|POST|PUT|DELETE) (\S+)$', body, re.M)
    assert len(rows) == body.count("\n") and rows, body
    for action, permission, method, path in rows:
        assert str(ROUTE_PERMISSIONS[(method, path)]) == permission, action
    # Every action the page can take is in the table (else it would be shown to all).
    actions = set(re.findall(r'^  "([\w-]+)":', _object("ACTIONS"), re.MULTILINE))
    assert actions == {action for action, *_ in rows}
