# SPDX-License-Identifier: MIT
"""The dashboard's ASGI application: server-rendered pages and the JSON API behind them.

Routing reads the raw (still percent-encoded) path relative to the ASGI ``root_path``,
so a scope or key holding ``/`` or ``%`` reaches its record, and every link is built
from ``root_path``: the app works mounted at any sub-path.

Every write is one of :class:`~onceonly.AsyncAdmin`'s fenced operations (the CLI's) or
the outbox's redrive, and is refused (401/403, nothing changed) unless
:class:`~onceonly.dashboard._auth.Auth` lets it through.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.types import Receive, Scope, Send

from onceonly._core.lateness import BIN_LABELS, DUPLICATE_BINS, HALF_TTL, NEAR_TTL, UNKNOWN
from onceonly._core.state import State
from onceonly.admin_async import AsyncAdmin, LatenessReport
from onceonly.dashboard import _views
from onceonly.dashboard._auth import COOKIE, SESSION_SECONDS, Auth, Verdict
from onceonly.errors import ConfigurationError

__all__ = ["Dashboard"]

_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self';"
        " frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}
_MAX_FORM = 64 * 1024
_WINDOWS = {"1h": 3600.0, "6h": 6 * 3600.0, "24h": 86400.0, "7d": 7 * 86400.0}
_DONE = {
    "redrive": "Redriven: the next delivery runs the handler again.",
    "release": "Released: the claim is failed; the next delivery runs it.",
    "delete": "Deleted.",
    "outbox": "Outbox rows put back to pending.",
    "login": "Logged in.",
    "logout": "Logged out.",
}
Handler = Callable[[Request, list[str]], Awaitable[Response]]


def _q(text: str) -> str:
    return urllib.parse.quote(text, safe="")


class Dashboard:
    """The dashboard as an ASGI application (build it with :func:`onceonly.dashboard.app`)."""

    def __init__(
        self,
        store: Any,
        *,
        token: str | None,
        title: str,
        outbox: bool,
        outbox_table: str | None,
        page_size: int,
    ) -> None:
        self.store = store
        self.admin = AsyncAdmin(store)
        self.auth = Auth(token)
        self.title = title
        self.outbox = outbox
        self.outbox_table = outbox_table
        self.page_size = page_size
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("onceonly.dashboard", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.css = (
            resources.files("onceonly.dashboard").joinpath("static/dashboard.css").read_bytes()
        )

    # -- ASGI
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # nothing to start: the store is the caller's
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        response = await self._dispatch(request)
        for name, value in _HEADERS.items():
            response.headers.setdefault(name, value)
        await response(scope, receive, send)

    def _segments(self, request: Request) -> list[str]:
        """The path below ``root_path`` as decoded segments (split before decoding)."""
        root = request.scope.get("root_path", "")
        raw = request.scope.get("raw_path")
        path = raw.decode("latin-1") if raw else urllib.parse.quote(request.scope["path"])
        path = path.split("?", 1)[0]
        quoted_root = urllib.parse.quote(root)
        if root and path.startswith(quoted_root):
            path = path[len(quoted_root) :]
        elif root and path.startswith(root):
            path = path[len(root) :]
        return [urllib.parse.unquote(p) for p in path.strip("/").split("/") if p != ""]

    async def _dispatch(self, request: Request) -> Response:
        parts = self._segments(request)
        request.scope["onceonly.api"] = bool(parts) and parts[0] == "api"
        method = request.method
        routes: dict[tuple[str, str], Handler] = {
            ("GET", ""): self.page_overview,
            ("GET", "records"): self.page_records,
            ("GET", "record"): self.page_record,
            ("POST", "record-action"): self.form_record_action,
            ("GET", "redrive"): self.page_redrive,
            ("POST", "redrive"): self.form_redrive,
            ("GET", "outbox"): self.page_outbox,
            ("POST", "outbox"): self.form_outbox,
            ("GET", "login"): self.page_login,
            ("POST", "login"): self.form_login,
            ("POST", "logout"): self.form_logout,
            ("GET", "static"): self.static,
            ("GET", "api-summary"): self.api_summary,
            ("GET", "api-records"): self.api_records,
            ("GET", "api-record"): self.api_record,
            ("POST", "api-record-action"): self.api_record_action,
            ("POST", "api-redrive"): self.api_redrive,
            ("GET", "api-outbox"): self.api_outbox,
            ("POST", "api-outbox-redrive"): self.api_outbox_redrive,
        }
        name, args = _route(parts)
        handler = routes.get((method if method != "HEAD" else "GET", name))
        if handler is None:
            if any(n == name for _, n in routes):
                return self._error(request, 405, "method not allowed")
            return self._error(request, 404, "not found")
        return await handler(request, args)

    # -- helpers
    def url(self, request: Request, path: str, params: dict[str, str] | None = None) -> str:
        root = urllib.parse.quote(request.scope.get("root_path", "").rstrip("/"))
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        return f"{root}/{path.lstrip('/')}{query}"

    def record_url(self, request: Request, scope: str, key: str, action: str = "") -> str:
        return self.url(
            request, f"records/{_q(scope)}/{_q(key)}" + (f"/{action}" if action else "")
        )

    def _session(self, request: Request) -> str | None:
        return self.auth.session(request.cookies.get(COOKIE))

    def render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> Response:
        session = self._session(request)
        done = request.query_params.get("done", "")
        page = self.env.get_template(template).render(
            title=self.title,
            url=lambda path, **p: self.url(request, path, p or None),
            record_url=lambda scope, key, action="": self.record_url(request, scope, key, action),
            writable=self.auth.enabled,
            logged_in=session is not None,
            csrf=self.auth.csrf(session) if session is not None else "",
            notice=_DONE.get(done, ""),
            notice_count=request.query_params.get("n", ""),
            age=_age,
            iso=_views.iso,
            here=request.url.path + (f"?{request.url.query}" if request.url.query else ""),
            **context,
        )
        return HTMLResponse(page, status_code=status)

    def _error(self, request: Request, status: int, message: str) -> Response:
        if _wants_json(request):
            return JSONResponse({"error": message}, status_code=status)
        return self.render(
            request, "error.html", status=status, status_code=status, message=message
        )

    async def _form(self, request: Request) -> dict[str, str] | Response:
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > _MAX_FORM:
                return self._error(request, 413, "the form is too large")
        pairs = urllib.parse.parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
        return dict(pairs)

    def _refused(self, request: Request, form: dict[str, str] | None) -> Response | None:
        verdict: Verdict = self.auth.check(
            request.headers.get("authorization"),
            request.cookies.get(COOKIE),
            None if form is None else form.get("csrf"),
        )
        if verdict.status == 0:
            return None
        response = self._error(request, verdict.status, verdict.reason)
        if verdict.status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="onceonly dashboard"'
        return response

    # -- pages
    async def page_overview(self, request: Request, args: list[str]) -> Response:
        window_name = request.query_params.get("window", "1h")
        window = _WINDOWS.get(window_name, 3600.0)
        data = await self._summary(window)
        return self.render(
            request,
            "overview.html",
            s=data,
            states=[s.value for s in State],
            chart=_rate_chart(data),
            lateness=_lateness_chart(data.lateness),
            windows=list(_WINDOWS),
            window_name=window_name if window_name in _WINDOWS else "1h",
        )

    async def page_records(self, request: Request, args: list[str]) -> Response:
        filters = _views.Filters.parse(request.query_params)
        if "limit" not in request.query_params:
            filters = _replace_limit(filters, self.page_size)
        records, cursor = await self._page(filters)
        next_url = self.url(request, "records", filters.params(after=cursor)) if cursor else ""
        first_url = self.url(request, "records", filters.params(after="")) if filters.after else ""
        return self.render(
            request,
            "records.html",
            f=filters,
            records=records,
            next_url=next_url,
            first_url=first_url,
            states=[s.value for s in State],
            now=time.time(),
            redrive_url=(
                self.url(request, "redrive", filters.params(after=""))
                if filters.state in ("dead", "failed")
                else ""
            ),
        )

    async def page_record(self, request: Request, args: list[str]) -> Response:
        scope, key = args
        record = await self.admin.show(scope, key)
        if record is None:
            return self._error(request, 404, "no such record (deleted, or never stored)")
        fields = _views.record_json(record, full=True)
        now = await self.admin.clock()
        lapsed = record.state is State.IN_PROGRESS and (
            record.lease_until is None or record.lease_until <= now
        )
        return self.render(
            request,
            "record.html",
            r=record,
            fields=fields,
            can_redrive=record.state in (State.DEAD, State.FAILED),
            can_release=lapsed,
            lease_live=record.state is State.IN_PROGRESS and not lapsed,
        )

    async def form_record_action(self, request: Request, args: list[str]) -> Response:
        form = await self._form(request)
        if isinstance(form, Response):
            return form
        refused = self._refused(request, form)
        if refused is not None:
            return refused
        scope, key, action = args
        if action == "delete" and form.get("confirm") != "yes":
            return self._error(request, 400, "tick the confirmation box to delete a record")
        done = await self._act(scope, key, action)
        if done is None:
            return self._error(request, 404, f"unknown action {action!r}")
        if not done:
            return self._error(
                request,
                409,
                f"not {action}d: the record is absent, not in a state that allows it, or a"
                " worker changed it meanwhile. Reload the record and try again.",
            )
        target = (
            self.url(request, "records", {"scope": scope})
            if action == "delete"
            else self.record_url(request, scope, key)
        )
        return _see_other(target + ("&" if "?" in target else "?") + f"done={action}")

    async def page_redrive(self, request: Request, args: list[str]) -> Response:
        filters = _views.Filters.parse(request.query_params)
        if filters.state not in ("dead", "failed"):
            return self._error(request, 400, "a filtered redrive needs state dead or failed")
        count = await self.admin.redrive_matching(filters.query(limit=500), dry_run=True)
        return self.render(
            request,
            "redrive.html",
            f=filters,
            count=count,
            back=self.url(request, "records", filters.params(after="")),
        )

    async def form_redrive(self, request: Request, args: list[str]) -> Response:
        form = await self._form(request)
        if isinstance(form, Response):
            return form
        refused = self._refused(request, form)
        if refused is not None:
            return refused
        filters = _views.Filters.parse(form)
        if filters.errors or filters.state not in ("dead", "failed"):
            return self._error(request, 400, "a filtered redrive needs state dead or failed")
        if form.get("confirm") != "yes":
            return self._error(request, 400, "confirm the redrive on the confirmation page")
        n = await self.admin.redrive_matching(filters.query(limit=500))
        params = filters.params(after="", state="failed", done="redrive", n=str(n))
        return _see_other(self.url(request, "records", params))

    async def page_outbox(self, request: Request, args: list[str]) -> Response:
        box = await _views.outbox_summary(self.store, self.outbox_table) if self.outbox else None
        rows = []
        if box is not None:
            from onceonly.outbox_async import AsyncOutbox

            rows = await AsyncOutbox(self.store, table=self.outbox_table).rows("dead", 200)
        return self.render(request, "outbox.html", box=box, rows=rows)

    async def form_outbox(self, request: Request, args: list[str]) -> Response:
        form = await self._form(request)
        if isinstance(form, Response):
            return form
        refused = self._refused(request, form)
        if refused is not None:
            return refused
        n = await self._outbox_redrive(form.get("id") or None)
        if n is None:
            return self._error(request, 404, "this store has no outbox")
        return _see_other(self.url(request, "outbox", {"done": "outbox", "n": str(n)}))

    async def page_login(self, request: Request, args: list[str]) -> Response:
        return self.render(
            request,
            "login.html",
            next=_safe_next(request.query_params.get("next", "")),
            failed=False,
        )

    async def form_login(self, request: Request, args: list[str]) -> Response:
        form = await self._form(request)
        if isinstance(form, Response):
            return form
        target = _safe_next(form.get("next", ""))
        if not self.auth.enabled:
            return self._error(request, 403, "read-only: no token is configured")
        if not self.auth.token_matches(form.get("token", "")):
            return self.render(request, "login.html", status=403, next=target, failed=True)
        response = _see_other(target or self.url(request, "", {"done": "login"}))
        response.set_cookie(
            COOKIE,
            self.auth.new_session(),
            max_age=SESSION_SECONDS,
            path=(request.scope.get("root_path", "").rstrip("/") or "") + "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def form_logout(self, request: Request, args: list[str]) -> Response:
        response = _see_other(self.url(request, "", {"done": "logout"}))
        response.delete_cookie(
            COOKIE, path=(request.scope.get("root_path", "").rstrip("/") or "") + "/"
        )
        return response

    async def static(self, request: Request, args: list[str]) -> Response:
        if args != ["dashboard.css"]:
            return self._error(request, 404, "not found")
        return Response(
            self.css,
            media_type="text/css",
            headers={"Cache-Control": "public, max-age=3600"},
        )

    # -- the JSON API
    async def api_summary(self, request: Request, args: list[str]) -> Response:
        window = _WINDOWS.get(request.query_params.get("window", "1h"), 3600.0)
        return JSONResponse((await self._summary(window)).json())

    async def api_records(self, request: Request, args: list[str]) -> Response:
        filters = _views.Filters.parse(request.query_params)
        if filters.errors:
            return JSONResponse({"error": "; ".join(filters.errors)}, status_code=400)
        records, cursor = await self._page(filters)
        return JSONResponse(
            {"records": [_views.record_json(r) for r in records], "next": cursor or None}
        )

    async def api_record(self, request: Request, args: list[str]) -> Response:
        record = await self.admin.show(*args)
        if record is None:
            return JSONResponse({"error": "no such record"}, status_code=404)
        return JSONResponse(_views.record_json(record, full=True))

    async def api_record_action(self, request: Request, args: list[str]) -> Response:
        refused = self._refused(request, None)
        if refused is not None:
            return refused
        scope, key, action = args
        done = await self._act(scope, key, action)
        if done is None:
            return JSONResponse({"error": f"unknown action {action!r}"}, status_code=404)
        record = await self.admin.show(scope, key)
        body = {
            "done": done,
            "action": action,
            "record": None if record is None else _views.record_json(record, full=True),
        }
        return JSONResponse(body, status_code=200 if done else 409)

    async def api_redrive(self, request: Request, args: list[str]) -> Response:
        refused = self._refused(request, None)
        if refused is not None:
            return refused
        filters = _views.Filters.parse(request.query_params)
        if filters.errors or filters.state not in ("dead", "failed"):
            return JSONResponse(
                {"error": "state=dead or state=failed is required"}, status_code=400
            )
        dry_run = request.query_params.get("dry_run", "") in ("1", "true", "yes")
        n = await self.admin.redrive_matching(filters.query(limit=500), dry_run=dry_run)
        return JSONResponse({"dry_run": dry_run, "matched" if dry_run else "redriven": n})

    async def api_outbox(self, request: Request, args: list[str]) -> Response:
        state = request.query_params.get("state", "dead")
        if state not in ("dead", "pending"):
            return JSONResponse({"error": "state is dead or pending"}, status_code=400)
        box = await _views.outbox_summary(self.store, self.outbox_table) if self.outbox else None
        if box is None:
            return JSONResponse({"error": "this store has no outbox"}, status_code=404)
        from onceonly.outbox_async import AsyncOutbox

        try:
            limit = min(500, max(1, int(request.query_params.get("limit", "100"))))
        except ValueError:
            return JSONResponse({"error": "limit is not a whole number"}, status_code=400)
        rows = await AsyncOutbox(self.store, table=self.outbox_table).rows(state, limit)
        return JSONResponse(
            {
                **box,
                "rows": [
                    {
                        "id": r.message.id,
                        "topic": r.message.topic,
                        "key": r.message.key,
                        "attempts": r.message.attempts,
                        "created_at": _views.iso(r.message.created_at),
                        "last_error": r.last_error,
                        "payload": r.message.payload,
                    }
                    for r in rows
                ],
            }
        )

    async def api_outbox_redrive(self, request: Request, args: list[str]) -> Response:
        refused = self._refused(request, None)
        if refused is not None:
            return refused
        n = await self._outbox_redrive(args[0] if args else None)
        if n is None:
            return JSONResponse({"error": "this store has no outbox"}, status_code=404)
        return JSONResponse({"redriven": n}, status_code=200 if n or not args else 409)

    # -- shared reads and writes
    async def _summary(self, window: float) -> _views.Summary:
        return await _views.summary(
            self.admin, window=window, points=12, outbox_table=self.outbox_table, outbox=self.outbox
        )

    async def _page(self, filters: _views.Filters) -> tuple[list[Any], str]:
        # one more than a page tells whether a next page exists
        records = (await self.admin.records.scan(filters.query(limit=filters.limit + 1)))[0]
        page = records[: filters.limit]
        more = len(records) > filters.limit
        cursor = _views.encode_cursor((page[-1].scope, page[-1].key)) if more and page else ""
        return page, cursor

    async def _act(self, scope: str, key: str, action: str) -> bool | None:
        """Run one fenced record action; ``None`` for an unknown action."""
        if action == "redrive":
            return await self.admin.redrive(scope, key) is not None
        if action == "release":
            return await self.admin.release(scope, key) is not None
        if action == "delete":
            return await self.admin.delete(scope, key)
        return None

    async def _outbox_redrive(self, message_id: str | None) -> int | None:
        if not self.outbox or await _views.outbox_summary(self.store, self.outbox_table) is None:
            return None
        from onceonly.outbox_async import AsyncOutbox

        return await AsyncOutbox(self.store, table=self.outbox_table).redrive(message_id)


def _route(parts: list[str]) -> tuple[str, list[str]]:
    """The route name and its arguments for the path's segments."""
    api = bool(parts) and parts[0] == "api"
    rest = parts[1:] if api else parts
    prefix = "api-" if api else ""
    if not rest:
        return ("" if not api else "api-"), []
    head = rest[0]
    if head == "records" and len(rest) == 3:
        return prefix + "record", rest[1:]
    if head == "records" and len(rest) == 4:
        return prefix + "record-action", rest[1:]
    if head == "outbox" and api and len(rest) == 2 and rest[1] == "redrive":
        return "api-outbox-redrive", []
    if head == "outbox" and api and len(rest) == 3 and rest[2] == "redrive":
        return "api-outbox-redrive", [rest[1]]
    if head in ("records", "outbox", "redrive", "summary", "login", "logout") and len(rest) == 1:
        return prefix + head, []
    if head == "static" and not api:
        return "static", rest[1:]
    return prefix + "?" + head, []


