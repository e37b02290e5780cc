# SPDX-License-Identifier: MIT
"""An effect that ran but whose completion could not be recorded is reported as the
transient ``StoreUnavailable``.

docs/errors.md: ``StoreUnavailable`` means "nack and retry later; no attempt was counted".
But here the function already ran (the charge happened); only its completion write was
lost. The caller cannot tell this from "nothing happened", retries, meets ``InFlight``
until the lease lapses, and then the takeover runs the effect a second time.
"""

from __future__ import annotations

import contextlib
import time
import uuid

import onceonly
from tests.faults._cutproxy import Proxy


def test_lost_completion_is_not_reported_as_transient():
    proxy = Proxy(6379)
    prefix = f"atk-{uuid.uuid4().hex}:"
    store = onceonly.open_store(
        f"redis://127.0.0.1:{proxy.port}/0", prefix=prefix, socket_timeout=0.3
    )
    effects = []
    try:
        store.migrate()

        @onceonly.idempotent(store, key=lambda k: k, scope="atk.completion", wait=0.5, lease=1)
        def charge(k):
            effects.append(k)
            proxy.mode = "cut"  # the store goes away after the effect, before the completion
            return "charged"

        try:
            charge("order-1")
            raised = None
        except Exception as exc:
            raised = exc
        assert effects == ["order-1"]
        proxy.mode = "pass"
        time.sleep(1.5)  # the lease lapses, as it does while the caller backs off
        with contextlib.suppress(Exception):
            charge("order-1")

        assert raised is not None
        # The effect ran: the outcome must not be hidden as a transient, uncounted error
        # that tells the caller to retry as if nothing happened ...
        assert not isinstance(raised, onceonly.StoreUnavailable), (
            f"effect ran, reported as {type(raised).__name__}: {raised}"
        )
        # ... which is what makes the retry run the effect again
        assert effects == ["order-1"], f"the effect ran {len(effects)} times"
    finally:
        store.close()
        proxy.close()
        import redis

        direct = redis.Redis(host="127.0.0.1", port=6379)
        for name in direct.scan_iter(match=prefix + "*"):
            direct.delete(name)
        direct.close()
