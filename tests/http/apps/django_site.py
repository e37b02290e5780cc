# SPDX-License-Identifier: MIT
"""A Django site with onceonly.contrib.django, for the real-server tests (waitress).

Configured like :mod:`tests.http.apps.asgi_app`, plus DJANGO_SCHEMA (PostgreSQL: the
schema Django's own tables go to). Migrates on import.
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
from typing import Any

import django
from django.conf import settings

URL = os.environ["ONCEONLY_URL"]
TABLE = os.environ.get("ONCEONLY_TABLE") or "onceonly_records"
EFFECTS = os.environ["EFFECTS"]

if URL.startswith("sqlite"):
    database: dict[str, Any] = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": URL.removeprefix("sqlite:///"),
    }
else:
    u = urllib.parse.urlsplit(URL)
    database = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": u.path.lstrip("/"),
        "USER": u.username or "",
        "HOST": u.hostname or "",
        "PORT": u.port or 5432,
        "OPTIONS": {"options": f"-c search_path={os.environ['DJANGO_SCHEMA']},public"},
    }

settings.configure(
    DEBUG=False,
    SECRET_KEY="test",
    ALLOWED_HOSTS=["*"],
    ROOT_URLCONF=__name__,
    INSTALLED_APPS=["onceonly.contrib.django"],
    MIDDLEWARE=["onceonly.contrib.django.middleware.IdempotencyMiddleware"],
    DATABASES={"default": database},
    ONCEONLY_HTTP={
        "PRINCIPAL": lambda request: request.headers.get("x-user"),
        "TABLE": TABLE,
        "LEASE": float(os.environ.get("LEASE", "30")),
    },
)
django.setup()

from django.core.asgi import get_asgi_application  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.db import connection  # noqa: E402
from django.http import Http404, HttpRequest, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402

from onceonly.contrib.django.views import idempotent_view  # noqa: E402

call_command("migrate", verbosity=0)
ORDERS = f"{TABLE}_orders"
with connection.cursor() as cursor:
    cursor.execute(f"CREATE TABLE IF NOT EXISTS {ORDERS} (item TEXT)")


def effect() -> int:
    with open(EFFECTS, "a") as f:
        f.write("run\n")
    with open(EFFECTS) as f:
        return len(f.readlines())


@idempotent_view("required")
def create(request: HttpRequest) -> JsonResponse:
    body = json.loads(request.body)
    n = effect()
    time.sleep(float(request.headers.get("x-sleep", 0)))
    response = JsonResponse({"order": n, "item": body.get("item")}, status=201)
    response["Location"] = f"/orders/{n}"
    response.set_cookie("session", "secret")
    return response


@idempotent_view("required", atomic=True)
def atomic(request: HttpRequest) -> JsonResponse:
    body = json.loads(request.body)
    with connection.cursor() as cursor:  # the ORM's connection: the same transaction
        cursor.execute(f"INSERT INTO {ORDERS} (item) VALUES (%s)", [body.get("item")])
    effect()
    if body.get("http404"):
        raise Http404("no such item")
    time.sleep(float(request.headers.get("x-sleep", 0)))
    return JsonResponse({"item": body.get("item")}, status=int(body.get("status", 201)))


@idempotent_view("required")
async def acreate(request: HttpRequest) -> JsonResponse:
    body = json.loads(request.body)
    n = effect()
    return JsonResponse({"order": n, "item": body.get("item")}, status=201)


urlpatterns = [path("orders", create), path("atomic", atomic), path("async", acreate)]
application = get_wsgi_application()
asgi_application = get_asgi_application()
