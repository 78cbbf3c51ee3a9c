// Host tensors and the file formats users hand to sdrun: ONNX TensorProto
// (.pb, decoded here without libprotobuf) and NumPy .npy.
#pragma once
#include "sd/format/status.h"
#include "sd/format/tensor.h"
#include <string>
#include <vector>

namespace sd {

struct HostTensor {
  std::string name;
  DType dtype = DType::Undefined;
  Dims dims;
  std::vector<uint8_t> data; // row-major, little-endian

  TensorView view() { return TensorView{data.data(), dtype, dims}; }
  size_t byteSize() const { return data.size(); }
};

StatusOr<HostTensor> decodeTensorProto(const uint8_t *bytes, size_t size, const std::string &what);
std::string encodeTensorProto(const HostTensor &t);
StatusOr<HostTensor> decodeNpy(const uint8_t *bytes, size_t size, const std::string &what);
std::string encodeNpy(const HostTensor &t);

// Reads a .pb or .npy file (chosen by the NumPy magic, not the extension).
StatusOr<HostTensor> readTensorFile(const std::string &path);
// Writes atomically (temp file + fsync + rename) so a failure leaves no
// partial file; the pieces are written in order (a header, then tensor data).
Status writeFileAtomic(const std::string &path, const std::string &bytes);
Status writeFileAtomic(const std::string &path, const std::vector<std::pair<const void *, size_t>> &pieces);
// fsyncs a directory so a rename inside it is durable.
Status syncDirectory(const std::string &dir);
StatusOr<std::string> readWholeFile(const std::string &path);

} // namespace sd
