"""Static check of a candidate kernel before any compiler runs.

A candidate is untrusted text from an LLM (or a person). Before it costs a compile, this module
refuses what a kernel has no business doing and what would make verification or timing lie:
sources that do not parse, a missing or mis-typed entry point (the generic ABI of
regions/abi.py: `extern "C" int kforge_launch(const void* const* inputs, void* const* outputs
[, cudaStream_t stream])`), headers outside an allow-list (torch, cuBLAS, file or thread
libraries; the one quoted include is the generated `"kforge_region.h"`), calls that run
programs, touch files or sockets, load code, start threads or streams, set signals or timers,
read the environment, change the floating-point environment or allocate outside the stream, and
state that outlives a call.

The rules are written against classes of trick, not single cheats (issue 17):
- preprocessor: every `#pragma` / `_Pragma` outside a small allow-list is refused (kills
  `#pragma redefine_extname`, `weak`, `GCC dependency`, `STDC FENV_ACCESS`, OpenMP `target`...);
  `#define`/`#undef` of a keyword, a CUDA qualifier, a reserved identifier (`__x`, `_X`) or an
  ABI constant (`KF_*`) is refused (kills `#define __device__` turning "device code" into host
  code that issues raw syscalls);
- names: a function declared without a body that this file does not define (a hand-declared
  libc entry such as `int pthread_create(...)` or `char* getenv(...)`), an `extern` variable
  (`extern char** environ`), names reserved for code the compiler generates;
- load-time code: `__attribute__((constructor/destructor/init_priority/ifunc/section/...))`;
- state: every variable with static or thread storage must be immutable all the way down: a
  `T* const` static still points at writable memory, and a `mutable` member is writable
  through a const object (issue 17, class 1);
- host escapes: asm outside device code, and the `__builtin_`s / intrinsics that walk the stack,
  read the thread pointer or time stamp counter, or set MXCSR (flush-to-zero, rounding).

Why an AST walk (tree-sitter) and not regexes: a regex cannot tell a call from a comment, a
string, a field name (`s.open`) or a declaration; it cannot say whether a variable is at file
scope or whether `const` applies to the pointer or the pointee; and it cannot tell inline PTX in
`__device__` code from host assembly. The text-level steps are a few spelling fixes the grammar
lacks (`__align__(n)`, `__attribute__((...))`, `_Pragma(...)`, `[] __device__` lambdas), blanked
to spaces of the same length so that every line and column stays exact, and the preprocessor
directives, which are read from the text with comments removed (the grammar keeps their bodies
as raw strings and does not know the `%:` digraph).

This check is the fast first filter, not the only layer: the built library's imported symbols,
load-time code and writable data are checked after the compile (sandbox/compile.py,
`link_check`), and candidates run in a killable worker process whose verification they cannot
predict.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from kforge_tui.regions import abi

ENTRY = abi.ENTRY
HEADER_NAME = abi.HEADER_NAME


@dataclass
class Diagnostic:
    line: int  # 1-based
    col: int  # 1-based
    message: str
    rule: str

    def text(self) -> str:
        return f"L{self.line}:{self.col} [{self.rule}] {self.message}"


@dataclass
class StaticReport:
    ok: bool
    diagnostics: list[Diagnostic] = field(default_factory=list)

    def text(self) -> str:
        """One diagnostic per line: `L12:5 [forbidden-call] system() is not allowed in a kernel`."""
        return "\n".join(d.text() for d in self.diagnostics)

    @property
    def first_line(self) -> int | None:
        return min((d.line for d in self.diagnostics), default=None)


# ----------------------------------------------------------------------------- includes

_INCLUDES_COMMON = {
    "stdint.h", "stddef.h", "math.h", "float.h", "limits.h", "string.h",
    "cmath", "cstdint", "cstddef", "cfloat", "climits", "cstring",
    "algorithm", "type_traits", "limits", "utility", "array", "numeric",
}
_INCLUDES_CUDA = {
    "cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "cuda.h", "mma.h",
    "cooperative_groups.h", "cuda_pipeline.h", "cuda_pipeline_primitives.h", "cuda_awbarrier.h",
    "vector_types.h", "vector_functions.h", "math_constants.h", "device_launch_parameters.h",
    "cuda_runtime_api.h", "cuda_fp16.hpp", "cuda_bf16.hpp",
}
# Directory prefixes. cub: block/warp/thread-level primitives only; cub/device and cub/cub.cuh
# would run a library's whole algorithm (and cub.cuh adds seconds to every compile).
_INCLUDE_DIRS_CUDA = ("cooperative_groups/", "cuda/", "cub/block/", "cub/warp/", "cub/thread/",
                      "cub/iterator/", "cub/util_")
_INCLUDES_CPU = {
    "omp.h", "immintrin.h", "x86intrin.h", "xmmintrin.h", "emmintrin.h", "pmmintrin.h",
    "tmmintrin.h", "smmintrin.h", "nmmintrin.h", "avxintrin.h", "arm_neon.h",
    "stdlib.h", "cstdlib", "vector", "new",  # malloc/free, std::vector: cpu scratch space
}
# Headers refused with a specific reason (everything off the allow-list is refused anyway).
_INCLUDE_REASONS = (
    (("torch/", "ATen/", "c10/", "caffe2/", "pybind11/", "Python.h"),
     "candidates must not call back into PyTorch (and torch/extension.h makes one compile take ~47 s)"),
    (("cublas", "cudnn", "cufft", "cusparse", "cusolver", "curand", "nccl", "cutlass/", "cute/",
      "thrust/", "cub/device/", "cub/cub.cuh", "cub/agent/", "cub/grid/"),
     "calling a library for the op is not writing the kernel (CUTLASS/CuTe are also not shipped "
     "with nvcc and add tens of seconds per compile)"),
    (("thread", "future", "pthread.h", "unistd.h", "stdio.h", "cstdio", "fstream", "iostream",
      "sys/", "dlfcn.h", "fcntl.h", "netinet/", "arpa/", "spawn.h", "signal.h", "filesystem",
      "mutex", "atomic", "chrono"),
     "threads, files, processes and sockets have no place in a kernel"),
)


def _include_allowed(path: str, backend: str) -> bool:
    if path in _INCLUDES_COMMON:
        return True
    if backend == "cuda":
        return path in _INCLUDES_CUDA or path.startswith(_INCLUDE_DIRS_CUDA)
    return path in _INCLUDES_CPU


def _include_reason(path: str) -> str:
    for prefixes, why in _INCLUDE_REASONS:
        if any(path == p or path.startswith(p) for p in prefixes):
            return why
    return "only the allow-listed headers are available to a kernel"


# ------------------------------------------------------------------------ forbidden names

_WHY = {
    "process": "it runs or replaces a process",
    "exit": "it ends the worker process",
    "exit-handler": "it registers code that runs at exit, outside any checked call",
    "file": "kernels must not touch the file system",
    "net": "kernels must not open network connections",
    "dl": "it loads code or walks the loaded libraries, which a kernel has no reason to see",
    "thread": "work on another thread escapes the timed call",
    "signal": "a signal handler or timer runs code outside the timed call",
    "clock": "a kernel has no reason to read clocks (timing is the harness's job)",
    "env": "kernels must not read the environment or the command line",
    "procinfo": "kernels must not inspect or change the process they run in",
    "memmap": "it maps memory or changes its protection (a way to run unchecked code or keep state)",
    "fpenv": "it changes the floating-point environment (rounding, flush-to-zero) for everything "
             "that runs after it, the reference included",
    "stack": "it reads the call stack or the thread's private area, outside the kernel's own data",
    "state": "it is library state that outlives the call",
    "stream": "work on another stream/event/graph escapes the timed region; launch on the given stream",
    "sync": "a host-side synchronisation breaks stream ordering and CUDA-graph capture",
    "alloc": "allocation must be stream-ordered: use cudaMallocAsync/cudaFreeAsync on the given stream",
    "device": "it changes device-wide state shared with other work",
    "symbol": "__constant__/__device__ symbols read or written from the host carry state between "
              "calls",
    "default-stream": "it runs on the legacy default stream; use the Async form on the given stream",
    "library": "calling a library for the op is not writing the kernel",
    "omp-settings": "it changes OpenMP settings for everything that runs after it",
}
_FORBIDDEN: dict[str, str] = {}
for _group, _names in {
    "process": "system popen pclose fork vfork clone clone3 execl execlp execle execv execvp execvpe "
               "execve fexecve posix_spawn posix_spawnp syscall kill tgkill ptrace daemon",
    "exit": "exit _exit _Exit quick_exit abort",
    "exit-handler": "atexit at_quick_exit on_exit __cxa_atexit __cxa_thread_atexit "
                    "__cxa_thread_atexit_impl",
    "file": "fopen fopen64 freopen fdopen open open64 openat creat unlink unlinkat remove rename "
            "renameat mkdir rmdir truncate ftruncate chmod chown symlink mkfifo mknod tmpfile "
            "mkstemp tmpnam opendir ioctl fcntl readlink readlinkat",
    "net": "socket connect bind listen accept accept4 sendto recvfrom sendmsg recvmsg getaddrinfo "
           "gethostbyname",
    "dl": "dlopen dlmopen dlsym dlvsym dladdr dladdr1 dlinfo dl_iterate_phdr getauxval "
          "_r_debug _dl_debug_state",
    "thread": "thrd_create",
    "signal": "signal sigaction sigset sigprocmask sigqueue sigaltstack raise alarm ualarm "
              "setitimer timer_create timer_settime",
    "clock": "clock_gettime gettimeofday timespec_get omp_get_wtime omp_get_wtick __rdtsc _rdtsc "
             "__rdtscp __builtin_ia32_rdtsc __builtin_ia32_rdtscp __builtin_readcyclecounter "
             "__builtin_ia32_rdpmc usleep nanosleep clock_nanosleep",
    "env": "getenv secure_getenv setenv putenv unsetenv clearenv environ __environ "
           "program_invocation_name program_invocation_short_name __progname __progname_full "
           "__libc_argv __libc_argc",
    "procinfo": "getpid getppid gettid getuid geteuid sysconf prctl uname gethostname getrusage "
                "getrlimit setrlimit sched_setaffinity sched_getaffinity sched_setscheduler",
    "memmap": "mmap mmap64 munmap mremap mprotect pkey_mprotect madvise brk sbrk shmget shmat "
              "memfd_create",
    "fpenv": "fesetround fesetenv feupdateenv feholdexcept fesetexceptflag feenableexcept "
             "fedisableexcept feclearexcept feraiseexcept fesetmode fesetexcept _mm_setcsr "
             "_MM_SET_FLUSH_ZERO_MODE _MM_SET_DENORMALS_ZERO_MODE _MM_SET_ROUNDING_MODE "
             "_MM_SET_EXCEPTION_MASK _MM_SET_EXCEPTION_STATE __builtin_ia32_ldmxcsr "
             "__builtin_ia32_fldenv __builtin_ia32_fnclex "
             # x87/SSE/AVX state restores load MXCSR (FTZ/DAZ, rounding) without naming it
             "_fxrstor _fxrstor64 _xrstor _xrstor64 _xrstors _xrstors64 __builtin_ia32_fxrstor "
             "__builtin_ia32_fxrstor64 __builtin_ia32_xrstor __builtin_ia32_xrstor64 "
             "__builtin_ia32_xrstors __builtin_ia32_xrstors64 __builtin_ia32_frstor",
    "stack": "__builtin_frame_address __builtin_return_address __builtin_extract_return_addr "
             "__builtin_frob_return_addr __builtin_dwarf_cfa __builtin_eh_return "
             "__builtin_unwind_init __builtin_apply __builtin_apply_args __builtin_return "
             "__builtin_setjmp __builtin_longjmp __builtin_thread_pointer __builtin_set_thread_pointer "
             "__builtin___clear_cache __builtin_ia32_rdfsbase32 __builtin_ia32_rdfsbase64 "
             "__builtin_ia32_rdgsbase32 __builtin_ia32_rdgsbase64 __builtin_ia32_wrfsbase32 "
             "__builtin_ia32_wrfsbase64 __builtin_ia32_wrgsbase32 __builtin_ia32_wrgsbase64 "
             "_readfsbase_u32 _readfsbase_u64 _readgsbase_u32 _readgsbase_u64 _writefsbase_u32 "
             "_writefsbase_u64 _writegsbase_u32 _writegsbase_u64 backtrace",
    "state": "errno __errno_location srand rand_r srandom random rand",
    "stream": "cudaLaunchHostFunc cudaStreamAddCallback cuLaunchHostFunc cuStreamAddCallback "
              "cudaStreamWaitEvent cudaStreamQuery cudaEventRecord cudaEventQuery",
    "sync": "cudaDeviceSynchronize cudaStreamSynchronize cudaEventSynchronize cudaThreadSynchronize",
    "alloc": "cudaMalloc cudaMallocManaged cudaMallocHost cudaHostAlloc cudaMallocPitch cudaMalloc3D "
             "cudaMallocArray cudaMalloc3DArray cudaMallocMipmappedArray cudaFree cudaFreeHost "
             "cudaHostRegister cudaMallocFromPoolAsync",
    "device": "cudaSetDevice cudaDeviceReset cudaDeviceSetLimit cudaDeviceSetCacheConfig "
              "cudaDeviceSetSharedMemConfig cudaSetDeviceFlags cudaThreadExit cudaDeviceSetMemPool "
              "cudaDeviceSetGraphMemAttribute cudaDeviceGraphMemTrim cudaCtxResetPersistingL2Cache "
              "cudaProfilerStart cudaProfilerStop",
    "symbol": "cudaMemcpyToSymbol cudaMemcpyToSymbolAsync cudaGetSymbolAddress cudaMemcpyFromSymbol "
              "cudaMemcpyFromSymbolAsync",
    "default-stream": "cudaMemcpy cudaMemcpy2D cudaMemcpy3D cudaMemset cudaMemset2D cudaMemset3D",
}.items():
    for _n in _names.split():
        _FORBIDDEN[_n] = _group
_FORBIDDEN_PREFIX = (
    ("pthread_", "thread"), ("cudaStreamCreate", "stream"), ("cudaEventCreate", "stream"),
    ("cudaGraph", "stream"), ("cudaStreamBeginCapture", "stream"), ("cudaStreamEndCapture", "stream"),
    ("cudaStreamDestroy", "stream"), ("cudaEventDestroy", "stream"), ("cuStreamCreate", "stream"),
    ("cuEventCreate", "stream"), ("cuGraph", "stream"), ("cuModule", "dl"), ("cuLibrary", "dl"),
    ("cuLink", "dl"), ("cuCtx", "device"), ("cuDevicePrimaryCtx", "device"), ("cuInit", "device"),
    ("cuMemAlloc", "alloc"), ("cuMemHostAlloc", "alloc"), ("cuMemFree", "alloc"),
    ("cudaMemPool", "alloc"), ("cudaIpc", "device"), ("cudaDeviceEnablePeer", "device"),
    ("omp_set_", "omp-settings"), ("omp_target", "device"), ("omp_init_", "omp-settings"),
    ("omp_destroy_", "omp-settings"), ("sigsetjmp", "signal"), ("siglongjmp", "signal"),
    ("cublas", "library"), ("cudnn", "library"), ("cufft", "library"), ("cusparse", "library"),
    ("cusolver", "library"), ("curandCreate", "library"), ("nccl", "library"),
)
_FORBIDDEN_SCOPES = {"torch": "library", "at": "library", "c10": "library", "cutlass": "library",
                     "cute": "library", "thrust": "library", "pybind11": "library"}
_FORBIDDEN_TYPES = {"thread": "thread", "jthread": "thread", "async": "thread"}
_CPU_ALLOWED = {"malloc", "free", "calloc", "realloc", "aligned_alloc", "posix_memalign"}
# Attribute names (after stripping GCC's optional __x__ spelling) that run code at load or exit,
# redirect a symbol, place code or data where the checks do not look, or keep memory uncleared.
_ATTR_FORBIDDEN = re.compile(
    r"\b(?:__)?(constructor|destructor|ifunc|alias|weakref|weak|section|init_priority|visibility|"
    r"symver|target_clones|noinit|persistent|naked)(?:__)?\b")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_UCN = re.compile(r"\\u([0-9a-fA-F]{4})|\\U([0-9a-fA-F]{8})")
# Names of code and data the compilers generate; a candidate that defines or uses them could
# pass for the compiler's own in the binary check (sandbox/compile.py).
_RESERVED_NAMES = re.compile(
    r"^(?:__cuda\w*|__device_stub\w*|__sti__\w*|__fatDeviceText|__fatbinwrap\w*|__nv_fatbin\w*|"
    r"__nv_cudaEntityRegisterCallback|__nv_module_id|_GLOBAL__\w*|frame_dummy|"
    r"__do_global_dtors_aux|_init|_fini|__dso_handle|__TMC_END__|_DYNAMIC|"
    r"_GLOBAL_OFFSET_TABLE_)$")


def _forbidden_group(name: str, backend: str) -> str | None:
    # GCC/clang give many libc functions a __builtin_ twin (__builtin_fork, __builtin_execl,
    # __builtin_printf, __builtin__exit, __builtin_setjmp ...) that compiles to a call of the
    # plain function: to this check `__builtin_X` is X (the explicitly listed __builtin_ names,
    # which have no plain twin, are looked up first).
    if name.startswith("__builtin_") and name not in _FORBIDDEN:
        plain = name[len("__builtin_"):]
        if plain and plain not in ("memcpy", "memset", "memmove", "memcmp"):
            group = _forbidden_group(plain, backend)
            if group:
                return group
    if backend == "cpu" and name in _CPU_ALLOWED:
        return None
    if name in _FORBIDDEN:
        return _FORBIDDEN[name]
    for prefix, group in _FORBIDDEN_PREFIX:
        if name.startswith(prefix):
            return group
    return None


def _forbidden_message(name: str, group: str) -> str:
    return f"{name}() is not allowed in a kernel: {_WHY[group]}"


def _decode_ucn(name: str) -> str:
    """`\\u0073ystem` is the identifier `system` to a C++ compiler; see through it."""
    return _UCN.sub(lambda m: chr(int(m.group(1) or m.group(2), 16)), name)


# ------------------------------------------------------------------------ preprocessor

# Keywords and qualifiers a candidate must not redefine or undefine with the preprocessor. Every
# reserved identifier (`__x`, `_X`: CUDA's __device__/__global__/__shared__, GCC's __attribute__,
# __asm__, ...) is refused by rule; these are the plain-spelled ones.
_KEYWORDS = frozenset("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
char32_t class compl concept const consteval constexpr constinit const_cast continue co_await
co_return co_yield decltype default delete do double dynamic_cast else enum explicit export
extern false float for friend goto if inline int long mutable namespace new noexcept not not_eq
nullptr operator or or_eq private protected public register reinterpret_cast requires return
short signed sizeof static static_assert static_cast struct switch template this thread_local
throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t while
xor xor_eq restrict typeof defined main
""".split())
_MACRO_OK = {"_USE_MATH_DEFINES"}  # reserved spelling, harmless and common


