"""Static check (sandbox/static.py): honest kernels pass; each forbidden thing is refused at its line.

Candidates follow the generic ABI (regions/abi.py): `kforge_launch(const void* const* inputs,
void* const* outputs[, cudaStream_t stream])` with shapes in the generated "kforge_region.h".
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from kforge_tui.regions.abi import Signature
from kforge_tui.regions.meta import TensorMeta
from kforge_tui.sandbox.static import Diagnostic, StaticReport, check_source, device_variables

HONEST = Path(__file__).parent / "cheats" / "honest"


def _sig(backend: str, shape=(8, 1024), dtype: str = "float32", n_in: int = 1) -> Signature:
    ins = tuple(TensorMeta(f"in{i}", shape, dtype) for i in range(n_in))
    return Signature(backend, ins, (TensorMeta("out0", shape, dtype),))


SM_CUDA = _sig("cuda")
SM_CPU = _sig("cpu")

# An honest skeleton with two holes: @FILE@ at file scope, @BODY@ inside the launcher.
CUDA_TEMPLATE = """#include "kforge_region.h"
@FILE@
__global__ void k(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}

extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    const int64_t n = KF_IN0_NUMEL;
    @BODY@
    k<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, y, n);
    return (int)cudaGetLastError();
}
"""
CPU_TEMPLATE = """#include "kforge_region.h"
@FILE@
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    const int64_t n = KF_IN0_NUMEL;
    @BODY@
    for (int64_t i = 0; i < n; ++i) y[i] = x[i];
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


def _check(backend: str, file: str = "", body: str = "") -> StaticReport:
    template, sig = (CUDA_TEMPLATE, SM_CUDA) if backend == "cuda" else (CPU_TEMPLATE, SM_CPU)
    return check_source(_fill(template, file, body)[0], sig)


# ----------------------------------------------------------------------------- honest

HONEST_FILES = sorted(HONEST.glob("*.c*"))


@pytest.mark.parametrize("path", HONEST_FILES, ids=lambda p: p.name)
def test_honest_kernels_pass(path):
    sig = SM_CUDA if path.suffix == ".cu" else SM_CPU
    report = check_source(path.read_text(), sig)
    assert report.ok, report.text()
    assert report.diagnostics == [] and report.text() == "" and report.first_line is None


def test_templates_are_honest():
    for template, sig in ((CUDA_TEMPLATE, SM_CUDA), (CPU_TEMPLATE, SM_CPU)):
        report = check_source(_fill(template)[0], sig)
        assert report.ok, report.text()


def test_the_check_is_fast():
    """The fast first filter: milliseconds on a realistic kernel (the idioms one is the largest)."""
    src = (HONEST / "softmax_idioms.cu").read_text()
    check_source(src, SM_CUDA)
    t0 = time.perf_counter()
    for _ in range(5):
        check_source(src, SM_CUDA)
    assert (time.perf_counter() - t0) / 5 < 0.05


