// libFuzzer target: bytes as a tensor file given to sdrun infer --input (ONNX
// TensorProto and .npy). Whatever decodes must hold exactly what its shape says.
#include "sd/format/tensor_io.h"
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  for (auto decode : {sd::decodeTensorProto, sd::decodeNpy}) {
    auto t = decode(data, size, "fuzz");
    if (!t.isOk()) continue;
    size_t n = 1;
    for (int64_t d : t.value().dims) n *= size_t(d);
    if (t.value().data.size() != n * sd::dtypeSize(t.value().dtype)) std::abort();
  }
  return 0;
}