def _macro_name_problem(name: str) -> str | None:
    if name in _MACRO_OK:
        return None
    if name in _KEYWORDS:
        return f"'{name}' is a C++ keyword"
    if name.startswith("__") or (len(name) > 1 and name[0] == "_" and name[1].isupper()):
        return (f"'{name}' is a reserved name (CUDA qualifiers such as __device__ and compiler "
                "keywords such as __attribute__ are spelled this way)")
    if name.startswith(("KF_", "kf_", "kforge_")):
        return f"'{name}' belongs to the region's ABI header ({HEADER_NAME})"
    return None


def _strip_comments(source: str) -> str:
    """The source with every comment replaced by spaces (newlines kept): offsets stay exact.
    String, character and raw-string literals are kept as they are."""
    out = list(source)
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if c == "/" and i + 1 < n and source[i + 1] == "/":
            j = i
            while j < n and source[j] != "\n":
                if source[j] == "\\" and j + 1 < n and source[j + 1] == "\n":
                    j += 2  # a line comment continues over a line splice
                    continue
                j += 1
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
        elif c == "/" and i + 1 < n and source[i + 1] == "*":
            j = source.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
        elif c == "R" and i + 1 < n and source[i + 1] == '"' and (i == 0 or not (
                source[i - 1].isalnum() or source[i - 1] == "_") or source[i - 1] in "uUL8"):
            m = re.match(r'R"([^()\\\s]{0,16})\(', source[i:])
            if m:
                end = source.find(")" + m.group(1) + '"', i + m.end())
                i = n if end < 0 else end + len(m.group(1)) + 2
            else:
                i += 1
        elif c == "'" and 0 < i < n - 1 and source[i - 1].isdigit() and source[i + 1].isalnum():
            i += 1  # a digit separator (1'000'000), not a character literal
        elif c in "\"'":
            j = i + 1
            while j < n and source[j] != c and source[j] != "\n":
                j += 2 if source[j] == "\\" else 1
            i = j + 1
        else:
            i += 1
    return "".join(out)


