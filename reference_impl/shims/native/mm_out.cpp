// The reference cuBLAS mm_out shim in C++: out = self @ mat2 with one cublasGemmEx call.
//
// C ABI of AOTInductor's `aoti_torch_cuda_mm_out(out, self, mat2)`. Exported as
// `refimpl_cuda_mm_out_v1` (the name compiled programs are routed to: same length as the ABI name, see
// routing.py) and, only when built with -DREFIMPL_EXPORT_AOTI_NAME (a runtime without libtorch that links
// this file), also as `aoti_torch_cuda_mm_out` itself. Exporting the ABI name from a library loaded into
// global scope next to libtorch would silently take over every AOTI program of the process.
//
// Semantics mirror reference_impl/shims/mm_out.py (validate) and gemm_plan.py (layouts):
//  * rules checked in errors.RULES order; every error names the argument and the rule, and nothing is
//    allocated, copied or written before all checks pass (out untouched on any error);
//  * row-major operands: CUBLAS_OP_N, column-major: CUBLAS_OP_T, anything else: a contiguous scratch copy;
//  * fp32/fp16/bf16 with CUBLAS_COMPUTE_32F and CUBLAS_DEFAULT_MATH (no TF32), beta = 0;
//  * the caller's current stream of the tensors' device (aoti_torch_get_current_cuda_stream), no host sync;
//  * one cuBLAS handle per (thread, device) and one workspace per (thread, device, stream), thread_local:
//    no lock anywhere on the call path.
// Tensor metadata is read only through the AOTI C shim (torch/csrc/inductor/aoti_torch/c/shim.h), so any
// AtenTensorHandle provider works. Errors: AOTI_TORCH_FAILURE plus a thread-local record read back with
// refimpl_mm_out_last_error().

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cuda.h>  // the ABI we implement (checked below)

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <library_types.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <type_traits>
#include <vector>

#define REFIMPL_API extern "C" __attribute__((visibility("default")))

namespace {

constexpr int64_t kInt32Max = 2147483647;
constexpr size_t kWorkspaceBytes = 32u * 1024u * 1024u;  // cuBLAS's recommendation for Hopper; torch's
constexpr size_t kMaxWorkspacesPerHandle = 16;

// ----------------------------------------------------------------------------------------- errors

enum ErrorKind : int32_t {
  kNoError = 0,
  kArgumentError = 1,  // -> MmOutArgumentError(argument, rule, detail)
  kCublasError = 2,    // -> CublasError(function, status, status name)
  kCudaError = 3,      // -> RuntimeError
  kInternalError = 4,  // -> RuntimeError (an AOTI shim call failed, an exception, ...)
};

struct LastError {
  int32_t kind = kNoError;
  int32_t status = 0;
  std::string argument;  // argument error: out/self/mat2; cuBLAS/CUDA error: the function
  std::string rule;      // argument error: the rule id; cuBLAS error: the status name
  std::string detail;
};

thread_local LastError t_error;

struct Failure {};  // thrown after t_error is filled; caught at the C boundary

[[noreturn]] void argument_error(const char* argument, const char* rule, std::string detail) {
  t_error.kind = kArgumentError;
  t_error.status = 0;
  t_error.argument = argument;
  t_error.rule = rule;
  t_error.detail = std::move(detail);
  throw Failure{};
}

[[noreturn]] void internal_error(int32_t kind, const char* function, int32_t status, std::string name,
                                 std::string detail) {
  t_error.kind = kind;
  t_error.status = status;
  t_error.argument = function;
  t_error.rule = std::move(name);
  t_error.detail = std::move(detail);
  throw Failure{};
}

void check_aoti(AOTITorchError code, const char* function) {
  if (code != AOTI_TORCH_SUCCESS) {
    internal_error(kInternalError, function, code, "AOTI_TORCH_FAILURE",
                   std::string("AOTI shim call ") + function + " failed");
  }
}

void check_cuda(cudaError_t code, const char* function) {
  if (code != cudaSuccess) {
    internal_error(kCudaError, function, static_cast<int32_t>(code), cudaGetErrorName(code),
                   std::string("CUDA call ") + function + " failed with " + cudaGetErrorName(code) + ": " +
                       cudaGetErrorString(code));
  }
}

void check_cublas(cublasStatus_t status, const char* function) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    const char* name = cublasGetStatusName(status);
    internal_error(kCublasError, function, static_cast<int32_t>(status), name ? name : "unknown status",
                   "");
  }
}

