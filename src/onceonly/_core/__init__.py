# SPDX-License-Identifier: MIT
"""The pure core: key rules, fingerprints, the result codec and the record state machine.

Invariant: nothing in this package performs I/O, reads a clock, or uses asyncio. Times
are passed in as epoch seconds measured on the store's clock.

Imports: the standard library, :mod:`onceonly.errors` and :mod:`onceonly.messaging`
only, nothing else of onceonly and no third-party package (tests/packaging/test_layout.py
checks it). Every other package may import these modules; they are the one private
package that is shared, so its modules carry no ``_`` prefix. The interface is the
modules themselves, listed in ``__all__`` and not imported here (a caller loads only
what it uses).
"""

__all__ = [
    "admin",
    "admin_sql",
    "attempts",
    "backoff",
    "canonical",
    "codec",
    "deadletter",
    "durations",
    "error_text",
    "fingerprint",
    "http",
    "http_replay",
    "keys",
    "lateness",
    "offsets",
    "pool",
    "publishing",
    "rebuild",
    "settle",
    "sql",
    "state",
    "urls",
    "window",
]