_DIRECTIVE = re.compile(r"^[ \t]*(?:#|%:)[ \t]*([A-Za-z_]\w*)?(.*)$")


def _directives(clean: str):
    """(line, col, name, argument) of every preprocessor directive, continuation lines joined."""
    lines = clean.split("\n")
    i = 0
    while i < len(lines):
        first = i
        text = lines[i]
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1] + lines[i]
        m = _DIRECTIVE.match(text)
        if m:
            col = len(text) - len(text.lstrip(" \t")) + 1
            digraph = text.lstrip(" \t").startswith("%:")
            yield first + 1, col, m.group(1) or "", m.group(2).strip(), digraph
        i += 1


_PRAGMA_EXPR = re.compile(r"^[\w\s()+\-*/<>%,.]*$")  # `unroll (kVec * 2)`: an integer expression
_OMP_DIRECTIVES = frozenset(
    "parallel for simd sections section single master masked critical atomic barrier task "
    "taskloop taskwait taskgroup taskyield ordered loop flush scan declare reduction unroll tile"
    .split())
_OMP_CLAUSES = frozenset(
    "private firstprivate lastprivate shared default reduction schedule collapse nowait "
    "num_threads if proc_bind simdlen safelen aligned linear uniform inbranch notinbranch untied "
    "mergeable final priority grainsize num_tasks nogroup depend in_reduction task_reduction read "
    "write update capture compare seq_cst relaxed acquire release acq_rel hint copyprivate "
    "nontemporal order partial full sizes initializer filter bind inscan inclusive exclusive "
    "static dynamic guided auto runtime none threads monotonic nonmonotonic close spread primary "
    "concurrent reproducible unconstrained omp_priv omp_orig omp_in omp_out"
    .split())
_GCC_OPTIMIZE_OK = {"O1", "O2", "O3", "-O1", "-O2", "-O3", "unroll-loops", "-funroll-loops",
                    "tree-vectorize", "-ftree-vectorize", "no-math-errno", "-fno-math-errno"}
_PRAGMA_WHY = {
    "redefine_extname": "it makes a name in the source call a different library symbol (a way "
                        "to reach a forbidden function under an innocent name)",
    "weak": "it creates weak symbols and aliases the binary check cannot attribute",
    "STDC": "kernels must not depend on or change the floating-point environment",
    "GCC": "it changes how the compiler builds or links the code",
    "omp": "only OpenMP's parallel/for/simd/task/reduction/... directives are allowed on cpu",
    "push_macro": "it can bring back a macro the check has seen removed",
    "pop_macro": "it can bring back a macro the check has seen removed",
}


def _pragma_problem(text: str, backend: str) -> str | None:
    """Why a pragma (the text after `#pragma`) is not allowed, or None when it is."""
    words = text.split()
    if not words:
        return None  # an empty pragma does nothing
    first, rest = words[0], text[len(words[0]):].strip()
    if first == "once" and not rest:
        return None
    if first in ("unroll", "nounroll") and _PRAGMA_EXPR.match(rest):
        return None
    gcc = re.match(r"^GCC\s+(\w+)\s*(.*)$", text.strip(), re.S)
    if first == "GCC" and gcc:
        sub, arg = gcc.group(1), gcc.group(2).strip()
        if sub == "unroll" and _PRAGMA_EXPR.match(arg):
            return None
        if sub in ("ivdep", "push_options", "pop_options") and not arg:
            return None
        if sub == "diagnostic" and re.match(r'^(push|pop|(ignored|warning)\s+"-W[\w=+-]*")$', arg):
            return None
        if sub == "optimize" and re.match(r'^\(\s*"[^"]*"(\s*,\s*"[^"]*")*\s*\)$', arg) and all(
                o in _GCC_OPTIMIZE_OK for o in re.findall(r'"([^"]*)"', arg)):
            return None
        if sub == "target" and re.match(r'^\(\s*"[\w.,=+-]*"(\s*,\s*"[\w.,=+-]*")*\s*\)$', arg):
            return None
        return (f"#pragma GCC {sub} is not allowed: {_PRAGMA_WHY['GCC']} (allowed: GCC unroll, "
                "ivdep, diagnostic, push_options/pop_options, optimize(\"O3\"), target(\"...\"))")
    if backend == "cuda" and first in ("nv_diag_suppress", "nv_diag_default", "nv_diag_warning",
                                       "nv_diag_once", "diag_suppress", "diag_default",
                                       "diag_warning") and re.match(r"^[\w\s,]*$", rest):
        return None
    if first == "omp":
        if backend != "cpu":
            return "#pragma omp is not allowed on the cuda backend: the launcher runs on one host thread"
        body = rest
        while True:  # drop parenthesised clause arguments: `reduction(max: m)`, `critical(name)`
            nxt = re.sub(r"\([^()]*\)", " ", body)
            if nxt == body:
                break
            body = nxt
        if re.search(r"[^\w\s,:]", body):
            return f"#pragma omp {rest} is not allowed: the directive could not be read"
        ws = re.findall(r"[A-Za-z_]\w*", body)
        if not ws or ws[0] not in _OMP_DIRECTIVES or (ws[0] == "declare" and (
                len(ws) < 2 or ws[1] not in ("simd", "reduction"))):
            return (f"#pragma omp {ws[0] if ws else ''} is not allowed: {_PRAGMA_WHY['omp']}")
        bad = [w for w in ws if w not in _OMP_DIRECTIVES and w not in _OMP_CLAUSES]
        if bad:
            return f"#pragma omp ... {bad[0]} is not allowed: {_PRAGMA_WHY['omp']}"
        return None
    why = _PRAGMA_WHY.get(first, "only unroll/once pragmas (and, on cpu, OpenMP's) are allowed: "
                                 "a pragma can rename symbols or change how the code is built")
    return f"#pragma {first} is not allowed: {why}"