// --------------------------------------------------------------------------------- tensor metadata

struct Constants {
  int32_t float32, float16, bfloat16;
  int32_t cuda, meta;
  int32_t strided;
};

const Constants& constants() {
  static const Constants c = {
      aoti_torch_dtype_float32(), aoti_torch_dtype_float16(), aoti_torch_dtype_bfloat16(),
      aoti_torch_device_type_cuda(), aoti_torch_device_type_meta(), aoti_torch_layout_strided(),
  };
  return c;
}

struct Meta {
  AtenTensorHandle handle;
  const char* name;
  int32_t layout = 0;
  int64_t dim = 0;
  const int64_t* sizes = nullptr;
  const int64_t* strides = nullptr;
  int32_t dtype = 0;
  int32_t device_type = 0;
  int32_t device_index = 0;
  bool negative = false;  // a negative view (Python entry only: the C shim cannot see the bit)
};

// Python's spelling of these values, so messages match mm_out.py's word for word.
std::string dtype_name(int32_t dtype) {
  static const char* const names[] = {
      "torch.uint8",       "torch.int8",          "torch.int16",      "torch.int32",
      "torch.int64",       "torch.float16",       "torch.float32",    "torch.float64",
      "torch.complex32",   "torch.complex64",     "torch.complex128", "torch.bool",
      "torch.qint8",       "torch.quint8",        "torch.qint32",     "torch.bfloat16",
      "torch.quint4x2",    "torch.quint2x4",      "torch.bits1x8",    "torch.bits2x4",
      "torch.bits4x2",     "torch.bits8",         "torch.bits16",     "torch.float8_e5m2",
      "torch.float8_e4m3fn", "torch.float8_e5m2fnuz", "torch.float8_e4m3fnuz", "torch.uint16",
      "torch.uint32",      "torch.uint64",
  };
  if (dtype >= 0 && dtype < static_cast<int32_t>(sizeof(names) / sizeof(names[0]))) {
    return names[dtype];
  }
  return "dtype code " + std::to_string(dtype);
}

std::string layout_name(int32_t layout) {
  static const char* const names[] = {"torch.strided",    "torch.sparse_coo", "torch.sparse_csr",
                                      "torch.sparse_csc", "torch.sparse_bsr", "torch.sparse_bsc",
                                      "torch._mkldnn",    "torch.jagged"};
  if (layout >= 0 && layout < static_cast<int32_t>(sizeof(names) / sizeof(names[0]))) {
    return names[layout];
  }
  return "layout code " + std::to_string(layout);
}

std::string device_name(int32_t type, int32_t index) {
  // c10::DeviceType numbering, lower-case as torch.device prints it.
  static const char* const names[] = {"cpu",  "cuda", "mkldnn", "opengl", "opencl", "ideep", "hip",
                                      "fpga", "maia", "xla",    "vulkan", "metal",  "xpu",   "mps",
                                      "meta", "hpu",  "ve",     "lazy",   "ipu",    "mtia",  "privateuseone"};
  std::string text = (type >= 0 && type < static_cast<int32_t>(sizeof(names) / sizeof(names[0])))
                         ? names[type]
                         : "device type " + std::to_string(type);
  if (index >= 0) {
    text += ":" + std::to_string(index);
  }
  return text;
}

std::string shape_text(const Meta& t) {
  std::string text = "[";
  for (int64_t i = 0; i < t.dim; ++i) {
    text += (i ? ", " : "") + std::to_string(t.sizes[i]);
  }
  return text + "]";
}

std::string strides_text(const Meta& t) {  // a Python tuple
  std::string text = "(";
  for (int64_t i = 0; i < t.dim; ++i) {
    text += (i ? ", " : "") + std::to_string(t.strides[i]);
  }
  return text + (t.dim == 1 ? ",)" : ")");
}

