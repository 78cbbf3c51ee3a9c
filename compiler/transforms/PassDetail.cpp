// Location helpers shared by passes.
#include "PassDetail.h"

namespace sd {

std::string nodeNameOf(mlir::Location loc) {
  if (auto n = mlir::dyn_cast<mlir::NameLoc>(loc)) return n.getName().str();
  if (auto f = mlir::dyn_cast<mlir::FusedLoc>(loc))
    for (mlir::Location l : f.getLocations())
      if (auto s = nodeNameOf(l); !s.empty()) return s;
  return "";
}

std::string describeNode(mlir::Operation *op) {
  std::string name = nodeNameOf(op->getLoc());
  std::string kind = op->getName().getStringRef().str();
  if (auto c = mlir::dyn_cast<sd::ir::ComputeOpInterface>(op)) kind = c.getContractName().str();
  return name.empty() ? kind : "node '" + name + "' (" + kind + ")";
}

} // namespace sd