@pytest.mark.parametrize("template, sig, file, body", [
    # stream-ordered scratch space is the legitimate way to get temporary memory
    (CUDA_TEMPLATE, SM_CUDA, "", "void* tmp = nullptr; cudaMallocAsync(&tmp, 64, stream); "
                                 "cudaMemsetAsync(tmp, 0, 64, stream); cudaFreeAsync(tmp, stream);"),
    (CUDA_TEMPLATE, SM_CUDA, "__device__ __forceinline__ unsigned lane() { unsigned l; "
                             "asm volatile(\"mov.u32 %0, %%laneid;\" : \"=r\"(l)); return l; }", ""),
    (CUDA_TEMPLATE, SM_CUDA, "__constant__ float kTab[4] = {1.f, 2.f, 3.f, 4.f};\n"
                             "__device__ const float kDev[2] = {1.f, 2.f};\nstatic const int kN = 4;\n"
                             "constexpr int kBlock = 256;\nconst char* const kName = \"k\";\n"
                             "__global__ void uses(float* y) { y[0] = kTab[0] + kDev[1]; }", ""),
    (CUDA_TEMPLATE, SM_CUDA, "#include <cub/block/block_reduce.cuh>\n#include <cuda/pipeline>\n"
                             "#include <cooperative_groups/reduce.h>\n#include <mma.h>", ""),
    (CUDA_TEMPLATE, SM_CUDA, "", "static const int kLocal = 3; static constexpr float kF = 1.f; "
                                 "(void)kLocal; (void)kF;"),
    (CUDA_TEMPLATE, SM_CUDA, "__global__ void k2(float* y) { auto add = [] __device__ (float a, float b) "
                             "{ return a + b; }; y[0] = add(1.f, 2.f); }\n"
                             "struct __align__(8) P2 { float a, b; };", ""),
    (CUDA_TEMPLATE, SM_CUDA, "", "cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, "
                                 "65536); dim3 grid(1), block(32); k<<<grid, block, 0, stream>>>(x, y, 0);"),
    (CUDA_TEMPLATE, SM_CUDA, "", "void* args[] = {&x, &y}; cudaLaunchKernel((const void*)k, dim3(1), "
                                 "dim3(32), args, 0, stream);"),
    (CUDA_TEMPLATE, SM_CUDA, "__global__ void dyn(float* y) { extern __shared__ float smem[]; "
                             "smem[threadIdx.x] = 0.f; y[0] = smem[0]; }", ""),
    (CUDA_TEMPLATE, SM_CUDA, "#pragma once\n#pragma nv_diag_suppress 177\n#define UNROLL_4 _Pragma(\"unroll 4\")",
     "#pragma unroll\n    for (int i = 0; i < 4; ++i) (void)i;\n#pragma unroll (2 * 2)\n"
     "    for (int i = 0; i < 4; ++i) (void)i;"),
    (CPU_TEMPLATE, SM_CPU, "#include <immintrin.h>\n#include <omp.h>\n#include <algorithm>\n#include <cstdlib>",
     "float* tmp = (float*)malloc(64); free(tmp); float buf[16] __attribute__((aligned(64))); (void)buf;"),
    (CPU_TEMPLATE, SM_CPU, "struct Acc { static constexpr int kW = 8; float v; };", "Acc a{0.f}; (void)a;"),
    (CPU_TEMPLATE, SM_CPU, "#pragma once\n#pragma GCC optimize(\"O3\")\n#pragma GCC diagnostic ignored \"-Wunused\"",
     "#pragma omp simd\n    for (int i = 0; i < 4; ++i) y[i] = 0;"),
    (CPU_TEMPLATE, SM_CPU, "#define _USE_MATH_DEFINES\n#define ROWS 4\n#define DIV_UP(a, b) (((a) + (b) - 1) / (b))",
     "float s = 0.f;\n#pragma omp parallel for schedule(static, 4) reduction(+ : s) num_threads(4)\n"
     "    for (int i = 0; i < DIV_UP(ROWS, 2); ++i) s += x[i];\n#pragma omp parallel\n    {\n"
     "#pragma omp single nowait\n        {\n#pragma omp task firstprivate(s)\n        (void)s;\n        }\n"
     "#pragma omp critical(acc)\n        (void)s;\n#pragma omp barrier\n    }\n"
     "#pragma GCC unroll 4\n    for (int i = 0; i < 4; ++i) (void)i;\n#pragma GCC ivdep\n"
     "    for (int i = 0; i < 4; ++i) (void)i;"),
    (CPU_TEMPLATE, SM_CPU, "#pragma omp declare simd\nstatic inline float twice(float v) { return 2 * v; }\n"
                           "static inline float helper(float);\nstatic inline float helper(float v) { return v; }\n"
                           "float expf(float);", "std::vector<float> e(n); (void)e; (void)twice(1.f); "
                                                 "(void)helper(1.f);"),
    (CPU_TEMPLATE, SM_CPU, "static const float* const kTabs[2] = {nullptr, nullptr};\n"
                           "static int (*const kFn)(int) = nullptr;\nstatic const float& kRef = 1.f;", ""),
    # a comment may name anything
    (CPU_TEMPLATE, SM_CPU, "// __attribute__((constructor)) and #pragma redefine_extname are refused\n"
                           "/* extern char** environ; */", ""),
])
def test_legitimate_idioms_pass(template, sig, file, body):
    source, _ = _fill(template, file, body)
    if "std::vector" in body:
        source = source.replace('#include "kforge_region.h"', '#include "kforge_region.h"\n#include <vector>')
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
    ("cuda", '#include "kforge_region.h/../helpers.h"', "include"),
    ("cuda", "#include <kforge_region.h>", "include"),
    ("cuda", "#define HDR <stdio.h>\n#include HDR", "include"),
    ("cuda", "#include <cuda/../../../../etc/passwd>", "include"),
    ("cuda", "#include </proc/self/environ>", "include"),
    ("cuda", "#include_next <stdio.h>", "preprocessor"),
    ("cpu", '#embed "/etc/passwd"', "preprocessor"),
    ("cpu", "#include <cuda_runtime.h>", "include"),
    ("cpu", "#include <fstream>", "include"),
    ("cpu", "#include <cfenv>", "include"),
    ("cuda", "__device__ float g_cache[1024];", "mutable-state"),
    ("cuda", "__managed__ int g_calls;", "mutable-state"),
    ("cuda", "static int calls = 0;", "mutable-state"),
    ("cuda", "float* g_prev = nullptr;", "mutable-state"),
    ("cuda", "const float* g_prev = nullptr;", "mutable-state"),  # the pointer itself is mutable
    ("cuda", "thread_local int t_state;", "mutable-state"),
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
    # --- issue 17: pragmas outside the allow-list
    ("cpu", "#pragma redefine_extname start_job pthread_create", "pragma"),
    ("cuda", "#pragma redefine_extname make_queue cudaStreamCreate", "pragma"),
    ("cpu", "#pragma weak kforge_launch = other", "pragma"),
    ("cpu", '#pragma GCC dependency "/etc/passwd"', "pragma"),
    ("cpu", '#pragma GCC optimize("fast-math")', "pragma"),
    ("cpu", "#pragma GCC visibility push(hidden)", "pragma"),
    ("cpu", "#pragma GCC poison x", "pragma"),
    ("cpu", "#pragma STDC FENV_ACCESS ON", "pragma"),
    ("cpu", '#pragma push_macro("x")', "pragma"),
    ("cpu", "#pragma omp threadprivate(x)", "pragma"),
    ("cpu", "#pragma omp declare target", "pragma"),
    ("cpu", "#pragma omp requires unified_shared_memory", "pragma"),
    ("cpu", "#pragma pack(1)", "pragma"),
    ("cuda", "#pragma omp parallel", "pragma"),
    ("cpu", '_Pragma("redefine_extname start_job pthread_create")', "pragma"),
    ("cpu", "#define P(x) _Pragma(#x)", "pragma"),
    ("cpu", '#define RENAME _Pragma("redefine_extname a b")', "pragma"),
    ("cpu", "%:pragma redefine_extname a b", "pragma"),
    # --- issue 17: redefining keywords, CUDA qualifiers, reserved names, the ABI's constants
    ("cuda", "#define __device__ __host__", "redefine"),
    ("cuda", "#define __global__", "redefine"),
    ("cuda", "#undef __shared__", "redefine"),
    ("cuda", "#define __forceinline__ __attribute__((always_inline))", "redefine"),
    ("cpu", "#define extern", "redefine"),
    ("cpu", "#define static", "redefine"),
    ("cpu", "#define const", "redefine"),
    ("cpu", "#define constexpr static", "redefine"),
    ("cpu", "#define mutable", "redefine"),
    ("cpu", "#define asm(x)", "redefine"),
    ("cpu", "#define _Pragma(x)", "redefine"),
    ("cpu", "#define __attribute__(x)", "redefine"),
    ("cpu", "#undef KF_IN0_NUMEL\n#define KF_IN0_NUMEL 8", "redefine"),
    ("cpu", "#define kforge_launch other", "redefine"),
    ("cuda", "%:define __device__ __host__", "redefine"),
    ("cuda", "%:define X 1", "preprocessor"),
    ("cuda", "#  /* spaced */ define __global__ static", "redefine"),
    # --- issue 17: hand-declared functions and extern variables
    ("cpu", "int pthread_create(void*, void*, void* (*)(void*), void*);", "undeclared-function"),
    ("cpu", 'extern "C" char* getlogin(void);', "undeclared-function"),
    ("cpu", 'extern "C" { long sysconf_(int); }', "undeclared-function"),
    ("cpu", "namespace libc { extern \"C\" int prctl(int, ...); }", "undeclared-function"),
    ("cuda", 'extern "C" cudaError_t make_queue(cudaStream_t*);', "undeclared-function"),
    ("cpu", "extern char** environ;", "extern-variable"),
    ("cuda", "extern char** environ;", "extern-variable"),
    ("cpu", 'extern "C" const char* __progname;', "extern-variable"),
    ("cpu", 'extern "C" int some_counter;', "extern-variable"),
    ("cpu", "extern const float kTable[];", "extern-variable"),
    ("cuda", "extern __constant__ float kTab[];", "extern-variable"),
    # --- issue 17: load-time code in every spelling
    ("cpu", "__attribute__((__constructor__)) static void init() {}", "load-time-code"),
    ("cpu", "__attribute__ ((constructor(101))) static void init() {}", "load-time-code"),
    ("cpu", "[[gnu::__constructor__]] static void init() {}", "load-time-code"),
    ("cpu", "__attribute__((destructor)) static void fini() {}", "load-time-code"),
    ("cpu", "struct S { S(); }; __attribute__((init_priority(101))) const S s;", "load-time-code"),
    ("cpu", "static void boot() {}\n__attribute__((section(\".init_array\"))) static void (*const e)() = boot;", "load-time-code"),
    ("cpu", '__attribute__((target_clones("avx2", "default"))) float f(float v) { return v; }', "load-time-code"),
    ("cpu", 'static void* pick() { return 0; }\nvoid g() __attribute__((ifunc("pick")));', "load-time-code"),
    ("cpu", "__attribute__((weak)) float w() { return 0.f; }", "load-time-code"),
    # --- issue 17, class 1: state behind T* const statics and mutable members
    ("cpu", "static float* const stash = nullptr;", "mutable-state"),
    ("cpu", "float* const stash = nullptr;", "mutable-state"),
    ("cpu", "static float store[4];\nstatic float& ref = store[0];", "mutable-state"),
    ("cpu", "static const float* const* table = nullptr;", "mutable-state"),
    ("cpu", "static float* const* const table = nullptr;", "mutable-state"),
    ("cpu", "static const float* arr[2];", "mutable-state"),
    ("cpu", "static int (*hook)(int) = nullptr;", "mutable-state"),
    ("cpu", "struct Memo { mutable float last[8]; };", "mutable-state"),
    ("cpu", "struct Memo { mutable const void* key; }; static const Memo memo{};", "mutable-state"),
    ("cpu", "struct Box { static float* const p; };", "mutable-state"),
    ("cpu", "#define KEEP(n) static float n mutable", "mutable-state"),
    # --- names reserved for the code the compiler generates
    ("cuda", "static void* __device_stub__cache() { return 0; }", "reserved-name"),
    ("cuda", "static const int __cudaFatCubinHandle = 0;", "reserved-name"),
    ("cpu", "static void frame_dummy() {}", "reserved-name"),
    ("cpu", "static void _GLOBAL__sub_I_x() {}", "reserved-name"),
    # --- a __constant__ table's host shadow is writable memory: host code must not touch it
    ("cuda", "__constant__ const void* g_slot[1];\nstatic void keep(const void* p) { "
             "const_cast<const void**>(g_slot)[0] = p; }", "mutable-state"),
    ("cuda", "__constant__ float kTab[4];\n#define TAB kTab\nstatic float peek() { return TAB[0]; }",
     "mutable-state"),
    ("cuda", "__constant__ float kTab[4];\nstatic const float* const p = kTab;", "mutable-state"),
]


