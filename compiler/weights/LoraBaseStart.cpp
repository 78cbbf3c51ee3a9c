// PiSSA, OLoRA and LoftQ starts (see LoraBaseStart.h).
#include "LoraBaseStart.h"
#include "Nf4.h"
#include "OsftSplit.h"
#include <algorithm>
#include <cmath>
#include <cstddef>

// LAPACK's Householder QR and its explicit Q, from the OpenBLAS the op
// library links (as OsftSplit's dgesdd_). The same Householder convention as
// torch.linalg.qr's, so R's diagonal has the signs PyTorch gives it.
extern "C" void dgeqrf_(const int *m, const int *n, double *a, const int *lda, double *tau, double *work,
                        const int *lwork, int *info);
extern "C" void dorgqr_(const int *m, const int *n, const int *k, double *a, const int *lda, const double *tau,
                        double *work, const int *lwork, int *info);

namespace sd {
namespace {

// W - scale B A, [out, in], with A and B as the adapter holds them (float).
std::vector<float> minusProduct(const std::vector<float> &w, const LoraBaseStart &s, int64_t out, int64_t in,
                                int64_t r, double scale) {
  std::vector<float> base(w.size());
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      double d = 0;
      for (int64_t k = 0; k < r; ++k) d += double(s.b[size_t(o * r + k)]) * double(s.a[size_t(k * in + i)]);
      base[size_t(o * in + i)] = float(double(w[size_t(o * in + i)]) - scale * d);
    }
  return base;
}

// The top r singular triplets of w, each split as sqrt(S / divisor) onto both
// sides: A = sqrt(S_r / d) V_rᵀ [r, in], B = U_r sqrt(S_r / d) [out, r].
bool splitTop(const std::vector<double> &w, int64_t out, int64_t in, int64_t r, double divisor, LoraBaseStart &s,
              std::string &error) {
  SvdFactors f;
  if (!svdSplit(w, out, in, f, error)) return false;
  s.a.assign(size_t(r * in), 0.0f);
  s.b.assign(size_t(out * r), 0.0f);
  for (int64_t k = 0; k < r; ++k) {
    double root = std::sqrt(f.s[size_t(k)] / divisor);
    for (int64_t i = 0; i < in; ++i) s.a[size_t(k * in + i)] = float(root * f.v[size_t(k * in + i)]);
    for (int64_t o = 0; o < out; ++o) s.b[size_t(o * r + k)] = float(f.u[size_t(o * f.rank + k)] * root);
  }
  return true;
}

bool qrStart(const std::vector<float> &w, int64_t out, int64_t in, int64_t r, LoraBaseStart &s, std::string &error) {
  // Row-major W [out, in] copied column-major for LAPACK.
  int m = int(out), n = int(in), k = int(std::min(out, in)), lwork = -1, info = 0;
  std::vector<double> a(static_cast<size_t>(out * in)), tau(static_cast<size_t>(k));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) a[size_t(i * out + o)] = double(w[size_t(o * in + i)]);
  double query = 0;
  dgeqrf_(&m, &n, a.data(), &m, tau.data(), &query, &lwork, &info);
  std::vector<double> work(size_t(std::max(int(query), 1)));
  lwork = int(work.size());
  if (info == 0) dgeqrf_(&m, &n, a.data(), &m, tau.data(), work.data(), &lwork, &info);
  if (info != 0) return error = "LAPACK dgeqrf failed (info " + std::to_string(info) + ")", false;
  s.a.assign(size_t(r * in), 0.0f); // R's first r rows: its upper triangle
  for (int64_t row = 0; row < r; ++row)
    for (int64_t i = row; i < in; ++i) s.a[size_t(row * in + i)] = float(a[size_t(i * out + row)]);
  lwork = -1;
  dorgqr_(&m, &k, &k, a.data(), &m, tau.data(), &query, &lwork, &info);
  work.assign(size_t(std::max(int(query), 1)), 0.0);
  lwork = int(work.size());
  if (info == 0) dorgqr_(&m, &k, &k, a.data(), &m, tau.data(), work.data(), &lwork, &info);
  if (info != 0) return error = "LAPACK dorgqr failed (info " + std::to_string(info) + ")", false;
  s.b.assign(size_t(out * r), 0.0f); // Q's first r columns
  for (int64_t o = 0; o < out; ++o)
    for (int64_t c = 0; c < r; ++c) s.b[size_t(o * r + c)] = float(a[size_t(c * out + o)]);
  return true;
}

// PEFT's loftq_init: the residual res (W at first) quantized and dequantized,
// a rank-r SVD of W minus that, then res = W - B A for the next round; the
// differences in float32, as PEFT computes them, so the codes are its own.
bool loftqStart(const std::vector<float> &w, int64_t out, int64_t in, int64_t r, int64_t rounds, LoraBaseStart &s,
                std::string &error) {
  if (w.size() % size_t(kNf4Block))
    return error = "LoftQ quantizes the weight in NF4 blocks of 64 values, and it holds " + std::to_string(w.size()),
           false;
  std::vector<float> res = w;
  for (int64_t round = 0; round < rounds; ++round) {
    std::vector<uint8_t> codes;
    std::vector<float> absmax;
    quantizeNf4(res.data(), res.size(), codes, absmax);
    s.base = dequantizeNf4(codes, absmax);
    std::vector<double> error64(w.size());
    for (size_t i = 0; i < w.size(); ++i) error64[i] = double(w[i] - s.base[i]);
    if (!splitTop(error64, out, in, r, 1.0, s, error)) return false;
    if (round + 1 < rounds) res = minusProduct(w, s, out, in, r, 1.0);
  }
  return true;
}

} // namespace

bool rewritesBaseWeight(const std::string &init) { return init == "pissa" || init == "olora" || init == "loftq"; }

bool loraBaseStart(const std::string &init, const std::vector<float> &w, int64_t out, int64_t in, int64_t r,
                   double scale, int64_t loftqIter, LoraBaseStart &start, std::string &error) {
  if (r > std::min(out, in))
    return error = init + " takes r singular directions of a [" + std::to_string(out) + "x" + std::to_string(in) +
                   "] weight, so r=" + std::to_string(r) + " must be at most " + std::to_string(std::min(out, in)),
           false;
  for (float x : w)
    if (!std::isfinite(x)) return error = "the weight holds a non-finite value", false;
  if (init == "loftq") {
    if (loftqIter < 1) return error = "loftq_iter must be at least 1, got " + std::to_string(loftqIter), false;
    return loftqStart(w, out, in, r, loftqIter, start, error);
  }
  if (init == "pissa") {
    if (!splitTop(std::vector<double>(w.begin(), w.end()), out, in, r, scale, start, error)) return false;
  } else if (init == "olora") {
    if (!qrStart(w, out, in, r, start, error)) return false;
  } else {
    return error = "unknown LoRA initialization '" + init + "'", false;
  }
  start.base = minusProduct(w, start, out, in, r, scale);
  return true;
}

} // namespace sd
