"""Compilation in a subprocess (sandbox/compile.py), with the real nvcc and g++ of this machine,
and the binary check of what was built (link_check)."""
from __future__ import annotations

import asyncio
import ctypes
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kforge_tui.errors import UsageError
from kforge_tui.regions.abi import Signature
from kforge_tui.regions.meta import TensorMeta
from kforge_tui.sandbox.compile import (CompileResult, compile_candidate, compile_candidate_sync,
                                        compile_flags, link_check, parse_error_line, parse_ptxas,
                                        read_elf)
from kforge_tui.sandbox.static import check_source

HONEST = Path(__file__).parent / "cheats" / "honest"
CHEATS = Path(__file__).parent / "cheats"
HAVE_NVCC = shutil.which(os.environ.get("KFORGE_NVCC") or "nvcc") is not None
needs_nvcc = pytest.mark.skipif(not HAVE_NVCC, reason="nvcc is not installed")
CUDA_ARCH = "sm_90"  # nvcc compiles for any arch without a GPU; sm_90 is the H200 target


def _sig(backend: str, shape=(3, 100), n_in: int = 1) -> Signature:
    ins = tuple(TensorMeta(f"in{i}", shape, "float32") for i in range(n_in))
    return Signature(backend, ins, (TensorMeta("out0", shape, "float32"),))


def _header(backend: str, shape=(3, 100)) -> str:
    return _sig(backend, shape).header("test")


def _gn_header(backend: str) -> str:
    x = TensorMeta("in0", (2, 32, 8, 8), "float32")
    return Signature(backend, (x, TensorMeta("in1", (32,), "float32"), TensorMeta("in2", (32,), "float32")),
                     (TensorMeta("out0", (2, 32, 8, 8), "float32"),)).header("gn")


def _exported(lib: str) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def _no_process_mentions(text: str) -> bool:
    """True when no live process has `text` in its command line (the compiler group is gone)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            return False
    return True


# -------------------------------------------------------------------------- flags

def test_compile_flags():
    cuda = compile_flags("cuda", "sm_90")
    assert "-shared" in cuda and "-fPIC" in cuda and "-arch=sm_90" in cuda and "-O3" in cuda
    assert cuda[cuda.index("-Xptxas") + 1] == "-v"
    # the CUDA runtime linked shared: a static cudart imports pthread/dlopen/open into every
    # candidate and the binary check could not tell a candidate's imports from the runtime's
    assert cuda[cuda.index("-cudart") + 1] == "shared"
    assert cuda[cuda.index("-Xlinker") + 1] == "-z,defs"
    assert "-arch=sm_90a" in compile_flags("cuda", "90a")
    cpu = compile_flags("cpu", "native")
    for flag in ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17"):
        assert flag in cpu
    with pytest.raises(UsageError):
        compile_flags("cuda", "hopper; rm -rf /")
    with pytest.raises(UsageError):
        compile_flags("rocm", "gfx90a")


# --------------------------------------------------------------------- ptxas parsing

PTXAS_LOG = """ptxas info    : 16 bytes gmem
ptxas info    : Function properties for _Z6helperf
    24 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
ptxas info    : Compiling entry function '_Z2k1Pf' for 'sm_90'
ptxas info    : Function properties for _Z2k1Pf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function '_Z2k2Pf' for 'sm_90'
ptxas info    : Function properties for _Z2k2Pf
    16 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 128 registers, 4096 bytes smem, 380 bytes cmem[0], 8 bytes cmem[2]