@pytest.mark.parametrize("backend, code, rule", FILE_CASES, ids=[c[1][:48] for c in FILE_CASES])
def test_file_scope_refusals(backend, code, rule):
    template, sig = (CUDA_TEMPLATE, SM_CUDA) if backend == "cuda" else (CPU_TEMPLATE, SM_CPU)
    source, line = _fill(template, file=code)
    report = check_source(source, sig)
    assert not report.ok
    hits = [d for d in report.diagnostics if d.rule == rule]
    assert hits, report.text()
    assert line <= hits[0].line <= line + code.count("\n"), report.text()
    assert f"L{hits[0].line}:{hits[0].col} [{rule}]" in report.text()
    assert all("\n" not in d.message for d in report.diagnostics)


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
    ("cuda", "cudaDeviceSynchronize();", "forbidden-call", "cudaDeviceSynchronize"),
    ("cuda", "cudaStreamSynchronize(stream);", "forbidden-call", "cudaStreamSynchronize"),
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
    # --- issue 17: the API forms of a launch or copy on the default stream
    ("cuda", "void* a[] = {&x}; cudaLaunchKernel((const void*)k, dim3(1), dim3(1), a, 0, 0);",
     "launch-stream", "cudaLaunchKernel"),
    ("cuda", "void* a[] = {&x}; cudaLaunchKernel((const void*)k, dim3(1), dim3(1), a);",
     "launch-stream", "cudaLaunchKernel"),
    ("cuda", "cudaMemcpyAsync(y, x, 16, cudaMemcpyDeviceToDevice);", "launch-stream", "cudaMemcpyAsync"),
    ("cuda", "cudaMemsetAsync(y, 0, 16, cudaStreamLegacy);", "launch-stream", "cudaMemsetAsync"),
    ("cuda", "void* p; cudaMallocAsync(&p, 16, (cudaStream_t)0);", "launch-stream", "cudaMallocAsync"),
    # --- issue 17: signals, timers, clocks, FP environment, stack walking, process state
    ("cpu", "signal(14, nullptr);", "forbidden-call", "signal"),
    ("cpu", "sigaction(14, nullptr, nullptr);", "forbidden-call", "sigaction"),
    ("cpu", "alarm(1);", "forbidden-call", "alarm"),
    ("cpu", "setitimer(0, nullptr, nullptr);", "forbidden-call", "setitimer"),
    ("cpu", "timer_create(0, nullptr, nullptr);", "forbidden-call", "timer_create"),
    ("cpu", "unsigned long long t = __rdtsc(); (void)t;", "forbidden-call", "__rdtsc"),
    ("cpu", "double t = omp_get_wtime(); (void)t;", "forbidden-call", "omp_get_wtime"),
    ("cpu", "_mm_setcsr(_mm_getcsr() | 0x8040);", "forbidden-call", "_mm_setcsr"),
    ("cpu", "_MM_SET_FLUSH_ZERO_MODE(0x8000);", "forbidden-call", "_MM_SET_FLUSH_ZERO_MODE"),
    ("cpu", "__builtin_ia32_ldmxcsr(0x9fc0);", "forbidden-call", "__builtin_ia32_ldmxcsr"),
    ("cpu", "fesetround(0xc00);", "forbidden-call", "fesetround"),
    ("cuda", "fesetround(0xc00);", "forbidden-call", "fesetround"),
    ("cpu", "void* f = __builtin_frame_address(0); (void)f;", "forbidden-call", "__builtin_frame_address"),
    ("cpu", "void* r = __builtin_return_address(0); (void)r;", "forbidden-call", "__builtin_return_address"),
    ("cpu", "void* tp = __builtin_thread_pointer(); (void)tp;", "forbidden-call", "__builtin_thread_pointer"),
    ("cpu", "dl_iterate_phdr(nullptr, nullptr);", "forbidden-call", "dl_iterate_phdr"),
    ("cpu", "unsigned long v = getauxval(31); (void)v;", "forbidden-call", "getauxval"),
    ("cpu", "mprotect(nullptr, 0, 7);", "forbidden-call", "mprotect"),
    ("cpu", "mmap(nullptr, 4096, 7, 0x22, -1, 0);", "forbidden-call", "mmap"),
    ("cpu", "omp_set_num_threads(1);", "forbidden-call", "omp_set_num_threads"),
    ("cpu", "omp_set_dynamic(1);", "forbidden-call", "omp_set_dynamic"),
    ("cpu", "errno = 7;", "forbidden-call", "errno"),
    ("cpu", "atexit(nullptr);", "forbidden-call", "atexit"),
    ("cpu", "srand(1); (void)rand();", "forbidden-call", "srand"),
    ("cpu", "int pid = getpid(); (void)pid;", "forbidden-call", "getpid"),
    ("cpu", "char** e = environ; (void)e;", "forbidden-call", "environ"),
    ("cpu", "int pthread_create(void*, void*, void* (*)(void*), void*);", "undeclared-function", "pthread_create"),
    ("cpu", "extern int hidden_counter;", "extern-variable", "hidden_counter"),
    ("cpu", '#pragma omp parallel if(system("id") == 0)\n    { }', "forbidden-call", "system"),
    ("cpu", "#pragma omp parallel num_threads(({ asm(\"syscall\"); 1; }))\n    { }", "pragma", "statements"),
    ("cpu", "#pragma omp target\n    { }", "pragma", "target"),
    ("cpu", "#pragma omp parallel copyin(x)\n    { }", "pragma", "copyin"),
]


