// expect: static_error | cudaLaunchHostFunc
// layer: static, link-check
// Cheat (class 4): enqueues a host callback on the stream that computes the softmax on the CPU
// (through mapped memory) - host work the device-event timing cannot see. Rejected by name and
// by import.
#include "kforge_region.h"
#include <float.h>
struct Job { const float* x; float* y; };
static void on_host(void* p) {
    Job* job = (Job*)p;
    (void)job;  // the CPU fills the (mapped) output here, outside the device-event timing
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    Job job{(const float*)inputs[0], (float*)outputs[0]};
    cudaLaunchHostFunc(stream, on_host, &job);
    return (int)cudaGetLastError();
}
