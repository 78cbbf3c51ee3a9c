// sd-accumulate-into-gemm: a sum of matrix products and other values of
// its shape is computed by the products themselves, each GEMM accumulating
// onto the running sum (its C, beta = 1: cuBLASLt and sgemm read it where
// it lies) instead of writing a product for an Add to read back:
//   base = Linear(x, W, b); up = Linear(down, B); y = r + (base + s * up)
// becomes
//   t = Gemm(down, B, C = r, alpha = s, transB); y = LinearAdd(x, W, b, t)
// LoRA's sums are the case (forward: the base and adapter products, with
// the residual where the layer's output joins it; backward: the input
// gradient's base and adapter products): each read two or three [tokens, d]
// tensors and wrote another, after the products had written theirs.
// Sums of one type, f32 or half; and autocast's f32 sums whose every term
// widens a value of one half type, which the GEMMs then sum in that type
// (a sum with an f32 term, such as the residual in a bf16 plan, would need
// a GEMM writing f32 from half operands: not taken yet). The order of the
// additions changes, so the plan's bits do, within rounding. Runs after
// autodiff and sd-scale-into-gemm, before sd-move-casts and
// sd-half-elementwise (a rotary reading the widened bf16 sum through a
// reshape then reads the bf16 sum itself), sd-norm-grad-sum (a norm
// gradient's dy is left to it) and sd-fuse-elementwise.
#include "PassDetail.h"
#include "Passes.h"
#include "vjp/GradBuilder.h"

namespace sd {
#define GEN_PASS_DEF_ACCUMULATEINTOGEMM
#include "Passes.h.inc"
} // namespace sd

using namespace mlir;
using namespace sd::ir;