@pytest.mark.parametrize("backend, code, rule, word", BODY_CASES, ids=[c[1][:48] for c in BODY_CASES])
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


def test_the_first_diagnostic_names_the_trick():
    """The first diagnostic is the one-line message users see: on a line that is both a
    hand-written declaration and an asm label / ifunc, the label or attribute comes first."""
    report = _check("cpu", file='extern "C" int spawn_(unsigned long*, const void*, void* (*)(void*), '
                                'void*) __asm__("pthread_create");')
    assert report.diagnostics[0].rule == "asm" and "pthread_create" in report.diagnostics[0].message
    report = _check("cpu", file='static void* pick() { return 0; }\n'
                                'extern "C" void g() __attribute__((ifunc("pick")));')
    assert report.diagnostics[0].rule == "load-time-code" and "ifunc" in report.diagnostics[0].message


def test_messages_name_the_variable_not_its_declarator():
    report = _check("cpu", file="extern char** environ;\nstatic float* const stash = nullptr;")
    msgs = [d.message for d in report.diagnostics]
    assert any("extern variable 'environ'" in m for m in msgs), msgs
    assert any("'stash'" in m and "points at writable memory" in m for m in msgs), msgs


def test_keyword_redefinition_is_refused_wherever_it_hides():
    """`#define __device__ __host__` makes 'device' code host code: refused in every spelling of
    the directive (comments, spacing, line splices, the %: digraph)."""
    for code in ("#define __device__ __host__", "# define __device__ __host__",
                 "#/**/define __device__ __host__", "#define \\\n __device__ __host__",
                 "%:define __device__ __host__", "  #  undef __global__"):
        report = _check("cuda", file=code)
        assert "redefine" in _rules(report), (code, report.text())
    assert "redefine" not in _rules(_check("cuda", file="// #define __device__ __host__"))


