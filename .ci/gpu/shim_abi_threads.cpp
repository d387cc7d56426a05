// Issue 13: thread scaling of the call compiled programs make, with no Python anywhere. The C ABI
// `aoti_torch_cuda_mm_out(out, self, mat2)` (libtorch's own, and our native shim's, exported as
// `refimpl_cuda_mm_out_v1` and dlopen'ed from the path given) is called from 1, 2, 4 and 8 C++ threads,
// each with its own non-blocking stream made current through the AOTI shim's stream guard (what an AOTI
// program's run does), on tensors made through the AOTI shim. Both entries run in this one process, so
// their figures compare. Output: one line per (entry, threads) and the 8-thread/1-thread ratios.
//
// Build and run: .ci/gpu/shim_abi_threads.sh (headers and libraries from the installed torch wheel).
#define USE_CUDA 1
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cuda.h>

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

using MmOut = AOTITorchError (*)(AtenTensorHandle, AtenTensorHandle, AtenTensorHandle);

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "failed: %s\n", what);
    std::exit(2);
  }
}

struct Operands {
  AtenTensorHandle a{}, b{}, out{};
};

AtenTensorHandle make(int64_t n) {
  const int64_t sizes[2] = {n, n}, strides[2] = {n, 1};
  AtenTensorHandle t{};
  check(aoti_torch_empty_strided(2, sizes, strides, aoti_torch_dtype_bfloat16(), aoti_torch_device_type_cuda(),
                                 0, &t) == AOTI_TORCH_SUCCESS,
        "aoti_torch_empty_strided");
  void* data{};
  check(aoti_torch_get_data_ptr(t, &data) == AOTI_TORCH_SUCCESS, "aoti_torch_get_data_ptr");
  check(cudaMemset(data, 0x3c, sizeof(uint16_t) * n * n) == cudaSuccess, "cudaMemset");  // ~0.0115, not 0
  return t;
}

// Calls/s of `threads` threads, `calls` each: from the release of all threads to the last stream drained.
double rate(MmOut mm, std::vector<Operands>& ops, int threads, int calls) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      check(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice");
      cudaStream_t stream{};
      check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess, "cudaStreamCreate");
      CUDAStreamGuardHandle guard{};
      check(aoti_torch_create_cuda_stream_guard(stream, 0, &guard) == AOTI_TORCH_SUCCESS, "stream guard");
      Operands& o = ops[i];
      for (int k = 0; k < 50; ++k) check(mm(o.out, o.a, o.b) == AOTI_TORCH_SUCCESS, "mm_out (warm-up)");
      check(cudaStreamSynchronize(stream) == cudaSuccess, "cudaStreamSynchronize");
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      for (int k = 0; k < calls; ++k) check(mm(o.out, o.a, o.b) == AOTI_TORCH_SUCCESS, "mm_out");
      check(cudaStreamSynchronize(stream) == cudaSuccess, "cudaStreamSynchronize");
      aoti_torch_delete_cuda_stream_guard(guard);
      cudaStreamDestroy(stream);
    });
  }
  while (ready.load() < threads) {
  }
  const auto start = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (auto& t : pool) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return threads * calls / seconds;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <native shim library> [n=64] [calls=20000] [repeats=5]\n", argv[0]);
    return 2;
  }
  const int n = argc > 2 ? std::atoi(argv[2]) : 64;
  const int calls = argc > 3 ? std::atoi(argv[3]) : 20000;
  const int repeats = argc > 4 ? std::atoi(argv[4]) : 5;
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  check(lib != nullptr, dlerror());
  auto ours = reinterpret_cast<MmOut>(dlsym(lib, "refimpl_cuda_mm_out_v1"));
  check(ours != nullptr, "dlsym refimpl_cuda_mm_out_v1");
  const struct {
    const char* name;
    MmOut fn;
  } entries[] = {{"libtorch aoti_torch_cuda_mm_out", &aoti_torch_cuda_mm_out}, {"ours refimpl_cuda_mm_out_v1", ours}};
  std::vector<Operands> ops(8);
  for (auto& o : ops) o = {make(n), make(n), make(n)};
  check(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
  std::printf("# %dx%dx%d bf16, %d calls per thread, best of %d; C ABI from C++ threads, no Python\n", n, n, n,
              calls, repeats);
  for (const auto& e : entries) {
    double one = 0;
    for (int threads : {1, 2, 4, 8}) {
      double best = 0;
      for (int r = 0; r < repeats; ++r) best = std::max(best, rate(e.fn, ops, threads, calls));
      if (threads == 1) one = best;
      std::printf("%-32s threads=%d  %10.0f calls/s  (%.2fx one thread)\n", e.name, threads, best, best / one);
    }
  }
  return 0;
}
