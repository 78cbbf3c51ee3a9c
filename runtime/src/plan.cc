// Plan loading and verification. Order matters: footer and CRC before the
// FlatBuffer verifier, the verifier before any field is read, and structural
// checks (indices, sizes, shape rules) before anything is decoded for use.
#include "sd/runtime/plan.h"
#include "sd/format/safetensors.h"
#include "plan_generated.h"
#include "sd/format/crc32c.h"
#include "sd/format/file_io.h"
#include "sd/format/json.h"
#include <algorithm>
#include <cstring>
#include <fcntl.h>
#include <limits>
#include <map>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace sd {

Plan::~Plan() = default;

StatusOr<std::unique_ptr<Plan>> Plan::loadFile(const std::string &path, const PlanLoadOptions &opts) {
  auto f = MappedFile::open(path);
  if (!f.isOk()) return f.status();
  std::unique_ptr<Plan> p(new Plan());
  p->file_ = std::move(f.value());
  p->bytes_ = p->file_->data;
  p->size_ = p->file_->size;
  std::string dir = ".";
  size_t slash = path.find_last_of('/');
  if (slash != std::string::npos) dir = path.substr(0, slash);
  Status s = p->parse(path, dir, opts);
  if (!s.isOk()) return s;
  return p;
}

StatusOr<std::unique_ptr<Plan>> Plan::loadBytes(const uint8_t *data, size_t size, const std::string &what,
                                                 const PlanLoadOptions &opts) {
  std::unique_ptr<Plan> p(new Plan());
  p->owned_.assign(data, data + size);
  p->bytes_ = p->owned_.data();
  p->size_ = size;
  Status s = p->parse(what, ".", opts);
  if (!s.isOk()) return s;
  return p;
}

namespace {

constexpr int64_t kMaxElements = int64_t(1) << 40;

// FlatBuffers 2.0's verifier checks a vector's length field but not that its
// 8-byte elements are aligned; a corrupt file must not make us load them.
template <typename T> bool aligned(const flatbuffers::Vector<T> *v) {
  return !v || v->size() == 0 || reinterpret_cast<uintptr_t>(v->data()) % alignof(T) == 0;
}

// Validates dims and returns the byte size, or an error.
Status checkedBytes(DType dt, const flatbuffers::Vector<int64_t> *dims, Dims &out, size_t &bytes) {
  if (!dtypeIsKnown(int32_t(dt))) return sdError("unknown dtype ", int32_t(dt));
  out.clear();
  int64_t n = 1;
  if (!aligned(dims)) return sdError("misaligned dims");
  if (dims) {
    if (dims->size() > 16) return sdError("rank ", dims->size(), " exceeds 16");
    for (int64_t d : *dims) {
      if (d < 0 || d > kMaxElements) return sdError("bad dim ", d);
      if (d && n > kMaxElements / d) return sdError("tensor too large");
      n *= d;
      out.push_back(d);
    }
  }
  bytes = size_t(n) * dtypeSize(dt);
  return Status::ok();
}

// The arena or global buffer an alias stands for (itself if it is one).
const BufferDesc &rootOf(const EntryDesc &e, const BufferDesc &b) {
  const BufferDesc *r = &b;
  while (r->kind == BufferKind::Alias) r = &e.buffers[size_t(r->offset)];
  return *r;
}

// Whether two root buffers' bytes intersect without being the same bytes.
bool overlapsInPart(const BufferDesc &x, const BufferDesc &y) {
  if (x.kind != y.kind || !x.bytes || !y.bytes) return false;
  if (x.kind == BufferKind::Global) return false; // a global is one buffer: the same or apart
  uint64_t x0 = uint64_t(x.offset), y0 = uint64_t(y.offset);
  bool same = x0 == y0 && x.bytes == y.bytes;
  return !same && x0 < y0 + y.bytes && y0 < x0 + x.bytes;
}

Status decodeAttrs(const flatbuffers::Vector<flatbuffers::Offset<fb::Attr>> *attrs, AttrMap &out) {
  if (!attrs) return Status::ok();
  for (const fb::Attr *a : *attrs) {
    std::string name = a->name()->str();
    if (!aligned(a->ints()) || !aligned(a->floats())) return sdError("attribute '", name, "' is misaligned");
    switch (a->kind()) {
    case fb::AttrKind::Int: out.setInt(name, a->i()); break;
    case fb::AttrKind::Float: out.setFloat(name, a->f()); break;
    case fb::AttrKind::String: out.setString(name, a->s() ? a->s()->str() : ""); break;
    case fb::AttrKind::Ints: out.setInts(name, a->ints() ? std::vector<int64_t>(a->ints()->begin(), a->ints()->end()) : std::vector<int64_t>{}); break;
    case fb::AttrKind::Floats: out.setFloats(name, a->floats() ? std::vector<double>(a->floats()->begin(), a->floats()->end()) : std::vector<double>{}); break;
    default: return sdError("attribute '", name, "' has unknown kind ", int(a->kind()));
    }
  }
  return Status::ok();
}

// Parses an external safetensors file and binds globals to its tensors by name.
Status bindExternalWeights(const uint8_t *data, size_t size, const std::string &what,
                           std::vector<GlobalDesc> &globals, std::vector<std::vector<uint64_t>> &alignedCopies) {
  std::map<std::string, NamedTensor> tensors;
  SD_RETURN_IF_ERROR(parseSafetensors(data, size, what, tensors, nullptr));
  for (GlobalDesc &g : globals) {
    if (g.data || g.zeroInit) continue;
    auto it = tensors.find(g.name);
    if (it == tensors.end()) return sdError(what, ": missing tensor '", g.name, "'");
    if (it->second.bytes != g.bytes)
      return sdError(what, ": tensor '", g.name, "' holds ", it->second.bytes, " bytes, plan needs ", g.bytes);
    g.data = static_cast<const uint8_t *>(it->second.data);
    // safetensors does not align tensors; kernels need element alignment.
    if (reinterpret_cast<uintptr_t>(g.data) % 8) {
      alignedCopies.emplace_back((g.bytes + 7) / 8);
      std::memcpy(alignedCopies.back().data(), g.data, g.bytes);
      g.data = reinterpret_cast<const uint8_t *>(alignedCopies.back().data());
    }
  }
  return Status::ok();
}

} // namespace

