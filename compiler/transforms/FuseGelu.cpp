// sd-fuse-gelu: recognizes the GELU that exporters decompose, exact,
// x * 0.5 * (1 + erf(x / sqrt(2))), or with the tanh approximation,
// x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) (GPT-2's gelu_new,
// Phi-2's, PyTorch's approximate="tanh"; x^3 as a Pow or as x * x * x), and
// replaces it with one sd.gelu, so it runs as one kernel (and,
// for training, one backward).
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "Passes.h"
#include "mlir/IR/Builders.h"
#include <cmath>

namespace sd {
#define GEN_PASS_DEF_FUSEGELU
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

using sd::isScalar;
using sd::otherOperand;
using sd::soleUser;

// Whether `c` is x cubed: Pow(x, 3) (HF's gelu_new), or x * (x * x) in any
// association and order (PyTorch's own tanh GELU as its exporter writes it).
bool isCube(Value c, Value x) {
  Operation *op = c.getDefiningOp();
  if (!op || !op->hasOneUse()) return false;
  if (auto pow = dyn_cast<PowOp>(op)) return pow.getLhs() == x && isScalar(pow.getRhs(), 3.0);
  auto mul = dyn_cast<MulOp>(op);
  if (!mul) return false;
  for (int i = 0; i < 2; ++i) {
    auto square = mul->getOperand(unsigned(1 - i)).getDefiningOp<MulOp>();
    if (mul->getOperand(unsigned(i)) == x && square && square->hasOneUse() && square.getLhs() == x &&
        square.getRhs() == x)
      return true;
  }
  return false;
}

// The x of s = x + 0.044715 * x^3 (any operand order); null otherwise.
Value cubicArgument(Value s) {
  auto add = s.getDefiningOp<AddOp>();
  if (!add || !add->hasOneUse()) return {};
  for (int i = 0; i < 2; ++i) {
    Value x = add->getOperand(unsigned(i));
    auto mul = add->getOperand(unsigned(1 - i)).getDefiningOp<MulOp>();
    if (!mul || !mul->hasOneUse()) continue;
    for (int j = 0; j < 2; ++j)
      if (isCube(mul->getOperand(unsigned(j)), x) && isScalar(mul->getOperand(unsigned(1 - j)), 0.044715)) return x;
  }
  return {};
}

struct FuseGeluPass : sd::impl::FuseGeluBase<FuseGeluPass> {
  void runOnOperation() override {
    SmallVector<ErfOp> erfs;
    SmallVector<TanhOp> tanhs;
    getOperation().walk([&](ErfOp e) { erfs.push_back(e); });
    getOperation().walk([&](TanhOp t) { tanhs.push_back(t); });
    for (ErfOp erf : erfs) tryFuseErf(erf);
    for (TanhOp tanh : tanhs) tryFuseTanh(tanh);
  }

  void tryFuseErf(ErfOp erf) {
    // erf(x / sqrt(2)) or erf(x * (1/sqrt(2)))
    Operation *scaled = erf.getInput().getDefiningOp();
    Value x;
    if (auto div = dyn_cast_or_null<DivOp>(scaled); div && isScalar(div.getRhs(), M_SQRT2)) x = div.getLhs();
    else if (auto mul = dyn_cast_or_null<MulOp>(scaled)) {
      if (isScalar(mul.getRhs(), M_SQRT1_2)) x = mul.getLhs();
      else if (isScalar(mul.getLhs(), M_SQRT1_2)) x = mul.getRhs();
    }
    if (!x || !scaled->hasOneUse()) return;
    replaceOuter(erf, x, StringAttr());
  }

  // GPT-2's gelu_new (and PyTorch's approximate="tanh" before opset 20):
  // 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))).
  void tryFuseTanh(TanhOp tanh) {
    auto mul = tanh.getInput().getDefiningOp<MulOp>();
    if (!mul || !mul->hasOneUse()) return;
    const double c = std::sqrt(2.0 / M_PI);
    Value x;
    if (isScalar(mul.getLhs(), c)) x = cubicArgument(mul.getRhs());
    else if (isScalar(mul.getRhs(), c)) x = cubicArgument(mul.getLhs());
    if (!x) return;
    replaceOuter(tanh, x, StringAttr::get(tanh.getContext(), "tanh"));
  }

  // x * (1 + f) * 0.5 around f = erf(...) or tanh(...), in either
  // association: (x * a) * 0.5 or (x * 0.5) * a; replaced by one sd.gelu.
  void replaceOuter(Operation *f, Value x, StringAttr approximate) {
    // 1 + f
    auto add = dyn_cast_or_null<AddOp>(soleUser(f->getResult(0)));
    if (!add || !isScalar(otherOperand(add, f->getResult(0)), 1.0)) return;
    Operation *user = soleUser(add.getResult());
    auto mulA = dyn_cast_or_null<MulOp>(user);
    if (!mulA) return;
    Value other = otherOperand(mulA, add.getResult());
    Operation *last = nullptr;
    if (other == x) {
      auto half = dyn_cast_or_null<MulOp>(soleUser(mulA.getResult()));
      if (half && isScalar(otherOperand(half, mulA.getResult()), 0.5)) last = half;
    } else if (auto xHalf = other.getDefiningOp<MulOp>()) {
      if (otherOperand(xHalf, x) && isScalar(otherOperand(xHalf, x), 0.5) && xHalf->hasOneUse()) last = mulA;
    }
    if (!last || last->getResult(0).getType() != x.getType()) return;
    OpBuilder b(last);
    auto gelu = b.create<GeluOp>(FusedLoc::get(b.getContext(), {f->getLoc(), last->getLoc()}), x.getType(), x,
                                 approximate);
    last->getResult(0).replaceAllUsesWith(gelu.getResult());
    // The decomposed ops are now dead; sd-propagate-shapes removes them.
  }
};

} // namespace
