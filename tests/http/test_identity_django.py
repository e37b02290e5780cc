# SPDX-License-Identifier: MIT
"""Django: identity (the concrete path and the query are the request) and principals
(anonymous visitors never share a response; an ``int`` user id works; ``"None"`` is
refused). Django's test ``Client`` with sessions and ``AuthenticationMiddleware``, in a
process of its own (Django is configured once per process), on SQLite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import (
    drop_mysql_table,
    drop_pg_table,
    require_mysql,
    require_postgres,
    unique_table,
)
from tests.http.servers import ROOT

SCRIPT = r"""
import json, sys
import django
from django.conf import settings

MODE = {"principal": None}

def principal(request):
    return MODE["principal"](request)

settings.configure(
    DEBUG=False,
    SECRET_KEY="test",
    ALLOWED_HOSTS=["*"],
    ROOT_URLCONF=__name__,
    INSTALLED_APPS=[
        "django.contrib.auth", "django.contrib.contenttypes", "django.contrib.sessions",
        "onceonly.contrib.django",
    ],
    MIDDLEWARE=[
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "onceonly.contrib.django.middleware.IdempotencyMiddleware",
    ],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": sys.argv[1]}},
    PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
    ONCEONLY_HTTP={"PRINCIPAL": principal, "STORE_URL": sys.argv[2] or None, "TABLE": sys.argv[3]},
)
django.setup()

from django.contrib.auth.models import User
from django.core.management import call_command
from django.http import JsonResponse
from django.test import Client
from django.urls import path

from onceonly.contrib.django.principals import user_principal
from onceonly.contrib.django.views import idempotent_view

PAID = []

@idempotent_view("required")
def pay(request, order):
    PAID.append((order, request.GET.get("amount")))
    return JsonResponse({"paid": order, "n": len(PAID)}, status=201)

urlpatterns = [path("orders/<int:order>/pay", pay)]
call_command("migrate", verbosity=0)
from django.apps import apps
apps.get_app_config("onceonly").store().migrate()
alice = User.objects.create_user("alice", password="pw")

def post(client, url, key, body=None, **extra):
    r = client.post(url, body or {"card": "x"}, content_type="application/json",
                    headers={"Idempotency-Key": key}, **extra)
    return [r.status_code, r.headers.get("Idempotent-Replayed"), r.content.decode()]

out = {}
MODE["principal"] = user_principal
a, b = Client(raise_request_exception=False), Client(raise_request_exception=False)
out["anon_a"] = post(a, "/orders/1/pay", "anon")
out["anon_b"] = post(b, "/orders/2/pay", "anon")
logged = Client(raise_request_exception=False)
logged.force_login(alice)
out["order1"] = post(logged, "/orders/1/pay?amount=5", "k1")
out["order2"] = post(logged, "/orders/2/pay?amount=5", "k1")
out["amount500"] = post(logged, "/orders/1/pay?amount=500", "k1")
out["again"] = post(logged, "/orders/1/pay?amount=5", "k1", {"card": "x"})

# one site served under two script prefixes (SCRIPT_NAME): request.path holds it
out["prefix_a"] = post(logged, "/orders/6/pay", "k-prefix", SCRIPT_NAME="/a")
out["prefix_a2"] = post(logged, "/orders/6/pay", "k-prefix", SCRIPT_NAME="/a")
out["prefix_b"] = post(logged, "/orders/6/pay", "k-prefix", SCRIPT_NAME="/b")

MODE["principal"] = lambda request: request.user.pk  # an int, or None when anonymous
out["int1"] = post(logged, "/orders/3/pay", "k-int")
out["int2"] = post(logged, "/orders/3/pay", "k-int")

MODE["principal"] = lambda request: str(request.user.pk)  # "None" for every visitor
out["none_a"] = post(a, "/orders/4/pay", "k-none")
out["none_b"] = post(b, "/orders/5/pay", "k-none")
out["paid"] = PAID
print(json.dumps(out))
"""


@pytest.fixture(params=["sqlite", "postgres", "mysql"])
def store_url(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """The store: the default database (SQLite), or PostgreSQL / MariaDB by STORE_URL."""
    table = unique_table()
    if request.param == "sqlite":
        yield "", table
    elif request.param == "postgres":
        yield require_postgres(), table
        drop_pg_table(table)
    else:
        yield require_mysql(), table
        drop_mysql_table(table)


def test_django_identity_and_principals(tmp_path: Path, store_url: tuple[str, str]) -> None:
    """Another order, amount or script prefix with one key: 422; anonymous visitors never
    share a key;
    an int user id replays; the text "None" is refused (500), never shared."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "dj.db"), *store_url],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # B: anonymous visitors have no principal with user_principal: 403, nothing runs
    assert out["anon_a"][0] == out["anon_b"][0] == 403
    assert "no-principal" in out["anon_b"][2]
    # A: the concrete path and the query are the request
    assert out["order1"][0] == 201 and out["order1"][1] is None
    assert out["order2"][0] == 422 and "key-mismatch" in out["order2"][2]
    assert out["amount500"][0] == 422
    assert out["again"][:2] == [201, "true"] and out["again"][2] == out["order1"][2]
    # B: an int principal (user.pk) is its text: no AttributeError, a faithful replay
    assert out["int1"][0] == 201 and out["int2"][:2] == [201, "true"]
    # B: "None" names no client: refused, and B never gets A's response
    assert out["none_a"][0] == out["none_b"][0] == 500
    # the script prefix is part of the concrete path: another prefix is another request
    assert out["prefix_a"][0] == 201 and out["prefix_a2"][:2] == [201, "true"]
    assert out["prefix_b"][0] == 422 and "key-mismatch" in out["prefix_b"][2]
    assert out["paid"] == [[1, "5"], [6, None], [3, None]]
