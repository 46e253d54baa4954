#!/usr/bin/env bash
# First call on a GPU machine: what is there, and does a plain extern "C" .cu load through ctypes?
set -u
source bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
nvcc --version | tail -1; python3 --version
python3 - <<'PY'
import torch, time, ctypes, subprocess, tempfile, os
print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).multi_processor_count)
import tree_sitter, tree_sitter_cuda; print("tree-sitter ok")
for m in ("transformers","diffusers","liger_kernel","triton","textual","litellm"):
    try:
        mod=__import__(m); print(m, getattr(mod,"__version__","?"))
    except Exception as e: print(m, "MISSING", type(e).__name__)
src=r'''
#include <cuda_runtime.h>
#include <stdint.h>
__global__ void k(const float* x, float* y, int64_t n){int64_t i=blockIdx.x*(int64_t)blockDim.x+threadIdx.x; if(i<n) y[i]=2*x[i];}
extern "C" int kforge_launch(const float* x, float* y, int64_t n, cudaStream_t s){k<<<(n+255)/256,256,0,s>>>(x,y,n); return (int)cudaGetLastError();}
'''
d=tempfile.mkdtemp(); open(d+"/a.cu","w").write(src)
t=time.time(); r=subprocess.run(["nvcc","-O3","-arch=sm_90","-shared","-Xcompiler","-fPIC","-Xptxas","-v","-o",d+"/a.so",d+"/a.cu"],capture_output=True,text=True); print("nvcc s", round(time.time()-t,2), r.returncode, r.stderr.strip()[-200:])
lib=ctypes.CDLL(d+"/a.so"); f=lib.kforge_launch; f.restype=ctypes.c_int; f.argtypes=[ctypes.c_void_p,ctypes.c_void_p,ctypes.c_int64,ctypes.c_void_p]
x=torch.randn(1<<20,device="cuda"); y=torch.empty_like(x); s=torch.cuda.Stream()
with torch.cuda.stream(s):
    rc=f(x.data_ptr(),y.data_ptr(),x.numel(),s.cuda_stream); s.synchronize()
print("ctypes rc", rc, "ok", torch.equal(y,2*x))
a=torch.empty(2*2**30,dtype=torch.uint8,device="cuda"); b=torch.empty_like(a)
for _ in range(3): b.copy_(a)
torch.cuda.synchronize(); e0=torch.cuda.Event(enable_timing=True); e1=torch.cuda.Event(enable_timing=True)
ts=[]
for _ in range(10):
    e0.record(); b.copy_(a); e1.record(); e1.synchronize(); ts.append(e0.elapsed_time(e1))
ts.sort(); print("copy bandwidth GB/s (r+w)", round(2*a.numel()/ (ts[5]/1e3)/1e9,1))
PY
