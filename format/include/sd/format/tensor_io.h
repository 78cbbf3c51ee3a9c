// Host tensors and the file formats users hand to sdrun: ONNX TensorProto
// (.pb, decoded here without libprotobuf) and NumPy .npy.
#pragma once
#include "sd/format/file_io.h"
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
// A .npy file's element type, shape and where its data starts (the data's size checked against the shape).
struct NpyHeader {
  DType dtype = DType::Undefined;
  Dims dims;
  size_t dataOffset = 0;
};
StatusOr<NpyHeader> parseNpyHeader(const uint8_t *bytes, size_t size, const std::string &what);
// A .npy file mapped, its data read in place: training arrays too large to read whole.
struct MappedNpy {
  std::unique_ptr<MappedFile> file;
  DType dtype = DType::Undefined;
  Dims dims;
  const uint8_t *data = nullptr;
};
StatusOr<MappedNpy> mapNpyFile(const std::string &path);
std::string encodeNpy(const HostTensor &t);

// Reads a .pb or .npy file (chosen by the NumPy magic, not the extension).
StatusOr<HostTensor> readTensorFile(const std::string &path);
} // namespace sd
