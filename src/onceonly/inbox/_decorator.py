# SPDX-License-Identifier: MIT
"""``@idempotent``: leased mode for plain functions, sync or async.

The scope (the namespace of the keys) defaults to ``module.qualname`` only where that
name is stable and names one function: never for a function made inside another
function or a lambda (every function a factory makes would share one name, so one
tenant could be replayed another's result) and never in ``__main__`` (the same
function imported under its real module name would get other records). Those need an
explicit ``scope=``; without one, decorating raises :class:`~onceonly.ConfigurationError`
(docs/spec.md §1.7).
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
import typing
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, ParamSpec, TypeVar

from onceonly._core import codec
from onceonly._core.durations import seconds
from onceonly._core.fingerprint import fingerprint as fingerprint_of
from onceonly._core.keys import validate_key
from onceonly._core.state import Policy
from onceonly.errors import ConfigurationError
from onceonly.events import Listener
from onceonly.inbox._leased import LeasedRunner
from onceonly.inbox._leased_async import AsyncLeasedRunner
from onceonly.inbox._running import refuse_nested

__all__ = ["idempotent"]

P = ParamSpec("P")
R = TypeVar("R")


def _is_async_store(store: object) -> bool:
    return inspect.iscoroutinefunction(getattr(store, "migrate", None))


def _name(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))


def _default_scope(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of ``fn``, or :class:`ConfigurationError` where it is unsafe."""
    qualname = getattr(fn, "__qualname__", None)
    module = getattr(fn, "__module__", None)
    if not isinstance(qualname, str) or not isinstance(module, str):
        raise ConfigurationError(
            f"{fn!r} has no module and qualified name to scope its keys: "
            "pass idempotent(..., scope='name') naming what it does"
        )
    name = f"{module}.{qualname}"
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise ConfigurationError(
            f"{name} is a lambda or is defined inside a function: every function made "
            "there would share one scope and replay each other's results. Pass "
            "idempotent(..., scope='...') with a name unique to this function (include "
            "the tenant or whatever the factory varies)"
        )
    if module == "__main__":
        raise ConfigurationError(
            f"{name} is defined in __main__: its default scope would change when the "
            "module is imported under its own name, and every key would run again. Pass "
            "idempotent(..., scope='...') with a stable name"
        )
    return name


def _return_type(fn: Callable[..., Any]) -> Any:
    try:
        hint = typing.get_type_hints(fn).get("return")
    except Exception:
        return None
    if typing.get_origin(hint) is Coroutine:
        hint = typing.get_args(hint)[-1]
    return hint


class _Idempotent:
    def __init__(
        self,
        store: Any,
        key: Callable[..., str],
        *,
        scope: str | None,
        ttl: dt.timedelta | float | None,
        lease: dt.timedelta | float,
        max_attempts: int,
        wait: dt.timedelta | float,
        fingerprint: Callable[..., Any] | None,
        check_arguments: bool,
        cache_errors: tuple[type[BaseException], ...],
        max_result_bytes: int,
        listeners: Iterable[Listener] = (),
    ) -> None:
        if max_attempts < 1:
            raise ConfigurationError("max_attempts must be at least 1")
        self.store = store
        self.key = key
        self.scope = scope
        self.ttl = None if ttl is None else seconds(ttl, what="ttl")
        self.policy = Policy(seconds(lease, what="lease"), max_attempts)
        self.wait = seconds(wait, what="wait", allow_inf=True, allow_zero=True)
        self.fingerprint = fingerprint
        self.check_arguments = check_arguments
        self.cache_errors = cache_errors
        self.max_result_bytes = codec.checked_max_bytes(max_result_bytes)
        self.listeners = tuple(listeners)

    def _fp(
        self, sig: inspect.Signature, names: tuple[str, ...] | None, args: Any, kwargs: Any
    ) -> tuple[str | None, Any]:
        """The fingerprint of a call and the arguments kept as its payload snapshot.

        ``names``: the parameters when all are positional (no ``*args``, keyword-only or
        ``**kwargs``); a call passing each of them positionally binds without
        ``Signature.bind`` (the same mapping, in the same order).
        """
        if names is not None and not kwargs and len(args) == len(names):
            arguments = dict(zip(names, args, strict=True))
        else:
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
        if self.fingerprint is not None:
            return fingerprint_of(self.fingerprint(*args, **kwargs)), arguments
        if not self.check_arguments:
            return None, arguments
        return fingerprint_of(arguments), arguments

    def __call__(self, fn: Callable[P, Any]) -> Callable[P, Any]:
        is_async = inspect.iscoroutinefunction(fn)
        if is_async and not _is_async_store(self.store):
            raise ConfigurationError(
                f"{_name(fn)} is async: give idempotent() an async store "
                "(onceonly.open_async_store)"
            )
        if not is_async and _is_async_store(self.store):
            raise ConfigurationError(
                f"{_name(fn)} is sync: give idempotent() a sync store (onceonly.open_store)"
            )
        scope = validate_key(
            self.scope if self.scope is not None else _default_scope(fn), what="scope"
        )
        sig = inspect.signature(fn)
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        names = (
            tuple(sig.parameters)
            if all(p.kind in positional for p in sig.parameters.values())
            else None
        )
        opts: dict[str, Any] = {
            "scope": scope,
            "policy": self.policy,
            "ttl": self.ttl,
            "wait": self.wait,
            "cache_errors": self.cache_errors,
            "max_result_bytes": self.max_result_bytes,
            "result_type": _return_type(fn),
            "listeners": self.listeners,
        }
        what = f"@idempotent {scope}"
        if is_async:
            arunner = AsyncLeasedRunner(self.store, **opts)

            @functools.wraps(fn)
            async def awrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                refuse_nested(self.store, what)
                key = validate_key(self.key(*args, **kwargs))
                fp, arguments = self._fp(sig, names, args, kwargs)
                result, _, _ = await arunner.run(key, fp, lambda: fn(*args, **kwargs), arguments)
                return result

            return awrapper
        runner = LeasedRunner(self.store, **opts)

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            refuse_nested(self.store, what)
            key = validate_key(self.key(*args, **kwargs))
            fp, arguments = self._fp(sig, names, args, kwargs)
            result, _, _ = runner.run(key, fp, lambda: fn(*args, **kwargs), arguments)
            return result

        return wrapper


