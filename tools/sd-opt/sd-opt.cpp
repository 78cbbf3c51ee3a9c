// sd-opt: mlir-opt with the sd dialect and passes, for lit tests.
#include "Pipeline.h"
#include "SDDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  sd::registerSdPasses();
  mlir::DialectRegistry registry;
  registry.insert<sd::ir::SDDialect, mlir::func::FuncDialect>();
  return mlir::asMainReturnCode(mlir::MlirOptMain(argc, argv, "sd-opt: the sd dialect and passes\n", registry));
}
