"""Default run directories: runs started in the same second (a script, a parallel test suite)
each get their own, and the one that loses the race for a name takes the next."""
from __future__ import annotations

import stat
from concurrent.futures import ThreadPoolExecutor

from kforge_tui.run_settings import OptimizeSettings, default_run_dir, reserve_run_dir


def test_a_taken_default_run_dir_is_passed_over(tmp_path):
    s = OptimizeSettings(model="models/tiny.py:build", run_root=str(tmp_path))
    first = default_run_dir(s)
    assert first.parent == tmp_path and first.name.startswith("tiny-")
    first.mkdir()
    second = default_run_dir(s)
    assert second != first and not second.exists()
    assert second.name == f"{first.name}-2" or second.name[:len("tiny-20261202-000000")] != first.name


def test_runs_reserving_at_once_get_distinct_private_dirs(tmp_path):
    s = OptimizeSettings(model="tiny.py", run_root=str(tmp_path / "runs"))
    with ThreadPoolExecutor(max_workers=8) as pool:
        dirs = list(pool.map(lambda _: reserve_run_dir(s), range(24)))
    assert len(set(dirs)) == 24
    for d in dirs:
        assert d.is_dir() and stat.S_IMODE(d.stat().st_mode) == 0o700
        assert not any(d.iterdir())  # reserved empty: the store fills it