Status Plan::parse(const std::string &what, const std::string &dir, const PlanLoadOptions &opts) {
  auto bad = [&](auto &&...parts) { return sdError(what, ": ", parts...); };
  fileBytes = size_;
  if (size_ < kPlanFooterSize + 8) return bad("not a plan file (too short: ", size_, " bytes)");
  const uint8_t *footer = bytes_ + size_ - kPlanFooterSize;
  if (std::memcmp(footer + 12, kPlanFooterMagic, 4) != 0)
    return bad("not a plan file (footer magic missing; truncated?)");
  uint64_t fbSize;
  uint32_t crc;
  std::memcpy(&fbSize, footer, 8);
  std::memcpy(&crc, footer + 8, 4);
  size_t body = size_ - kPlanFooterSize;
  if (fbSize < 8 || fbSize > body) return bad("corrupt footer (flatbuffer size ", fbSize, ")");
  if (opts.verifyChecksum && crc32c(bytes_, body) != crc) return bad("checksum mismatch (file is corrupt)");
  if (!flatbuffers::BufferHasIdentifier(bytes_, fb::PlanIdentifier()))
    return bad("not a plan file (identifier is not SDPL)");
  flatbuffers::Verifier::Options vopts;
  vopts.max_depth = 32;
  vopts.max_tables = 10'000'000;
  flatbuffers::Verifier verifier(bytes_, size_t(fbSize), vopts);
  if (!fb::VerifyPlanBuffer(verifier)) return bad("plan structure is invalid");
  const fb::Plan *p = fb::GetPlan(bytes_);
  schemaMajor = p->schema_major();
  schemaMinor = p->schema_minor();
  if (schemaMajor != kPlanSchemaMajor)
    return bad("plan schema version ", schemaMajor, ".", schemaMinor, " is not supported (this sdrun reads ",
               kPlanSchemaMajor, ".x)");
  producer = p->producer() ? p->producer()->str() : "";
  config = p->config() ? p->config()->str() : "";
  if (p->source_sha256()) sourceSha256.assign(p->source_sha256()->begin(), p->source_sha256()->end());
  externalWeights = p->external_weights() ? p->external_weights()->str() : "";
  if (p->files())
    for (const fb::File *f : *p->files()) {
      if (f->name()->size() == 0) return bad("a carried file has no name");
      files.emplace_back(f->name()->str(), f->data() ? std::string(f->data()->begin(), f->data()->end()) : "");
    }

  uint64_t wOff = p->weights_offset(), wSize = p->weights_size();
  weightsBytes = wSize;
  if (wSize && (wOff < fbSize || wOff % kWeightAlignment || wOff > body || wSize > body - wOff))
    return bad("weight region [", wOff, ", +", wSize, ") lies outside the file");

  // Globals.
  if (p->globals()) {
    for (const fb::Global *g : *p->globals()) {
      GlobalDesc d;
      d.name = g->name()->str();
      d.dtype = DType(g->dtype());
      SD_RETURN_IF_ERROR(checkedBytes(d.dtype, g->dims(), d.dims, d.bytes).withContext(what + ": global '" + d.name + "': "));
      auto role = globalRoleFromByte(uint8_t(g->role()));
      if (!role) return bad("global '", d.name, "' has unknown role ", int(g->role()));
      d.role = *role;
      bool zeroInit = g->data_offset() < 0 && g->data_size() == 0 && d.bytes > 0;
      if (zeroInit && !isMutableRole(d.role)) return bad("global '", d.name, "' has no data");
      if (zeroInit) {
        d.zeroInit = true;
      } else if (g->data_offset() >= 0) {
        uint64_t off = uint64_t(g->data_offset());
        if (uint64_t(g->data_size()) != d.bytes || off > wSize || d.bytes > wSize - off)
          return bad("global '", d.name, "' data lies outside the weight region");
        if (off % kWeightAlignment) return bad("global '", d.name, "' data is not 64-byte aligned");
        d.data = bytes_ + wOff + off;
      } else if (externalWeights.empty()) {
        return bad("global '", d.name, "' has no data");
      }
      globals.push_back(std::move(d));
    }
  }
  if (!externalWeights.empty()) {
    if (externalWeights.find('/') != std::string::npos || externalWeights == ".." )
      return bad("external weights name '", externalWeights, "' must be a plain file name");
    std::string path = dir + "/" + externalWeights;
    auto ext = MappedFile::open(path);
    if (!ext.isOk()) return ext.status();
    external_ = std::move(ext.value());
    SD_RETURN_IF_ERROR(bindExternalWeights(external_->data, external_->size, path, globals, alignedCopies_));
  }

  // Entries.
  if (!p->entries() || p->entries()->size() == 0) return bad("plan has no entries");
  for (const fb::Entry *e : *p->entries()) {
    EntryDesc ed;
    ed.name = e->name()->str();
    std::string ctx = what + ": entry '" + ed.name + "': ";
    if (e->bucket())
      for (const fb::BucketDim *b : *e->bucket()) ed.bucket.emplace_back(b->name()->str(), b->value());
    ed.arenaSize = e->arena_size();
    ed.tensorBytes = e->tensor_bytes();
    ed.isBody = e->body();
    if (ed.arenaSize > (uint64_t(1) << 44)) return sdError(ctx, "arena size ", ed.arenaSize, " is implausible");
    int nbuf = e->buffers() ? int(e->buffers()->size()) : 0;
    for (int i = 0; i < nbuf; ++i) {
      const fb::Buffer *b = e->buffers()->Get(flatbuffers::uoffset_t(i));
      BufferDesc bd;
      bd.dtype = DType(b->dtype());
      SD_RETURN_IF_ERROR(checkedBytes(bd.dtype, b->dims(), bd.dims, bd.bytes)
                             .withContext(ctx + "buffer " + std::to_string(i) + ": "));
      bd.kind = BufferKind(b->kind());
      bd.offset = b->offset();
      switch (bd.kind) {
      case BufferKind::Arena:
        if (bd.offset < 0 || uint64_t(bd.offset) > ed.arenaSize || bd.bytes > ed.arenaSize - uint64_t(bd.offset))
          return sdError(ctx, "buffer ", i, " lies outside the arena");
        if (bd.offset % int64_t(kWeightAlignment)) return sdError(ctx, "buffer ", i, " is not 64-byte aligned");
        break;
      case BufferKind::Global: {
        if (bd.offset < 0 || size_t(bd.offset) >= globals.size())
          return sdError(ctx, "buffer ", i, " names global ", bd.offset, " of ", globals.size());
        const GlobalDesc &g = globals[size_t(bd.offset)];
        if (g.dtype != bd.dtype || g.dims != bd.dims)
          return sdError(ctx, "buffer ", i, " does not match global '", g.name, "'");
        break;
      }
      case BufferKind::Alias: {
        if (bd.offset < 0 || bd.offset >= i) return sdError(ctx, "buffer ", i, " aliases a later buffer");
        const BufferDesc &t = ed.buffers[size_t(bd.offset)];
        if (t.bytes != bd.bytes) return sdError(ctx, "alias buffer ", i, " differs in size from its target");
        break;
      }
      default: return sdError(ctx, "buffer ", i, " has unknown kind");
      }
      ed.buffers.push_back(std::move(bd));
    }
    auto checkBinding = [&](const fb::Binding *bnd, bool isInput) -> Status {
      int32_t idx = bnd->buffer();
      if (idx < 0 || idx >= nbuf) return sdError(ctx, "binding '", bnd->name()->str(), "' names buffer ", idx);
      if (isInput && ed.buffers[size_t(idx)].kind != BufferKind::Arena)
        return sdError(ctx, "input '", bnd->name()->str(), "' must live in the arena");
      (isInput ? ed.inputs : ed.outputs).emplace_back(bnd->name()->str(), idx);
      if (isInput) return Status::ok();
      EntryDesc::Extent ext{bnd->extent_buffer(), bnd->extent_axis()};
      if (ext.buffer != -1) {
        if (ext.buffer < 0 || ext.buffer >= nbuf)
          return sdError(ctx, "output '", bnd->name()->str(), "' counts its extent in buffer ", ext.buffer);
        const BufferDesc &count = ed.buffers[size_t(ext.buffer)];
        if (count.dtype != DType::I64 || product(count.dims) != 1)
          return sdError(ctx, "output '", bnd->name()->str(), "' counts its extent in a buffer that is not one int64");
        if (ext.axis < 0 || size_t(ext.axis) >= ed.buffers[size_t(idx)].dims.size())
          return sdError(ctx, "output '", bnd->name()->str(), "' has extent axis ", ext.axis, " out of range");
      }
      ed.outputExtents.push_back(ext);
      return Status::ok();
    };
    if (e->inputs())
      for (const fb::Binding *b : *e->inputs()) SD_RETURN_IF_ERROR(checkBinding(b, true));
    if (e->outputs())
      for (const fb::Binding *b : *e->outputs()) SD_RETURN_IF_ERROR(checkBinding(b, false));

    if (e->steps()) {
      int si = 0;
      for (const fb::Step *s : *e->steps()) {
        StepDesc sd;
        sd.op = s->op()->str();
        sd.location = s->location() ? s->location()->str() : "";
        std::string sctx = ctx + "step " + std::to_string(si++) + " (" + sd.op +
                           (sd.location.empty() ? "" : " at " + sd.location) + "): ";
        // Kernels are bound per device when a session is created; the plan
        // only needs to name ops this runtime knows, at its contract version.
        sd.schema = findSchema(sd.op);
        if (!sd.schema) return sdError(sctx, "unknown contract '", sd.op, "'");
        if (s->contract_version() != sd.schema->contractVersion)
          return sdError(sctx, "contract version ", s->contract_version(), " is not supported (runtime has ",
                         sd.schema->contractVersion, ")");
        SD_RETURN_IF_ERROR(decodeAttrs(s->attrs(), sd.attrs).withContext(sctx));
        auto readIdx = [&](const flatbuffers::Vector<int32_t> *v, std::vector<int32_t> &out, bool allowAbsent) -> Status {
          if (!v) return Status::ok();
          if (v->size() > 4096) return sdError(sctx, "too many operands");
          for (int32_t x : *v) {
            if (x < -1 || x >= nbuf || (x == -1 && !allowAbsent)) return sdError(sctx, "operand names buffer ", x);
            out.push_back(x);
          }
          return Status::ok();
        };
        SD_RETURN_IF_ERROR(readIdx(s->inputs(), sd.inputs, true));
        SD_RETURN_IF_ERROR(readIdx(s->outputs(), sd.outputs, false));
        if (sd.outputs.empty()) return sdError(sctx, "step has no outputs");
        // Re-derive output shapes from the op's shape rule: a plan whose shapes
        // disagree with the op semantics would send kernels out of bounds.
        ShapeContext sc{sd.attrs, {}, {}, {}, sd.outputs.size()};
        std::vector<TensorView> consts(sd.inputs.size());
        for (size_t k = 0; k < sd.inputs.size(); ++k) {
          TensorInfo ti;
          const TensorView *cv = nullptr;
          if (sd.inputs[k] >= 0) {
            const BufferDesc *b = &ed.buffers[size_t(sd.inputs[k])];
            ti.dtype = b->dtype;
            ti.dims = b->dims;
            b = &rootOf(ed, *b);
            if (b->kind == BufferKind::Global && globals[size_t(b->offset)].data) {
              consts[k] = TensorView{const_cast<uint8_t *>(globals[size_t(b->offset)].data), ti.dtype, ti.dims};
              cv = &consts[k];
            }
          }
          sc.inputs.push_back(ti);
          sc.constInputs.push_back(cv);
        }
        SD_RETURN_IF_ERROR(inferShapes(sd.op, sc).withContext(sctx));
        for (size_t k = 0; k < sd.outputs.size(); ++k) {
          const BufferDesc &b = ed.buffers[size_t(sd.outputs[k])];
          const TensorInfo &ti = sc.outputs[k];
          // A Loop's scan outputs and an If's results are typed by their
          // bodies (checkBodySteps).
          if ((sd.op == "Loop" || sd.op == "If") && ti.dtype == DType::Undefined && !ti.rankKnown) continue;
          bool dimsOk = ti.rankKnown ? ti.rank() == int64_t(b.dims.size()) : true;
          for (size_t d = 0; dimsOk && ti.rankKnown && d < b.dims.size(); ++d)
            dimsOk = ti.dims[d] < 0 || ti.dims[d] == b.dims[d];
          if (ti.dtype != b.dtype || !dimsOk)
            return sdError(sctx, "output ", k, " is planned as ", dtypeName(b.dtype), "[", formatDims(b.dims),
                           "] but the op yields ", dtypeName(ti.dtype), "[", formatDims(ti.dims), "]");
          const BufferDesc *root = &rootOf(ed, b);
          if (root->kind == BufferKind::Global) {
            GlobalRole r = globals[size_t(root->offset)].role;
            if (r == GlobalRole::Frozen || r == GlobalRole::Constant)
              return sdError(sctx, "writes read-only global '", globals[size_t(root->offset)].name, "'");
          }
          // A result may share an operand's memory whole (in place), never
          // in part: no kernel reads and writes overlapping bytes.
          for (size_t j = 0; j < sd.inputs.size(); ++j)
            if (sd.inputs[j] >= 0 && overlapsInPart(*root, rootOf(ed, ed.buffers[size_t(sd.inputs[j])])))
              return sdError(sctx, "output ", k, " overlaps operand ", j, " in part");
        }
        ed.steps.push_back(std::move(sd));
      }
    }
    entries.push_back(std::move(ed));
  }
  uint64_t shared = 0, end = 0;
  for (const EntryDesc &e : entries)
    if (!e.isBody) shared = std::max(shared, e.arenaSize);
  end = shared;
  for (EntryDesc &e : entries)
    if (e.isBody) e.arenaBase = end, end += (e.arenaSize + kWeightAlignment - 1) / kWeightAlignment * kWeightAlignment;
  arenaBytes_ = end;
  return checkBodySteps(what);
}

