"""The runner's Python before and after its RUN filter (sandbox/runner.py `_quiet_python`):
source lines stay readable until the filter is on (Triton's JIT reads its kernels' source through
linecache at decoration: with no lines every Triton candidate failed to load on a GPU), and once
it is on nothing reads or stats a file for them (a refused openat would end the runner)."""
import subprocess
import sys
import textwrap


def test_source_lines_until_the_filter_then_none(tmp_path):
    (tmp_path / "cand_a.py").write_text("def f():\n    return 1\n")
    (tmp_path / "cand_b.py").write_text("def g():\n    return 2 // 0\n")
    code = textwrap.dedent(f"""
        import inspect, linecache, os, sys
        sys.path.insert(0, {str(tmp_path)!r})
        from kforge_tui.sandbox import runner
        runner._quiet_python()
        import cand_a, cand_b
        assert "return 1" in inspect.getsource(cand_a.f)  # read as usual before the filter
        runner._FILTERED = True
        assert "return 1" in inspect.getsource(cand_a.f)  # read once: served from the cache
        opened = []
        real_open = open
        import builtins, io
        def spy(*a, **k):
            opened.append(a[0])
            return real_open(*a, **k)
        builtins.open = io.open = spy
        os.stat = lambda *a, **k: opened.append(a[0])
        import traceback
        assert linecache.getlines(cand_b.__file__) == []
        try:
            cand_b.g()  # raises inside cand_b: its traceback has a frame there
        except ZeroDivisionError as e:
            text = "".join(traceback.format_exception(e))
        assert "cand_b" in text and "return 2" not in text
        linecache.checkcache()
        assert not [p for p in opened if "cand_b" in str(p)], opened
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_a_signal_handler_in_installed_library_code_is_that_librarys_own():
    """LLVM's crash handlers, installed by Triton's first compile in a runner, point into
    libtriton's code: excused there by address (what the code is), never elsewhere."""
    from kforge_tui.sandbox.backends import probe

    n = probe.NSIG
    before = {"signals": [0] * (2 * n) + [0]}
    after = {"signals": list(before["signals"])}
    after["signals"][2 * (1 - 1)] = 0x7000_1234  # SIGHUP's handler: inside the library's code
    assert probe.diff(before, after, handler_code=((0x7000_0000, 0x7100_0000),)) == []
    assert probe.diff(before, after) == ["signal handler changed for SIGHUP"]
    after["signals"][2 * (2 - 1)] = 0x5555_0000  # SIGINT's: anywhere else is a change
    assert probe.diff(before, after, handler_code=((0x7000_0000, 0x7100_0000),)) == \
        ["signal handler changed for SIGINT"]


def test_library_code_lists_only_installed_executable_mappings():
    from kforge_tui.sandbox import runner

    import torch  # noqa: F401  (maps libtorch's code from site-packages)

    got = runner._library_code("libtorch")
    assert got and all(lo < hi for lo, hi in got)
    assert runner._library_code("no-such-library-name") == ()