void read_layout(Meta& t) {
  if (t.handle == nullptr) {
    argument_error(t.name, "present", std::string(t.name) + " is a null tensor handle; mm_out needs a tensor");
  }
  check_aoti(aoti_torch_get_layout(t.handle, &t.layout), "aoti_torch_get_layout");
}

void read_rest(Meta& t) {
  check_aoti(aoti_torch_get_dim(t.handle, &t.dim), "aoti_torch_get_dim");
  int64_t* sizes = nullptr;
  int64_t* strides = nullptr;
  check_aoti(aoti_torch_get_sizes(t.handle, &sizes), "aoti_torch_get_sizes");
  check_aoti(aoti_torch_get_strides(t.handle, &strides), "aoti_torch_get_strides");
  t.sizes = sizes;
  t.strides = strides;
  check_aoti(aoti_torch_get_dtype(t.handle, &t.dtype), "aoti_torch_get_dtype");
  check_aoti(aoti_torch_get_device_type(t.handle, &t.device_type), "aoti_torch_get_device_type");
  check_aoti(aoti_torch_get_device_index(t.handle, &t.device_index), "aoti_torch_get_device_index");
}

uintptr_t address(const Meta& t) {
  void* data = nullptr;
  check_aoti(aoti_torch_get_data_ptr(t.handle, &data), "aoti_torch_get_data_ptr");
  return reinterpret_cast<uintptr_t>(data);
}

// ------------------------------------------------------------------------- layouts (gemm_plan.py)

struct Layout {
  bool in_place;
  cublasOperation_t op;
  int64_t ld;
};

// (op, ld) that reads a [rows, cols] operand where it lies; in_place false when it must be copied.
Layout in_place_layout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  const int64_t min_cols = cols > 1 ? cols : 1;
  const int64_t min_rows = rows > 1 ? rows : 1;
  if (cols <= 1 || col_stride == 1) {  // row-major
    const int64_t ld = rows > 1 ? row_stride : min_cols;
    if (min_cols <= ld && ld <= kInt32Max) return {true, CUBLAS_OP_N, ld};
  }
  if (rows <= 1 || row_stride == 1) {  // column-major, e.g. a transposed view
    const int64_t ld = cols > 1 ? col_stride : min_rows;
    if (min_rows <= ld && ld <= kInt32Max) return {true, CUBLAS_OP_T, ld};
  }
  return {false, CUBLAS_OP_N, 0};
}

struct Plan {
  cublasOperation_t transa, transb;
  int64_t m, n, k, lda, ldb, ldc;
  bool copy_mat2, copy_self;
};

void check_size(const char* argument, const char* what, int64_t value) {
  if (value > kInt32Max) {
    argument_error(argument, "size-limit",
                   std::string(what) + " is " + std::to_string(value) + ", more than cuBLAS accepts (" +
                       std::to_string(kInt32Max) + ", a 32-bit signed int)");
  }
}

Plan plan_gemm(int64_t M, int64_t N, int64_t K, const Meta& self, const Meta& mat2) {
  check_size("self", "self.size(0) (M)", M);
  check_size("self", "self.size(1) (K)", K);
  check_size("mat2", "mat2.size(1) (N)", N);
  const Layout a = in_place_layout(K, N, mat2.strides[0], mat2.strides[1]);
  const Layout b = in_place_layout(M, K, self.strides[0], self.strides[1]);
  Plan plan;
  plan.transa = a.in_place ? a.op : CUBLAS_OP_N;
  plan.lda = a.in_place ? a.ld : (N > 1 ? N : 1);
  plan.transb = b.in_place ? b.op : CUBLAS_OP_N;
  plan.ldb = b.in_place ? b.ld : (K > 1 ? K : 1);
  plan.m = N;
  plan.n = M;
  plan.k = K;
  plan.ldc = N > 1 ? N : 1;
  plan.copy_mat2 = !a.in_place;
  plan.copy_self = !b.in_place;
  return plan;
}

using i128 = __int128;

i128 floor_div(i128 a, i128 b) {  // Python's //, b > 0
  i128 q = a / b;
  if ((a % b != 0) && (a < 0)) --q;
  return q;
}