def _pragma_text_problems(text: str, backend: str) -> list[tuple[str, str]]:
    """(rule, message) for code hidden in a pragma's text: OpenMP clauses are expressions
    (`if(...)`, `num_threads(...)`, reduction combiners) evaluated at run time."""
    out = []
    if re.search(r"[{};]", text) or re.search(r"\b(asm|__asm__|__asm)\b", text):
        out.append(("pragma", "a pragma must not contain statements or asm"))
    # string literals are option names already checked against the allow-list by
    # _pragma_problem (`GCC optimize ("no-math-errno")`), not identifiers code could call
    for ident in _IDENT.findall(_decode_ucn(re.sub(r'"[^"\n]*"', '""', text))):
        group = _forbidden_group(ident, backend)
        if group:
            out.append(("forbidden-call", _forbidden_message(ident, group)))
    return out


def _check_directives(source: str, backend: str, diags: list[Diagnostic]) -> None:
    """Rules on preprocessor directives, read from the text (comments removed)."""
    clean = _strip_comments(source)
    for line, col, name, arg, digraph in _directives(clean):
        if digraph:
            diags.append(Diagnostic(line, col, f"%:{name} is not allowed: spell preprocessor "
                                    "directives with # (the digraph hides them from the check)",
                                    "preprocessor"))
        if name in ("define", "undef"):
            m = _IDENT.match(arg)
            macro = m.group(0) if m else ""
            problem = _macro_name_problem(macro) if macro else None
            if problem:
                diags.append(Diagnostic(line, col, f"#{name} {macro} is not allowed: {problem}; "
                                        "redefining it changes what the checked code means "
                                        "(e.g. host code posing as device code)", "redefine"))
            if "%:%:" in arg:
                diags.append(Diagnostic(line, col, "token pasting (%:%: / ##) is not allowed: it "
                                        "can build names the check cannot see", "macro"))
        elif name == "pragma":
            problem = _pragma_problem(arg, backend)
            if problem:
                diags.append(Diagnostic(line, col, problem, "pragma"))
            for rule, msg in _pragma_text_problems(arg, backend):
                diags.append(Diagnostic(line, col, msg, rule))
    for m in _PRAGMA_OP.finditer(clean):
        line, col = _line_col(source, m.start())
        lit = m.group(2)
        if lit is None:
            diags.append(Diagnostic(line, col, f"{m.group(1)} needs one plain string literal "
                                    "(e.g. _Pragma(\"unroll\"))", "pragma"))
            continue
        text = bytes(lit[1:-1], "utf-8").decode("unicode_escape", "replace")
        problem = _pragma_problem(text, backend)
        if problem:
            diags.append(Diagnostic(line, col, problem.replace("#pragma", "_Pragma", 1), "pragma"))
        for rule, msg in _pragma_text_problems(text, backend):
            diags.append(Diagnostic(line, col, msg, rule))


_PRAGMA_OP = re.compile(r'\b(_Pragma|__pragma)\s*(?:\(\s*(L?"(?:[^"\\\n]|\\.)*")\s*\)|)')


# ------------------------------------------------------------------------------ parsing

@functools.lru_cache(maxsize=None)
def _parser(backend: str):
    import tree_sitter

    if backend == "cuda":
        import tree_sitter_cuda as grammar
    else:
        import tree_sitter_cpp as grammar
    return tree_sitter.Parser(tree_sitter.Language(grammar.language()))


def _scan_balanced(text: str, i: int) -> int:
    """Index just past the parenthesised group starting at text[i] == '(' (or len(text))."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "(":
            depth += 1
        elif text[j] == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


# GCC accepts `__attribute` as well as `__attribute__` (same meaning): both are attributes.
_ATTR_START = re.compile(r"\b(__attribute__|__attribute|__align__|__declspec)\s*\(")
_LAMBDA_SPACE = re.compile(r"\]\s*((?:(?:__host__|__device__)\s*)+)")


def _blank(text: str, a: int, b: int) -> str:
    return text[:a] + re.sub(r"[^\n]", " ", text[a:b]) + text[b:]


_ATTR_WHY = {
    "constructor": "it runs code when the library loads, before any checked call",
    "destructor": "it runs code when the library unloads, after the checked calls",
    "init_priority": "it runs a static initialiser when the library loads, before any checked call",
    "ifunc": "its resolver runs when the library loads",
    "target_clones": "its resolver runs when the library loads",
    "section": "it places code or data where the binary check does not expect it",
    "noinit": "memory that is not cleared keeps values between loads",
    "persistent": "memory that is not cleared keeps values between loads",
}


def _attribute_message(name: str) -> str:
    why = _ATTR_WHY.get(name, "it redirects or hides a symbol from the checks")
    return f"attribute '{name}' is not allowed: {why}"


def _prepare(source: str, backend: str, out: list[Diagnostic]) -> str:
    """Blank the attribute and `_Pragma(...)` spellings the grammars mis-parse, keeping every
    offset; check attributes first (pragmas are checked by _check_directives). Comments are
    blanked too: an attribute or pragma named in a comment is not code."""
    text = _strip_comments(source)
    pos = 0
    while (m := _ATTR_START.search(text, pos)) is not None:
        end = _scan_balanced(text, m.end() - 1)
        body = text[m.start():end]
        bad = _ATTR_FORBIDDEN.search(body)
        if bad:
            line, col = _line_col(source, m.start())
            out.append(Diagnostic(line, col, _attribute_message(bad.group(1)), "load-time-code"))
        for ident in _IDENT.findall(body):
            group = _forbidden_group(ident, backend)
            if group:
                line, col = _line_col(source, m.start())
                out.append(Diagnostic(line, col, _forbidden_message(ident, group), "forbidden-call"))
        text = _blank(text, m.start(), end)
        pos = end
    for m in list(_PRAGMA_OP.finditer(text)):
        if m.group(2) is not None and not _in_directive(text, m.start()):
            text = _blank(text, m.start(), m.end())  # in code: a statement the grammar lacks
    if backend == "cuda":
        text = _LAMBDA_SPACE.sub(lambda m: m.group(0)[:m.start(1) - m.start(0)]
                                 + " " * len(m.group(1)), text)
    return text


def _in_directive(text: str, offset: int) -> bool:
    """Whether `offset` lies on a preprocessor directive's logical line (continuations included)."""
    start = text.rfind("\n", 0, offset) + 1
    while start > 1 and text[start - 2] == "\\":
        start = text.rfind("\n", 0, start - 1) + 1
    return text[start:offset].lstrip(" \t").startswith(("#", "%:"))