"""


def test_parse_ptxas_max_over_kernels_and_sum_of_spills():
    r = parse_ptxas(PTXAS_LOG)
    assert r["registers"] == 128 and r["smem_bytes"] == 4096 and r["cmem_bytes"] == 400
    assert r["stack_bytes"] == 16 and r["barriers"] == 1 and r["gmem_bytes"] == 16
    assert r["spill_stores"] == 12 and r["spill_loads"] == 20  # includes the device function
    assert r["kernels"] == 2
    assert r["per_kernel"]["_Z2k2Pf"] == {"registers": 128, "smem_bytes": 4096, "cmem_bytes": 388,
                                          "stack_bytes": 16, "spill_stores": 4, "spill_loads": 12,
                                          "barriers": 0}
    assert parse_ptxas("") == {} and parse_ptxas("kernel.cpp:3:1: error: x") == {}


def test_parse_error_line_only_counts_the_candidate_file():
    log = ("/usr/include/foo.h(10): error: bad\nkernel.cu(42): error: identifier \"q\" is undefined\n")
    assert parse_error_line(log, "kernel.cu") == 42
    log = "In file included from kernel.cpp:2:\n/usr/include/x.h:5:3: error: no\nkernel.cpp:7:9: error: y\n"
    assert parse_error_line(log, "kernel.cpp") == 7
    assert parse_error_line("/usr/bin/ld: undefined reference to `foo'", "kernel.cpp") is None


# ----------------------------------------------------------------------- cpu (g++)

def test_cpu_softmax_compiles_to_a_working_library(tmp_path):
    src = (HONEST / "softmax_f32.cpp").read_text()
    sig = _sig("cpu")
    assert check_source(src, sig).ok
    r = compile_candidate_sync(src, "cpu", "native", tmp_path, header=sig.header())
    assert isinstance(r, CompileResult)
    assert r.ok and not r.cached and not r.timed_out and r.status == "ok", r.log
    assert r.lib_path and Path(r.lib_path).is_file() and r.error_line is None
    assert Path(r.lib_path).parent.parent == tmp_path and r.command[0].endswith(("g++", "c++", "clang++"))
    assert "kforge_launch" in _exported(r.lib_path)
    assert (Path(r.lib_path).parent / "kforge_region.h").read_text() == sig.header()
    assert r.link_check_ms is not None and r.link_check_ms < 20 and r.stage == "compile"
    # the library computes softmax (a compile that produced the wrong thing would fail here)
    import torch

    x = torch.randn(3, 100)
    y = torch.full_like(x, float("nan"))
    fn = ctypes.CDLL(r.lib_path).kforge_launch
    fn.restype, fn.argtypes = ctypes.c_int, sig.argtypes()
    assert fn(*sig.call_args([x], [y])) == 0
    torch.testing.assert_close(y, torch.softmax(x, -1))


def test_cpu_group_norm_compiles_with_a_relative_cache_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = compile_candidate_sync((HONEST / "group_norm_f32.cpp").read_text(), "cpu", "native", "cache",
                               header=_gn_header("cpu"))
    assert r.ok and r.resources == {} and "kforge_launch" in _exported(r.lib_path), r.log
    assert os.path.isabs(r.lib_path)  # a worker with another cwd must find it


def test_the_header_is_written_beside_the_candidate_and_keys_the_cache(tmp_path):
    src = (HONEST / "softmax_f32.cpp").read_text()
    missing = compile_candidate_sync(src, "cpu", "native", tmp_path)  # header=None: nothing written
    assert not missing.ok and missing.status == "compile_error" and "kforge_region.h" in missing.log
    a = compile_candidate_sync(src, "cpu", "native", tmp_path, header=_header("cpu", (3, 100)))
    b = compile_candidate_sync(src, "cpu", "native", tmp_path, header=_header("cpu", (4, 64)))
    assert a.ok and b.ok and not b.cached and a.lib_path != b.lib_path  # same source, other shapes
    again = compile_candidate_sync(src, "cpu", "native", tmp_path, header=_header("cpu", (4, 64)))
    assert again.cached and again.lib_path == b.lib_path
    bad = compile_candidate_sync(src, "cpu", "native", tmp_path, header=b"bytes")  # type: ignore[arg-type]
    assert not bad.ok and "header is bytes" in bad.message


def test_temp_dirs_of_a_killed_compile_are_swept_once_old(tmp_path):
    """A compile killed with its owner (`kill -9`) leaves its temp dir in the shared cache; the
    next process that compiles there removes such dirs once they are a day old, and no other."""
    import os
    import time

    from kforge_tui.sandbox import cache_sweep as comp

    old, young = tmp_path / ".tmp-0123456789abcdef-old", tmp_path / ".tmp-0123456789abcdef-new"
    for d in (old, young):
        d.mkdir()
        (d / "kernel.cpp").write_text("// left by a killed compile\n")
    then = time.time() - comp.STALE_TMP_S - 60
    os.utime(old, (then, then))
    comp.swept.discard(str(tmp_path))
    sig = _sig("cpu")
    r = compile_candidate_sync((HONEST / "softmax_f32.cpp").read_text(), "cpu", "native", tmp_path,
                               header=sig.header())
    assert r.ok, r.log
    assert not old.exists() and young.is_dir()
    assert not [d for d in tmp_path.iterdir() if d.name.startswith(".tmp-") and d != young]


def test_the_positional_call_form_of_the_pool_still_works(tmp_path):
    """pool.py calls compile_candidate(source, backend, arch, cache_dir, timeout_s): keep it."""
    src = '#include <stdint.h>\nextern "C" int kforge_launch(const void* const* i, void* const* o) { return 0; }\n'
    r = asyncio.run(compile_candidate(src, "cpu", "native", tmp_path, 60.0))
    assert r.ok and r.to_json()["status"] == "ok"


def test_cpu_compile_error_gives_error_line_and_is_cached(tmp_path):
    src = '#include <stdint.h>\n\nextern "C" int kforge_launch(const float* x) {\n    return undefined_name;\n}\n'
    r = compile_candidate_sync(src, "cpu", "native", tmp_path)
    assert not r.ok and r.lib_path is None and r.error_line == 4 and r.status == "compile_error"
    assert "\n" not in r.message and r.message.startswith("compile error:") and "undefined_name" in r.message
    assert "error" in r.log
    again = compile_candidate_sync(src, "cpu", "native", tmp_path)
    assert again.cached and not again.ok and again.error_line == 4 and again.log == r.log


def test_undefined_function_fails_at_compile_not_at_load(tmp_path):
    src = 'extern "C" int helper_that_does_not_exist();\nextern "C" int kforge_launch() { return helper_that_does_not_exist(); }\n'
    r = compile_candidate_sync(src, "cpu", "native", tmp_path)
    assert not r.ok and "helper_that_does_not_exist" in r.log


def test_cache_hit_is_fast_and_keyed_on_target(tmp_path):
    src = (HONEST / "softmax_f32.cpp").read_text()
    h = _header("cpu")
    first = compile_candidate_sync(src, "cpu", "native", tmp_path, header=h)
    t0 = time.perf_counter()
    hit = compile_candidate_sync(src, "cpu", "native", tmp_path, header=h)
    elapsed = time.perf_counter() - t0
    assert first.ok and not first.cached
    assert hit.cached and hit.ok and hit.lib_path == first.lib_path and elapsed < 0.5
    assert hit.compile_seconds == pytest.approx(first.compile_seconds)
    other = compile_candidate_sync(src, "cpu", "x86-64", tmp_path, header=h)  # another target: another entry
    assert other.ok and not other.cached and other.lib_path != first.lib_path
    changed = compile_candidate_sync(src + "\n// v2\n", "cpu", "native", tmp_path, header=h)
    assert not changed.cached and changed.lib_path != first.lib_path
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


async def test_concurrent_compiles_of_one_source_share_one_compile(tmp_path):
    src = (HONEST / "group_norm_f32.cpp").read_text()
    h = _gn_header("cpu")
    results = await asyncio.gather(*(compile_candidate(src, "cpu", "native", tmp_path, header=h)
                                     for _ in range(4)))
    assert all(r.ok for r in results)
    assert len({r.lib_path for r in results}) == 1
    assert sum(not r.cached for r in results) == 1  # one compiler run, three waiters
    entries = [p for p in tmp_path.iterdir()]
    assert len(entries) == 1 and not entries[0].name.startswith(".tmp")


def test_concurrent_compiles_from_two_processes_do_not_corrupt_the_cache(tmp_path):
    """Two processes (as two engines sharing a cache would) compile one source at once: the
    loser of the rename drops its copy and both get the same, complete library."""
    src_file = tmp_path / "race.cpp"
    src_file.write_text(_standalone_softmax() + "\n// race\n")
    cache = tmp_path / "cache"
    code = ("import sys; from kforge_tui.sandbox.compile import compile_candidate_sync as c; "
            "r = c(open(sys.argv[1]).read(), 'cpu', 'native', sys.argv[2]); "
            "print(r.ok, r.cached, r.lib_path)")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent.parent))
    procs = [subprocess.Popen([sys.executable, "-c", code, str(src_file), str(cache)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    results = [o[0].split() for o in outs]
    assert all(r[0] == "True" for r in results), outs
    assert results[0][2] == results[1][2] and Path(results[0][2]).is_file()
    assert "kforge_launch" in _exported(results[0][2])
    assert [p.name for p in cache.iterdir()] == [Path(results[0][2]).parent.name]


def _standalone_softmax() -> str:
    """The honest cpu softmax with its header pasted in (for callers that pass no header)."""
    src = (HONEST / "softmax_f32.cpp").read_text()
    return src.replace('#include "kforge_region.h"', _header("cpu").replace("#pragma once\n", ""))


def test_sync_compile_works_inside_a_running_loop(tmp_path):
    src = _standalone_softmax()

    async def inner():
        return compile_candidate_sync(src, "cpu", "native", tmp_path)

    assert asyncio.run(inner()).ok


# A constexpr evaluation of ~10^10 steps: nested loops stay under g++'s per-loop limit, so the
# compiler grinds for minutes before its ops limit; only the timeout can stop it.
SLOW_CPP = """#include <stdint.h>
constexpr int64_t grind() {
    int64_t s = 0;
    for (int64_t i = 0; i < 200000; ++i)
        for (int64_t j = 0; j < 200000; ++j) s += i ^ j;
    return s;
}
constexpr int64_t kValue = grind();
extern "C" int kforge_launch() { return (int)(kValue & 1); }
"""

SLOW_CU = """#include <cuda_runtime.h>
#include <stdint.h>
__global__ void grind(float* y) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 400000; ++i) s = s * 1.0001f + __sinf(s + (float)i);
    y[threadIdx.x] = s;
}
extern "C" int kforge_launch(float* y, cudaStream_t stream) {
    grind<<<1, 32, 0, stream>>>(y);
    return (int)cudaGetLastError();
}
"""


def test_timeout_kills_the_compiler_process_group(tmp_path):
    t0 = time.perf_counter()
    r = compile_candidate_sync(SLOW_CPP, "cpu", "native", tmp_path, timeout_s=1.5)
    elapsed = time.perf_counter() - t0
    assert r.timed_out and not r.ok and r.lib_path is None and not r.cached
    assert "timed out" in r.message and "\n" not in r.message
    assert elapsed < 15, elapsed
    # cc1plus (a grandchild of g++) is gone too, and nothing was cached or left behind
    deadline = time.time() + 5
    while not _no_process_mentions(str(tmp_path)) and time.time() < deadline:
        time.sleep(0.1)
    assert _no_process_mentions(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


async def test_cancelling_a_compile_kills_the_compiler(tmp_path):
    """The engine cancels work (user quits, search ends): no compiler may outlive its task."""
    task = asyncio.create_task(compile_candidate(SLOW_CPP, "cpu", "native", tmp_path, timeout_s=300))
    await asyncio.sleep(1.0)
    assert not _no_process_mentions(str(tmp_path))  # the compiler is running
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadline = time.time() + 5
    while not _no_process_mentions(str(tmp_path)) and time.time() < deadline:
        await asyncio.sleep(0.1)
    assert _no_process_mentions(str(tmp_path)) and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("backend, env, label", [("cuda", "KFORGE_NVCC", "nvcc not found"),
                                                  ("cpu", "KFORGE_CXX", "c++ compiler not found")])
def test_missing_compiler_is_a_clean_failure(tmp_path, monkeypatch, backend, env, label):
    missing = str(tmp_path / "no-such-dir" / "compiler")
    monkeypatch.setenv(env, missing)
    arch = CUDA_ARCH if backend == "cuda" else "native"
    r = compile_candidate_sync("int x;", backend, arch, tmp_path / "cache")
    assert not r.ok and not r.timed_out and r.lib_path is None
    assert r.message.startswith(label) and missing in r.message and "\n" not in r.message


@pytest.mark.parametrize("source, backend, arch, words", [
    ("int x;", "cuda", "hopper", "bad cuda arch"),
    ("int x;", "tpu", "v5", "unknown backend"),
    (None, "cpu", "native", "not text"),
])
def test_bad_input_is_a_failed_result_not_an_exception(tmp_path, source, backend, arch, words):
    r = compile_candidate_sync(source, backend, arch, tmp_path)
    assert not r.ok and words in r.message


def test_unwritable_cache_dir_is_a_failed_result(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = compile_candidate_sync(_standalone_softmax(), "cpu", "native", blocker / "c")
    assert not r.ok and "cache dir" in r.message


# ----------------------------------------------------------------------- cuda (nvcc)

@needs_nvcc
@pytest.mark.slow
@pytest.mark.parametrize("name", ["softmax_f32.cu", "group_norm_f32.cu", "adaptive_avg_pool2d_f32.cu"])
def test_cuda_honest_kernels_compile_and_report_resources(tmp_path, name):
    x = {"softmax_f32.cu": _header("cuda", (64, 1000)), "group_norm_f32.cu": _gn_header("cuda"),
         "adaptive_avg_pool2d_f32.cu": Signature("cuda", (TensorMeta("in0", (2, 8, 7, 7), "float32"),),
                                                 (TensorMeta("out0", (2, 8, 1, 1), "float32"),)).header()}
    src = (HONEST / name).read_text()
    r = compile_candidate_sync(src, "cuda", CUDA_ARCH, tmp_path, header=x[name])
    assert r.ok and not r.cached and r.error_line is None, r.log
    assert "kforge_launch" in _exported(r.lib_path)
    assert r.resources["registers"] > 0 and r.resources["kernels"] == 1
    assert r.resources["spill_stores"] == 0 and "registers" in r.message
    assert r.link_check_ms is not None and r.link_check_ms < 20
    assert "libcudart.so" in " ".join(read_elf(r.lib_path).needed)  # linked shared
    hit = compile_candidate_sync(src, "cuda", CUDA_ARCH, tmp_path, header=x[name])
    assert hit.cached and hit.resources == r.resources and hit.seconds < 0.5


@needs_nvcc
@pytest.mark.slow
def test_cuda_compile_error_gives_error_line(tmp_path):
    src = (HONEST / "softmax_f32.cu").read_text()
    lines = src.splitlines()
    target = next(i for i, ln in enumerate(lines) if "const float inv" in ln)
    lines[target] = "    const float inv = 1.f / s_undefined;"
    r = compile_candidate_sync("\n".join(lines) + "\n", "cuda", CUDA_ARCH, tmp_path,
                               header=_header("cuda", (64, 1000)))
    assert not r.ok and r.error_line == target + 1, r.log
    assert "s_undefined" in r.message and r.resources == {}


@needs_nvcc
@pytest.mark.slow
async def test_cuda_timeout_kills_nvcc_and_its_children(tmp_path):
    # nvcc's front end gives up on SLOW_CPP's constexpr grind quickly, and it may or may not
    # honour a huge unroll; but no nvcc run with the CUDA headers finishes in 0.3 s (>= 1.2 s seen
    # on the H200 and here), so a 0.3 s limit always catches it mid-compile
    r = await compile_candidate(SLOW_CU, "cuda", CUDA_ARCH, tmp_path, timeout_s=0.3)
    assert r.timed_out and not r.ok and r.status == "timeout"
    deadline = time.time() + 5
    while not _no_process_mentions(str(tmp_path)) and time.time() < deadline:
        await asyncio.sleep(0.1)
    assert _no_process_mentions(str(tmp_path)) and list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------- the binary check

EMPTY_CPP = 'extern "C" int kforge_launch(const void* const* i, void* const* o) { return 0; }\n'
EMPTY_CU = ('#include <cuda_runtime.h>\n__global__ void k(float* y) { y[threadIdx.x] = 0.f; }\n'
            'extern "C" int kforge_launch(const void* const* i, void* const* o, cudaStream_t s) {\n'
            '    k<<<1, 32, 0, s>>>((float*)o[0]);\n    return (int)cudaGetLastError();\n}\n')


def _gxx(tmp_path: Path, src: str, name: str = "k", flags=()) -> Path:
    """A library built by hand, with none of the sandbox's checks in the way."""
    (tmp_path / f"{name}.cpp").write_text(src)
    lib = tmp_path / f"{name}.so"
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-fopenmp", *flags, str(tmp_path / f"{name}.cpp"),
                    "-o", str(lib)], check=True, capture_output=True)
    return lib


