// The kforge region op in C++: a verified kernel's `kforge_launch` called by the dispatcher with
// no Python on the call path (issue 26: the Python custom op cost ~120 us of host time a call).
//
// Built once per machine and torch version by integrate/native.py (torch.utils.cpp_extension),
// shipped as source inside exports. It includes no CUDA header: the current stream comes from
// the AOTInductor C shim that every CUDA build of libtorch exports, so one source builds with
// the CPU wheel's headers too.
//
//   kforge_native_init(ns)              implement `<ns>::region(str key, Tensor[] inputs) ->
//                                       Tensor[]` for CPU and CUDA (the schema, its tags and
//                                       its fake implementation are defined from Python)
//   kforge_native_add(key, fn, ...)     a verified kernel: its entry point and exact layouts
//   kforge_native_calls(key)            how often it ran here (fallbacks are counted in Python)
//
// A call whose tensors differ from the verified layouts (the compiled graph's keys are exact,
// but the op is callable by anyone) is forwarded to `<ns>::region_fallback`, the Python op that
// runs the region's own graph, so the answer is always right.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <dlfcn.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

struct Layout {
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype;
};

struct Kernel {
  void* fn = nullptr;
  bool cuda = false;
  std::vector<Layout> ins, outs;
  int64_t align = 1;  // every pointer must be a multiple of this (what the sandbox verified)
  std::atomic<int64_t> calls{0};
};

using Launch2 = int (*)(const void* const*, void* const*);
using Launch3 = int (*)(const void* const*, void* const*, void*);
using GetStream = int32_t (*)(int32_t, void**);

std::shared_mutex mu;  // kernels are added while other models may be running
std::unordered_map<std::string, std::unique_ptr<Kernel>> kernels;
std::vector<std::unique_ptr<Kernel>> retired;
std::string ns_name;
std::vector<std::unique_ptr<torch::Library>> libs;  // registrations live as long as the process

GetStream current_stream_fn() {
  // libtorch_cuda exports this C entry point (AOTInductor's shim) in every CUDA build; a CPU
  // build has none, and only CUDA kernels ask for it.
  static GetStream fn = [] {
    void* h = dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_NOLOAD);
    void* sym = h ? dlsym(h, "aoti_torch_get_current_cuda_stream") : nullptr;
    if (!sym) sym = dlsym(RTLD_DEFAULT, "aoti_torch_get_current_cuda_stream");
    return reinterpret_cast<GetStream>(sym);
  }();
  return fn;
}

bool matches(const Kernel& k, const at::TensorList& inputs) {
  if (inputs.size() != k.ins.size()) return false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    const Layout& m = k.ins[i];
    if (t.scalar_type() != m.dtype || t.is_cuda() != k.cuda) return false;
    if (reinterpret_cast<uintptr_t>(t.data_ptr()) % k.align) return false;
    auto sz = t.sizes();
    auto st = t.strides();
    if (sz.size() != m.sizes.size()) return false;
    for (size_t d = 0; d < sz.size(); ++d) {
      if (sz[d] != m.sizes[d]) return false;
      // the stride of a dim of size 1 never moves a pointer
      if (sz[d] > 1 && st[d] != m.strides[d]) return false;
    }
  }
  return true;
}

std::vector<at::Tensor> fallback(c10::string_view key, at::TensorList inputs) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow((ns_name + "::region_fallback").c_str(), "")
                       .typed<std::vector<at::Tensor>(c10::string_view, at::TensorList)>();
  return op.call(key, inputs);
}

