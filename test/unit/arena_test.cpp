// Arena packing on random programs: after sd-bufferize, sd-inplace-reuse,
// sd-liveness and sd-pack-arena, no two buffers that are live at the same step
// share a byte, and the arena never exceeds the sum of all buffer sizes.
#include "Pipeline.h"
#include "SDDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include <gtest/gtest.h>
#include <random>
#include <sstream>

namespace {

struct Val {
  std::string name;
  int64_t rows, cols;
  std::string type() const { return "tensor<" + std::to_string(rows) + "x" + std::to_string(cols) + "xf32>"; }
};

std::string randomProgram(std::mt19937 &rng, int numOps) {
  std::ostringstream body;
  std::vector<Val> vals;
  std::uniform_int_distribution<int64_t> dim(1, 40);
  int nargs = 1 + int(rng() % 3);
  std::string sig;
  for (int i = 0; i < nargs; ++i) {
    Val v{"%arg" + std::to_string(i), dim(rng), dim(rng)};
    sig += (i ? ", " : "") + v.name + ": " + v.type() + " {sd.name = \"x" + std::to_string(i) + "\"}";
    vals.push_back(v);
  }
  for (int i = 0; i < numOps; ++i) {
    const Val a = vals[rng() % vals.size()];
    std::string name = "%v" + std::to_string(i);
    int kind = int(rng() % 5);
    if (kind == 0 || kind == 1) {
      const char *op = kind == 0 ? "sd.relu" : "sd.exp";
      body << "  " << name << " = " << op << " " << a.name << " : (" << a.type() << ") -> " << a.type() << "\n";
      vals.push_back({name, a.rows, a.cols});
    } else if (kind == 2) {
      // Binary op against any value of the same shape (or itself).
      std::vector<Val> same;
      for (auto &v : vals)
        if (v.rows == a.rows && v.cols == a.cols) same.push_back(v);
      const Val b = same[rng() % same.size()];
      body << "  " << name << " = sd.add " << a.name << ", " << b.name << " : (" << a.type() << ", " << b.type()
           << ") -> " << a.type() << "\n";
      vals.push_back({name, a.rows, a.cols});
    } else if (kind == 3) {
      Val t{name, a.cols, a.rows};
      body << "  " << name << " = sd.transpose " << a.name << " : (" << a.type() << ") -> " << t.type() << "\n";
      vals.push_back(t);
    } else {
      Val m{name, a.rows, dim(rng)};
      Val w{"%w" + std::to_string(i), a.cols, m.cols};
      body << "  " << w.name << " = sd.constant dense<1.0> : " << w.type() << "\n";
      body << "  " << name << " = sd.matmul " << a.name << ", " << w.name << " : (" << a.type() << ", " << w.type()
           << ") -> " << m.type() << "\n";
      vals.push_back(m);
    }
  }
  // Return the last value and one random earlier one.
  const Val &last = vals.back(), &other = vals[rng() % vals.size()];
  std::ostringstream fn;
  fn << "func.func @infer(" << sig << ") -> (" << last.type() << ", " << other.type()
     << ") attributes {sd.entry = \"infer\", sd.output_names = [\"y0\", \"y1\"]} {\n"
     << body.str() << "  return " << last.name << ", " << other.name << " : " << last.type() << ", " << other.type()
     << "\n}\n";
  return fn.str();
}

int64_t bytesOf(mlir::MemRefType t) { return t.getNumElements() * 4; }

TEST(ArenaPacking, LiveBuffersNeverOverlap) {
  mlir::MLIRContext ctx;
  ctx.loadDialect<sd::ir::SDDialect, mlir::func::FuncDialect>();
  std::mt19937 rng(1234);
  int checkedPairs = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::string src = randomProgram(rng, 5 + int(rng() % 40));
    auto module = mlir::parseSourceString<mlir::ModuleOp>(src, &ctx);
    ASSERT_TRUE(module) << src;
    mlir::PassManager pm(&ctx);
    sd::buildPlanPipeline(pm);
    ASSERT_TRUE(mlir::succeeded(pm.run(*module))) << src;
    for (auto f : module->getOps<mlir::func::FuncOp>()) {
      struct B {
        int64_t off, size, first, last;
      };
      std::vector<B> bufs;
      int64_t total = 0;
      f.walk([&](sd::ir::BufferOp b) {
        auto live = *b.getLive();
        int64_t size = bytesOf(mlir::cast<mlir::MemRefType>(b.getType()));
        bufs.push_back({int64_t(*b.getOffset()), size, live[0], live[1]});
        total += (size + 63) / 64 * 64;
      });
      int64_t arena = f->getAttrOfType<mlir::IntegerAttr>("sd.arena_bytes").getInt();
      EXPECT_LE(arena, total);
      for (size_t i = 0; i < bufs.size(); ++i) {
        EXPECT_LE(bufs[i].off + bufs[i].size, arena);
        EXPECT_EQ(bufs[i].off % 64, 0);
        for (size_t j = i + 1; j < bufs.size(); ++j) {
          const B &a = bufs[i], &b = bufs[j];
          bool timeOverlap = a.first <= b.last && b.first <= a.last;
          bool spaceOverlap = a.off < b.off + b.size && b.off < a.off + a.size;
          if (timeOverlap) ++checkedPairs;
          ASSERT_FALSE(timeOverlap && spaceOverlap) << "buffers overlap in\n" << src;
        }
      }
    }
  }
  EXPECT_GT(checkedPairs, 1000);
}

} // namespace