def test_empty_kernel_is_the_baseline_the_check_allows(tmp_path):
    """What the toolchain itself puts in every library: crtstuff's frame_dummy in .init_array,
    __do_global_dtors_aux in .fini_array, a few bytes of its own writable data; nothing else."""
    info = read_elf(_gxx(tmp_path, EMPTY_CPP))
    assert info.init_array == ["frame_dummy"] and info.fini_array == ["__do_global_dtors_aux"]
    assert {n for n, _, _ in info.writable} <= {"completed.0", "__dso_handle", "__TMC_END__",
                                                 "DW.ref.__gxx_personality_v0"}
    assert link_check(tmp_path / "k.so", "cpu") == []


def test_read_elf_imports_match_nm(tmp_path):
    lib = _gxx(tmp_path, (HONEST / "softmax_idioms.cpp").read_text().replace(
        '#include "kforge_region.h"', _header("cpu", (32, 256)).replace("#pragma once\n", "")))
    out = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], capture_output=True, text=True,
                         check=True).stdout
    want = {ln.split()[-1].split("@")[0] for ln in out.splitlines() if ln.strip()}
    assert set(read_elf(lib).undefined) == want
    assert link_check(lib, "cpu") == []


def test_the_binary_check_costs_milliseconds(tmp_path):
    lib = _gxx(tmp_path, (HONEST / "softmax_idioms.cpp").read_text().replace(
        '#include "kforge_region.h"', _header("cpu", (32, 256)).replace("#pragma once\n", "")))
    link_check(lib, "cpu")
    t0 = time.perf_counter()
    for _ in range(20):
        link_check(lib, "cpu")
    assert (time.perf_counter() - t0) / 20 < 0.01


