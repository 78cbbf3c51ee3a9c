// The op library: for every op, its shape rule (shared by compiler and runtime)
// and its kernels. The compiler folds constants by running the CPU kernels, so
// folding and execution share one definition of each op's semantics.
#pragma once
#include "sd/ops/attrs.h"
#include "sd/format/status.h"
#include "sd/format/tensor.h"
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sd {

class ThreadPool;

// Inputs to a shape rule. An absent optional operand has dtype Undefined.
// constInputs[i] is set when operand i's value is known (constants, weights).
struct ShapeContext {
  const AttrMap &attrs;
  std::vector<TensorInfo> inputs;
  std::vector<const TensorView *> constInputs;
  std::vector<TensorInfo> outputs; // filled by the rule
  size_t numOutputs = 1;           // how many results the caller expects

  bool hasInput(size_t i) const {
    return i < inputs.size() && inputs[i].dtype != DType::Undefined;
  }
  const TensorView *constInput(size_t i) const {
    return i < constInputs.size() ? constInputs[i] : nullptr;
  }
  // Integer values of a constant operand; false when not known.
  bool constInts(size_t i, std::vector<int64_t> &out) const;
};

struct KernelContext {
  const AttrMap &attrs;
  std::vector<TensorView> inputs; // absent optional operand: data == nullptr
  std::vector<TensorView> outputs;
  ThreadPool *pool = nullptr;
  // What the op's prepare function derived for this step when the session was
  // created (e.g. a constant weight packed for the GEMM); null when it has
  // none, as in constant folding. Kernels compute the same result either way.
  const void *prepared = nullptr;

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
  // Prepared values shared across steps and entries, keyed by the op, so a
  // weight that several entries multiply by is packed once.
  std::map<std::string, std::shared_ptr<const void>> &shared;
};

using ShapeFn = Status (*)(ShapeContext &);
using KernelFn = Status (*)(const KernelContext &);
// Returns the step's prepared value (kept alive by the session), or null.
using PrepareFn = std::shared_ptr<const void> (*)(const PrepareContext &);

struct OpDef {
  std::string name; // contract name, e.g. "Add"
  ShapeFn shape = nullptr;
  KernelFn cpu = nullptr;
  PrepareFn prepare = nullptr;
  uint32_t contractVersion = 1;
  // f16/bf16 are storage types on the CPU: for ops with this flag, runKernel
  // widens half operands to f32, runs the f32 kernel and rounds results back.
  bool halfViaF32 = false;
};

// Runs op `def`'s CPU kernel, converting half-precision operands when the op
// computes them through f32. Every caller (session, constant folding) uses it.
Status runKernel(const OpDef &def, const KernelContext &ctx);
// Marks ops whose CPU kernels compute f16/bf16 through f32.
void computeHalfViaF32(std::initializer_list<const char *> ops);

// Registration happens in each family's translation unit through
// registerOp(); the lookups are safe to call from any thread after startup.
const OpDef *findOp(std::string_view name);
std::vector<const OpDef *> allOps();
void registerOp(OpDef def);
// Forces every op family to register (static-library linking drops
// translation units nobody references, so registration is explicit).
void registerAllOps();

// Operand count bounds of `op`; false for unknown ops.
bool opArity(std::string_view op, int &minInputs, int &maxInputs);

// Runs an op's shape rule after checking operand count and presence.
Status inferShapes(std::string_view op, ShapeContext &ctx);

} // namespace sd
