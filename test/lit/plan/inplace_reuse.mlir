// RUN: sd-opt %s --sd-inplace-reuse | FileCheck %s

// Neg overwrites the entry input (dead after it), Relu writes in place too;
// Exp cannot, because its input is read again by the Add.
// CHECK-LABEL: func.func @infer()
//       CHECK:   %[[X:.*]] = sd.buffer {input = "x"} : memref<4xf32>
//       CHECK:   sd.step "Neg" {} ins(%[[X]] : memref<4xf32>) outs(%[[X]] : memref<4xf32>)
//       CHECK:   sd.step "Relu" {} ins(%[[X]] : memref<4xf32>) outs(%[[X]] : memref<4xf32>)
//       CHECK:   %[[C:.*]] = sd.buffer : memref<4xf32>
//       CHECK:   sd.step "Exp" {} ins(%[[X]] : memref<4xf32>) outs(%[[C]] : memref<4xf32>)
//       CHECK:   sd.step "Add" {} ins(%[[C]], %[[X]] : memref<4xf32>, memref<4xf32>) outs(%[[C]] : memref<4xf32>)
func.func @infer() attributes {sd.entry = "infer"} {
  %x = sd.buffer {input = "x"} : memref<4xf32>
  %a = sd.buffer : memref<4xf32>
  sd.step "Neg" {} ins(%x : memref<4xf32>) outs(%a : memref<4xf32>)
  %b = sd.buffer : memref<4xf32>
  sd.step "Relu" {} ins(%a : memref<4xf32>) outs(%b : memref<4xf32>)
  %c = sd.buffer : memref<4xf32>
  sd.step "Exp" {} ins(%b : memref<4xf32>) outs(%c : memref<4xf32>)
  %d = sd.buffer : memref<4xf32>
  sd.step "Add" {} ins(%c, %b : memref<4xf32>, memref<4xf32>) outs(%d : memref<4xf32>)
  sd.output "y", %d : memref<4xf32>
  return
}

// A variadic Sum folds operands into its output one by one: only its first
// operand may share the output's memory (the gradient check found this).
// CHECK-LABEL: func.func @sum3()
//       CHECK:   %[[Y:.*]] = sd.buffer {input = "y"}
//       CHECK:   %[[O:.*]] = sd.buffer : memref<4xf32>
//       CHECK:   sd.step "Sum" {} ins(%{{.*}}, %{{.*}}, %[[Y]] : {{.*}}) outs(%[[O]] : memref<4xf32>)
func.func @sum3() attributes {sd.entry = "sum3"} {
  %w = sd.global_buffer @w : memref<4xf32>
  %x = sd.global_buffer @x : memref<4xf32>
  %y = sd.buffer {input = "y"} : memref<4xf32>
  %o = sd.buffer : memref<4xf32>
  sd.step "Sum" {} ins(%w, %x, %y : memref<4xf32>, memref<4xf32>, memref<4xf32>) outs(%o : memref<4xf32>)
  sd.output "o", %o : memref<4xf32>
  return
}