# Each: a source the *source* check would refuse, built by hand so that only the binary check
# stands between it and the worker - what it must still catch, and the words it must use.
BINARY_CASES = [
    ('#pragma redefine_extname start_job pthread_create\nextern "C" int start_job(unsigned long*, '
     'const void*, void* (*)(void*), void*);\nstatic void* w(void*) { return 0; }\n' + EMPTY_CPP.replace(
         "return 0;", "unsigned long t; return start_job(&t, 0, w, 0);"), "pthread_create", "threads"),
    ('extern char** environ;\n' + EMPTY_CPP.replace("return 0;", "return environ[0][0];"), "environ",
     "environment"),
    ('extern "C" char* getenv(const char*);\n' + EMPTY_CPP.replace("return 0;", 'return getenv("X") != 0;'),
     "getenv", "environment"),
    ('extern "C" int sigaction(int, const void*, void*);\n' + EMPTY_CPP.replace(
        "return 0;", "return sigaction(14, 0, 0);"), "sigaction", "signal"),
    ('extern "C" unsigned alarm(unsigned);\n' + EMPTY_CPP.replace("return 0;", "return alarm(1);"),
     "alarm", "signal"),
    ('extern "C" int fesetround(int);\n' + EMPTY_CPP.replace("return 0;", "return fesetround(0xc00);"),
     "fesetround", "floating-point"),
    ('extern "C" void* dlopen(const char*, int);\n' + EMPTY_CPP.replace("return 0;", 'return dlopen("x", 1) != 0;'),
     "dlopen", "loads code"),
    ('extern "C" int* __errno_location();\n' + EMPTY_CPP.replace("return 0;", "return ++*__errno_location();"),
     "__errno_location", "state"),
    ('#include <omp.h>\n' + EMPTY_CPP.replace("return 0;", "omp_set_num_threads(3); return 0;"),
     "omp_set_num_threads", "OpenMP settings"),
    ('extern "C" int puts(const char*);\n' + EMPTY_CPP.replace("return 0;", 'return puts("hi");'),
     "puts", "file system"),
    ('#define KEEP static int calls\n' + EMPTY_CPP.replace("return 0;", "KEEP; return ++calls;"),
     "calls (static in kforge_launch)", "mutable static state"),
    ('float g_cache[64];\n' + EMPTY_CPP.replace("return 0;", "return (int)g_cache[0]++;"), "g_cache",
     "mutable static state"),
    ('#define TL thread_local\nTL int t_calls;\n' + EMPTY_CPP.replace("return 0;", "return ++t_calls;"),
     "t_calls", "thread-local state"),
    ('struct Boot { Boot(); };\nBoot::Boot() { }\nconst Boot boot;\nstatic int touch() { return 1; }\n'
     'static const int loaded = touch();\n' + EMPTY_CPP, "code runs when the library loads", "_GLOBAL__sub_I"),
    ('__attribute__((__constructor__)) static void at_load() { asm volatile("" ::: "memory"); }\n'
     + EMPTY_CPP, "at_load", "code runs when the library loads"),
    ('__attribute__((destructor)) static void at_exit() { asm volatile("" ::: "memory"); }\n'
     + EMPTY_CPP, "at_exit", "unloads"),
    ('static void boot() { asm volatile("" ::: "memory"); }\n__attribute__((section(".init_array"), used)) '
     'static void (*const e)() = boot;\n' + EMPTY_CPP, "boot", "code runs when the library loads"),
    ('static int impl() { return 0; }\nextern "C" int (*pick())() { return impl; }\n'
     'extern "C" int chosen() __attribute__((ifunc("pick")));\n' + EMPTY_CPP.replace("return 0;", "return chosen();"),
     "chosen", "ifunc"),
    ('extern "C" float expf(float x) noexcept { return 1.f + x; }\n' + EMPTY_CPP, "defines expf", "replace"),
    ('#include <thread>\n' + EMPTY_CPP.replace("return 0;", "std::thread([] {}).detach(); return 0;"),
     "_M_start_thread", "threads"),
]