def idempotent(
    store: Any,
    *,
    key: Callable[..., str],
    scope: str | None = None,
    ttl: dt.timedelta | float | None = dt.timedelta(days=7),
    lease: dt.timedelta | float = dt.timedelta(seconds=30),
    max_attempts: int = 5,
    wait: dt.timedelta | float = 5.0,
    fingerprint: Callable[..., Any] | None = None,
    check_arguments: bool = True,
    cache_errors: tuple[type[BaseException], ...] = (),
    max_result_bytes: int = codec.DEFAULT_MAX_BYTES,
    listeners: Iterable[Listener] = (),
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Run the decorated function once per key; duplicates get the stored result.

    Leased mode: the claim commits with a lease on the store's clock and a fencing
    token, renewed in the background while the function runs; completion is
    conditional on the token. Works on sync functions with a sync store and on
    ``async def`` functions with an async store.

    Args:
        store: a store from :func:`onceonly.open_store` / :func:`onceonly.open_async_store`.
        key: computes the idempotency key from the call's arguments.
        scope: the namespace of the keys. The default, ``module.qualname``, is refused
            for lambdas, functions defined inside functions and functions in
            ``__main__``: pass a stable name unique to the function there.
        ttl: how long a completed result is replayed (``None``: for ever).
        lease: how long a claim is held without renewal before another call may take it.
        max_attempts: failed runs after which the key is dead-lettered.
        wait: how long a duplicate waits for a running call before :class:`InFlight`
            (0: raise it at once).
        fingerprint: computes what identifies the payload (default: all arguments).
        check_arguments: compare the arguments of duplicates (``PayloadMismatch``).
        cache_errors: exception classes stored and re-raised to duplicates.
        max_result_bytes: the largest encoded result stored (:class:`TooLarge`).
        listeners: callables handed an :class:`~onceonly.events.Event` per call
            (completed, replayed, lease renewals and losses, …); errors logged.

    Returns:
        A decorator keeping the function's signature.

    Raises:
        ConfigurationError: a sync function with an async store, or the reverse; no
            ``scope`` for a lambda, a function defined inside a function or a function
            in ``__main__`` (raised when decorating).

    .. versionadded:: 0.1
    .. versionchanged:: 0.2 ``listeners``.
    """
    return _Idempotent(
        store,
        key,
        scope=scope,
        ttl=ttl,
        lease=lease,
        max_attempts=max_attempts,
        wait=wait,
        fingerprint=fingerprint,
        check_arguments=check_arguments,
        cache_errors=cache_errors,
        max_result_bytes=max_result_bytes,
        listeners=listeners,
    )
