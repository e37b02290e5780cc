# SPDX-License-Identifier: MIT
"""Django REST framework behind onceonly's Django middleware, runnable:
python examples/django_rest_framework.py [database path].

Needs ``pip install 'onceonly[django]' djangorestframework``. Clients authenticate with
DRF's token authentication; DRF authenticates inside the view, after every middleware,
so the principal is ``rest_framework_principal``, which runs DRF's authentication
classes first. A client retrying a payment gets the first response; the same key on
another order is 422; another client's key never meets this one's.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import django
from django.conf import settings

DB = sys.argv[1] if len(sys.argv) > 1 else str(Path(tempfile.mkdtemp()) / "drf.db")

settings.configure(
    DEBUG=False,
    SECRET_KEY="example",
    ALLOWED_HOSTS=["testserver"],
    ROOT_URLCONF=__name__,
    INSTALLED_APPS=[
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "rest_framework",
        "rest_framework.authtoken",
        "onceonly.contrib.django",
    ],
    MIDDLEWARE=["onceonly.contrib.django.middleware.IdempotencyMiddleware"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": DB}},
    REST_FRAMEWORK={
        "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.TokenAuthentication"],
        "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    },
    ONCEONLY_HTTP={"PRINCIPAL": "onceonly.contrib.django.principals.rest_framework_principal"},
)
django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.urls import path  # noqa: E402
from rest_framework.authtoken.models import Token  # noqa: E402
from rest_framework.request import Request  # noqa: E402
from rest_framework.response import Response  # noqa: E402
from rest_framework.test import APIClient  # noqa: E402
from rest_framework.views import APIView  # noqa: E402

from onceonly.contrib.django.views import idempotent_view  # noqa: E402

CHARGES: list[tuple[str, int, int]] = []


class PayOrder(APIView):
    def post(self, request: Request, order: int) -> Response:
        amount = int(request.data["amount"])
        CHARGES.append((request.user.username, order, amount))  # the effect: a charge
        return Response({"order": order, "charged": amount, "charge": len(CHARGES)}, status=201)


urlpatterns = [path("orders/<int:order>/pay", idempotent_view("required")(PayOrder.as_view()))]


def client_for(name: str) -> APIClient:
    user = User.objects.create_user(name)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def main() -> None:
    call_command("migrate", verbosity=0)
    alice, bob = client_for("alice"), client_for("bob")
    key = {"Idempotency-Key": "pay-7f3c"}
    first = alice.post("/orders/1/pay", {"amount": 5}, format="json", headers=key)
    retry = alice.post("/orders/1/pay", {"amount": 5}, format="json", headers=key)
    other = alice.post("/orders/2/pay", {"amount": 5}, format="json", headers=key)
    bobs = bob.post("/orders/3/pay", {"amount": 9}, format="json", headers=key)
    anonymous = APIClient().post("/orders/4/pay", {"amount": 1}, format="json", headers=key)
    print("first:", first.status_code, first.json())
    print(
        "retry:", retry.status_code, retry.json(), "replayed:", retry.headers["Idempotent-Replayed"]
    )
    print("same key, order 2:", other.status_code, other.json()["type"].rsplit("#", 1)[1])
    print("bob, same key:", bobs.status_code, bobs.json())
    print("anonymous:", anonymous.status_code, anonymous.json()["type"].rsplit("#", 1)[1])
    print("charges:", CHARGES)


if __name__ == "__main__":
    main()
