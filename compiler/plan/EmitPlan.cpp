// Plan emission: FlatBuffer tables from the step IR, weights streamed after it
// at 64-byte alignment (or to a safetensors file), CRC32C footer last.
#include "EmitPlan.h"
#include "OpLibraryBridge.h"
#include "PassDetail.h"
#include "plan_generated.h"
#include "mlir/IR/BuiltinDialect.h"
#include "mlir/IR/DialectResourceBlobManager.h"
#include "sd/format/crc32c.h"
#include "sd/format/json.h"
#include "sd/format/safetensors.h"
#include "sd/format/plan_format.h"
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <unistd.h>

using namespace mlir;
using namespace sd::ir;

namespace sd {
namespace {

struct GlobalData {
  std::string name;
  DType dtype;
  Dims dims;
  GlobalRole role;
  const uint8_t *data = nullptr;
  size_t size = 0;
  std::vector<uint8_t> owned;
  bool zeroInit = false;
  uint64_t offset = 0;
};



// Streams bytes to a temp file, tracking CRC and position; renames on commit.
class PlanWriter {
public:
  explicit PlanWriter(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp." + std::to_string(getpid())) {}
  ~PlanWriter() {
    if (f_) {
      std::fclose(f_);
      std::remove(tmp_.c_str());
    }
  }
  bool open() {
    size_t slash = path_.find_last_of('/');
    removeStaleTemps(parentDirectory(path_), (slash == std::string::npos ? path_ : path_.substr(slash + 1)) + ".tmp.");
    return (f_ = std::fopen(tmp_.c_str(), "wb")) != nullptr;
  }
  bool write(const void *d, size_t n) {
    crc_ = crc32c(d, n, crc_);
    pos_ += n;
    if (n == 0 || std::fwrite(d, 1, n, f_) == n) return true;
    err_ = errno;
    return false;
  }
  bool padTo(size_t align) {
    static const uint8_t zeros[64] = {};
    size_t pad = (align - pos_ % align) % align;
    return write(zeros, pad);
  }
  bool commit() {
    bool ok = std::fflush(f_) == 0 && fsync(fileno(f_)) == 0;
    if (!ok) err_ = errno;
    ok = std::fclose(f_) == 0 && ok;
    f_ = nullptr;
    if (!ok || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      std::remove(tmp_.c_str());
      return false;
    }
    return true;
  }
  uint32_t crc() const { return crc_; }
  std::string failure() const { return err_ ? writeErrorReason(err_) : "cannot rename into place"; }
  uint64_t pos() const { return pos_; }

private:
  std::string path_, tmp_;
  FILE *f_ = nullptr;
  uint32_t crc_ = 0;
  uint64_t pos_ = 0;
  int err_ = 0;
};

LogicalResult collectGlobals(ModuleOp module, std::vector<GlobalData> &out, llvm::StringMap<int> &index,
                             std::string &error) {
  for (GlobalOp g : module.getOps<GlobalOp>()) {
    GlobalData d;
    d.name = g.getSymName().str();
    TensorInfo info = toTensorInfo(g.getType());
    d.dtype = info.dtype;
    d.dims = info.dims;
    std::optional<GlobalRole> role = parseGlobalRole(g.getRole());
    if (!role) {
      error = "global '" + d.name + "' has unknown role '" + g.getRole().str() + "'";
      return failure();
    }
    d.role = *role;
    d.size = size_t(product(d.dims)) * dtypeSize(d.dtype);
    if (auto init = g.getInitialValueAttr()) {
      auto res = dyn_cast<DenseResourceElementsAttr>(init);
      AsmResourceBlob *blob = res ? res.getRawHandle().getBlob() : nullptr;
      if (blob && blob->getData().size() == d.size) {
        d.data = reinterpret_cast<const uint8_t *>(blob->getData().data());
      } else if (!elementsToBytes(init, d.owned) || d.owned.size() != d.size) {
        error = "global '" + d.name + "' has an initial value that cannot be serialized";
        return failure();
      } else {
        d.data = d.owned.data();
      }
    } else if (d.role == GlobalRole::Frozen || d.role == GlobalRole::Constant) {
      d.owned.assign(d.size, 0);
      d.data = d.owned.data();
    } else {
      d.zeroInit = true; // gradients, moments, counters: not stored, the runtime zero-fills them
    }
    index[d.name] = int(out.size());
    out.push_back(std::move(d));
  }
  return success();
}

flatbuffers::Offset<fb::Entry> buildEntry(flatbuffers::FlatBufferBuilder &fbb, func::FuncOp f,
                                          const llvm::StringMap<int> &globalIndex, std::string &error, bool &ok) {
  llvm::DenseMap<Value, int32_t> bufIndex;
  std::vector<flatbuffers::Offset<fb::Buffer>> buffers;
  std::vector<flatbuffers::Offset<fb::Step>> steps;
  std::vector<flatbuffers::Offset<fb::Binding>> inputs, outputs;
  std::map<std::string, int32_t> inputByName;
  auto addBuffer = [&](Value v, fb::BufferKind kind, int64_t offset) {
    auto t = cast<MemRefType>(v.getType());
    std::vector<int64_t> dims(t.getShape().begin(), t.getShape().end());
    int32_t dt = int32_t(toDType(t.getElementType()).value_or(DType::Undefined));
    bufIndex[v] = int32_t(buffers.size());
    buffers.push_back(fb::CreateBufferDirect(fbb, kind, dt, &dims, offset));
  };
  ok = true;
  f.walk([&](Operation *op) {
    if (!ok) return;
    if (auto b = dyn_cast<BufferOp>(op)) {
      if (!b.getOffset()) {
        error = "buffer without an arena offset: run sd-pack-arena";
        ok = false;
        return;
      }
      addBuffer(b, fb::BufferKind::Arena, *b.getOffset());
      if (b.getInput()) inputByName[b.getInput()->str()] = bufIndex[b];
    } else if (auto g = dyn_cast<GlobalBufferOp>(op)) {
      auto it = globalIndex.find(g.getGlobal());
      if (it == globalIndex.end()) {
        error = "unknown global '" + g.getGlobal().str() + "'";
        ok = false;
        return;
      }
      addBuffer(g, fb::BufferKind::Global, it->second);
    } else if (auto v = dyn_cast<ViewOp>(op)) {
      addBuffer(v, fb::BufferKind::Alias, bufIndex.lookup(v.getSource()));
    } else if (auto s = dyn_cast<StepOp>(op)) {
      std::vector<int32_t> ins, outs;
      for (Value in : s.getInputs()) ins.push_back(isa<NoneType>(in.getType()) ? -1 : bufIndex.lookup(in));
      for (Value out : s.getOutputs()) outs.push_back(bufIndex.lookup(out));
      AttrMap attrs = toAttrMap(s.getParams());
      std::vector<flatbuffers::Offset<fb::Attr>> fattrs;
      for (auto &[name, a] : attrs.entries()) {
        auto n = fbb.CreateString(name);
        auto str = a.kind == Attr::Kind::String ? fbb.CreateString(a.s) : 0;
        auto ints = a.kind == Attr::Kind::Ints ? fbb.CreateVector(a.ints) : 0;
        auto floats = a.kind == Attr::Kind::Floats ? fbb.CreateVector(a.floats) : 0;
        fattrs.push_back(fb::CreateAttr(fbb, n, fb::AttrKind(int(a.kind)), a.i, a.f, str, ints, floats));
      }
      const OpSchema *schema = findSchema(s.getContract().str());
      std::string loc = nodeNameOf(s.getLoc());
      steps.push_back(fb::CreateStepDirect(fbb, s.getContract().str().c_str(), schema ? schema->contractVersion : 1, &ins,
                                           &outs, &fattrs, loc.c_str()));
    } else if (auto o = dyn_cast<OutputOp>(op)) {
      int32_t extent = o.getExtent() ? bufIndex.lookup(o.getExtent()) : -1;
      outputs.push_back(fb::CreateBindingDirect(fbb, o.getName().str().c_str(), bufIndex.lookup(o.getBuffer()), extent,
                                                int32_t(o.getExtentAxis().value_or(0))));
    }
  });
  if (!ok) return 0;
  if (auto names = f->getAttrOfType<ArrayAttr>("sd.input_names"))
    for (Attribute n : names) {
      std::string name = cast<StringAttr>(n).str();
      inputs.push_back(fb::CreateBindingDirect(fbb, name.c_str(), inputByName[name]));
    }
  std::vector<flatbuffers::Offset<fb::BucketDim>> bucket;
  if (auto dict = f->getAttrOfType<DictionaryAttr>("sd.bucket"))
    for (NamedAttribute a : dict)
      if (auto i = dyn_cast<IntegerAttr>(a.getValue()))
        bucket.push_back(fb::CreateBucketDimDirect(fbb, a.getName().str().c_str(), i.getInt()));
  uint64_t arena = 0, tensors = 0;
  if (auto a = f->getAttrOfType<IntegerAttr>("sd.arena_bytes")) arena = uint64_t(a.getInt());
  if (auto t = f->getAttrOfType<IntegerAttr>("sd.tensor_bytes")) tensors = uint64_t(t.getInt());
  std::string entryName = f->getAttrOfType<StringAttr>("sd.entry").str();
  return fb::CreateEntryDirect(fbb, entryName.c_str(), &bucket, arena, &buffers, &steps, &inputs, &outputs, tensors,
                               f->hasAttr("sd.body"));
}

std::string baseName(const std::string &p) {
  size_t s = p.find_last_of('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

// --external-weights: the initial values of stored globals, keyed by name.
LogicalResult writeExternalWeights(const std::string &path, const std::vector<GlobalData> &globals,
                                   std::string &error) {
  std::vector<NamedTensor> tensors;
  for (const GlobalData &g : globals)
    if (!g.zeroInit) tensors.push_back({g.name, g.dtype, g.dims, g.data, g.size});
  Status s = writeSafetensors(path, tensors);
  if (!s.isOk()) return error = s.message(), failure();
  return success();
}

} // namespace

LogicalResult emitPlan(ModuleOp module, const EmitOptions &opts, std::string &error) {
  std::vector<GlobalData> globals;
  llvm::StringMap<int> globalIndex;
  if (failed(collectGlobals(module, globals, globalIndex, error))) return failure();

  uint64_t weightsSize = 0;
  for (GlobalData &g : globals) {
    if (g.zeroInit) continue;
    g.offset = weightsSize;
    weightsSize = (weightsSize + g.size + kWeightAlignment - 1) / kWeightAlignment * kWeightAlignment;
  }
  std::string externalName;
  if (opts.externalWeights) {
    std::string stem = opts.outputPath;
    if (StringRef(stem).ends_with(".sdp")) stem.resize(stem.size() - 4);
    std::string path = stem + ".safetensors";
    externalName = baseName(path);
    if (failed(writeExternalWeights(path, globals, error))) return failure();
    weightsSize = 0;
  }

  flatbuffers::FlatBufferBuilder fbb(1 << 16);
  std::vector<flatbuffers::Offset<fb::Global>> fglobals;
  for (GlobalData &g : globals)
    fglobals.push_back(fb::CreateGlobalDirect(fbb, g.name.c_str(), int32_t(g.dtype), &g.dims, fb::GlobalRole(int(g.role)),
                                              opts.externalWeights || g.zeroInit ? -1 : int64_t(g.offset),
                                              g.zeroInit ? 0 : int64_t(g.size)));
  std::vector<flatbuffers::Offset<fb::Entry>> entries;
  for (auto f : module.getOps<func::FuncOp>()) {
    if (!isEntry(f)) continue;
    bool ok;
    auto e = buildEntry(fbb, f, globalIndex, error, ok);
    if (!ok) return failure();
    entries.push_back(e);
  }
  if (entries.empty()) return error = "module has no entries", failure();
  std::vector<uint8_t> sha(opts.sourceSha256.begin(), opts.sourceSha256.end());
  // The weight offset depends on the FlatBuffer's size; build once with a
  // placeholder, then patch the field in place (its size does not change).
  std::vector<flatbuffers::Offset<fb::File>> files;
  for (const auto &[name, bytes] : opts.files)
    files.push_back(fb::CreateFile(fbb, fbb.CreateString(name),
                                   fbb.CreateVector(reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size())));
  auto plan = fb::CreatePlanDirect(fbb, kPlanSchemaMajor, kPlanSchemaMinor, opts.producer.c_str(), &sha,
                                   opts.config.c_str(), &fglobals, &entries, /*weights_offset=*/1, weightsSize,
                                   externalName.empty() ? nullptr : externalName.c_str(), files.empty() ? nullptr : &files);
  fbb.Finish(plan, fb::PlanIdentifier());
  uint64_t fbSize = fbb.GetSize();
  uint64_t weightsOffset = (fbSize + kWeightAlignment - 1) / kWeightAlignment * kWeightAlignment;
  auto *mutablePlan = fb::GetMutablePlan(fbb.GetBufferPointer());
  if (!mutablePlan->mutate_weights_offset(weightsOffset)) return error = "cannot record weight offset", failure();

  PlanWriter w(opts.outputPath);
  if (!w.open()) return error = opts.outputPath + ": cannot write", failure();
  bool ok = w.write(fbb.GetBufferPointer(), fbSize) && w.padTo(kWeightAlignment);
  if (!opts.externalWeights)
    for (GlobalData &g : globals) ok = ok && (g.zeroInit || (w.write(g.data, g.size) && w.padTo(kWeightAlignment)));
  uint8_t footer[kPlanFooterSize];
  uint32_t crc = w.crc();
  std::memcpy(footer, &fbSize, 8);
  std::memcpy(footer + 8, &crc, 4);
  std::memcpy(footer + 12, kPlanFooterMagic, 4);
  // The footer is not covered by the CRC it carries.
  ok = ok && w.write(footer, sizeof footer);
  if (!ok || !w.commit()) return error = opts.outputPath + ": write failed: " + w.failure(), failure();
  return success();
}

} // namespace sd
