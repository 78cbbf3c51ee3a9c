// The attribute map steps carry (plan attributes, decoded once at load).
#include "sd/ops/attrs.h"

namespace sd {

Attr &AttrMap::slot(const std::string &n) {
  for (auto &e : entries_)
    if (e.first == n) return e.second = Attr();
  entries_.emplace_back(n, Attr());
  return entries_.back().second;
}
void AttrMap::setInt(const std::string &n, int64_t v) {
  Attr &a = slot(n); a.kind = Attr::Kind::Int; a.i = v;
}
void AttrMap::setFloat(const std::string &n, double v) {
  Attr &a = slot(n); a.kind = Attr::Kind::Float; a.f = v;
}
void AttrMap::setString(const std::string &n, std::string v) {
  Attr &a = slot(n); a.kind = Attr::Kind::String; a.s = std::move(v);
}
void AttrMap::setInts(const std::string &n, std::vector<int64_t> v) {
  Attr &a = slot(n); a.kind = Attr::Kind::Ints; a.ints = std::move(v);
}
void AttrMap::setFloats(const std::string &n, std::vector<double> v) {
  Attr &a = slot(n); a.kind = Attr::Kind::Floats; a.floats = std::move(v);
}
const Attr *AttrMap::find(const std::string &n) const {
  for (auto &e : entries_)
    if (e.first == n) return &e.second;
  return nullptr;
}
int64_t AttrMap::getInt(const std::string &n, int64_t def) const {
  const Attr *a = find(n);
  if (!a) return def;
  return a->kind == Attr::Kind::Float ? int64_t(a->f) : a->i;
}
double AttrMap::getFloat(const std::string &n, double def) const {
  const Attr *a = find(n);
  if (!a) return def;
  return a->kind == Attr::Kind::Int ? double(a->i) : a->f;
}
std::string AttrMap::getString(const std::string &n, const std::string &def) const {
  const Attr *a = find(n);
  return a && a->kind == Attr::Kind::String ? a->s : def;
}
std::vector<int64_t> AttrMap::getInts(const std::string &n) const {
  const Attr *a = find(n);
  return a && a->kind == Attr::Kind::Ints ? a->ints : std::vector<int64_t>{};
}
std::vector<double> AttrMap::getFloats(const std::string &n) const {
  const Attr *a = find(n);
  return a && a->kind == Attr::Kind::Floats ? a->floats : std::vector<double>{};
}

} // namespace sd