std::vector<at::Tensor> region(c10::string_view key, at::TensorList inputs) {
  Kernel* k = nullptr;
  {
    std::shared_lock<std::shared_mutex> lock(mu);
    auto it = kernels.find(std::string(key));
    if (it != kernels.end()) k = it->second.get();
  }
  if (k == nullptr || !matches(*k, inputs)) return fallback(key, inputs);
  c10::Device device = inputs.empty() ? c10::Device(k->cuda ? c10::kCUDA : c10::kCPU, 0)
                                      : inputs[0].device();
  std::vector<at::Tensor> outs;
  outs.reserve(k->outs.size());
  c10::SmallVector<const void*, 8> in_ptrs;
  c10::SmallVector<void*, 4> out_ptrs;
  for (const Layout& m : k->outs) {
    outs.push_back(at::empty_strided(m.sizes, m.strides,
                                     at::TensorOptions().dtype(m.dtype).device(device)));
    out_ptrs.push_back(outs.back().data_ptr());
  }
  for (const at::Tensor& t : inputs) in_ptrs.push_back(t.data_ptr());
  if (in_ptrs.empty()) in_ptrs.push_back(nullptr);
  if (out_ptrs.empty()) out_ptrs.push_back(nullptr);
  int rc;
  if (k->cuda) {
    GetStream get = current_stream_fn();
    TORCH_CHECK(get != nullptr, "kforge: this torch exports no aoti_torch_get_current_cuda_stream");
    void* stream = nullptr;
    TORCH_CHECK(get(device.index(), &stream) == 0, "kforge: cannot read the current CUDA stream");
    rc = reinterpret_cast<Launch3>(k->fn)(in_ptrs.data(), out_ptrs.data(), stream);
  } else {
    rc = reinterpret_cast<Launch2>(k->fn)(in_ptrs.data(), out_ptrs.data());
  }
  TORCH_CHECK(rc == 0, "kforge kernel ", std::string(key).substr(0, 12), " returned error ", rc);
  k->calls.fetch_add(1, std::memory_order_relaxed);
  return outs;
}

std::vector<Layout> layouts(int n, const int32_t* ndims, const int64_t* sizes,
                            const int64_t* strides, const int32_t* dtypes) {
  std::vector<Layout> out;
  size_t at = 0;
  for (int i = 0; i < n; ++i) {
    Layout m;
    m.sizes.assign(sizes + at, sizes + at + ndims[i]);
    m.strides.assign(strides + at, strides + at + ndims[i]);
    m.dtype = static_cast<c10::ScalarType>(dtypes[i]);
    at += ndims[i];
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace

extern "C" {

// 0 on success; -1 if an exception escaped (the message goes to stderr) or the library already
// serves another namespace (each copy of runtime.py builds its own library).
int kforge_native_init(const char* ns) {
  try {
    std::unique_lock<std::shared_mutex> lock(mu);
    if (!ns_name.empty()) return ns_name == ns ? 0 : -1;
    ns_name = ns;
    for (auto key : {c10::DispatchKey::CPU, c10::DispatchKey::CUDA}) {
      libs.push_back(std::make_unique<torch::Library>(torch::Library::IMPL, ns_name, key,
                                                      __FILE__, __LINE__));
      libs.back()->impl("region", TORCH_FN(region));
    }
    return 0;
  } catch (const std::exception& e) {
    fprintf(stderr, "kforge_native_init: %s\n", e.what());
    return -1;
  }
}

// Layouts are flattened: ndims[i] sizes and strides per tensor, dtypes as c10::ScalarType.
int kforge_native_add(const char* key, void* fn, int cuda, int n_in, const int32_t* in_ndims,
                      const int64_t* in_sizes, const int64_t* in_strides, const int32_t* in_dtypes,
                      int n_out, const int32_t* out_ndims, const int64_t* out_sizes,
                      const int64_t* out_strides, const int32_t* out_dtypes, int64_t align) {
  auto k = std::make_unique<Kernel>();
  k->fn = fn;
  k->cuda = cuda != 0;
  k->align = align > 0 ? align : 1;
  k->ins = layouts(n_in, in_ndims, in_sizes, in_strides, in_dtypes);
  k->outs = layouts(n_out, out_ndims, out_sizes, out_strides, out_dtypes);
  std::unique_lock<std::shared_mutex> lock(mu);
  // a key names one region at one layout; a re-applied run brings the same kernel again. The
  // old entry is kept alive: a call on another thread may be holding it.
  auto it = kernels.find(key);
  if (it != kernels.end()) retired.push_back(std::move(it->second));
  kernels[key] = std::move(k);
  return 0;
}

int64_t kforge_native_calls(const char* key) {
  std::shared_lock<std::shared_mutex> lock(mu);
  auto it = kernels.find(key);
  return it == kernels.end() ? -1 : it->second->calls.load();
}

void kforge_native_reset(const char* key) {
  std::shared_lock<std::shared_mutex> lock(mu);
  auto it = kernels.find(key);
  if (it != kernels.end()) it->second->calls = 0;
}

}  // extern "C"