@pytest.mark.parametrize("src, name, words", BINARY_CASES, ids=[c[1][:30] for c in BINARY_CASES])
def test_the_binary_check_catches_what_the_source_check_would(tmp_path, src, name, words):
    problems = link_check(_gxx(tmp_path, src), "cpu")
    assert problems, "nothing found"
    hit = [p for p in problems if name in p]
    assert hit and words.lower() in hit[0].lower(), problems
    assert all("\n" not in p for p in problems)


def test_a_refused_library_is_a_static_error_with_a_one_line_message_and_is_cached(tmp_path):
    """Through compile_candidate: status static_error at stage link-check, the library deleted
    (nothing loadable is left), the full list in the log, and the verdict cached."""
    src = ('#include "kforge_region.h"\n#pragma redefine_extname start_job pthread_create\n'
           'extern "C" int start_job(unsigned long*, const void*, void* (*)(void*), void*);\n'
           'static void* w(void*) { return 0; }\n'
           'extern "C" int kforge_launch(const void* const* i, void* const* o) {\n'
           '    unsigned long t; return start_job(&t, 0, w, 0);\n}\n')
    h = _header("cpu")
    assert not check_source(src, _sig("cpu")).ok  # the source check would have stopped it first
    r = compile_candidate_sync(src, "cpu", "native", tmp_path, header=h)
    assert not r.ok and r.status == "static_error" and r.stage == "link-check" and r.lib_path is None
    assert r.message.startswith("refused by the binary check: ") and "\n" not in r.message
    assert "pthread_create" in r.message and "--- binary check (link-check) ---" in r.log
    assert not list(tmp_path.glob("*/kernel.so"))
    again = compile_candidate_sync(src, "cpu", "native", tmp_path, header=h)
    assert again.cached and again.status == "static_error" and again.message == r.message
    assert r.to_json()["status"] == "static_error"


