"""Helpers of test_foreign_arrays.py and test_foreign_gpu.py."""

from fusekit import _buffer


def record_allocations(monkeypatch) -> list:
    """Makes ``fusekit.Buffer.empty`` append the address of every buffer it makes
    to the returned list (for the zero-copy checks: a result that is fusekit's
    allocation has one of these addresses)."""
    made = []
    real = _buffer.Buffer.empty.__func__

    def spy(cls, *a, **k):
        b = real(cls, *a, **k)
        made.append(b.data_ptr)
        return b

    monkeypatch.setattr(_buffer.Buffer, "empty", classmethod(spy))
    return made
