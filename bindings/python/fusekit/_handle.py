"""The base of every object that owns one C handle (contexts, streams, buffers,
and runtime.py's events and communicators), and the read-only attributes they
expose."""

from __future__ import annotations

from operator import attrgetter

from ._lib import ERROR_INVALID_ARGUMENT, raise_error


def _readonly(attr: str, doc: str | None = None) -> property:
    """A read-only property whose value is ``self.<attr>`` (a dotted path too:
    ``"_context.device"``)."""
    p = property(attrgetter(attr))
    p.__doc__ = doc  # not attrgetter's
    return p


class _Handle:
    """Owns one C handle: ``handle`` (raises once closed), ``closed``, an idempotent
    ``close`` (destroys the handle, then drops what ``_after_close`` releases), a
    context manager, and release on garbage collection. Subclasses set ``_handle``
    and ``_destroy`` and name themselves in ``_where`` / ``_noun``."""

    _handle = None
    _where = "fusekit"
    _noun = "handle"

    @property
    def handle(self):
        """The C handle (raises once closed)."""
        h = self._handle
        if h is None:
            raise_error(ERROR_INVALID_ARGUMENT, self._where, f"the {self._noun} is closed")
        return h

    @property
    def closed(self) -> bool:
        return self._handle is None

    def close(self) -> None:
        """Releases the handle (idempotent)."""
        h, self._handle = self._handle, None
        if h is not None:
            self._destroy(h)
        self._after_close()

    def _after_close(self) -> None:
        pass

    @classmethod
    def _arg(cls, obj, where: str, name: str):
        """``obj`` when it is a ``cls``, else InvalidArgumentError "<name> must be a
        fusekit.<cls>"."""
        if not isinstance(obj, cls):
            raise_error(ERROR_INVALID_ARGUMENT, where, f"{name} must be a fusekit.{cls.__name__}, got {type(obj).__name__}")
        return obj

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
