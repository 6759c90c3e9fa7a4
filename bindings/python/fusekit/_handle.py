"""The base of every object that owns one C handle (contexts, streams, buffers,
and runtime.py's events and communicators)."""

from __future__ import annotations

from ._lib import ERROR_INVALID_ARGUMENT, raise_error


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

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
