// The Python entry of the native mm_out shim: a CPython extension module whose mm_out(out, self, mat2)
// is ONE C call that unpacks the three tensors, computes their negative-view bits, and releases the GIL
// once around all the work (validation, scratch copies, the cuBLAS launch), as torch's own ops do.
//
// It holds no copy of the shim: bind() hands it the address of the shim library's C entry
// `refimpl_mm_out_borrowed` (and of `refimpl_mm_out_last_error`), so every call is served and counted by
// the one library that compiled programs are routed to. The three AtenTensorHandles it passes are
// NON-owning: in libtorch's AOTI shim an AtenTensorHandle is an `at::Tensor*`
// (torch/csrc/inductor/aoti_torch/utils.h, tensor_pointer_to_tensor_handle), and the at::Tensor is the
// one inside each THPVariable, kept alive by the caller's references for the whole call. Nothing is
// allocated per call.
//
// Argument rules only Python can see (present / is-tensor) and tensor subclasses go through the Python
// pre-check bound at bind() (library._check_python_rules: same messages as mm_out.validate). On an error
// the GIL is taken back, the shim's thread-local error record (same OS thread) is read and handed to the
// bound Python raiser, which raises exactly what the ctypes entry raises (MmOutArgumentError(argument,
// rule, detail), CublasError(function, status, name), RuntimeError).
//
// No CUDA header is needed: the module builds (and its binding part is tested) against CPU torch.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>

#include <cstdint>
#include <cstring>

namespace {

// Bumped with any change of bind()'s arguments or of the entry signatures below.
constexpr int kEntryAbiVersion = 1;

// refimpl_mm_out_borrowed: (out, self, mat2, negative_mask) -> AOTI_TORCH_SUCCESS (0) or a failure code;
// the handles stay the caller's. negative_mask: 1 out, 2 self, 4 mat2.
using Entry = int32_t (*)(AtenTensorHandle, AtenTensorHandle, AtenTensorHandle, int32_t);
// refimpl_mm_out_last_error: this thread's last error (kind, argument, rule, detail, status).
using LastError = int32_t (*)(const char**, const char**, const char**, int32_t*);

// Written by bind() and read by mm_out(), both with the GIL held (the GIL orders them).
Entry g_entry = nullptr;
LastError g_last_error = nullptr;
PyObject* g_precheck = nullptr;  // _check_python_rules(out, self, mat2): raises or returns None
PyObject* g_raise = nullptr;     // _raise_error(kind, argument, rule, detail, status): always raises

AtenTensorHandle borrow(PyObject* tensor) {
  const at::Tensor& t = THPVariable_Unpack(tensor);
  return torch::aot_inductor::tensor_pointer_to_tensor_handle(const_cast<at::Tensor*>(&t));
}

PyObject* arity_error(Py_ssize_t nargs) {
  // Python's own wording for a def with three positional parameters (the chapter's arity case reads it).
  if (nargs == 0) {
    PyErr_SetString(PyExc_TypeError,
                    "mm_out() missing 3 required positional arguments: 'out', 'self', and 'mat2'");
  } else if (nargs == 1) {
    PyErr_SetString(PyExc_TypeError, "mm_out() missing 2 required positional arguments: 'self' and 'mat2'");
  } else if (nargs == 2) {
    PyErr_SetString(PyExc_TypeError, "mm_out() missing 1 required positional argument: 'mat2'");
  } else {
    PyErr_Format(PyExc_TypeError, "mm_out() takes 3 positional arguments but %zd were given", nargs);
  }
  return nullptr;
}

// The slow start: some argument is not exactly a torch.Tensor (None, another type, a subclass).
bool precheck(PyObject* const* args) {
  if (g_precheck == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "mm_out entry is not bound (call bind() first)");
    return false;
  }
  PyObject* result = PyObject_Vectorcall(g_precheck, args, 3, nullptr);
  if (result == nullptr) return false;
  Py_DECREF(result);
  for (int i = 0; i < 3; ++i) {  // what passed the pre-check is a torch.Tensor instance; say so if not
    const int is_tensor = PyObject_IsInstance(args[i], THPVariableClass);
    if (is_tensor < 0) return false;
    if (!is_tensor) {
      PyErr_Format(PyExc_TypeError, "mm_out: argument %d is a %s, not a torch.Tensor", i,
                   Py_TYPE(args[i])->tp_name);
      return false;
    }
  }
  return true;
}