namespace {

bool summableType(Type t) {
  auto r = dyn_cast<RankedTensorType>(t);
  if (!r || !r.hasStaticShape() || r.getRank() < 1 || r.getNumElements() == 0) return false;
  Type e = r.getElementType();
  return e.isF32() || e.isBF16() || e.isF16();
}

// An Add of two operands of the sum's own type (no broadcast).
AddOp sameTypeAdd(Value v, Type t) {
  auto add = v.getDefiningOp<AddOp>();
  if (!add || v.getType() != t) return {};
  for (Value o : add->getOperands())
    if (o.getType() != t) return {};
  return add;
}

// The leaves of the Add tree under `root`: inner Adds read only by the tree.
void leavesOf(Value v, Type t, bool isRoot, SmallVectorImpl<Value> &leaves, SmallVectorImpl<Operation *> &adds) {
  AddOp add = sameTypeAdd(v, t);
  if (!add || (!isRoot && !v.hasOneUse())) return leaves.push_back(v);
  adds.push_back(add);
  leavesOf(add->getOperand(0), t, false, leaves, adds);
  leavesOf(add->getOperand(1), t, false, leaves, adds);
}

// A leaf the GEMMs can take in: alpha * op(a) x op(b) ([m, n], a reshape of
// the leaf), a 2-D `a` unless `linear` (its input, rows to flatten); or,
// `whole`, the Linear itself, kept with its bias.
struct Product {
  Value a, b;
  bool transA = false, transB = false, whole = false;
  double alpha = 1;
  int64_t m = 0, n = 0;
  LinearOp linear;
  SmallVector<Operation *> ops; // what computed it, the leaf's op first
};

// The half value a leaf of an f32 sum widens (Cast, read once), under its
// constant scale if any; else null.
Value widenedLeaf(Value leaf) {
  Value v = leaf, rest;
  double scale = 1;
  if (sd::scalarFactor(v, rest, scale)) v = rest;
  return v.hasOneUse() ? sd::widenedHalf(v) : Value();
}

// The product `leaf` is, its element type `type` (the sum's, or the half
// type an f32 sum of widened halves is computed in).
std::optional<Product> productOf(Value leaf, Block *block, Type type) {
  Product p;
  Value v = leaf;
  auto take = [&](Value next) {
    p.ops.push_back(v.getDefiningOp());
    v = next;
  };
  if (Value rest; sd::scalarFactor(v, rest, p.alpha)) {
    if (!std::isfinite(p.alpha)) return std::nullopt;
    take(rest);
  }
  if (Value h = type != elementTypeOf(leaf) && v.hasOneUse() ? sd::widenedHalf(v) : Value()) take(h);
  if (auto reshape = v.getDefiningOp<ReshapeOp>(); reshape && v.hasOneUse()) take(reshape.getLhs());
  Operation *def = v.getDefiningOp();
  if (!def || !v.hasOneUse() || def->getBlock() != block || elementTypeOf(v) != type) return std::nullopt;
  if (auto gemm = dyn_cast<GemmOp>(def)) {
    if (!isa<NoneType>(gemm.getC().getType()) || gemm->getAttr("beta")) return std::nullopt;
    p.a = gemm.getA();
    p.b = gemm.getB();
    p.transA = gemm.getTransA().value_or(0) != 0;
    p.transB = gemm.getTransB().value_or(0) != 0;
    if (gemm.getAlpha()) p.alpha *= double(gemm.getAlpha()->convertToFloat());
  } else if (auto linear = dyn_cast<LinearOp>(def)) {
    p.linear = linear;
    p.whole = p.alpha == 1 && shapeOf(v) == shapeOf(leaf); // no Reshape taken
    if (!p.whole) { // scaled: a Gemm on the flattened input, without a bias
      if (!isa<NoneType>(linear.getBias().getType())) return std::nullopt;
      p.a = linear.getInput();
      p.b = linear.getWeight();
      p.transB = linear.getLayout() == "oi";
    }
  } else {
    return std::nullopt;
  }
  ArrayRef<int64_t> out = shapeOf(v);
  p.n = out.empty() ? 0 : out.back();
  p.m = p.n ? ShapedType::getNumElements(out) / p.n : 0;
  if (!p.whole && (!p.m || p.m * p.n != ShapedType::getNumElements(shapeOf(leaf)))) return std::nullopt;
  p.ops.push_back(def);
  return p;
}

// `v` in `shape`: itself, what a Reshape of it read, or a new Reshape.
Value reshaped(GradBuilder &g, Value v, ArrayRef<int64_t> shape) {
  if (shapeOf(v) == shape) return v;
  if (auto r = v.getDefiningOp<ReshapeOp>(); r && shapeOf(r.getLhs()) == shape) return r.getLhs();
  return g.reshape(v, shape);
}

struct AccumulateIntoGemmPass : sd::impl::AccumulateIntoGemmBase<AccumulateIntoGemmPass> {
  void runOnOperation() override {
    SmallVector<AddOp> roots;
    getOperation().walk([&](AddOp add) {
      Value sum = add.getResult();
      if (!summableType(sum.getType()) || !sameTypeAdd(sum, sum.getType())) return;
      // An Add read only by a larger tree is that tree's.
      if (auto user = sum.hasOneUse() ? dyn_cast<AddOp>(*sum.getUsers().begin()) : AddOp{};
          user && sameTypeAdd(user.getResult(), sum.getType()))
        return;
      // A norm gradient's dy: sd-norm-grad-sum reads its summands as they are.
      if (sum.hasOneUse() && isa<LayerNormalizationGradOp, RMSNormalizationGradOp>(*sum.getUsers().begin())) return;
      roots.push_back(add);
    });
    for (AddOp root : roots) rewrite(root);
  }

