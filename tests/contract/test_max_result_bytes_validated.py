# SPDX-License-Identifier: MIT
"""A nonsensical ``max_result_bytes`` is accepted at start-up and then dead-letters work.

docs/errors.md: ``ConfigurationError`` is "bad URL, table name, option ...: raised at
start-up". ``ttl``, ``wait``, ``lease`` and ``max_attempts`` are validated when the inbox
or decorator is built, but ``max_result_bytes=-1`` is taken as is: every delivery then runs
its handler, rolls its writes back and counts a ``TooLarge`` failure, so after
``max_attempts`` every message is dead (consumers dead-letter ``TooLarge`` at once).
"""

from __future__ import annotations

import pytest

import onceonly


def test_inbox_refuses_a_negative_max_result_bytes():
    store = onceonly.open_store("memory://")
    with pytest.raises(onceonly.ConfigurationError):
        onceonly.Inbox(store, consumer="atk-opt", max_result_bytes=-1)


def test_idempotent_refuses_a_negative_max_result_bytes():
    store = onceonly.open_store("memory://")
    with pytest.raises(onceonly.ConfigurationError):

        @onceonly.idempotent(store, key=lambda k: k, scope="atk.opt", max_result_bytes=-1)
        def f(k):
            return k