def test_bodiless_declaration_rules():
    # a prototype of a function this file defines is fine; one it never defines is not
    ok = _check("cpu", file="static float helper(float);\nstatic float helper(float v) { return v; }")
    assert ok.ok, ok.text()
    bad = _check("cpu", file='extern "C" char* getlogin(void);')
    assert [d.rule for d in bad.diagnostics] == ["undeclared-function"]
    assert "getlogin" in bad.text() and "declared here but not defined" in bad.text()
    # inside a function: `int getpid();` is a declaration, `std::vector<float> e(n);` an object
    assert "undeclared-function" in _rules(_check("cpu", body="int getppid_();"))
    assert "undeclared-function" in _rules(_check("cpu", body="int g(int, float*);"))
    obj = check_source(_fill(CPU_TEMPLATE, body="std::vector<float> e(n); (void)e;")[0].replace(
        '#include "kforge_region.h"', '#include "kforge_region.h"\n#include <vector>'), SM_CPU)
    assert obj.ok, obj.text()


def test_device_variables_are_the_ones_the_source_declares():
    src = _fill(CUDA_TEMPLATE, file="__constant__ float kTab[4];\n__device__ const float kDev[2] = {1, 2};\n"
                                     "namespace ns { __constant__ int kN[1]; }\n")[0]
    assert device_variables(src) == {"kTab", "kDev", "kN"}
    assert device_variables(src, "cpu") == set() and device_variables(None) == set()


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
    source = "```cuda\n" + (HONEST / "softmax_f32.cu").read_text() + "```\n"
    report = check_source(source, SM_CUDA)
    assert not report.ok and report.diagnostics[0].rule == "parse" and report.first_line == 1