PyObject* text(const char* value) {  // as the ctypes entry decodes them: UTF-8, invalid bytes replaced
  const char* s = value ? value : "";
  return PyUnicode_DecodeUTF8(s, static_cast<Py_ssize_t>(std::strlen(s)), "replace");
}

PyObject* raise_last_error() {
  const char* argument = nullptr;
  const char* rule = nullptr;
  const char* detail = nullptr;
  int32_t status = 0;
  const int32_t kind = g_last_error(&argument, &rule, &detail, &status);
  PyObject* result = PyObject_CallFunction(g_raise, "iNNNi", static_cast<int>(kind), text(argument), text(rule),
                                           text(detail), static_cast<int>(status));
  if (result != nullptr) {  // the raiser must raise
    Py_DECREF(result);
    PyErr_SetString(PyExc_RuntimeError, "mm_out (native): failed and the error raiser returned");
  }
  return nullptr;
}

PyObject* mm_out(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) return arity_error(nargs);
  if (g_entry == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "mm_out entry is not bound (call bind() first)");
    return nullptr;
  }
  if (!(THPVariable_CheckExact(args[0]) && THPVariable_CheckExact(args[1]) && THPVariable_CheckExact(args[2]))) {
    if (!precheck(args)) return nullptr;  // subclasses pass on to the native checks
  }
  AtenTensorHandle out = borrow(args[0]);
  AtenTensorHandle self = borrow(args[1]);
  AtenTensorHandle mat2 = borrow(args[2]);
  const int32_t mask = (THPVariable_Unpack(args[0]).is_neg() ? 1 : 0) |
                       (THPVariable_Unpack(args[1]).is_neg() ? 2 : 0) |
                       (THPVariable_Unpack(args[2]).is_neg() ? 4 : 0);
  const Entry entry = g_entry;
  int32_t code;
  Py_BEGIN_ALLOW_THREADS
  code = entry(out, self, mat2, mask);
  Py_END_ALLOW_THREADS
  if (code == 0) Py_RETURN_NONE;
  return raise_last_error();
}

PyObject* address_of(PyObject* value, const char* what, void** target) {
  void* address = PyLong_AsVoidPtr(value);
  if (address == nullptr) {
    if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "bind: %s is a null address", what);
    return nullptr;
  }
  *target = address;
  return value;
}

PyObject* bind(PyObject*, PyObject* args) {
  PyObject *entry, *last_error, *precheck_fn, *raise_fn;
  if (!PyArg_ParseTuple(args, "OOOO:bind", &entry, &last_error, &precheck_fn, &raise_fn)) return nullptr;
  if (!PyCallable_Check(precheck_fn) || !PyCallable_Check(raise_fn)) {
    PyErr_SetString(PyExc_TypeError, "bind: precheck and raise_error must be callables");
    return nullptr;
  }
  void* entry_address = nullptr;
  void* last_error_address = nullptr;
  if (!address_of(entry, "entry", &entry_address) || !address_of(last_error, "last_error", &last_error_address)) {
    return nullptr;
  }
  Py_INCREF(precheck_fn);
  Py_INCREF(raise_fn);
  Py_XSETREF(g_precheck, precheck_fn);
  Py_XSETREF(g_raise, raise_fn);
  g_last_error = reinterpret_cast<LastError>(last_error_address);
  g_entry = reinterpret_cast<Entry>(entry_address);
  Py_RETURN_NONE;
}

PyObject* is_bound(PyObject*, PyObject*) { return PyBool_FromLong(g_entry != nullptr); }

PyObject* abi_version(PyObject*, PyObject*) { return PyLong_FromLong(kEntryAbiVersion); }

PyMethodDef kMethods[] = {
    {"mm_out", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(mm_out)), METH_FASTCALL,
     "mm_out(out, self, mat2, /) -> None\n--\n\nout = self @ mat2 through the native shim: one call, the GIL "
     "released once for validation and the cuBLAS launch."},
    {"bind", bind, METH_VARARGS,
     "bind(entry_address, last_error_address, precheck, raise_error) -> None: the shim's C entries and the "
     "Python pre-check / error raiser."},
    {"is_bound", is_bound, METH_NOARGS, "Whether bind() has been called."},
    {"abi_version", abi_version, METH_NOARGS, "The version of bind()'s contract this module speaks."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "_refimpl_mm_out_entry",
    "The native mm_out shim's Python entry (see reference_impl/shims/native/entry.cpp).", -1, kMethods,
    nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) PyObject* PyInit__refimpl_mm_out_entry(void) {
  return PyModule_Create(&kModule);
}