def _line_col(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _pos(node) -> tuple[int, int]:
    return node.start_point.row + 1, node.start_point.column + 1


def _walk(node):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def _txt(node) -> str:
    return node.text.decode("utf-8", "replace")


# ------------------------------------------------------------------------------- checks

def check_source(source: str, signature: abi.Signature) -> StaticReport:
    """Check one candidate against its task's entry-point signature; backend = signature.backend."""
    backend = signature.backend
    if not isinstance(source, str):
        return _report([Diagnostic(1, 1, f"source is {type(source).__name__}, not text", "empty")])
    if not source.strip():
        return _report([Diagnostic(1, 1, "empty source: there is no code to check", "empty")])
    if "\x00" in source:
        line, col = _line_col(source, source.index("\x00"))
        return _report([Diagnostic(line, col, "source contains a NUL byte: not a text file", "parse")])

    diags: list[Diagnostic] = []
    _check_directives(source, backend, diags)
    text = _prepare(source, backend, diags)
    tree = _parser(backend).parse(text.encode("utf-8"))
    root = tree.root_node

    parse = _parse_errors(root, text)
    if parse:
        # Nothing else is meaningful on a tree with holes: report where it breaks (and what the
        # directive and attribute checks already found).
        return _report(_unique(parse + diags))

    _check_splices(source, diags)
    defined = _defined_functions(root)
    if backend == "cuda":
        _check_shadow_uses(root, diags)
    for node in _walk(root):
        t = node.type
        if t == "preproc_include":
            _check_include(node, backend, diags)
        elif t in ("preproc_def", "preproc_function_def"):
            _check_macro(node, backend, diags)
        elif t == "preproc_call":
            _check_directive(node, diags)
        elif t == "identifier":
            _check_identifier(node, backend, diags)
        elif t == "qualified_identifier":
            _check_qualified(node, diags)
        elif t == "type_identifier" and node.parent is not None \
                and node.parent.type != "qualified_identifier" and _txt(node) in _FORBIDDEN_TYPES:
            line, col = _pos(node)
            diags.append(Diagnostic(line, col, f"{_txt(node)} is not allowed in a kernel: "
                                    f"{_WHY['thread']}", "forbidden-call"))
        elif t == "declaration":
            _check_declaration(node, diags)
            _check_bodiless(node, defined, diags)
        elif t == "field_declaration":
            _check_field(node, diags)
        elif t in ("storage_class_specifier",) and _txt(node) in ("thread_local", "__thread"):
            line, col = _pos(node)
            diags.append(Diagnostic(line, col, f"{_txt(node)} state is not allowed: it can carry "
                                    "results from one call to the next", "mutable-state"))
        elif "asm" in t and t.endswith(("expression", "statement", "declaration")):
            _check_asm(node, backend, diags)
        elif t == "kernel_call_syntax":
            _check_launch(node, diags)
        elif t == "call_expression" and backend == "cuda":
            _check_stream_call(node, diags)
        elif t == "attribute_declaration" or t == "attribute":
            bad = _ATTR_FORBIDDEN.search(_txt(node))
            if bad:
                line, col = _pos(node)
                diags.append(Diagnostic(line, col, _attribute_message(bad.group(1)), "load-time-code"))
    _check_entry(root, signature, diags, _includes_header(root))
    return _report(_unique(diags))


# Within one line, the diagnostic that names the trick comes first (the first diagnostic is the
# one-line message users see): `extern "C" int f(...) __asm__("pthread_create");` is an asm label
# before it is a bodiless declaration.
_RULE_RANK = {"parse": 0, "pragma": 1, "redefine": 1, "preprocessor": 1, "load-time-code": 2,
              "asm": 2, "macro": 2, "reserved-name": 3, "forbidden-call": 3, "extern-variable": 3,
              "mutable-state": 4, "include": 4, "launch-stream": 4, "line-splice": 4,
              "undeclared-function": 5}


# ------------------------------------------------------------------ device variables on the host

_DEVICE_SPACES = ("__constant__", "__device__", "__managed__")


def _device_variable_names(root) -> set[str]:
    """Names of file-scope __constant__/__device__/__managed__ variables the source declares."""
    out = set()
    for n in _walk(root):
        if n.type != "declaration" or _inside_function(n):
            continue
        _, quals = _specifiers(n)
        if quals & set(_DEVICE_SPACES):
            out.update(_decode_ucn(_var_name(d)) for d, _, _ in _declared_vars(n))
    return out


def device_variables(source: str, backend: str = "cuda") -> set[str]:
    """The __constant__/__device__ variables a CUDA source declares where the parser can see them:
    nvcc gives each a host-side shadow in writable memory, which the binary check allows for
    exactly these names (and the source check keeps host code away from them)."""
    if backend != "cuda" or not isinstance(source, str):
        return set()
    try:
        text = _prepare(source, backend, [])
        return _device_variable_names(_parser(backend).parse(text.encode("utf-8")).root_node)
    except Exception:  # a source the parser cannot read declares nothing the check trusts
        return set()


def _is_declared_name(node) -> bool:
    """Whether an identifier is the name a declaration introduces (not a use of it)."""
    child, p = node, node.parent
    while p is not None and p.type in ("array_declarator", "init_declarator", "pointer_declarator",
                                       "reference_declarator", "parenthesized_declarator"):
        if p.child_by_field_name("declarator") != child:
            return False
        child, p = p, p.parent
    if p is None or p.type != "declaration":
        return False
    return any(p.field_name_for_child(i) == "declarator" and c == child
               for i, c in enumerate(p.children))


def _host_context(node) -> bool:
    fn = _enclosing_function(node)
    if fn is None:
        return True  # file scope: a host initialiser
    spaces = {c.type for c in fn.children if not c.is_named}
    return "__host__" in spaces or not spaces & {"__device__", "__global__"}


def _check_shadow_uses(root, diags: list[Diagnostic]) -> None:
    """Host code must not touch a __constant__/__device__ variable: what it reaches is the host
    shadow nvcc keeps for the registration, ordinary writable memory (a place to hide state)."""
    names = _device_variable_names(root)
    if not names:
        return
    tainted = set(names)  # macros whose bodies name a device variable, to a fixpoint
    macros = {}
    for n in _walk(root):
        if n.type in ("preproc_def", "preproc_function_def"):
            name, value = n.child_by_field_name("name"), n.child_by_field_name("value")
            if name is not None and value is not None:
                macros[_txt(name)] = set(_IDENT.findall(_decode_ucn(_txt(value))))
    changed = True
    while changed:
        changed = False
        for m, idents in macros.items():
            if m not in tainted and idents & tainted:
                tainted.add(m)
                changed = True
    for n in _walk(root):
        if n.type != "identifier":
            continue
        name = _decode_ucn(_txt(n))
        if name not in tainted or _is_declared_name(n) or not _host_context(n):
            continue
        if n.parent is not None and n.parent.type in ("preproc_def", "preproc_function_def"):
            continue
        line, col = _pos(n)
        what = name if name in names else f"{name} (a macro naming a device variable)"
        diags.append(Diagnostic(line, col, f"host code must not use the device variable {what}: "
                                "on the host it is a shadow copy in ordinary writable memory, a "
                                "place to keep state between calls", "mutable-state"))


def _unique(diags: list[Diagnostic]) -> list[Diagnostic]:
    """One diagnostic per (place, rule, message): an identifier and its call site say the same."""
    seen, unique = set(), []
    for d in sorted(diags, key=lambda d: (d.line, _RULE_RANK.get(d.rule, 4), d.col)):
        key = (d.line, d.col, d.rule, d.message)
        if key not in seen:
            seen.add(key)
            unique.append(d)
    return unique


def _report(diags: list[Diagnostic]) -> StaticReport:
    return StaticReport(ok=not diags, diagnostics=diags)


def _parse_errors(root, text: str, limit: int = 5) -> list[Diagnostic]:
    if not root.has_error:
        return []
    out: list[Diagnostic] = []
    stack = [root]
    while stack and len(out) < limit:
        n = stack.pop()
        if n.is_missing:
            line, col = _pos(n)
            out.append(Diagnostic(line, col, f"syntax error: missing {n.type!r} (truncated or "
                                  "unbalanced source?)", "parse"))
            continue
        if n.is_error:
            line, col = _pos(n)
            if n.end_byte >= len(text.rstrip().encode("utf-8")):
                out.append(Diagnostic(line, col, "syntax error: what starts here is not closed "
                                      "before the end of the source (truncated?)", "parse"))
                continue
            snippet = _txt(n).strip().splitlines()[0][:40] if _txt(n).strip() else ""
            out.append(Diagnostic(line, col, f"syntax error near {snippet!r}" if snippet
                                  else "syntax error", "parse"))
            continue
        if n.has_error:
            stack.extend(reversed(n.children))
    out.sort(key=lambda d: (d.line, d.col))
    return out


def _check_splices(source: str, diags: list[Diagnostic]) -> None:
    """A backslash-newline outside a directive glues tokens (`sys\\` + `tem`) the grammar sees apart."""
    in_directive = False
    for i, line in enumerate(source.split("\n"), 1):
        starts = line.lstrip().startswith("#")
        directive = in_directive or starts
        continued = line.rstrip("\r").endswith("\\")
        if continued and not directive and not line.lstrip().startswith("//"):
            diags.append(Diagnostic(i, len(line.rstrip("\r")), "a backslash-newline outside a "
                                    "#define is not allowed: it can splice names the check cannot "
                                    "see", "line-splice"))
        in_directive = directive and continued


def _check_include(node, backend: str, diags: list[Diagnostic]) -> None:
    path_node = node.child_by_field_name("path")
    line, col = _pos(node)
    if path_node is None:
        diags.append(Diagnostic(line, col, "#include without a path", "include"))
        return
    raw = _txt(path_node).strip()
    if path_node.type == "string_literal":
        if raw == f'"{HEADER_NAME}"':
            return  # the region's generated ABI header, written beside the candidate
        diags.append(Diagnostic(line, col, f"#include {raw} is not allowed: a candidate is one "
                                f'self-contained file; the only quoted include is "{HEADER_NAME}" '
                                "(use <...> for the allow-listed headers)", "include"))
        return
    if path_node.type != "system_lib_string":
        diags.append(Diagnostic(line, col, f"#include {raw} is not allowed: the header must be "
                                "named literally", "include"))
        return
    path = raw[1:-1].strip()
    if ".." in path or path.startswith("/") or "\\" in path:
        diags.append(Diagnostic(line, col, f"#include <{path}> is not allowed: a header path must "
                                "not climb out of the include directories", "include"))
    elif path == HEADER_NAME:
        diags.append(Diagnostic(line, col, f'write #include "{HEADER_NAME}" (quoted): the region '
                                "header sits beside the candidate", "include"))
    elif not _include_allowed(path, backend):
        diags.append(Diagnostic(line, col, f"#include <{path}> is not allowed on the {backend} "
                                f"backend: {_include_reason(path)}", "include"))


_DIRECTIVES_OK = {"#pragma", "#error", "#warning", "#undef"}


def _check_directive(node, diags: list[Diagnostic]) -> None:
    """#include_next, #import, #embed, #line ...: other ways to pull in files or skew line numbers."""
    d = node.child_by_field_name("directive")
    name = re.sub(r"\s+", "", _txt(d)) if d is not None else "#?"
    if name not in _DIRECTIVES_OK:
        line, col = _pos(node)
        diags.append(Diagnostic(line, col, f"the {name} directive is not allowed in a kernel",
                                "preprocessor"))


def _check_macro(node, backend: str, diags: list[Diagnostic]) -> None:
    value = node.child_by_field_name("value")
    if value is None:
        return
    body = _txt(value).replace("\\\r\n", "").replace("\\\n", "")
    line, col = _pos(value)
    if "##" in body:
        diags.append(Diagnostic(line, col, "token pasting (##) is not allowed: it can build names "
                                "the check cannot see", "macro"))
    for ident in _IDENT.findall(_decode_ucn(body)):
        group = _forbidden_group(ident, backend)
        if group:
            diags.append(Diagnostic(line, col, _forbidden_message(ident, group), "forbidden-call"))
        elif ident in ("asm", "__asm__", "__asm"):
            diags.append(Diagnostic(line, col, "inline asm inside a macro is not allowed", "asm"))
        elif ident in ("thread_local", "__thread", "mutable"):
            diags.append(Diagnostic(line, col, f"{ident} inside a macro is not allowed", "mutable-state"))
        elif _RESERVED_NAMES.match(ident):
            diags.append(Diagnostic(line, col, f"the name {ident} is reserved for code the compiler "
                                    "generates (the binary check trusts it)", "reserved-name"))


def _check_identifier(node, backend: str, diags: list[Diagnostic]) -> None:
    name = _decode_ucn(_txt(node))
    group = _forbidden_group(name, backend)
    if group:
        line, col = _pos(node)
        diags.append(Diagnostic(line, col, _forbidden_message(name, group), "forbidden-call"))
    elif _RESERVED_NAMES.match(name):
        line, col = _pos(node)
        diags.append(Diagnostic(line, col, f"the name {name} is reserved for code the compiler "
                                "generates (the binary check trusts it)", "reserved-name"))


def _check_qualified(node, diags: list[Diagnostic]) -> None:
    scope = node.child_by_field_name("scope")
    name = node.child_by_field_name("name")
    scope_txt = _txt(scope) if scope is not None else ""
    line, col = _pos(node)
    if scope_txt in _FORBIDDEN_SCOPES and (node.parent is None
                                            or node.parent.type != "qualified_identifier"):
        diags.append(Diagnostic(line, col, f"{_txt(node)} is not allowed: {_WHY['library']} "
                                "(and kernels must not call back into PyTorch)", "forbidden-call"))
    elif scope_txt == "std" and name is not None and _txt(name) in _FORBIDDEN_TYPES:
        diags.append(Diagnostic(line, col, f"std::{_txt(name)} is not allowed in a kernel: "
                                f"{_WHY['thread']}", "forbidden-call"))


def _inside_function(node) -> bool:
    p = node.parent
    while p is not None:
        if p.type in ("function_definition", "lambda_expression"):
            return True
        p = p.parent
    return False


def _specifiers(node) -> tuple[set[str], set[str]]:
    """(storage classes, qualifiers incl. CUDA memory spaces) written on a declaration."""
    storage, quals = set(), set()
    for c in node.children:
        if c.type == "storage_class_specifier":
            storage.add(_txt(c))
        elif c.type == "type_qualifier":
            quals.add(_txt(c))
        elif not c.is_named and c.type in ("__device__", "__constant__", "__shared__", "__managed__",
                                            "__host__", "__global__"):
            quals.add(c.type)
    return storage, quals


def _is_const(node) -> bool:
    return any(q.type == "type_qualifier" and _txt(q) == "const" for q in node.children)


def _declared_vars(node):
    """(declarator, layers, function_pointer) for each variable (not function) a declaration
    introduces. `layers` lists the const-ness of every pointer level, outermost (the pointee)
    first and the variable itself last; a reference adds a level that is always const."""
    for i, c in enumerate(node.children):
        if node.field_name_for_child(i) != "declarator":
            continue
        if "asm" in c.type:
            continue  # an asm label (`... __asm__("sym")`), reported by _check_asm
        d, layers, is_func, fn_ptr = c, [], False, False
        while d is not None:
            if d.type in ("function_declarator", "abstract_function_declarator"):
                inner = d.child_by_field_name("declarator")
                probe = inner
                while probe is not None and probe.type in ("parenthesized_declarator",
                                                           "abstract_parenthesized_declarator"):
                    probe = next((x for x in probe.named_children if x.type != "type_qualifier"), None)
                if probe is None or probe.type not in ("pointer_declarator", "reference_declarator",
                                                       "abstract_pointer_declarator"):
                    is_func = True
                    break
                fn_ptr, layers = True, []  # a pointer to code: only the pointer levels matter
                d = inner
                continue
            if d.type in ("pointer_declarator", "abstract_pointer_declarator"):
                layers.append(_is_const(d))
            elif d.type in ("reference_declarator", "abstract_reference_declarator"):
                layers.append(True)
            if d.type in ("identifier", "field_identifier", "qualified_identifier",
                          "operator_name", "destructor_name"):
                break
            nxt = d.child_by_field_name("declarator")
            if nxt is None:
                named = [x for x in d.named_children if x.type != "type_qualifier"]
                nxt = named[0] if named else None
            d = nxt
        if not is_func:
            yield c, layers, fn_ptr


def _var_name(decl) -> str:
    """The name a declarator introduces (`** environ` -> `environ`, `cache[N] = {}` -> `cache`)."""
    d = decl
    while d is not None:
        if d.type in ("identifier", "field_identifier", "qualified_identifier", "operator_name",
                      "destructor_name"):
            return _txt(d)
        nxt = d.child_by_field_name("declarator")
        if nxt is None:
            named = [x for x in d.named_children if x.type not in ("type_qualifier",)]
            nxt = named[0] if named else None
        d = nxt
    return _txt(decl).split("=")[0].strip()


def _mutability(quals: set[str], layers: list[bool], fn_ptr: bool) -> str | None:
    """What is writable about a variable with static storage, in words (None: nothing)."""
    if "constexpr" in quals:
        return None  # a constant expression cannot point at memory that is writable and its own
    base_const = fn_ptr or "const" in quals
    if layers and not layers[-1]:
        return "the variable itself can be changed"
    if not layers:
        return None if base_const else "the variable itself can be changed"
    if not base_const or not all(layers):
        return "it points at writable memory (a const pointer to non-const data is still state)"
    return None


def _check_declaration(node, diags: list[Diagnostic]) -> None:
    storage, quals = _specifiers(node)
    local = _inside_function(node)
    if local and not storage & {"static", "extern"}:
        return  # an automatic local lives for one call
    if "extern" in storage and "__shared__" not in quals:  # `extern __shared__ float smem[]` is fine
        for decl, _, _ in _declared_vars(node):
            line, col = _pos(decl)
            diags.append(Diagnostic(line, col, f"extern variable '{_var_name(decl)}' is not allowed: "
                                    "it names data defined outside the kernel (e.g. extern char** "
                                    "environ); a kernel sees only its arguments", "extern-variable"))
        return
    if "__shared__" in quals or "__constant__" in quals:
        # __shared__ lives for one block of one launch; device code cannot write __constant__ and
        # the host-side writers (cudaMemcpyToSymbol, cudaGetSymbolAddress) are forbidden calls.
        return
    if "typedef" in storage:
        return
    extern = node.parent is not None and node.parent.type == "linkage_specification"
    for decl, layers, fn_ptr in _declared_vars(node):
        line, col = _pos(decl)
        name = _var_name(decl)
        if extern:
            diags.append(Diagnostic(line, col, f"extern variable '{name}' is not allowed: it "
                                    "names data defined outside the kernel (e.g. extern char** "
                                    "environ); a kernel sees only its arguments", "extern-variable"))
            continue
        problem = _mutability(quals, layers, fn_ptr)
        if problem is None:
            continue
        where = "static local" if local else "file-scope variable"
        space = next((q for q in ("__device__", "__managed__", "__constant__") if q in quals), "")
        what = f"{space} {where}" if space else where
        diags.append(Diagnostic(line, col, f"mutable {what} '{name}' is not allowed: {problem}, "
                                "so it can carry results from one call to the next (make it "
                                "constexpr, or const all the way down, or pass it in)",
                                "mutable-state"))


def _check_field(node, diags: list[Diagnostic]) -> None:
    storage, quals = _specifiers(node)
    if "mutable" in quals:
        line, col = _pos(node)
        diags.append(Diagnostic(line, col, "a mutable member is not allowed: it can be changed "
                                "through a const (even a static const) object, so it can carry "
                                "results from one call to the next", "mutable-state"))
        return
    if "static" not in storage:
        return
    for decl, layers, fn_ptr in _declared_vars(node):
        problem = _mutability(quals, layers, fn_ptr)
        if problem is None:
            continue
        line, col = _pos(decl)
        diags.append(Diagnostic(line, col, f"mutable static member '{_var_name(decl)}' is not allowed: "
                                f"{problem}, so it can carry results from one call to the next",
                                "mutable-state"))


def _declarator_name(node) -> str | None:
    """The (unqualified) name a function definition or declaration introduces."""
    d = node.child_by_field_name("declarator")
    while d is not None:
        if d.type in ("identifier", "field_identifier", "operator_name", "destructor_name"):
            return _txt(d)
        if d.type == "qualified_identifier":
            return re.split(r"\s*::\s*", _txt(d))[-1]
        if d.type == "template_function":
            n = d.child_by_field_name("name")
            return _txt(n) if n is not None else None
        nxt = d.child_by_field_name("declarator")
        if nxt is None:
            named = [x for x in d.named_children if x.type not in ("type_qualifier", "parameter_list")]
            nxt = named[0] if named else None
        d = nxt
    return None


def _defined_functions(root) -> set[str]:
    return {n for node in _walk(root) if node.type == "function_definition"
            and (n := _declarator_name(node)) is not None}


_LIBM_NAME = re.compile(
    r"^(?:sin|cos|tan|asin|acos|atan|atan2|sinh|cosh|tanh|asinh|acosh|atanh|exp|exp2|exp10|expm1|"
    r"log|log2|log10|log1p|logb|ilogb|pow|sqrt|rsqrt|cbrt|hypot|erf|erfc|erfinv|erfcinv|lgamma|"
    r"tgamma|ceil|floor|trunc|round|lround|llround|rint|lrint|llrint|nearbyint|fmod|remainder|"
    r"remquo|fdim|fmax|fmin|fma|fabs|copysign|nan|nextafter|frexp|ldexp|modf|scalbn|scalbln|"
    r"sincos|sincospi|sinpi|cospi|normcdf|normcdfinv)[fl]?$")


_TYPE_NODES = {"primitive_type", "sized_type_specifier", "struct_specifier", "class_specifier",
               "enum_specifier", "union_specifier", "type_qualifier", "template_type",
               "qualified_identifier"}


def _params_look_like_types(fd) -> bool:
    """Whether a block-scope `T f(...)` declares a function (parameter types) rather than an
    object built from expressions (`std::vector<float> e(kN)`, the most vexing parse)."""
    plist = fd.child_by_field_name("parameters")
    if plist is None:
        return False
    params = [c for c in plist.named_children if c.type != "comment"]
    if not params:
        return True  # `int getpid();`
    for p in params:
        if p.type == "variadic_parameter" or p.child_by_field_name("declarator") is not None:
            return True
        t = p.child_by_field_name("type")
        if t is not None and (t.type in _TYPE_NODES or _txt(t) in ("size_t", "int64_t", "uint64_t",
                                                                     "int32_t", "uint32_t")):
            return True
    return False


def _check_bodiless(node, defined: set[str], diags: list[Diagnostic]) -> None:
    """A function declared without a body that this file never defines: a hand-declared entry
    into some library (`int pthread_create(...)`, `extern "C" char* getenv(...)`)."""
    storage, _ = _specifiers(node)
    if "typedef" in storage or (node.parent is not None
                                and node.parent.type in ("field_declaration_list", "template_declaration")
                                and node.parent.parent is not None
                                and node.parent.parent.type in ("class_specifier", "struct_specifier",
                                                                "union_specifier")):
        return
    d = node.child_by_field_name("declarator")
    fd = None
    while d is not None:
        if d.type == "function_declarator":
            inner = d.child_by_field_name("declarator")
            if inner is not None and inner.type in ("identifier", "qualified_identifier",
                                                    "field_identifier", "operator_name",
                                                    "destructor_name", "template_function"):
                fd = d
            break  # `(*fp)(int)` is a function pointer variable: _check_declaration's business
        if d.type in ("init_declarator", "parenthesized_declarator", "identifier",
                      "array_declarator"):
            break  # a variable
        d = d.child_by_field_name("declarator")
    if fd is None:
        return
    if _inside_function(node) and "extern" not in storage and not _params_look_like_types(fd):
        return  # `std::vector<float> e(n);`: an object, whatever the grammar calls it
    name = _declarator_name(node)
    if name is None or name in defined or name == ENTRY or _LIBM_NAME.match(name):
        return
    line, col = _pos(node)
    group = _forbidden_group(name, "cuda")
    why = f" ({_WHY[group]})" if group else ""
    diags.append(Diagnostic(line, col, f"function '{name}' is declared here but not defined: a "
                            "kernel calls only functions it defines or that the allowed headers "
                            f"declare; a hand-written declaration reaches library code the check "
                            f"cannot vet{why}", "undeclared-function"))


def _enclosing_function(node):
    p = node.parent
    while p is not None and p.type != "function_definition":
        p = p.parent
    return p


def _check_asm(node, backend: str, diags: list[Diagnostic]) -> None:
    line, col = _pos(node)
    if node.parent is not None and node.parent.type in ("declaration", "field_declaration",
                                                         "function_definition"):
        code = node.child_by_field_name("assembly_code")
        sym = _txt(code).strip('"') if code is not None else "?"
        diags.append(Diagnostic(line, col, f"asm label {sym!r} is not allowed: it binds a name to a "
                                "symbol the check cannot see", "asm"))
        return
    if backend != "cuda":
        diags.append(Diagnostic(line, col, "inline asm is not allowed on the cpu backend: it can "
                                "issue system calls the check cannot see (use intrinsics from "
                                "<immintrin.h>)", "asm"))
        return
    fn = _enclosing_function(node)
    spaces = {c.type for c in fn.children if not c.is_named} if fn is not None else set()
    if fn is None or not spaces & {"__device__", "__global__"} or "__host__" in spaces:
        diags.append(Diagnostic(line, col, "inline asm is allowed only in __device__/__global__ "
                                "functions (inline PTX); host asm can make system calls the check "
                                "cannot see", "asm"))


_DEFAULT_STREAMS = {"0", "0x0", "nullptr", "NULL", "cudaStreamLegacy", "cudaStreamPerThread",
                    "0x1", "0x2", "1", "2"}


# Runtime API calls that take a stream, and the index of that argument.
_STREAM_ARG = {"cudaLaunchKernel": 5, "cudaLaunchCooperativeKernel": 5, "cudaMemcpyAsync": 4,
               "cudaMemsetAsync": 3, "cudaMallocAsync": 2, "cudaFreeAsync": 1,
               "cudaMemcpy2DAsync": 7, "cudaMemset2DAsync": 5}


def _check_stream_call(node, diags: list[Diagnostic]) -> None:
    """`cudaLaunchKernel(..., 0)`, `cudaMemcpyAsync(d, s, n, kind)` (the stream defaults to 0):
    work on the legacy default stream, which <<<...>>> checking alone would not see."""
    fn = node.child_by_field_name("function")
    args = node.child_by_field_name("arguments")
    if fn is None or args is None:
        return
    name = re.split(r"\s*::\s*", _txt(fn))[-1]
    if name not in _STREAM_ARG:
        return
    vals = [c for c in args.named_children if c.type != "comment"]
    i = _STREAM_ARG[name]
    if len(vals) <= i or _txt(vals[i]).strip() in _DEFAULT_STREAMS \
            or re.fullmatch(r"\(\s*cudaStream_t\s*\)\s*(0|nullptr|NULL)", _txt(vals[i]).strip()):
        line, col = _pos(node)
        diags.append(Diagnostic(line, col, f"{name} must be given the launcher's stream argument "
                                "(work on the default stream is not ordered with the caller or "
                                "timed)", "launch-stream"))


def _check_launch(node, diags: list[Diagnostic]) -> None:
    args = [c for c in node.named_children if c.type != "comment"]
    line, col = _pos(node)
    if len(args) < 4 or _txt(args[3]).strip() in _DEFAULT_STREAMS:
        diags.append(Diagnostic(line, col, "kernel launch must use the given stream: "
                                "<<<grid, block, smem, stream>>> (work on another stream is not "
                                "ordered with the caller or timed)", "launch-stream"))


# ------------------------------------------------------------------------- entry point

_RESTRICT = {"__restrict__", "__restrict", "restrict"}
_CV = {"const", "volatile"}
_ALIASES = {
    "long": "int64_t", "long int": "int64_t", "signed long": "int64_t", "signed long int": "int64_t",
    "long long": "int64_t", "long long int": "int64_t", "signed long long": "int64_t",
    "signed long long int": "int64_t", "int64_t": "int64_t",
    "unsigned short": "uint16_t", "unsigned short int": "uint16_t", "uint16_t": "uint16_t",
    "half": "__half", "nv_bfloat16": "__nv_bfloat16",
}


def _base_type(node) -> str:
    t = re.sub(r"\s+", " ", _txt(node)).strip()
    t = re.sub(r"\s*::\s*", "::", t)
    t = t[2:] if t.startswith("::") else t
    t = t[5:] if t.startswith("std::") else t
    return _ALIASES.get(t, t)


def _param_type(param) -> str:
    """Canonical C type of one parameter: names, `restrict` and top-level cv dropped."""
    if param.type == "variadic_parameter":
        return "..."
    type_node = param.child_by_field_name("type")
    base = _base_type(type_node) if type_node is not None else "?"
    base_q = {_txt(c) for c in param.children if c.type == "type_qualifier"} & _CV
    layers: list[tuple[str, set[str]]] = []
    d = param.child_by_field_name("declarator")
    while d is not None and d.type not in ("identifier", "field_identifier"):
        if d.type in ("pointer_declarator", "abstract_pointer_declarator"):
            layers.append(("*", {_txt(c) for c in d.children if c.type == "type_qualifier"} & _CV))
        elif d.type in ("reference_declarator", "abstract_reference_declarator"):
            layers.append(("&", set()))
        elif d.type in ("array_declarator", "abstract_array_declarator"):
            layers.append(("*", set()))  # a parameter array is a pointer
        elif d.type not in ("parenthesized_declarator", "abstract_parenthesized_declarator"):
            return re.sub(r"\s+", " ", _txt(param))  # function pointers etc.: compare as written
        nxt = d.child_by_field_name("declarator")
        if nxt is None:
            named = [x for x in d.named_children if x.type not in ("type_qualifier", "number_literal")]
            nxt = named[0] if named else None
        d = nxt
    if not layers:
        return base  # top-level cv of a value parameter is not part of the function type
    out = " ".join(sorted(base_q)) + " " + base if base_q else base
    for i, (op, q) in enumerate(layers):
        out += op
        if i < len(layers) - 1 and q:
            out += " " + " ".join(sorted(q))
    return out


def _params(fn_declarator) -> list:
    plist = fn_declarator.child_by_field_name("parameters")
    if plist is None:
        return []
    ps = [c for c in plist.named_children if c.type in ("parameter_declaration", "variadic_parameter",
                                                        "optional_parameter_declaration")]
    if len(ps) == 1 and _txt(ps[0]).strip() == "void":
        return []
    return ps


def _fn_declarator(node):
    """The function_declarator naming `kforge_launch` under a definition/declaration, if any."""
    d = node.child_by_field_name("declarator")
    while d is not None:
        if d.type == "function_declarator":
            name = d.child_by_field_name("declarator")
            return d if name is not None and _txt(name) == ENTRY else None
        d = d.child_by_field_name("declarator")
    return None


def _c_linkage(node) -> bool:
    p = node.parent
    while p is not None:
        if p.type == "linkage_specification":
            v = p.child_by_field_name("value")
            if v is not None and _txt(v).strip('"') == "C":
                return True
        p = p.parent
    return False


@functools.lru_cache(maxsize=256)
def _expected_types(declaration: str, backend: str) -> tuple[str, ...]:
    tree = _parser(backend).parse((declaration + ";").encode())
    for n in _walk(tree.root_node):
        if n.type == "function_declarator":
            return tuple(_param_type(p) for p in _params(n))
    raise ValueError(f"cannot parse the expected declaration {declaration!r}")


def _includes_header(root) -> bool:
    for n in _walk(root):
        if n.type == "preproc_include":
            p = n.child_by_field_name("path")
            if p is not None and _txt(p).strip() == f'"{HEADER_NAME}"':
                return True
    return False


_PARAM_NAMES = ("inputs", "outputs", "stream")


def _check_entry(root, signature: abi.Signature, diags: list[Diagnostic],
                 has_header: bool = False) -> None:
    defs, decls = [], []
    for n in _walk(root):
        if n.type == "function_definition" and _fn_declarator(n) is not None:
            defs.append(n)
        elif n.type in ("declaration", "field_declaration") and _fn_declarator(n) is not None:
            decls.append(n)
    want = signature.declaration()
    if not defs:
        if decls:
            line, col = _pos(decls[0])
            diags.append(Diagnostic(line, col, f"{ENTRY} is declared but never defined; define "
                                    f"{want} {{...}}", "entry-point"))
        else:
            diags.append(Diagnostic(1, 1, f"no entry point: the candidate must define {want} {{...}}",
                                    "entry-point"))
        return
    if len(defs) > 1:
        line, col = _pos(defs[1])
        diags.append(Diagnostic(line, col, f"{ENTRY} is defined more than once", "entry-point"))
    fn = defs[0]
    line, col = _pos(fn)
    storage, _ = _specifiers(fn)
    if "static" in storage:
        diags.append(Diagnostic(line, col, f"{ENTRY} must not be static: it would not be exported",
                                "entry-point"))
    # The generated header declares the entry point extern "C"; a later definition keeps that
    # linkage, so a candidate that includes the header may define it without repeating extern "C".
    if not has_header and not _c_linkage(fn) and not any(_c_linkage(d) for d in decls):
        diags.append(Diagnostic(line, col, f'{ENTRY} must have C linkage: write extern "C" int '
                                f'{ENTRY}(...), put it inside extern "C" {{ }} or include '
                                f'"{HEADER_NAME}" (a C++ name is mangled and the loader cannot '
                                "find it)", "linkage"))
    rtype = fn.child_by_field_name("type")
    if rtype is None or _base_type(rtype) != "int" or fn.child_by_field_name("declarator").type \
            != "function_declarator":
        got = _txt(rtype) if rtype is not None else "nothing"
        diags.append(Diagnostic(line, col, f"{ENTRY} must return int (0 or a cudaError_t), not {got}",
                                "signature"))
    fd = _fn_declarator(fn)
    params = _params(fd)
    got = [_param_type(p) for p in params]
    expected = list(_expected_types(want, signature.backend))
    names = list(_PARAM_NAMES[:len(expected)])
    if len(got) != len(expected):
        pline, pcol = _pos(fd.child_by_field_name("parameters"))
        diags.append(Diagnostic(pline, pcol, f"{ENTRY} takes {len(got)} parameters, expected "
                                f"{len(expected)}: expected ({', '.join(expected)}), got "
                                f"({', '.join(got)}); the entry point is {want}", "signature"))
        return
    for i, (g, e) in enumerate(zip(got, expected)):
        if g != e:
            pline, pcol = _pos(params[i])
            diags.append(Diagnostic(pline, pcol, f"parameter {i + 1} ({names[i]}): expected {e}, "
                                    f"got {g} (shapes, strides and dtypes come from "
                                    f"{HEADER_NAME}, not from parameters)", "signature"))
