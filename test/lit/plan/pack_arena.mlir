// RUN: sd-opt %s --sd-liveness --sd-pack-arena | FileCheck %s

// Four 4 KiB buffers in a chain: each is dead once the next is written, so two
// slots suffice. The arena is 8 KiB against 16 KiB of tensors.
// CHECK-LABEL: func.func @infer()
//  CHECK-SAME:   sd.arena_bytes = 8192 : i64
//  CHECK-SAME:   sd.tensor_bytes = 16384 : i64
func.func @infer() attributes {sd.entry = "infer"} {
  %x = sd.buffer {input = "x"} : memref<1024xf32>
  %a = sd.buffer : memref<1024xf32>
  sd.step "Neg" {} ins(%x : memref<1024xf32>) outs(%a : memref<1024xf32>)
  %b = sd.buffer : memref<1024xf32>
  sd.step "Exp" {} ins(%a : memref<1024xf32>) outs(%b : memref<1024xf32>)
  %c = sd.buffer : memref<1024xf32>
  sd.step "Relu" {} ins(%b : memref<1024xf32>) outs(%c : memref<1024xf32>)
  sd.output "y", %c : memref<1024xf32>
  return
}
