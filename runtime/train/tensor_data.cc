// Tensor training data: a folder of NumPy arrays, one per data input.
#include "sd/train/tensor_data.h"
#include "sd/format/file_io.h"
#include <cstring>
#include <sys/stat.h>

namespace sd::train {
namespace {

std::string arrayPath(const std::string &dir, const TensorInput &in) { return dir + "/" + in.name + ".npy"; }

// What the input's array must be: "f32[Nx3x16x16]", N examples.
std::string arrayOf(const TensorInput &in) {
  const Dims row(in.dims.begin() + 1, in.dims.end());
  return std::string(dtypeName(in.dtype)) + "[N" + (row.empty() ? "" : "x" + formatDims(row)) + "]";
}

Status requireFolder(const std::string &dir, const std::vector<TensorInput> &inputs) {
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return Status::ok();
  std::string wanted;
  for (const TensorInput &in : inputs)
    wanted += (wanted.empty() ? "" : ", ") + in.name + ".npy (" + arrayOf(in) + ")";
  return sdError(dir, ": this plan computes its own loss from ", inputs.size() == 1 ? "the input" : "the inputs",
                 " it was compiled with, so --data must be a folder holding ", wanted,
                 ", the examples along the first axis");
}

} // namespace

StatusOr<TensorData> loadTensorFolder(const std::string &dir, const std::vector<TensorInput> &inputs) {
  SD_RETURN_IF_ERROR(requireFolder(dir, inputs));
  TensorData out;
  out.inputs = inputs;
  int64_t examples = -1;
  std::string first;
  for (const TensorInput &in : inputs) {
    const std::string path = arrayPath(dir, in);
    auto t = mapNpyFile(path);
    if (!t.isOk()) return t.status();
    MappedNpy &a = t.value();
    const Dims row(in.dims.begin() + 1, in.dims.end());
    if (a.dims.empty() || Dims(a.dims.begin() + 1, a.dims.end()) != row || a.dtype != in.dtype)
      return sdError(path, ": ", dtypeName(a.dtype), "[", formatDims(a.dims), "], but input '", in.name, "' takes ",
                     arrayOf(in), " (N examples)");
    if (a.dims[0] == 0) return sdError(path, ": holds no examples");
    if (examples >= 0 && a.dims[0] != examples)
      return sdError(path, ": ", a.dims[0], " examples, but ", first, " holds ", examples);
    examples = a.dims[0];
    first = path;
    out.arrays.push_back(std::move(a));
  }
  out.examples.resize(size_t(examples));
  for (int64_t i = 0; i < examples; ++i) out.examples[size_t(i)].row = i;
  return out;
}

StatusOr<std::string> tensorFolderFingerprint(const std::string &dir, const std::vector<TensorInput> &inputs) {
  std::string out;
  for (const TensorInput &in : inputs) {
    auto f = fileFingerprint(arrayPath(dir, in));
    if (!f.isOk()) return f.status();
    out += (out.empty() ? "" : ",") + in.name + ":" + f.value();
  }
  return out;
}

TensorBatch::TensorBatch(const Rows &rows, const TensorData &data) {
  for (size_t i = 0; i < data.arrays.size(); ++i) {
    const MappedNpy &a = data.arrays[i];
    const size_t rowBytes = size_t(product(Dims(a.dims.begin() + 1, a.dims.end()))) * dtypeSize(a.dtype);
    HostTensor t{data.inputs[i].name, a.dtype, a.dims, {}};
    t.dims[0] = int64_t(rows.size());
    t.data.resize(rowBytes * rows.size());
    for (size_t r = 0; r < rows.size(); ++r)
      std::memcpy(t.data.data() + r * rowBytes, a.data + size_t(rows[r].front()->row) * rowBytes, rowBytes);
    tensors.push_back(std::move(t));
  }
}

std::map<std::string, const HostTensor *> TensorBatch::inputs() const {
  std::map<std::string, const HostTensor *> out;
  for (const HostTensor &t : tensors) out[t.name] = &t;
  return out;
}

} // namespace sd::train
