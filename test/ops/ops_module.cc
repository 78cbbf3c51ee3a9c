// _sdops: the op harness's window on the kernel registries. It runs one op on
// one backend through the same path a session takes (schema shape rule,
// KernelRegistry::bind, the kernel's prepare function, runKernel on the
// device's memory and stream), on NumPy arrays.
#include "sd/ops/registry.h"
#include "sd/ops/threadpool.h"
#include "sd/runtime/device.h"
#include <map>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <cstring>

namespace py = pybind11;
using namespace sd;

namespace {

// The device of a backend, opened once: "cpu", or "cuda" where a GPU is usable.
StatusOr<std::shared_ptr<Device>> openBackend(const std::string &backend) {
  static std::map<std::string, StatusOr<std::shared_ptr<Device>>> opened;
  auto it = opened.find(backend);
  if (it == opened.end()) {
    StatusOr<std::shared_ptr<Device>> d = backend == "cpu" || backend == "cuda"
                                              ? openDevice(backend)
                                              : StatusOr<std::shared_ptr<Device>>(sdError("no backend '", backend, "'"));
    it = opened.emplace(backend, std::move(d)).first;
  }
  return it->second;
}

Device &deviceOf(const std::string &backend) {
  StatusOr<std::shared_ptr<Device>> d = openBackend(backend);
  if (!d.isOk()) throw std::invalid_argument(d.status().message());
  return **d;
}

// A backend's registry, without opening its device (listing needs no GPU).
const KernelRegistry &registryOf(const std::string &backend) {
  if (const KernelRegistry *r = kernelRegistry(backend)) return *r;
  return deviceOf(backend).kernels();
}

// Device memory for one run, released when it ends.
struct DeviceBuffers {
  Device &dev;
  std::vector<void *> ptrs;
  ~DeviceBuffers() {
    for (void *p : ptrs) dev.release(p);
  }
  void *allocate(size_t bytes) {
    StatusOr<void *> p = dev.allocate(bytes);
    if (!p.isOk()) throw std::runtime_error(p.status().message());
    ptrs.push_back(*p);
    return *p;
  }
};

void check(const Status &st, const char *stage) {
  if (!st.isOk()) throw std::runtime_error(std::string(stage) + ": " + st.message());
}

DType dtypeOf(const py::array &a) {
  py::dtype d = a.dtype();
  std::string name = py::str(d.attr("name"));
  static const std::pair<const char *, DType> names[] = {
      {"float32", DType::F32}, {"float64", DType::F64}, {"float16", DType::F16}, {"bfloat16", DType::BF16},
      {"int8", DType::I8},     {"int16", DType::I16},   {"int32", DType::I32},   {"int64", DType::I64},
      {"uint8", DType::U8},    {"uint16", DType::U16},  {"uint32", DType::U32},  {"uint64", DType::U64},
      {"bool", DType::Bool},
      // ml_dtypes' narrow types: one byte per element, as sdc holds them.
      {"float8_e4m3fn", DType::F8E4M3FN}, {"float8_e4m3fnuz", DType::F8E4M3FNUZ}, {"float8_e5m2", DType::F8E5M2},
      {"float8_e5m2fnuz", DType::F8E5M2FNUZ}, {"int4", DType::I4}, {"uint4", DType::U4}, {"int2", DType::I2},
      {"uint2", DType::U2}, {"float4_e2m1fn", DType::F4E2M1}, {"float8_e8m0fnu", DType::F8E8M0}};
  for (auto &[n, t] : names)
    if (name == n) return t;
  throw std::invalid_argument("unsupported array dtype " + name);
}

py::dtype numpyDtype(DType t) {
  if (t == DType::BF16) return py::dtype::from_args(py::module_::import("ml_dtypes").attr("bfloat16"));
  static const std::pair<DType, const char *> narrow[] = {
      {DType::F8E4M3FN, "float8_e4m3fn"}, {DType::F8E4M3FNUZ, "float8_e4m3fnuz"}, {DType::F8E5M2, "float8_e5m2"},
      {DType::F8E5M2FNUZ, "float8_e5m2fnuz"}, {DType::I4, "int4"}, {DType::U4, "uint4"}, {DType::I2, "int2"},
      {DType::U2, "uint2"}, {DType::F4E2M1, "float4_e2m1fn"}, {DType::F8E8M0, "float8_e8m0fnu"}};
  for (auto &[d, n] : narrow)
    if (d == t) return py::dtype::from_args(py::module_::import("ml_dtypes").attr(n));
  static const std::pair<DType, const char *> names[] = {
      {DType::F32, "float32"}, {DType::F64, "float64"}, {DType::F16, "float16"}, {DType::I8, "int8"},
      {DType::I16, "int16"},   {DType::I32, "int32"},   {DType::I64, "int64"},   {DType::U8, "uint8"},
      {DType::U16, "uint16"},  {DType::U32, "uint32"},  {DType::U64, "uint64"},  {DType::Bool, "bool"}};
  for (auto &[d, n] : names)
    if (d == t) return py::dtype(n);
  throw std::invalid_argument(std::string("no NumPy dtype for ") + dtypeName(t));
}

AttrMap attrsOf(const py::dict &d) {
  AttrMap m;
  for (auto [k, v] : d) {
    std::string name = py::str(k);
    if (py::isinstance<py::bool_>(v) || py::isinstance<py::int_>(v)) m.setInt(name, v.cast<int64_t>());
    else if (py::isinstance<py::float_>(v)) m.setFloat(name, v.cast<double>());
    else if (py::isinstance<py::str>(v)) m.setString(name, v.cast<std::string>());
    else {
      py::list l = v.cast<py::list>();
      bool floats = false;
      for (auto x : l) floats = floats || py::isinstance<py::float_>(x);
      if (floats) m.setFloats(name, v.cast<std::vector<double>>());
      else m.setInts(name, v.cast<std::vector<int64_t>>());
    }
  }
  return m;
}

// ml_dtypes keeps a 4- or 2-bit integer in the low bits of its byte; sdc
// keeps it sign-extended (so a byte reads as the value): convert both ways.
bool isSignedNarrow(DType t) { return t == DType::I4 || t == DType::I2; }
void signExtend(py::array &a, DType t) {
  int shift = t == DType::I4 ? 4 : 6;
  auto *p = static_cast<uint8_t *>(a.mutable_data());
  for (py::ssize_t i = 0; i < a.size(); ++i) p[i] = uint8_t(int8_t(uint8_t(p[i] << shift)) >> shift);
}
void keepLowBits(py::array &a, DType t) {
  uint8_t mask = t == DType::I4 ? 0x0f : 0x03;
  auto *p = static_cast<uint8_t *>(a.mutable_data());
  for (py::ssize_t i = 0; i < a.size(); ++i) p[i] &= mask;
}

// Runs `op` on `inputs` (None: an absent optional operand). Every input is
// offered to the shape rule as a constant, as the compiler does for folding.
py::list runOp(const std::string &backend, const std::string &op, const py::dict &attrDict, const py::list &inputList,
               size_t numOutputs, int threads, bool bindOnly) {
  const KernelRegistry &reg = registryOf(backend);
  AttrMap attrs = attrsOf(attrDict);
  std::vector<py::array> keep; // the arrays the views point into
  std::vector<TensorView> views;
  for (auto item : inputList) {
    if (item.is_none()) {
      views.push_back(TensorView{});
      continue;
    }
    py::array a = py::array::ensure(item, py::array::c_style);
    if (!a) throw std::invalid_argument("inputs must be arrays");
    Dims dims(a.shape(), a.shape() + a.ndim());
    if (isSignedNarrow(dtypeOf(a))) {
      a = py::array(a.attr("copy")());
      signExtend(a, dtypeOf(a));
    }
    views.push_back(TensorView{const_cast<void *>(a.data()), dtypeOf(a), dims});
    keep.push_back(a);
  }
  ShapeContext sc{attrs, {}, {}};
  for (auto &v : views) {
    sc.inputs.push_back(TensorInfo{v.dtype, v.dims}); // dtype Undefined: absent
    sc.constInputs.push_back(v.dtype != DType::Undefined ? &v : nullptr);
  }
  sc.numOutputs = numOutputs;
  Status st = inferShapes(op, sc);
  if (!st.isOk()) throw std::runtime_error("shape rule: " + st.message());
  std::vector<DType> inTypes, outTypes;
  for (auto &v : views) inTypes.push_back(v.dtype);
  for (auto &o : sc.outputs) outTypes.push_back(o.dtype);
  StatusOr<const KernelDef *> k = reg.bind(op, inTypes, outTypes);
  if (!k.isOk()) throw std::runtime_error("bind: " + k.status().message());
  if (bindOnly) return py::list(); // the registry accepts these operand types; nothing runs
  Device &dev = deviceOf(backend);
  DeviceBuffers buffers{dev, {}};
  std::vector<py::array> outs;
  std::vector<TensorView> onDevice = views;
  for (TensorView &v : onDevice) {
    if (v.dtype == DType::Undefined) continue;
    const void *host = v.data;
    v.data = buffers.allocate(v.byteSize());
    check(dev.copyFromHost(v.data, host, v.byteSize()), "upload");
  }
  KernelContext kc{attrs, onDevice, {}, nullptr};
  kc.stream = dev.stream();
  for (const TensorInfo &o : sc.outputs) {
    if (!o.isStatic()) throw std::runtime_error("shape rule left a dynamic output shape");
    std::vector<py::ssize_t> shape(o.dims.begin(), o.dims.end());
    py::array a(numpyDtype(o.dtype), shape);
    // Poison, so an element the kernel forgets to write shows up.
    std::memset(a.mutable_data(), 0x7f, size_t(a.nbytes()));
    TensorView v{a.mutable_data(), o.dtype, o.dims};
    v.data = buffers.allocate(v.byteSize());
    check(dev.copyFromHost(v.data, a.data(), v.byteSize()), "upload");
    kc.outputs.push_back(v);
    outs.push_back(a);
  }
  std::unique_ptr<ThreadPool> pool;
  if (threads > 1) pool = std::make_unique<ThreadPool>(threads);
  kc.pool = pool.get();
  // Every operand is constant here, as for a frozen weight in a session.
  std::map<std::string, std::shared_ptr<const void>> shared;
  std::shared_ptr<const void> prepared;
  if ((*k)->prepare) {
    PrepareContext pc{kc, std::vector<bool>(onDevice.size(), true), {}, shared};
    for (const TensorView &v : views) pc.hostInputs.push_back(v.data);
    prepared = (*k)->prepare(pc);
    kc.prepared = prepared.get();
  }
  st = runKernel(**k, kc);
  if (!st.isOk()) throw std::runtime_error("kernel: " + st.message());
  for (size_t i = 0; i < outs.size(); ++i)
    check(dev.copyToHost(outs[i].mutable_data(), kc.outputs[i].data, kc.outputs[i].byteSize()), "download");
  for (size_t i = 0; i < outs.size(); ++i)
    if (isSignedNarrow(kc.outputs[i].dtype)) keepLowBits(outs[i], kc.outputs[i].dtype);
  py::list result;
  for (auto &a : outs) result.append(a);
  return result;
}

} // namespace

