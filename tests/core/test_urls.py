# SPDX-License-Identifier: MIT
"""redact_url never lets a password through (spec: secrets are never printed)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from onceonly._core.urls import redact_url

CASES = [
    ("postgresql://app:s3cret@db:5432/app", "postgresql://app:***@db:5432/app"),
    ("postgresql://app@db/app", "postgresql://app@db/app"),
    ("postgresql://app:s3cret@h1:5432,h2:5433/app", "postgresql://app:***@h1:5432,h2:5433/app"),
    ("postgresql://app@db/app?password=s3cret&sslmode=require",
     "postgresql://app@db/app?password=***&sslmode=require"),
    ("amqp://guest:guest@rabbit:5672/vhost", "amqp://guest:***@rabbit:5672/vhost"),
    ("nats://u:p4ss@nats:4222", "nats://u:***@nats:4222"),
    ("nats://nats:4222?token=abc", "nats://nats:4222?token=***"),
    ("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
    ("redis://s3cret@cache:6379/0", "redis://***@cache:6379/0"),
    ("mysql://root:pw@127.0.0.1:3306/test", "mysql://root:***@127.0.0.1:3306/test"),
    ("sqlite:////var/lib/app/onceonly.db", "sqlite:////var/lib/app/onceonly.db"),
    ("host=db dbname=app password=s3cret user=app", "host=db dbname=app password=*** user=app"),
    ("host=db password='s3 cret' user=app", "host=db password=*** user=app"),
    ("user:p%40ss@host", "user:p%40ss@host"),  # no scheme: not a URL, nothing to find
]  # fmt: skip


@pytest.mark.parametrize(("url", "shown"), CASES)
def test_redacts(url: str, shown: str) -> None:
    """Passwords in userinfo, secret query parameters and conninfo are masked."""
    assert redact_url(url) == shown


def test_non_strings_are_shown_by_type() -> None:
    """Anything else prints as its type, never its repr."""
    assert redact_url(b"postgresql://a:b@c/d") == "<bytes>"


@given(
    scheme=st.sampled_from(["postgresql", "amqp", "nats", "redis", "mysql", "rediss"]),
    user=st.text(alphabet="abcxyz_", min_size=1, max_size=8),
    secret=st.text(alphabet="QWERTY0123456789!$&*()-_=+;,.~", min_size=6, max_size=20),
    host=st.sampled_from(["db", "127.0.0.1", "h1:5432,h2:5433", "[::1]:5432"]),
)
def test_the_password_never_survives(scheme: str, user: str, secret: str, host: str) -> None:
    """Whatever the password's characters, the shown URL does not contain it."""
    # a password that is part of the rest of the URL (the host "127.0.0.1" holds "127.0.")
    # is "in" the shown URL without having leaked: not a case to judge by substrings
    quoted = __import__("urllib.parse").parse.quote(secret, safe="")
    assume(not any(secret in part or quoted in part for part in (scheme, user, host, "/x")))
    for url in (
        f"{scheme}://{user}:{quoted}@{host}/x",
        f"{scheme}://{user}@{host}/x?password={quoted}",
    ):
        shown = redact_url(url)
        assert quoted not in shown and secret not in shown, (url, shown)