@pytest.mark.parametrize("name, sig", [("softmax_f32.cu", SM_CUDA), ("softmax_f32.cpp", SM_CPU)])
def test_truncated_source_reports_where_it_breaks(name, sig):
    full = (HONEST / name).read_text()
    cut = full[: full.index("extern \"C\" int kforge_launch") + 120]  # stops inside the launcher
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
    assert "kforge_launch" in report.text() and "void* const* outputs" in report.text()


def test_declared_but_not_defined():
    source = ('#include "kforge_region.h"\nextern "C" int kforge_launch(const void* const* inputs, '
              "void* const* outputs);\n")
    report = check_source(source, SM_CPU)
    assert [(d.rule, d.line) for d in report.diagnostics] == [("entry-point", 2)]
    assert "never defined" in report.text()


def test_defined_twice():
    body = 'extern "C" int kforge_launch(const void* const*, void* const*) { return 0; }\n'
    report = check_source('#include "kforge_region.h"\n' + body + body.replace("return 0", "return 1"), SM_CPU)
    assert "entry-point" in _rules(report) and "more than once" in report.text()


def test_entry_point_without_extern_c():
    """Without the header, a C++ definition is mangled: refused. With the header, whose
    declaration is extern "C", the definition keeps C linkage: fine."""
    source = _fill(CPU_TEMPLATE)[0].replace('extern "C" ', "")
    assert check_source(source, SM_CPU).ok
    no_header = source.replace('#include "kforge_region.h"', "#include <stdint.h>").replace(
        "KF_IN0_NUMEL", "8")
    report = check_source(no_header, SM_CPU)
    assert [d.rule for d in report.diagnostics] == ["linkage"]
    assert report.diagnostics[0].line == next(i for i, ln in enumerate(no_header.split("\n"), 1)
                                              if "kforge_launch" in ln)