// Whether run [start + i*pitch, start + i*pitch + length), 0 <= i < count, meets [lo, hi) (exact).
bool runs_meet_range(i128 start, i128 count, i128 length, i128 pitch, i128 lo, i128 hi) {
  if (count <= 0 || length <= 0 || hi <= lo) return false;
  if (count == 1 || pitch == 0) return start < hi && start + length > lo;
  i128 first = floor_div(lo - start - length, pitch) + 1;
  if (first < 0) first = 0;
  i128 last = floor_div(hi - start - 1, pitch);
  if (last > count - 1) last = count - 1;
  return first <= last;
}

int64_t element_size(int32_t dtype) { return dtype == constants().float32 ? 4 : 2; }

void check_no_overlap(const Meta& out, const Meta& self, const Meta& mat2, const Plan& plan, int64_t M,
                      int64_t N) {
  if (out.device_type == constants().meta) return;  // no memory; every meta tensor reports address 0
  const i128 itemsize = element_size(out.dtype);
  const i128 lo = static_cast<i128>(address(out));
  const i128 hi = lo + static_cast<i128>(M) * N * itemsize;
  const Meta* operands[] = {&self, &mat2};
  for (const Meta* t : operands) {
    const bool is_mat2 = t == &mat2;
    if ((is_mat2 ? plan.copy_mat2 : plan.copy_self)) continue;  // read from its scratch
    if (t->device_type != out.device_type || t->device_index != out.device_index) continue;
    i128 count, length, pitch;
    if (is_mat2) {  // op N: K rows of N elements; op T: N columns of K elements
      count = plan.transa == CUBLAS_OP_N ? plan.k : plan.m;
      length = plan.transa == CUBLAS_OP_N ? plan.m : plan.k;
      pitch = plan.lda;
    } else {  // op N: M rows of K elements; op T: K columns of M elements
      count = plan.transb == CUBLAS_OP_N ? plan.n : plan.k;
      length = plan.transb == CUBLAS_OP_N ? plan.k : plan.n;
      pitch = plan.ldb;
    }
    if (runs_meet_range(static_cast<i128>(address(*t)), count, length * itemsize, pitch * itemsize, lo, hi)) {
      argument_error("out", "no-overlap",
                     std::string("out shares memory with ") + t->name + "; cuBLAS would overwrite " + t->name +
                         " while reading it");
    }
  }
}

// How many CUDA devices this process sees. Fixed for the process's life (CUDA_VISIBLE_DEVICES is read when
// CUDA starts), so it is asked once, not on every call; a failed query is not remembered (asked again).
int visible_devices() {
  static std::atomic<int> cached{-1};
  int visible = cached.load(std::memory_order_relaxed);
  if (visible >= 0) return visible;
  if (cudaGetDeviceCount(&visible) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later CUDA calls of this thread are not confused
    return 0;
  }
  cached.store(visible, std::memory_order_relaxed);
  return visible;
}

struct Checked {
  int64_t M, N, K;
  bool has_plan;
  Plan plan;
};

