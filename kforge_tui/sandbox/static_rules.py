"""The source check's vocabulary: diagnostics, the header allow-lists and the forbidden names.

Names are grouped by why a kernel has no business with them (`_WHY`); the binary check
(sandbox/compile.py) words its import refusals from the same groups.
"""
from __future__ import annotations

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