def test_extern_c_prototype_gives_the_definition_c_linkage():
    proto = 'extern "C" int kforge_launch(const void* const*, void* const*);\n'
    source = _fill(CPU_TEMPLATE, file=proto)[0].replace('extern "C" int kforge_launch(const void* const* inputs',
                                                       "int kforge_launch(const void* const* inputs")
    source = source.replace('#include "kforge_region.h"', "#include <stdint.h>").replace("KF_IN0_NUMEL", "8")
    assert check_source(source, SM_CPU).ok, check_source(source, SM_CPU).text()


def test_static_entry_point_is_refused():
    source = _fill(CPU_TEMPLATE)[0].replace('extern "C" int', 'extern "C" static int')
    report = check_source(source, SM_CPU)
    assert not report.ok and "static" in report.text()


def test_wrong_parameter_count_names_expected_and_got():
    source = _fill(CUDA_TEMPLATE)[0].replace(", cudaStream_t stream)", ")").replace(
        "0, stream>>>", "0, 0>>>")
    report = check_source(source, SM_CUDA)
    assert "signature" in _rules(report), report.text()
    msg = next(d.message for d in report.diagnostics if d.rule == "signature")
    assert "takes 2 parameters, expected 3" in msg
    assert "expected (const void* const*, void* const*, cudaStream_t)" in msg
    assert "got (const void* const*, void* const*)" in msg


