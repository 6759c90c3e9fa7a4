"""Module paths that moved, kept as aliases for one release: importing one emits a
:class:`DeprecationWarning` that names the new module (docs/nn.md lists them)."""

import warnings


def moved(old: str, new: str) -> None:
    """Warns that module ``old`` is now ``new``. Called from ``old``'s body: the
    warning points at the code that imported ``old`` (``warnings`` skips the
    import machinery's frames), so Python's default filters show it where that
    code is ``__main__``."""
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release: use {new}",
        DeprecationWarning,
        stacklevel=3,
    )
