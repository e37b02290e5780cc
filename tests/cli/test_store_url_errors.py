# SPDX-License-Identifier: MIT
"""Bad store URLs must be a typed ConfigurationError (exit 2), never untyped or transient.

docs/errors.md: ``ConfigurationError`` is "bad URL, table name, option"; docs/operating.md:
exit 2 is "a bad option or URL ... do not retry", exit 3 "cannot be reached now ... retry".
docs/stores.md: "An unknown option is a ConfigurationError that lists the valid ones".
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import onceonly

BAD_URLS = [
    # a typo'd query option: PostgreSQL says StoreUnavailable (transient, retried for ever)
    "postgresql://postgres@127.0.0.1:5432/postgres?conect_timeout=3",
    # a port that cannot exist: a URL error, reported as transient
    "postgresql://postgres@127.0.0.1:99999/postgres",
    # an unknown charset: a raw AttributeError from PyMySQL
    "mysql://root@127.0.0.1:3306/mysql?charset=nope",
    # an unknown Redis URL option: a raw TypeError from redis-py
    "redis://127.0.0.1:6379/0?prefx=atk:",
    # a file that is not a SQLite database
    "sqlite:////etc/passwd",
    # a memory store takes no URL options
    "memory://?x=1",
]


@pytest.mark.parametrize("url", BAD_URLS)
def test_bad_url_is_a_configuration_error(url):
    with pytest.raises(onceonly.OnceOnlyError) as info:
        store = onceonly.open_store(url)
        try:
            store.migrate()
        finally:
            store.close()
    assert isinstance(info.value, onceonly.ConfigurationError), type(info.value).__mro__
    # not "transient": a consumer would retry a typo for ever, uncounted
    assert not isinstance(info.value, onceonly.StoreUnavailable) or isinstance(
        info.value, onceonly.StoreMisconfigured
    )


@pytest.mark.parametrize("url", [*BAD_URLS[:3], BAD_URLS[4]])
def test_cli_exits_2_on_a_bad_url(url):
    proc = subprocess.run(
        [sys.executable, "-m", "onceonly", "stats", "--url", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-400:])