def test_old_per_op_signature_is_a_mismatch_that_points_at_the_header():
    source = ('#include "kforge_region.h"\nextern "C" int kforge_launch(const float* x, float* y, '
              "int64_t outer, int64_t n, int64_t inner) { return 0; }\n")
    report = check_source(source, SM_CPU)
    assert [d.rule for d in report.diagnostics] == ["signature"]
    assert "takes 5 parameters, expected 2" in report.text()


@pytest.mark.parametrize("old, new, index", [
    ("const void* const* inputs", "void* const* inputs", 1),  # inputs must be const
    ("const void* const* inputs", "const float* const* inputs", 1),  # typed: the header says void
    ("void* const* outputs", "float** outputs", 2),
    ("void* const* outputs", "void** outputs", 2),
])
def test_wrong_parameter_type(old, new, index):
    source = _fill(CPU_TEMPLATE)[0].replace(old, new, 1)
    report = check_source(source, SM_CPU)
    assert [d.rule for d in report.diagnostics] == ["signature"], report.text()
    assert f"parameter {index} (" in report.text() and "expected" in report.text()
    assert "kforge_region.h" in report.text()


def test_equivalent_spellings_are_accepted():
    decl = ('extern "C" int kforge_launch(void const * const * __restrict__ in,\n'
            '                             void *const *__restrict out) {\n'
            '    (void)in; (void)out; return 0;\n}\n')
    report = check_source('#include "kforge_region.h"\n' + decl, SM_CPU)
    assert report.ok, report.text()
    unnamed = 'extern "C" int kforge_launch(const void* const*, void* const* const) { return 0; }'
    assert check_source('#include "kforge_region.h"\n' + unnamed, SM_CPU).ok
    cuda = ('#include "kforge_region.h"\nextern "C" {\nint kforge_launch(const void *const *i, '
            "void *const *o, cudaStream_t s) { (void)i; (void)o; (void)s; return 0; }\n}\n")
    assert check_source(cuda, SM_CUDA).ok


def test_wrong_return_type():
    source = _fill(CPU_TEMPLATE)[0].replace('extern "C" int', 'extern "C" void').replace("return 0;", "return;")
    report = check_source(source, SM_CPU)
    assert [d.rule for d in report.diagnostics] == ["signature"] and "must return int" in report.text()


def test_cuda_signature_needs_the_stream():
    src = (HONEST / "softmax_f32.cpp").read_text()
    report = check_source(src, SM_CUDA)
    assert "signature" in _rules(report) and "cudaStream_t" in report.text()


def test_never_raises_on_truncated_or_mangled_sources():
    """Whatever the LLM sends, the answer is a report: every prefix and random splices."""
    import random

    rnd = random.Random(1234)
    for name, sig in (("softmax_f32.cu", SM_CUDA), ("group_norm_f32.cpp", SM_CPU),
                      ("softmax_idioms.cu", SM_CUDA)):
        src = (HONEST / name).read_text()
        for i in range(0, len(src), 13):
            assert isinstance(check_source(src[:i], sig), StaticReport)
        for _ in range(100):
            a, b = sorted(rnd.randrange(len(src)) for _ in range(2))
            junk = rnd.choice(["", "{", "}", "(", '"', "'", "/*", "\\", "#", "<<<", "\u00e9", "\\u0073",
                               "_Pragma(", "%:", "R\"(", "#pragma omp "])
            report = check_source(src[:a] + junk + src[b:], sig)
            assert report.ok == (not report.diagnostics)