def _see_other(url: str) -> Response:
    return RedirectResponse(url, status_code=303)


def _wants_json(request: Request) -> bool:
    return bool(request.scope.get("onceonly.api")) or "application/json" in request.headers.get(
        "accept", ""
    )


def _safe_next(target: str) -> str:
    """Only a path on this site: never ``//host``, ``https://…``, nor one a browser would
    turn into either (it drops tabs and newlines and reads ``\\`` as ``/``)."""
    if any(ord(c) < 0x21 or c in "\\\x7f" for c in target):
        return ""
    if target.startswith("/") and not target.startswith("//"):
        return target
    return ""


def _replace_limit(filters: _views.Filters, limit: int) -> _views.Filters:
    import dataclasses

    return dataclasses.replace(filters, limit=limit)


def _age(seconds: float | None) -> str:
    """A short human duration (``42s``, ``7m``, ``3h 5m``, ``2d 4h``)."""
    if seconds is None:
        return "-"
    s = int(max(0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def _rate_chart(s: _views.Summary) -> dict[str, Any]:
    """Bars of the duplicate rate per scope and interval, for the SVG."""
    scopes = sorted({name for p in s.duplicates for name in p.counts})
    rows: list[dict[str, Any]] = []
    every_bar: list[dict[str, Any]] = []
    for name in scopes:
        bars: list[dict[str, Any]] = []
        for i, p in enumerate(s.duplicates):
            claims, replays = p.counts.get(name, (0, 0))
            bars.append(
                {
                    "i": i,
                    "rate": p.rate(name),
                    "claims": claims,
                    "replays": replays,
                    "start": _views.iso(p.start),
                }
            )
        every_bar += bars
        total_claims = sum(p.counts.get(name, (0, 0))[0] for p in s.duplicates)
        total_replays = sum(p.counts.get(name, (0, 0))[1] for p in s.duplicates)
        rows.append(
            {
                "scope": name,
                "bars": bars,
                "claims": total_claims,
                "replays": total_replays,
                "rate": total_replays / total_claims if total_claims else None,
            }
        )
    top = max((b["rate"] or 0.0 for b in every_bar), default=0.0)
    scale = next(x for x in (0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0) if top <= x)
    for b in every_bar:  # bar heights in pixels, the largest rate near the top
        b["height"] = None if b["rate"] is None else round(b["rate"] / scale * 46, 1)
    return {"rows": rows, "points": len(s.duplicates), "scale": scale}


def _lateness_chart(report: LatenessReport | None) -> dict[str, Any] | None:
    """Bars of the duplicate-lateness histogram (duplicates per bin, the ttl bins last)
    and a row per scope, for the SVG; ``None`` when nothing was recorded."""
    if report is None:
        return None
    top = max(report.bins[b] for b in DUPLICATE_BINS) or 1
    bars = []
    for i, b in enumerate(DUPLICATE_BINS):
        n = report.bins[b]
        height = round(n / top * 120, 1)
        kind = "near" if b == NEAR_TTL else "half" if b == HALF_TTL else "bar"
        bars.append(
            {"bin": b, "i": i, "label": BIN_LABELS[b], "n": n, "height": height, "kind": kind}
        )
    ttls = sorted({t for t in report.ttl.values() if t is not None})
    rows = []
    for scope, counts in sorted(report.by_scope.items()):
        total = sum(counts.values())
        late = counts[HALF_TTL] + counts[NEAR_TTL]
        rows.append(
            {
                "scope": scope,
                "total": total,
                "half": counts[HALF_TTL],
                "near": counts[NEAR_TTL],
                "late_share": late / total if total else None,
                "ttl": _age(report.ttl[scope]) if report.ttl.get(scope) is not None else "none",
            }
        )
    return {
        "bars": bars,
        "ttl": ", ".join(_age(t) for t in ttls) if ttls else None,
        "total": report.duplicates,
        "unknown": report.bins[UNKNOWN],
        "rows": rows,
        "width": len(bars) * 60 + 40,
    }


def build(
    store: Any,
    *,
    token: str | None,
    title: str,
    outbox: bool,
    outbox_table: str | None,
    page_size: int,
) -> Dashboard:
    """Validate the options and build the app (see :func:`onceonly.dashboard.app`)."""
    if page_size < 1 or page_size > _views.MAX_LIMIT:
        raise ConfigurationError(f"page_size must be between 1 and {_views.MAX_LIMIT}")
    return Dashboard(
        store, token=token, title=title, outbox=outbox, outbox_table=outbox_table,
        page_size=page_size,
    )  # fmt: skip