// The call graph of Loop and If steps has no cycle: entries that run no body
// are settled first, then those whose bodies are all settled (Kahn's order),
// until none is left.
Status Plan::checkNoBodyRunsItself(const std::string &what) const {
  std::vector<std::vector<size_t>> callees(entries.size());
  for (size_t ei = 0; ei < entries.size(); ++ei)
    for (const StepDesc &st : entries[ei].steps) callees[ei].insert(callees[ei].end(), st.bodies.begin(), st.bodies.end());
  std::vector<size_t> pending(entries.size());
  std::vector<std::vector<size_t>> callers(entries.size());
  for (size_t ei = 0; ei < entries.size(); ++ei)
    for (size_t c : callees[ei]) callers[c].push_back(ei), ++pending[ei];
  std::vector<size_t> ready;
  for (size_t ei = 0; ei < entries.size(); ++ei)
    if (!pending[ei]) ready.push_back(ei);
  size_t settled = 0;
  while (!ready.empty()) {
    size_t x = ready.back();
    ready.pop_back();
    ++settled;
    for (size_t c : callers[x])
      if (--pending[c] == 0) ready.push_back(c);
  }
  if (settled != entries.size()) {
    // From any unsettled entry, unsettled callees lead into a cycle: the
    // first one seen twice lies on it.
    size_t x = 0;
    while (!pending[x]) ++x;
    std::vector<bool> seen(entries.size());
    while (!seen[x]) {
      seen[x] = true;
      x = *std::find_if(callees[x].begin(), callees[x].end(), [&](size_t c) { return pending[c] > 0; });
    }
    return sdError(what, ": body entry '", entries[x].name, "' runs itself (through a Loop or If step)");
  }
  return Status::ok();
}