// mm_out.py's validate(), rule for rule and message for message (present/is-tensor are Python's own).
Checked validate(Meta& out, Meta& self, Meta& mat2) {
  const Constants& c = constants();
  Meta* tensors[] = {&self, &mat2, &out};
  for (Meta* t : tensors) read_layout(*t);
  for (Meta* t : tensors) {
    if (t->layout != c.strided) {
      argument_error(t->name, "strided-layout",
                     std::string(t->name) + " has layout " + layout_name(t->layout) +
                         "; mm_out needs torch.strided");
    }
  }
  for (Meta* t : tensors) read_rest(*t);
  for (Meta* t : tensors) {
    if (t->dim != 2) {
      argument_error(t->name, "rank-2",
                     std::string(t->name) + " has " + std::to_string(t->dim) + " dimensions (shape " +
                         shape_text(*t) + "); mm_out needs 2");
    }
  }
  for (Meta* t : tensors) {
    if (t->dtype != c.float32 && t->dtype != c.float16 && t->dtype != c.bfloat16) {
      argument_error(t->name, "supported-dtype",
                     std::string(t->name) + " has dtype " + dtype_name(t->dtype) +
                         "; mm_out supports torch.float32, torch.float16, torch.bfloat16");
    }
  }
  if (mat2.dtype != self.dtype) {
    argument_error("mat2", "same-dtype",
                   "mat2 has dtype " + dtype_name(mat2.dtype) + " but self has " + dtype_name(self.dtype));
  }
  if (out.dtype != self.dtype) {
    argument_error("out", "same-dtype",
                   "out has dtype " + dtype_name(out.dtype) + " but self and mat2 have " +
                       dtype_name(self.dtype));
  }
  const int64_t M = self.sizes[0], K = self.sizes[1], K2 = mat2.sizes[0], N = mat2.sizes[1];
  if (K2 != K) {
    argument_error("mat2", "inner-dimension",
                   "mat2 has " + std::to_string(K2) + " rows (shape " + shape_text(mat2) + ") but self has " +
                       std::to_string(K) + " columns (shape " + shape_text(self) + ")");
  }
  if (out.sizes[0] != M || out.sizes[1] != N) {
    argument_error("out", "out-shape",
                   "out has shape " + shape_text(out) + " but self @ mat2 has shape [" + std::to_string(M) +
                       ", " + std::to_string(N) + "]");
  }
  // torch's is_contiguous for a 2-d tensor: strides of size-1 dimensions are ignored.
  const bool contiguous = M * N == 0 || ((N == 1 || out.strides[1] == 1) && (M == 1 || out.strides[0] == N));
  if (!contiguous) {
    argument_error("out", "out-contiguous",
                   "out has strides " + strides_text(out) + " for shape " + shape_text(out) +
                       "; mm_out needs row-major contiguous strides (" + std::to_string(N) + ", 1)");
  }
  Checked checked{M, N, K, false, Plan{}};
  if (M && N && K) {  // only a real product reaches cuBLAS and its limits
    checked.plan = plan_gemm(M, N, K, self, mat2);
    checked.has_plan = true;
    check_no_overlap(out, self, mat2, checked.plan, M, N);
  }
  for (Meta* t : tensors) {
    if (t->device_type != c.cuda) {
      argument_error(t->name, "cuda-device",
                     std::string(t->name) + " is on " + device_name(t->device_type, t->device_index) +
                         "; mm_out needs CUDA tensors");
    }
  }
  for (Meta* t : {&self, &mat2}) {
    if (t->device_index != out.device_index) {
      argument_error(t->name, "same-device",
                     std::string(t->name) + " is on " + device_name(t->device_type, t->device_index) +
                         " but out is on " + device_name(out.device_type, out.device_index));
    }
  }
  const int visible = visible_devices();
  if (out.device_index < 0 || out.device_index >= visible) {
    argument_error("out", "device-index",
                   "out is on " + device_name(out.device_type, out.device_index) + " but " +
                       std::to_string(visible) + " CUDA device(s) are visible");
  }
  return checked;
}

// ---------------------------------------------------------------- per-(thread, device) cuBLAS state

struct Workspace {
  cudaStream_t stream;
  void* memory;
};

struct DeviceState {
  cublasHandle_t handle = nullptr;
  bool bound = false;
  cudaStream_t bound_stream = nullptr;
  std::vector<Workspace> workspaces;  // most recently used last

  void bind(cudaStream_t stream) {
    if (bound && stream == bound_stream) return;
    size_t found = workspaces.size();
    for (size_t i = 0; i < workspaces.size(); ++i) {
      if (workspaces[i].stream == stream) found = i;
    }
    Workspace ws{stream, nullptr};
    if (found == workspaces.size()) {
      // cudaMalloc, not the caching allocator: it outlives any one call and is used on `stream` only, so
      // two streams never share scratch memory even when this thread alternates between them.
      check_cuda(cudaMalloc(&ws.memory, kWorkspaceBytes), "cudaMalloc");
      if (workspaces.size() >= kMaxWorkspacesPerHandle) {
        // The evicted stream may still run work using it: cudaFree waits for the device (rare: >16 streams).
        cudaFree(workspaces.front().memory);
        workspaces.erase(workspaces.begin());
      }
    } else {
      ws = workspaces[found];
      workspaces.erase(workspaces.begin() + static_cast<std::ptrdiff_t>(found));
    }
    workspaces.push_back(ws);
    bound = false;  // not bound until both calls succeed
    check_cublas(cublasSetStream(handle, stream), "cublasSetStream_v2");
    // cublasSetStream resets the workspace to cuBLAS's default pool, so set ours after it.
    check_cublas(cublasSetWorkspace(handle, ws.memory, kWorkspaceBytes), "cublasSetWorkspace_v2");
    bound = true;
    bound_stream = stream;
  }
};

