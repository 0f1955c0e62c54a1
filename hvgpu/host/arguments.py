"""The kinds of value a control operation's arguments may hold, checked before it runs.

A control call arrives as JSON from any member of the control group, so an
argument may be a list where a count belongs, or ``true`` where a size does.
Checked here, against the ControlAPI method's own annotations, such a call is
refused as a bad request naming the argument, instead of failing deep in the
slice manager with a traceback. An unannotated argument (a size, a share, a GPU
named by index or UUID) takes one JSON scalar: a string or a number. Must not
parse or range-check values: the API's own parsers do, with their own words.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing

_SCALARS = (str, int, float)


def _allowed(hint) -> tuple[type, ...] | None:
    """The Python types a JSON value for ``hint`` may have; None: any scalar."""
    if hint is inspect.Parameter.empty:
        return None
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        kinds: tuple[type, ...] = ()
        for arm in typing.get_args(hint):
            kinds += _allowed(arm) or _SCALARS
        return kinds
    if hint is type(None):
        return (type(None),)
    if hint is float:
        return (int, float)
    return (hint,) if isinstance(hint, type) else None


@functools.lru_cache(maxsize=None)
def _kinds(func) -> dict[str, tuple[type, ...] | None]:
    hints = typing.get_type_hints(func)
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {name: _allowed(hints.get(name, inspect.Parameter.empty))
            for name, p in inspect.signature(func).parameters.items()
            if name != "self" and p.kind in named}


def _kind_name(value) -> str:
    return {bool: "true/false", int: "a number", float: "a number", str: "a string",
            list: "a list", dict: "an object", type(None): "null"}.get(type(value),
                                                                       type(value).__name__)


def check(method, named: dict) -> None:
    """Raise TypeError (a bad request) naming the first argument in ``named`` whose
    value is not of a kind ``method`` takes there. ``None`` always passes: it means
    the argument's default."""
    kinds = _kinds(getattr(method, "__func__", method))
    for name, value in named.items():
        if value is None or name not in kinds:
            continue
        allowed = kinds[name]
        if allowed is None:
            ok = isinstance(value, _SCALARS) and not isinstance(value, bool)
            want = "a string or a number"
        else:
            # bool is an int to Python, never to a caller: true is not a count
            ok = isinstance(value, allowed) and (bool in allowed or not isinstance(value, bool))
            want = " or ".join(sorted({_kind_name(k()) if k is not type(None) else "null"
                                       for k in allowed}))
        if not ok:
            raise TypeError(f"argument {name!r} takes {want}, "
                            f"not {_kind_name(value)}")
