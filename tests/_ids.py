# SPDX-License-Identifier: MIT
"""Test ids that are the same in every process.

``repr`` of a set follows the hash seed, which differs between pytest-xdist's workers;
they must collect the same ids, so sets print their members sorted.
"""

from __future__ import annotations


def stable_repr(value: object) -> str:
    """``repr(value)`` with the members of every set (at any depth) in sorted order."""
    if isinstance(value, (set, frozenset)):
        inner = ", ".join(sorted(stable_repr(v) for v in value))
        return f"{{{inner}}}" if type(value) is set else f"frozenset({{{inner}}})"
    if isinstance(value, dict):
        return (
            "{" + ", ".join(f"{stable_repr(k)}: {stable_repr(v)}" for k, v in value.items()) + "}"
        )
    if isinstance(value, list):
        return "[" + ", ".join(stable_repr(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(stable_repr(v) for v in value) + (",)" if len(value) == 1 else ")")
    return repr(value)