def test_a_statically_linked_cuda_runtime_would_blind_the_check(tmp_path):
    """Why -cudart shared: the static runtime imports threads, files, sockets and dlopen itself."""
    if not HAVE_NVCC:
        pytest.skip("nvcc is not installed")
    (tmp_path / "k.cu").write_text(EMPTY_CU)
    subprocess.run(["nvcc", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", str(tmp_path / "k.cu"),
                    "-o", str(tmp_path / "static.so")], check=True, capture_output=True)
    problems = " ".join(link_check(tmp_path / "static.so", "cuda"))
    assert "pthread_create" in problems and "dlopen" in problems


@needs_nvcc
@pytest.mark.slow
def test_empty_cuda_kernel_is_the_baseline_the_check_allows(tmp_path):
    """nvcc's own load-time code is the fatbinary registration, once, plus crtstuff's; its own
    writable data is the fatbin handle and each launch stub's kernel-handle cache."""
    r = compile_candidate_sync(EMPTY_CU, "cuda", CUDA_ARCH, tmp_path)
    assert r.ok, r.log
    info = read_elf(r.lib_path)
    assert sorted(info.init_array) == sorted(["frame_dummy", "_ZL24__sti____cudaRegisterAllv"])
    assert info.fini_array == ["__do_global_dtors_aux"] and not info.tls
    assert any("__cudaRegisterFunction" == u for u in info.undefined)
    assert not any(u.startswith(("pthread", "dlopen", "open")) for u in info.undefined)