// Each Loop and If step against the body entries it names: they exist and
// are marked as bodies (their indices go into StepDesc::bodies), no body runs
// itself, directly or through others (it has one region of the arena), and
// the bodies match the step's types. A Loop body takes (iteration, cond, the
// step's carried and outer-scope operands) and gives (cond, the carried
// values, one slice of each scan output); an If's two bodies take their
// shares of its operands and each give all its results.
Status Plan::checkBodySteps(const std::string &what) {
  std::map<std::string, size_t> bodyIndex;
  for (size_t i = 0; i < entries.size(); ++i)
    if (entries[i].isBody && !bodyIndex.emplace(entries[i].name, i).second)
      return sdError(what, ": body entry '", entries[i].name, "' is defined twice");
  auto stepContext = [&](const EntryDesc &e, size_t si) {
    const StepDesc &st = e.steps[si];
    return what + ": entry '" + e.name + "' step " + std::to_string(si) + " (" + st.op +
           (st.location.empty() ? "" : " at " + st.location) + "): ";
  };
  for (EntryDesc &e : entries)
    for (size_t si = 0; si < e.steps.size(); ++si) {
      StepDesc &st = e.steps[si];
      if (st.op != "Loop" && st.op != "If") continue;
      for (const char *attr : st.op == "Loop" ? std::vector<const char *>{"body"}
                                              : std::vector<const char *>{"then_body", "else_body"}) {
        auto it = bodyIndex.find(st.attrs.getString(attr, ""));
        if (it == bodyIndex.end())
          return sdError(stepContext(e, si), "names no body entry '", st.attrs.getString(attr, ""), "'");
        st.bodies.push_back(it->second);
      }
    }
  SD_RETURN_IF_ERROR(checkNoBodyRunsItself(what));
  auto buffer = [](const EntryDesc &x, int32_t b) -> const BufferDesc * {
    return b >= 0 && size_t(b) < x.buffers.size() ? &x.buffers[size_t(b)] : nullptr;
  };
  auto same = [](const BufferDesc *a, DType dtype, const Dims &dims) { return a && a->dtype == dtype && a->dims == dims; };
  auto one = [&](const BufferDesc *a, DType dtype) { return a && a->dtype == dtype && product(a->dims) == 1; };
  for (const EntryDesc &e : entries) {
    for (size_t si = 0; si < e.steps.size(); ++si) {
      const StepDesc &st = e.steps[si];
      if (st.bodies.empty()) continue;
      const std::string ctx = stepContext(e, si);
      if (st.op == "If") {
        const EntryDesc *then = &entries[st.bodies[0]], *other = &entries[st.bodies[1]];
        const int64_t thenInputs = st.attrs.getInt("then_inputs", -1);
        if (thenInputs != int64_t(then->inputs.size()) ||
            st.inputs.size() != 1 + then->inputs.size() + other->inputs.size())
          return sdError(ctx, "has ", st.inputs.size(), " operands, its bodies take ", then->inputs.size(), " and ",
                         other->inputs.size(), " inputs after the condition");
        if (!one(buffer(e, st.inputs[0]), DType::Bool)) return sdError(ctx, "its condition must be one bool");
        for (size_t k = 1; k < st.inputs.size(); ++k) {
          const EntryDesc &b = k <= then->inputs.size() ? *then : *other;
          const auto &input = b.inputs[k <= then->inputs.size() ? k - 1 : k - 1 - then->inputs.size()];
          const BufferDesc *in = buffer(e, st.inputs[k]);
          if (!in || !same(buffer(b, input.second), in->dtype, in->dims))
            return sdError(ctx, "operand ", k, " does not match input '", input.first, "' of its body '", b.name, "'");
        }
        for (const EntryDesc *b : {then, other}) {
          if (b->outputs.size() != st.outputs.size())
            return sdError(ctx, "has ", st.outputs.size(), " results, its body '", b->name, "' gives ", b->outputs.size());
          for (size_t k = 0; k < st.outputs.size(); ++k) {
            const BufferDesc *out = buffer(e, st.outputs[k]), *got = buffer(*b, b->outputs[k].second);
            if (!out || !got || !same(out, got->dtype, got->dims))
              return sdError(ctx, "result ", k, " does not match output '", b->outputs[k].first, "' of its body '",
                             b->name, "'");
          }
        }
        continue;
      }
      const EntryDesc &b = entries[st.bodies[0]];
      const size_t carried = size_t(st.attrs.getInt("carried", 0));
      const int64_t trips = st.attrs.getInt("max_trips", 0);
      if (b.inputs.size() != st.inputs.size() || b.outputs.size() != 1 + st.outputs.size() || st.inputs.size() < 2 ||
          carried > st.outputs.size() || 2 + carried > st.inputs.size())
        return sdError(ctx, "has ", st.inputs.size(), " operands and ", st.outputs.size(), " results; its body takes ",
                       b.inputs.size(), " inputs and gives ", b.outputs.size(), " outputs");
      if (!one(buffer(e, st.inputs[0]), DType::I64) || !one(buffer(e, st.inputs[1]), DType::Bool) ||
          !one(buffer(b, b.inputs[0].second), DType::I64) || !one(buffer(b, b.inputs[1].second), DType::Bool) ||
          !one(buffer(b, b.outputs[0].second), DType::Bool))
        return sdError(ctx, "its trip count, iteration number and conditions must each be one int64 or one bool");
      for (size_t k = 2; k < st.inputs.size(); ++k) {
        const BufferDesc *in = buffer(e, st.inputs[k]);
        if (!in || !same(buffer(b, b.inputs[k].second), in->dtype, in->dims))
          return sdError(ctx, "operand ", k, " does not match its body's input '", b.inputs[k].first, "'");
      }
      for (size_t k = 0; k < st.outputs.size(); ++k) {
        const BufferDesc *out = buffer(e, st.outputs[k]), *slice = buffer(b, b.outputs[1 + k].second);
        if (!out || !slice) return sdError(ctx, "result ", k, " has no buffer");
        Dims want = slice->dims;
        if (k >= carried) want.insert(want.begin(), trips);
        else if (!same(buffer(e, st.inputs[2 + k]), out->dtype, out->dims))
          return sdError(ctx, "carried value ", k, " changes type");
        if (!same(out, slice->dtype, want))
          return sdError(ctx, "result ", k, " is ", dtypeName(out->dtype), "[", formatDims(out->dims), "], its body gives ",
                         dtypeName(slice->dtype), "[", formatDims(slice->dims), "]",
                         k >= carried ? " per iteration" : "");
      }
    }
  }
  return Status::ok();
}