  static void rewrite(AddOp root) {
    Type t = root.getResult().getType();
    SmallVector<Value> leaves;
    SmallVector<Operation *> adds;
    leavesOf(root.getResult(), t, true, leaves, adds);
    // An f32 sum of widened halves of one type (autocast's LoRA sums): the
    // GEMMs sum in that half type, as they write their products (f32
    // accumulation, one rounding per GEMM); the f32 sum is the half one
    // widened.
    Type half;
    for (Value leaf : leaves) {
      Value h = widenedLeaf(leaf);
      Type ht = h ? elementTypeOf(h) : Type();
      half = leaf == leaves.front() || ht == half ? ht : Type();
      if (!half) break;
    }
    Type type = half ? half : elementTypeOf(root.getResult());
    SmallVector<Value> others;
    SmallVector<Product> products;
    SmallVector<Operation *> dropped; // the widening casts of the plain values
    for (Value leaf : leaves) {
      std::optional<Product> p = productOf(leaf, root->getBlock(), type);
      // A value the tree reads twice (Add(x, x)) stays a plain value.
      if (p && llvm::count(leaves, leaf) == 1) {
        products.push_back(std::move(*p));
      } else if (!half) {
        others.push_back(leaf);
      } else if (Value h = sd::widenedHalf(leaf); h && leaf.hasOneUse()) { // unscaled
        others.push_back(h);
        dropped.push_back(leaf.getDefiningOp());
      } else {
        return;
      }
    }
    // One Linear kept whole becomes the LinearAdd, the last step: one with a
    // bias first (a Gemm has none); any other adds as a plain value.
    std::optional<size_t> last;
    auto biased = [&](size_t i) { return !isa<NoneType>(products[i].linear.getBias().getType()); };
    for (size_t i = 0; i < products.size(); ++i)
      if (products[i].whole && (!last || (biased(i) && !biased(*last)))) last = i;
    for (size_t i = products.size(); i-- > 0;)
      if (products[i].whole && i != *last) {
        others.push_back(products[i].linear.getResult());
        dropped.append(products[i].ops.begin(), products[i].ops.end() - 1);
        products.erase(products.begin() + long(i));
        if (i < *last) --*last;
      }
    if (products.empty()) return;
    Operation *before = root->getPrevNode();
    OpBuilder b(root);
    GradBuilder g(b, root.getLoc());
    Value acc;
    for (Value o : others) acc = acc ? g.add(acc, o) : o;
    ArrayRef<int64_t> shape = shapeOf(root.getResult());
    for (size_t i = 0; i < products.size() && !g.failed(); ++i) {
      Product &p = products[i];
      if (p.whole) continue; // the LinearAdd, last
      Value a = p.linear ? reshaped(g, p.a, {p.m, shapeOf(p.a).back()}) : p.a;
      SmallVector<NamedAttribute> attrs;
      if (p.transA) attrs.push_back(g.attr("transA", 1));
      if (p.transB) attrs.push_back(g.attr("transB", 1));
      if (p.alpha != 1) attrs.push_back(b.getNamedAttr("alpha", b.getF32FloatAttr(float(p.alpha))));
      Value c = g.none();
      if (acc) {
        c = reshaped(g, acc, {p.m, p.n});
        attrs.push_back(b.getNamedAttr("beta", b.getF32FloatAttr(1.0f)));
      }
      Value out = g.make<GemmOp>({a, p.b, c}, attrs);
      acc = g.failed() ? Value() : reshaped(g, out, shape);
    }
    if (last && acc && !g.failed()) {
      LinearOp l = products[*last].linear;
      acc = g.make<LinearAddOp>({l.getInput(), l.getWeight(), l.getBias(), acc}, l->getAttrs());
    }
    // The f32 sum: the half one widened, unless its one reader rounds it back.
    CastOp narrowing = half && root->hasOneUse() ? dyn_cast<CastOp>(*root->getUsers().begin()) : CastOp{};
    if (narrowing && narrowing.getResult().getType() != (acc ? acc.getType() : Type())) narrowing = {};
    Value sum = acc;
    if (half && !narrowing && acc && !g.failed()) sum = g.make<CastOp>({acc}, {g.attr("to", 1)});
    if (g.failed() || !acc || (!narrowing && sum.getType() != t)) { // shapes that did not line up: take back what was built
      while (root->getPrevNode() != before) root->getPrevNode()->erase();
      return;
    }
    if (narrowing) {
      narrowing.getResult().replaceAllUsesWith(acc);
      narrowing->erase();
    } else {
      root.getResult().replaceAllUsesWith(sum);
    }
    for (Operation *add : adds) add->dropAllReferences();
    for (Operation *add : adds) add->erase();
    for (Product &p : products)
      for (Operation *op : p.ops)
        if (op->use_empty()) op->erase();
    for (Operation *op : dropped)
      if (op->use_empty()) op->erase();
  }
};

} // namespace