PYBIND11_MODULE(_sdops, m) {
  m.doc() = "The op harness's access to sdc's op schemas and kernel registries (a test module).";
  m.def("backends", [] {
    std::vector<std::string> b;
    for (const char *name : {"cpu", "cuda"})
      if (openBackend(name).isOk()) b.push_back(name);
    return b;
  }, "The backends usable on this machine.");
  m.def("unavailable_reason", [](const std::string &backend) -> py::object {
    StatusOr<std::shared_ptr<Device>> d = openBackend(backend);
    if (d.isOk()) return py::none();
    return py::str(d.status().message());
  }, "Why a backend cannot be used here, or None.");
  m.def("schemas", [] {
    py::list l;
    for (const OpSchema *s : allSchemas())
      l.append(py::dict(py::arg("name") = s->name, py::arg("min_inputs") = s->minInputs,
                        py::arg("max_inputs") = s->maxInputs, py::arg("contract_version") = s->contractVersion));
    return l;
  });
  m.def("kernels", [](const std::string &backend) {
    py::list l;
    for (const KernelDef *k : registryOf(backend).all()) {
      std::vector<std::string> types;
      for (DType t : k->types.list()) types.push_back(dtypeName(t));
      std::vector<std::string> results;
      for (DType t : k->resultTypes.list()) results.push_back(dtypeName(t));
      l.append(py::dict(py::arg("op") = k->op, py::arg("types") = types, py::arg("type_operand") = k->typeOperand,
                        py::arg("half_via_f32") = k->halfViaF32, py::arg("result_types") = results));
    }
    return l;
  });
  m.def("run", &runOp, py::arg("backend"), py::arg("op"), py::arg("attrs"), py::arg("inputs"),
        py::arg("num_outputs") = 1, py::arg("threads") = 1, py::arg("bind_only") = false,
        "Runs one op; returns its outputs. Raises RuntimeError naming the stage that refused. With bind_only,\n"
        "stops after the shape rule and the backend's kernel binding (no device needed) and returns [].");
}
