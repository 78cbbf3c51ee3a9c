// RUN: sd-opt %s --sd-liveness | FileCheck %s

// Inputs live from step 0; outputs until the end (step count); a view keeps
// its source alive.
// CHECK-LABEL: func.func @infer()
//       CHECK:   sd.buffer {input = "x", live = array<i64: 0, 1>}
//       CHECK:   sd.buffer {live = array<i64: 0, 3>}
//       CHECK:   sd.buffer {live = array<i64: 1, 2>}
//       CHECK:   sd.buffer {live = array<i64: 2, 3>}
func.func @infer() attributes {sd.entry = "infer"} {
  %x = sd.buffer {input = "x"} : memref<4xf32>
  %a = sd.buffer : memref<4xf32>
  sd.step "Neg" {} ins(%x : memref<4xf32>) outs(%a : memref<4xf32>)
  %b = sd.buffer : memref<4xf32>
  sd.step "Exp" {} ins(%x : memref<4xf32>) outs(%b : memref<4xf32>)
  %c = sd.buffer : memref<4xf32>
  sd.step "Relu" {} ins(%b : memref<4xf32>) outs(%c : memref<4xf32>)
  %v = sd.view %a : memref<4xf32> to memref<2x2xf32>
  sd.output "y", %v : memref<2x2xf32>
  sd.output "z", %c : memref<4xf32>
  return
}