struct ThreadState {
  std::vector<DeviceState> devices;

  DeviceState& device(int32_t index) {  // `index` is the current device
    if (static_cast<size_t>(index) >= devices.size()) devices.resize(static_cast<size_t>(index) + 1);
    DeviceState& state = devices[static_cast<size_t>(index)];
    if (state.handle == nullptr) {
      cublasHandle_t handle = nullptr;
      check_cublas(cublasCreate(&handle), "cublasCreate_v2");
      const cublasStatus_t status = cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH);  // no TF32
      if (status != CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(handle);
        check_cublas(status, "cublasSetMathMode");
      }
      state.handle = handle;
    }
    return state;
  }

  ~ThreadState() {
    // Thread exit. Errors are ignored: at process exit the CUDA context may already be going away.
    int previous = -1;
    cudaGetDevice(&previous);
    for (size_t i = 0; i < devices.size(); ++i) {
      DeviceState& state = devices[i];
      if (state.handle == nullptr && state.workspaces.empty()) continue;
      if (cudaSetDevice(static_cast<int>(i)) != cudaSuccess) continue;
      if (state.handle != nullptr) cublasDestroy(state.handle);
      for (const Workspace& ws : state.workspaces) cudaFree(ws.memory);
    }
    if (previous >= 0) cudaSetDevice(previous);
    cudaGetLastError();
  }
};

thread_local ThreadState t_state;

