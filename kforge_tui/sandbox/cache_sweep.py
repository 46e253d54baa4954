"""Sweeps the shared compile cache of what killed compiles left behind.

A compile's temp dir is removed by its own process; one whose process was killed (`kill -9` of
the owner: no `finally` runs) stays in the cache that every run shares."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

# Older than this, no compile can still be writing a temp dir (the compile timeout is minutes).
STALE_TMP_S = 24 * 3600
swept: set[str] = set()  # cache dirs already swept by this process


def sweep_stale(cache: Path) -> None:
    """Remove the cache's temp dirs older than STALE_TMP_S, once per process and cache dir."""
    swept.add(str(cache))
    now = time.time()
    try:
        found = [d for d in cache.iterdir() if d.name.startswith(".tmp-")]
    except OSError:
        return  # no cache yet, or unreadable: the compile reports that itself
    for d in found:
        try:
            if now - d.stat().st_mtime > STALE_TMP_S:
                shutil.rmtree(d, ignore_errors=True)
        except OSError:
            pass
