// Issue 13's thread target, without Python: calls/s of one small cublasGemmEx (bf16, fp32 compute; the
// call our shim makes) from 1, 2, 4 and 8 native threads, each with its own cuBLAS handle, workspace and
// non-blocking stream, on one GPU. What Python threads can reach is bounded by this: if 8 C++ threads are
// not 3x one, the driver (one context, one device) is the limit, not the GIL.
//
// Build and run: .ci/gpu/thread_ceiling.sh (it finds the headers and libraries the shim builds with).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#define CHECK_CUDA(x)                                                                  \
  do {                                                                                 \
    cudaError_t e = (x);                                                               \
    if (e != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e));                      \
      std::exit(2);                                                                    \
    }                                                                                  \
  } while (0)
#define CHECK_CUBLAS(x)                                                                \
  do {                                                                                 \
    cublasStatus_t s = (x);                                                            \
    if (s != CUBLAS_STATUS_SUCCESS) {                                                  \
      std::fprintf(stderr, "%s: status %d\n", #x, static_cast<int>(s));                 \
      std::exit(2);                                                                    \
    }                                                                                  \
  } while (0)

namespace {

struct Worker {
  cudaStream_t stream{};
  cublasHandle_t handle{};
  void* workspace{};
  __nv_bfloat16 *a{}, *b{}, *c{};
};

constexpr size_t kWorkspace = 4u << 20;

void setup(Worker& w, int n) {
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaStreamCreateWithFlags(&w.stream, cudaStreamNonBlocking));
  CHECK_CUBLAS(cublasCreate(&w.handle));
  CHECK_CUBLAS(cublasSetStream(w.handle, w.stream));
  CHECK_CUDA(cudaMalloc(&w.workspace, kWorkspace));
  CHECK_CUBLAS(cublasSetWorkspace(w.handle, w.workspace, kWorkspace));
  CHECK_CUBLAS(cublasSetMathMode(w.handle, CUBLAS_DEFAULT_MATH));
  const size_t bytes = sizeof(__nv_bfloat16) * n * n;
  CHECK_CUDA(cudaMalloc(&w.a, bytes));
  CHECK_CUDA(cudaMalloc(&w.b, bytes));
  CHECK_CUDA(cudaMalloc(&w.c, bytes));
  CHECK_CUDA(cudaMemset(w.a, 0x3c, bytes));  // bf16 0x3c3c ~ 0.0115: not zeros
  CHECK_CUDA(cudaMemset(w.b, 0x3c, bytes));
}

void gemm(Worker& w, int n) {
  const float one = 1.0f, zero = 0.0f;
  CHECK_CUBLAS(cublasGemmEx(w.handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, w.b, CUDA_R_16BF, n, w.a,
                            CUDA_R_16BF, n, &zero, w.c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
}

// Calls/s of `threads` threads, `calls` each, from the release of all threads to the last stream drained.
double rate(std::vector<Worker>& workers, int threads, int calls, int n) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      Worker& w = workers[i];
      CHECK_CUDA(cudaSetDevice(0));
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      for (int k = 0; k < calls; ++k) gemm(w, n);
      CHECK_CUDA(cudaStreamSynchronize(w.stream));
    });
  }
  while (ready.load() < threads) {
  }
  const auto start = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (auto& t : pool) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return threads * static_cast<double>(calls) / seconds;
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 64;
  const int calls = argc > 2 ? std::atoi(argv[2]) : 20000;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 5;
  std::vector<Worker> workers(8);
  for (auto& w : workers) {
    setup(w, n);
    for (int k = 0; k < 200; ++k) gemm(w, n);  // handles, kernels and workspaces warm
    CHECK_CUDA(cudaStreamSynchronize(w.stream));
  }
  std::printf("native cublasGemmEx %dx%dx%d bf16, %d calls per thread, best and median of %d\n", n, n, n, calls,
              repeats);
  double one = 0.0;
  for (int threads : {1, 2, 4, 8}) {
    std::vector<double> rates;
    for (int r = 0; r < repeats; ++r) rates.push_back(rate(workers, threads, calls, n));
    std::sort(rates.begin(), rates.end());
    const double median = rates[rates.size() / 2];
    if (threads == 1) one = median;
    std::printf("threads %d: median %.0f calls/s (best %.0f, worst %.0f), %.2fx one thread\n", threads, median,
                rates.back(), rates.front(), median / one);
  }
  return 0;
}
