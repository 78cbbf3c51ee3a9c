// LAPACK SVD for sd-peft-osft and sdc merge (see OsftSplit.h).
#include "OsftSplit.h"
#include <cmath>
#include <cstddef>

// LAPACK's Fortran entry, from the OpenBLAS the op library links (its serial
// build; the LAPACKE wrapper would pull in the system liblapack and with it
// the threaded BLAS). The trailing argument is gfortran's hidden length of
// `jobz`.
extern "C" void dgesdd_(const char *jobz, const int *m, const int *n, double *a, const int *lda, double *s, double *u,
                        const int *ldu, double *vt, const int *ldvt, double *work, const int *lwork, int *iwork,
                        int *info, size_t jobzLength);

namespace sd {

bool svdSplit(const std::vector<double> &w, int64_t out, int64_t in, SvdFactors &f, std::string &error) {
  for (double x : w)
    if (!std::isfinite(x)) return error = "the weight holds a non-finite value", false;
  int64_t rank = std::min(out, in);
  f.out = out, f.in = in, f.rank = rank;
  f.u.assign(size_t(out * rank), 0.0);
  f.s.assign(size_t(rank), 0.0);
  f.v.assign(size_t(rank * in), 0.0);
  // Row-major W [out, in] is column-major W^T [in, out]; with W^T = U' S V'^T,
  // W = V' S U'^T, so LAPACK's VT (column-major [rank, out]) read row-major
  // is our U [out, rank], and its U (column-major [in, rank]) our V [rank, in].
  std::vector<double> a = w; // dgesdd overwrites its input
  int m = int(in), n = int(out), k = int(rank), lwork = -1, info = 0;
  std::vector<int> iwork(size_t(8 * rank));
  double query = 0;
  dgesdd_("S", &m, &n, a.data(), &m, f.s.data(), f.v.data(), &m, f.u.data(), &k, &query, &lwork, iwork.data(), &info, 1);
  if (info == 0) {
    lwork = int(query);
    std::vector<double> work(size_t(std::max(lwork, 1)));
    dgesdd_("S", &m, &n, a.data(), &m, f.s.data(), f.v.data(), &m, f.u.data(), &k, work.data(), &lwork, iwork.data(),
            &info, 1);
  }
  if (info != 0) return error = "LAPACK dgesdd failed (info " + std::to_string(info) + ")", false;
  for (int64_t j = 0; j < rank; ++j) {
    int64_t at = 0;
    for (int64_t i = 1; i < out; ++i)
      if (std::fabs(f.u[size_t(i * rank + j)]) > std::fabs(f.u[size_t(at * rank + j)])) at = i;
    if (f.u[size_t(at * rank + j)] >= 0) continue;
    for (int64_t i = 0; i < out; ++i) f.u[size_t(i * rank + j)] = -f.u[size_t(i * rank + j)];
    for (int64_t i = 0; i < in; ++i) f.v[size_t(j * in + i)] = -f.v[size_t(j * in + i)];
  }
  return true;
}

void factorSlice(const SvdFactors &f, int64_t first, int64_t count, std::vector<float> &u, std::vector<float> &s,
                 std::vector<float> &v) {
  u.resize(size_t(f.out * count));
  s.resize(size_t(count));
  v.resize(size_t(count * f.in));
  for (int64_t i = 0; i < f.out; ++i)
    for (int64_t j = 0; j < count; ++j) u[size_t(i * count + j)] = float(f.u[size_t(i * f.rank + first + j)]);
  for (int64_t j = 0; j < count; ++j) {
    s[size_t(j)] = float(f.s[size_t(first + j)]);
    for (int64_t i = 0; i < f.in; ++i) v[size_t(j * f.in + i)] = float(f.v[size_t((first + j) * f.in + i)]);
  }
}

int64_t preservedRank(double value, int64_t minDim) {
  if (value > 0 && value < 1) return int64_t(std::floor(double(minDim) * value));
  return int64_t(value);
}

} // namespace sd
