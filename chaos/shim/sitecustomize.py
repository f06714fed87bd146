"""Loaded (through PYTHONPATH) only into node processes that run under
libfaketime. libfaketime 0.9.10 breaks `clock_nanosleep(CLOCK_MONOTONIC,
TIMER_ABSTIME)` -- which is what CPython's time.sleep uses -- with EINVAL when
the monotonic clock is left real (FAKETIME_DONT_FAKE_MONOTONIC=1). pysyncobj's
tick thread calls time.sleep and would die. select() is not affected, so sleep
with it on the (real) monotonic clock."""

import select
import time


def _sleep(seconds: float) -> None:
    deadline = time.monotonic() + max(0.0, float(seconds))
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        select.select([], [], [], remaining)


time.sleep = _sleep  # type: ignore[assignment]
