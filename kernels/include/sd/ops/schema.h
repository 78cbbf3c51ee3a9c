// Op schemas: what an op is, independent of any device. Arity, shape rule and
// contract version are shared by the compiler (shape propagation, plan
// emission), the plan loader and every backend; kernels live in the
// per-backend registries of kernel.h.
#pragma once
#include "sd/ops/attrs.h"
#include "sd/format/status.h"
#include "sd/format/tensor.h"
#include <string>
#include <string_view>
#include <vector>

namespace sd {

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

using ShapeFn = Status (*)(ShapeContext &);

struct OpSchema {
  std::string name; // contract name, e.g. "Add"
  int minInputs = 0, maxInputs = 0;
  ShapeFn shape = nullptr;
  uint32_t contractVersion = 1;
};

// Registration happens once, from registerAllOps(); the lookups are safe to
// call from any thread after that.
const OpSchema *findSchema(std::string_view name);
std::vector<const OpSchema *> allSchemas();
// Forces every op family (schemas and CPU kernels) to register: static-library
// linking drops translation units nobody references.
void registerAllOps();

// Operand count bounds of `op`; false for unknown ops.
bool opArity(std::string_view op, int &minInputs, int &maxInputs);

// Runs an op's shape rule after checking operand count and presence.
Status inferShapes(std::string_view op, ShapeContext &ctx);

} // namespace sd