@needs_nvcc
@pytest.mark.slow
def test_cuda_constant_shadow_is_allowed_only_when_the_source_declares_it(tmp_path):
    """nvcc keeps a writable host shadow of each __constant__ variable: allowed by name for the
    variables the source check saw declared, refused when a macro hid the declaration."""
    body = ("__global__ void k(float* y) { y[threadIdx.x] = kTab[threadIdx.x & 3]; }\n"
            'extern "C" int kforge_launch(const void* const* i, void* const* o, cudaStream_t s) {\n'
            "    k<<<1, 32, 0, s>>>((float*)o[0]);\n    return (int)cudaGetLastError();\n}\n")
    seen = '#include "kforge_region.h"\n__constant__ float kTab[4] = {1.f, 2.f, 3.f, 4.f};\n' + body
    hidden = '#include "kforge_region.h"\n#define TABLE(n) __constant__ float n[4]\nTABLE(kTab);\n' + body
    ok = compile_candidate_sync(seen, "cuda", CUDA_ARCH, tmp_path, header=_header("cuda"))
    assert ok.ok, ok.log
    bad = compile_candidate_sync(hidden, "cuda", CUDA_ARCH, tmp_path, header=_header("cuda"))
    assert bad.status == "static_error" and "mutable static state kTab" in bad.message, bad.log


# ------------------------------------------------------------------------ on a GPU

@pytest.mark.gpu
def test_gpu_library_built_for_the_visible_gpu_runs(tmp_path):
    """The library built for the visible GPU's arch (CUDA runtime linked shared) loads in a torch
    process and computes there."""
    import torch

    from kforge_tui.device import device_info

    arch = device_info("cuda").arch
    sig = _sig("cuda", (64, 1000))
    r = compile_candidate_sync((HONEST / "softmax_f32.cu").read_text(), "cuda", arch, tmp_path,
                               header=sig.header())
    assert r.ok, r.log
    x = torch.randn(64, 1000, device="cuda")
    y = torch.full_like(x, float("nan"))
    fn = ctypes.CDLL(r.lib_path).kforge_launch
    fn.restype, fn.argtypes = ctypes.c_int, sig.argtypes()
    stream = torch.cuda.current_stream()
    rc = fn(*sig.call_args([x], [y], ctypes.c_void_p(stream.cuda_stream)))
    torch.cuda.synchronize()
    assert rc == 0
    torch.testing.assert_close(y, torch.softmax(x, -1))
