"""Argument checks shared by the public entry points: one wording, one place.

Every size-like argument has a documented range (README, "Limits of the
arguments"), checked where it is given, before anything is allocated or
written: a wrong type raises ``TypeError``, a value outside its range
``ValueError`` naming the range and the value. Each range's bound is derived
where it is defined, next to the code it protects.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

__all__ = ["check_flag", "check_int", "check_state_int", "check_verify"]


def check_int(name: str, value: Any, low: int, high: int | None = None) -> int:  # Any: checked here
    """``value`` as a Python int in ``low..high`` (no upper bound when
    ``high`` is None); bools, floats and strings are refused."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, got bool {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None
    if number < low or (high is not None and number > high):
        limit = f"at least {low}" if high is None else f"in {low}..{high:,}"
        raise ValueError(f"{name} must be {limit}, got {number:,}")
    return number


def check_flag(name: str, value: Any) -> bool:  # Any: checked here
    """``value`` as a bool: only True or False (or a NumPy bool). A string such
    as ``"no"`` is truthy, so taking it would silently do the opposite."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")


def check_verify(value: Any) -> bool | None:  # Any: checked here
    """A ``verify=`` argument: True (check every read), False (none) or None
    (the default: check where it costs little, see the store's docs)."""
    if value is None:
        return None
    try:
        return check_flag("verify", value)
    except TypeError:
        raise TypeError(
            f"verify must be True, False or None (the default: check where it costs little), "
            f"got {type(value).__name__} {value!r}"
        ) from None


def check_state_int(name: str, value: Any, high: int) -> int:  # Any: checked here
    """A number read from a checkpoint, an int in ``0..high``: anything else
    means the state is damaged, a ``ValueError`` whatever the type."""
    try:
        return check_int(name, value, 0, high)
    except TypeError as exc:
        raise ValueError(f"{exc}: the state is damaged") from None