class DeviceGuard {  // makes `index` current; restores the caller's device on every exit path
 public:
  explicit DeviceGuard(int32_t index) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != index) {
      check_cuda(cudaSetDevice(index), "cudaSetDevice");
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

class OwnedTensor {  // a scratch tensor from the AOTI shim's allocator, deleted on scope exit
 public:
  OwnedTensor() = default;
  ~OwnedTensor() {
    if (handle_ != nullptr) aoti_torch_delete_tensor_object(handle_);
  }
  OwnedTensor(const OwnedTensor&) = delete;
  OwnedTensor& operator=(const OwnedTensor&) = delete;
  AtenTensorHandle* out() { return &handle_; }
  AtenTensorHandle get() const { return handle_; }

 private:
  AtenTensorHandle handle_ = nullptr;
};

// A row-major contiguous copy on the current stream (the caching allocator orders its reuse after the
// GEMM queued on that same stream, so deleting it right after the launch needs no sync).
uintptr_t scratch_copy(const Meta& t, OwnedTensor& scratch) {
  const int64_t sizes[2] = {t.sizes[0], t.sizes[1]};
  const int64_t strides[2] = {t.sizes[1] > 1 ? t.sizes[1] : 1, 1};
  check_aoti(aoti_torch_empty_strided(2, sizes, strides, t.dtype, t.device_type, t.device_index, scratch.out()),
             "aoti_torch_empty_strided");
  check_aoti(aoti_torch_copy_(scratch.get(), t.handle, 0), "aoti_torch_copy_");
  void* data = nullptr;
  check_aoti(aoti_torch_get_data_ptr(scratch.get(), &data), "aoti_torch_get_data_ptr");
  return reinterpret_cast<uintptr_t>(data);
}

cudaDataType_t data_type(int32_t dtype) {
  const Constants& c = constants();
  if (dtype == c.float32) return CUDA_R_32F;
  if (dtype == c.float16) return CUDA_R_16F;
  return CUDA_R_16BF;
}

// Call counters, sharded by thread: one shared atomic would bounce its cache line between every calling
// thread on every call. A thread takes a shard on its first call; readers sum the shards.
constexpr size_t kCounterShards = 64;
struct alignas(64) CounterShard {
  std::atomic<uint64_t> calls{0};      // every call of any entry
  std::atomic<uint64_t> abi_calls{0};  // calls through the AOTI ABI entry (compiled programs)
};
CounterShard g_counters[kCounterShards];
std::atomic<size_t> g_next_shard{0};

CounterShard& my_counters() {
  thread_local CounterShard* shard = nullptr;
  if (shard == nullptr) {
    shard = &g_counters[g_next_shard.fetch_add(1, std::memory_order_relaxed) % kCounterShards];
  }
  return *shard;
}

uint64_t total(std::atomic<uint64_t> CounterShard::*field) {
  uint64_t sum = 0;
  for (const CounterShard& shard : g_counters) sum += (shard.*field).load(std::memory_order_relaxed);
  return sum;
}

void mm_out(AtenTensorHandle out_h, AtenTensorHandle self_h, AtenTensorHandle mat2_h, int32_t negative_mask) {
  Meta out{out_h, "out"}, self{self_h, "self"}, mat2{mat2_h, "mat2"};
  out.negative = negative_mask & 1;
  self.negative = negative_mask & 2;
  mat2.negative = negative_mask & 4;
  const Checked checked = validate(out, self, mat2);
  if (checked.M == 0 || checked.N == 0) return;
  DeviceGuard guard(out.device_index);
  void* stream_ptr = nullptr;
  check_aoti(aoti_torch_get_current_cuda_stream(out.device_index, &stream_ptr),
             "aoti_torch_get_current_cuda_stream");
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const uintptr_t c = address(out);
  if (!checked.has_plan) {  // K == 0: an empty sum, as torch.mm
    check_cuda(cudaMemsetAsync(reinterpret_cast<void*>(c), 0,
                               static_cast<size_t>(checked.M * checked.N * element_size(out.dtype)), stream),
               "cudaMemsetAsync");
    return;
  }
  const Plan& plan = checked.plan;
  DeviceState& state = t_state.device(out.device_index);
  OwnedTensor scratch_a, scratch_b;
  // A copy materialises a negative view, so only operands read in place keep their sign bit.
  const uintptr_t a = plan.copy_mat2 ? scratch_copy(mat2, scratch_a) : address(mat2);
  const uintptr_t b = plan.copy_self ? scratch_copy(self, scratch_b) : address(self);
  const int negatives = (out.negative ? 1 : 0) + (!plan.copy_mat2 && mat2.negative ? 1 : 0) +
                        (!plan.copy_self && self.negative ? 1 : 0);
  const float alpha = negatives % 2 ? -1.0f : 1.0f;
  const float beta = 0.0f;  // out's old contents are never read
  state.bind(stream);
  const cudaDataType_t type = data_type(out.dtype);
  check_cublas(cublasGemmEx(state.handle, plan.transa, plan.transb, static_cast<int>(plan.m),
                            static_cast<int>(plan.n), static_cast<int>(plan.k), &alpha,
                            reinterpret_cast<const void*>(a), type, static_cast<int>(plan.lda),
                            reinterpret_cast<const void*>(b), type, static_cast<int>(plan.ldb), &beta,
                            reinterpret_cast<void*>(c), type, static_cast<int>(plan.ldc), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

AOTITorchError guarded(AtenTensorHandle out, AtenTensorHandle self, AtenTensorHandle mat2, int32_t negative) {
  my_counters().calls.fetch_add(1, std::memory_order_relaxed);
  try {
    t_error.kind = kNoError;
    mm_out(out, self, mat2, negative);
    return AOTI_TORCH_SUCCESS;
  } catch (const Failure&) {
  } catch (const std::exception& exc) {
    t_error = LastError{kInternalError, 0, "mm_out", "exception", exc.what()};
  } catch (...) {
    t_error = LastError{kInternalError, 0, "mm_out", "exception", "unknown C++ exception"};
  }
  return AOTI_TORCH_FAILURE;
}

void report_to_stderr() {  // compiled programs only see the error code: say what went wrong
  std::fprintf(stderr, "refimpl_cuda_mm_out_v1: %s %s: %s\n", t_error.argument.c_str(), t_error.rule.c_str(),
               t_error.detail.c_str());
}

}  // namespace

// ------------------------------------------------------------------------------------------- C ABI

// What compiled programs call (routing.py renames their `aoti_torch_cuda_mm_out` reference to this).
REFIMPL_API AOTITorchError refimpl_cuda_mm_out_v1(AtenTensorHandle out, AtenTensorHandle self,
                                                  AtenTensorHandle mat2) {
  my_counters().abi_calls.fetch_add(1, std::memory_order_relaxed);
  const AOTITorchError code = guarded(out, self, mat2, 0);
  if (code != AOTI_TORCH_SUCCESS) report_to_stderr();
  return code;
}

// The routed entry has exactly the ABI of torch's declaration of aoti_torch_cuda_mm_out.
static_assert(std::is_same<decltype(&refimpl_cuda_mm_out_v1), decltype(&aoti_torch_cuda_mm_out)>::value,
              "refimpl_cuda_mm_out_v1 must have the signature of aoti_torch_cuda_mm_out");

#ifdef REFIMPL_EXPORT_AOTI_NAME
REFIMPL_API AOTITorchError aoti_torch_cuda_mm_out(AtenTensorHandle out, AtenTensorHandle self,
                                                  AtenTensorHandle mat2) {
  return refimpl_cuda_mm_out_v1(out, self, mat2);
}
#endif

// The Python entry (the extension module, entry.cpp): the three handles are borrowed (`at::Tensor*` inside
// the callers' Python tensors) and stay the caller's; the caller has released the GIL around this call.
// `negative_mask` carries the negative-view bits (1: out, 2: self, 4: mat2).
REFIMPL_API int32_t refimpl_mm_out_borrowed(AtenTensorHandle out, AtenTensorHandle self, AtenTensorHandle mat2,
                                            int32_t negative_mask) {
  return guarded(out, self, mat2, negative_mask);
}

// The ctypes fallback entry: takes ownership of the three handles (torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors)
// and deletes them; `negative_mask` carries the negative-view bits (1: out, 2: self, 4: mat2).
REFIMPL_API int32_t refimpl_mm_out_owned(AtenTensorHandle out, AtenTensorHandle self, AtenTensorHandle mat2,
                                         int32_t negative_mask) {
  const AOTITorchError code = guarded(out, self, mat2, negative_mask);
  for (AtenTensorHandle h : {out, self, mat2}) {
    if (h != nullptr) aoti_torch_delete_tensor_object(h);
  }
  return code;
}

// This thread's last error: returns its kind (0 none, 1 argument, 2 cuBLAS, 3 CUDA, 4 internal); the
// strings stay valid until this thread's next call.
REFIMPL_API int32_t refimpl_mm_out_last_error(const char** argument, const char** rule, const char** detail,
                                              int32_t* status) {
  if (argument) *argument = t_error.argument.c_str();
  if (rule) *rule = t_error.rule.c_str();
  if (detail) *detail = t_error.detail.c_str();
  if (status) *status = t_error.status;
  return t_error.kind;
}

// Call counters: every call (both entries), and calls through the ABI entry compiled programs use.
REFIMPL_API uint64_t conformance_mm_out_calls(void) { return total(&CounterShard::calls); }
REFIMPL_API uint64_t refimpl_mm_out_abi_calls(void) { return total(&CounterShard::abi_calls); }

// Bumped when an exported signature or meaning changes; the Python side refuses a library it does not know.
REFIMPL_API int32_t refimpl_mm_out_abi_version(void) { return 2; }

// The cuBLAS version this library runs with (e.g. 130100), or -1 when it cannot be read.
REFIMPL_API int32_t refimpl_mm_out_cublas_version(void) {
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) != CUBLAS_STATUS_SUCCESS ||
      cublasGetProperty(MINOR_VERSION, &minor) != CUBLAS_STATUS_SUCCESS ||
      cublasGetProperty(PATCH_LEVEL, &patch) != CUBLAS_STATUS_SUCCESS) {
    return -1;
  }
  return major * 10000 + minor * 100 + patch;
}