const std::string *Plan::file(const std::string &name) const {
  for (const auto &f : files)
    if (f.first == name) return &f.second;
  return nullptr;
}

uint64_t Plan::maxArenaSize() const { return arenaBytes_; }

StatusOr<size_t> Plan::selectEntry(const std::string &name, const std::vector<Dims> &inputDims) const {
  std::string buckets;
  bool found = false;
  for (size_t i = 0; i < entries.size(); ++i) {
    const EntryDesc &e = entries[i];
    if (e.name != name) continue;
    found = true;
    bool match = e.inputs.size() == inputDims.size();
    for (size_t k = 0; match && k < inputDims.size(); ++k)
      match = e.buffers[size_t(e.inputs[k].second)].dims == inputDims[k];
    if (match) return i;
    buckets += buckets.empty() ? "" : "; ";
    for (size_t k = 0; k < e.inputs.size(); ++k)
      buckets += (k ? ", " : "") + e.inputs[k].first + "=" + formatDims(e.buffers[size_t(e.inputs[k].second)].dims);
  }
  if (!found) return sdError("plan has no entry '", name, "'");
  std::string got;
  for (size_t k = 0; k < inputDims.size(); ++k) got += (k ? ", " : "") + formatDims(inputDims[k]);
  return sdError("no '", name, "' bucket takes inputs shaped ", got, " (buckets: ", buckets, ")");
}

} // namespace sd
