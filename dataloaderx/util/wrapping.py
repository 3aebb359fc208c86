"""Pieces shared by the objects that wrap a user's iterable or iterator."""

from __future__ import annotations

from types import TracebackType
from typing import Any, TypeVar

C = TypeVar("C", bound="ClosesOnExit")


class ClosesOnExit:
    """Mixin: ``with obj:`` calls ``obj.close()`` on the way out."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: C) -> C:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def delegate(wrapped: object, name: str, own: frozenset[str]) -> Any:
    """Read ``name`` from ``wrapped``, for the wrapper's ``__getattr__``. Dunder names and the
    wrapper's ``own`` attributes raise ``AttributeError``, so a half-built or unpickled
    wrapper never recurses."""
    if name.startswith("__") or name in own:
        raise AttributeError(name)
    return getattr(wrapped, name)
