"""What every benchmark records about the code it timed, without torch or jax."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git_commit(root=ROOT) -> str:
    """The checkout's short commit, with " (+ uncommitted changes)" when tracked files
    differ from it; "unknown" without git history (the GPU machine's copy)."""
    commit = "unknown"
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        if dirty:
            commit += " (+ uncommitted changes)"
    except Exception:  # noqa: BLE001
        pass
    return commit
