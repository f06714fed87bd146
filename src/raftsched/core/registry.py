"""The features of this build, in order, and the registry derived from them.

Order matters where features share a phase: sections are encoded by name
whatever the order here, but Tick work and job-finished hooks run by rank
(declared in each record), and invariants are reported in this order.
"""

from __future__ import annotations

from typing import Final

from raftsched.core.auth import feature as auth
from raftsched.core.events import feature as events
from raftsched.core.jobs import feature as jobs
from raftsched.core.kernel import builtin as kernel
from raftsched.core.kernel.feature import Feature, Registry
from raftsched.core.membership import feature as membership
from raftsched.core.schedules import feature as schedules
from raftsched.core.workflows import feature as workflows

FEATURES: Final[tuple[Feature, ...]] = (
    kernel.FEATURE,
    jobs.FEATURE,
    schedules.FEATURE,
    workflows.FEATURE,
    events.FEATURE,
    auth.FEATURE,
    membership.FEATURE,
)

REGISTRY: Final = Registry(FEATURES)
