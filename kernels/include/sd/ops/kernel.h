// Kernels, one registry per backend. A session binds each step of a plan to
// its device's registry when it is created: a missing kernel or an element
// type the kernel does not compute is an error there, naming the op and the
// device, never half-way through a step.
#pragma once
#include "sd/ops/attrs.h"
#include "sd/format/status.h"
#include "sd/format/tensor.h"
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sd {

class ThreadPool;
class Communicator;

struct KernelContext {
  const AttrMap &attrs;
  std::vector<TensorView> inputs; // absent optional operand: data == nullptr
  std::vector<TensorView> outputs;
  ThreadPool *pool = nullptr;
  // What the op's prepare function derived for this step when the session was
  // created (e.g. a constant weight packed for the GEMM); null when it has
  // none, as in constant folding. Kernels compute the same result either way.
  const void *prepared = nullptr;
  // The device queue the kernel enqueues its work on: a cudaStream_t on the
  // CUDA backend, null on the CPU. Tensors' data are device addresses there.
  void *stream = nullptr;
  // The ranks a training plan's collectives (AllReduce) span; null when the
  // session runs alone, and then every collective is the identity.
  Communicator *comm = nullptr;
  // Plans compiled with --shard optimizer: the rank that updates this step's
  // parameter (and alone holds its optimizer state); -1 for every other step.
  int shardOwner = -1;

  bool hasInput(size_t i) const {
    return i < inputs.size() && inputs[i].dtype != DType::Undefined;
  }
};

// A step as a session sees it before the first run.
struct PrepareContext {
  const KernelContext &kernel;
  // constantInputs[i]: operand i holds the same values for the session's
  // whole life (frozen weights and constants, not trainable state).
  std::vector<bool> constantInputs;
  // hostInputs[i]: operand i's values where the host can read them (the
  // plan's copy of a constant), else null. On a GPU the kernel's operands are
  // device addresses, so shape-like operands (Slice starts, Pad pads, Reduce
  // axes) are read here, once, instead of mid-step.
  std::vector<const void *> hostInputs;
  // Prepared values shared across steps and entries, keyed by the op, so a
  // weight that several entries multiply by is packed once.
  std::map<std::string, std::shared_ptr<const void>> &shared;
  // Set by a prepare function for each constant operand its prepared value
  // stands in for (a weight packed for the GEMM): the kernel never reads that
  // operand's data again, so a copy made only for it (a widened half weight)
  // can be released. Null when the caller keeps every operand anyway.
  std::vector<bool> *superseded = nullptr;
};

using KernelFn = Status (*)(const KernelContext &);
// Returns the step's prepared value (kept alive by the session), or null.
using PrepareFn = std::shared_ptr<const void> (*)(const PrepareContext &);

// A set of element types.
class TypeSet {
public:
  TypeSet() = default;
  TypeSet(std::initializer_list<DType> types) {
    for (DType t : types) bits_ |= bit(t);
  }
  bool contains(DType t) const { return bits_ & bit(t); }
  TypeSet operator|(TypeSet o) const { return fromBits(bits_ | o.bits_); }
  bool empty() const { return bits_ == 0; }
  std::vector<DType> list() const;
  std::string describe() const; // "f32, f64"

  static TypeSet floats() { return {DType::F32, DType::F64}; }
  static TypeSet halves() { return {DType::F16, DType::BF16}; }
  static TypeSet integers();
  static TypeSet numeric() { return floats() | integers(); }
  // Every fixed-size type: kernels that only move bytes.
  static TypeSet all() { return numeric() | halves() | TypeSet{DType::Bool}; }
  // Narrow floats and 4-/2-bit integers (dtype.h): storage only, taken by Cast.
  static TypeSet narrow() {
    return {DType::F8E4M3FN, DType::F8E4M3FNUZ, DType::F8E5M2, DType::F8E5M2FNUZ, DType::F8E8M0,
            DType::F4E2M1,   DType::U4,         DType::I4,     DType::U2,         DType::I2};
  }

private:
  static uint32_t bit(DType t) { return int32_t(t) > 0 && int32_t(t) < 32 ? 1u << int32_t(t) : 0; }
  static TypeSet fromBits(uint32_t b) {
    TypeSet s;
    s.bits_ = b;
    return s;
  }
  uint32_t bits_ = 0;
};

struct KernelDef {
  std::string op;
  KernelFn run = nullptr;
  PrepareFn prepare = nullptr;
  // Element types the kernel computes, read off one operand: input
  // `typeOperand`, or output 0 when it is -1 (ops whose inputs are shapes).
  TypeSet types;
  int typeOperand = 0;
  // f16/bf16 are storage types on the CPU: these kernels compute them by
  // widening to f32 and rounding the results back (runKernel does it).
  bool halfViaF32 = false;
  // The element types result 0 may take, for a kernel that does not produce
  // every type its operands could ask for (CUDA's Cast); empty: any.
  TypeSet resultTypes;
};

class KernelRegistry {
public:
  explicit KernelRegistry(std::string backend) : backend_(std::move(backend)) {}
  const std::string &backend() const { return backend_; }
  void add(KernelDef def);
  const KernelDef *find(std::string_view op) const;
  std::vector<const KernelDef *> all() const;
  // The kernel that computes `op` on these operand types, or an error naming
  // the op and this backend. An absent optional input has dtype Undefined.
  StatusOr<const KernelDef *> bind(std::string_view op, const std::vector<DType> &inputs,
                                   const std::vector<DType> &outputs) const;

private:
  std::string backend_;
  std::map<std::string, KernelDef, std::less<>> kernels_;
};

// The CPU backend's kernels (registered by registerAllOps()).
const KernelRegistry &cpuKernels();

// The CUDA backend's kernels; only builds with CUDA (SD_HAVE_CUDA) define it.
const KernelRegistry &cudaKernels();

// Runs a kernel, widening half operands to f32 when it computes them that way.
// Callers without a session (constant folding, the op harness) go through it;
// a session lays the widening out once instead (HalfOperands).
Status runKernel(const KernelDef &def, const KernelContext &ctx);

// The f32 stand-ins of a halfViaF32 kernel's f16/bf16 operands. `wide` is the
// context the kernel runs with: before each run the inputs in widenInputs are
// converted into their stand-ins, after it the outputs in roundOutputs are
// rounded back into the step's. A session lays the stand-ins out when it is
// created (a constant operand widened there and then, once, so its prepare
// function sees f32 and can pack it; the others in one scratch block), so a
// run allocates nothing; runKernel lays them out per call.
struct HalfOperands {
  KernelContext wide;
  std::vector<size_t> widenInputs, roundOutputs;
};

// True when `def` computes this step's half operands through f32 stand-ins.
bool widensHalves(const KernelDef &def, const KernelContext &ctx);

// The stand-ins `ctx` needs: an f32 view (data still null, for the caller to
// place) for each f16/bf16 operand that has data, listed in widenInputs and
// roundOutputs.
HalfOperands halfOperandsOf(const KernelContext &ctx);

// Runs `def` on `narrow`'s operands through `h`'s stand-ins; the conversions
// split across narrow.pool.
Status runWidened(const KernelDef &def, const KernelContext &narrow, const HalfOperands &h);

// Converts between an f16/bf16 tensor and an f32 one of the same size (either
// way), split across `pool`; exact when widening, round to nearest even when
// narrowing.
Status convertHalf(ThreadPool *pool, const TensorView &from, const TensorView &to);

} // namespace sd
