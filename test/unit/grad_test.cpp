// Gradient checks: for every differentiable op, the gradient the compiled
// accumulate entry writes into grad/<w> matches central finite differences
// of the eval_step loss, L = sum(y * y) with y = op(...). Float32 with
// eps = 1e-2 and tolerance |analytic - numeric| <= 2e-3 + 2e-2 |numeric|.
#include "Driver.h"
#include "sd/runtime/plan.h"
#include "sd/runtime/session.h"
#include "temp_dir.h"
#include <cmath>
#include <cstring>
#include <fstream>
#include <gtest/gtest.h>
#include <random>
#include <unistd.h>

using namespace sd;

namespace {

struct Init {
  std::string name, dims; // "2, 3"
  int count;
  bool positive = false;
};

struct Case {
  std::string name;
  std::vector<Init> inits; // names starting with 'w' are trainable
  std::string body;        // defines y from x (float[2, 3]) and the initializers
  int opset = 17;
};

std::string initializerText(const Init &in, std::mt19937 &rng) {
  std::uniform_real_distribution<float> d(in.positive ? 0.5f : -1.0f, in.positive ? 1.5f : 1.0f);
  std::string s = "float[" + in.dims + "] " + in.name + " = {";
  for (int i = 0; i < in.count; ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.5f", i ? ", " : "", d(rng));
    s += buf;
  }
  return s + "}";
}

class GradCheck : public ::testing::TestWithParam<Case> {};

float lossOf(Session &s, int64_t eval, const HostTensor &x) {
  std::vector<HostTensor> outs;
  Status st = s.run(size_t(eval), {&x}, outs);
  EXPECT_TRUE(st.isOk()) << st.message();
  float v;
  std::memcpy(&v, outs.at(0).data.data(), 4);
  return v;
}

TEST_P(GradCheck, MatchesFiniteDifferences) {
  const Case &c = GetParam();
  std::mt19937 rng(42);
  std::string inits;
  for (const Init &in : c.inits) inits += (inits.empty() ? "" : ", ") + initializerText(in, rng);
  std::string text = "<ir_version: 8, opset_import: [\"\" : " + std::to_string(c.opset) +
                     "]>\ng (float[2, 3] x) => (float loss)\n<" + inits +
                     ">\n{\n" + c.body + "\n  sq = Mul(y, y)\n  loss = ReduceSum <keepdims = 0> (sq)\n}\n";
  TempDir tmp("sd_grad_test");
  const std::string &dir = tmp.path();
  std::ofstream(dir + "/m.onnxtxt") << text;
  CompileRequest req;
  req.model = dir + "/m.onnxtxt";
  req.output = dir + "/m.sdp";
  req.pipeline.peft = "none";
  req.pipeline.trainable = "w.*";
  req.pipeline.lossOutput = "loss";
  std::string err;
  ASSERT_TRUE(compileModel(req, err)) << err << "\n" << text;
  auto plan = Plan::loadFile(req.output);
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  std::shared_ptr<const Plan> p(std::move(plan.value()));
  SessionOptions so;
  so.threads = 1;
  auto session = Session::create(p, so);
  ASSERT_TRUE(session.isOk());
  Session &s = *session.value();
  int64_t acc = s.findEntry("accumulate"), eval = s.findEntry("eval_step");
  ASSERT_GE(acc, 0);
  ASSERT_GE(eval, 0);
  HostTensor x{"x", DType::F32, {2, 3}, std::vector<uint8_t>(24)};
  float xv[6] = {0.3f, -0.7f, 1.1f, 0.9f, -0.2f, 0.5f};
  std::memcpy(x.data.data(), xv, 24);
  std::vector<HostTensor> outs;
  ASSERT_TRUE(s.run(size_t(acc), {&x}, outs).isOk());
  int checked = 0;
  for (const Init &in : c.inits) {
    if (in.name[0] != 'w') continue;
    int64_t wi = s.findGlobal(in.name), gi = s.findGlobal("grad/" + in.name);
    ASSERT_GE(wi, 0);
    ASSERT_GE(gi, 0) << "no gradient global for " << in.name;
    auto wt = s.readGlobal(size_t(wi)), gt = s.readGlobal(size_t(gi));
    ASSERT_TRUE(wt.isOk() && gt.isOk());
    float *w = reinterpret_cast<float *>(wt.value().data.data());
    const float *g = reinterpret_cast<const float *>(gt.value().data.data());
    for (int k = 0; k < in.count; ++k) {
      const float eps = 1e-2f, saved = w[k];
      auto setW = [&](float v) {
        w[k] = v;
        ASSERT_TRUE(s.writeGlobal(size_t(wi), w, wt.value().byteSize()).isOk());
      };
      setW(saved + eps);
      float up = lossOf(s, eval, x);
      setW(saved - eps);
      float down = lossOf(s, eval, x);
      setW(saved);
      float numeric = (up - down) / (2 * eps);
      EXPECT_NEAR(g[k], numeric, 2e-3 + 2e-2 * std::fabs(numeric)) << c.name << ": d loss / d " << in.name << "[" << k << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
  unlink(req.output.c_str());
  unlink(req.model.c_str());
  rmdir(dir.c_str());
}

const Init W23{"w", "2, 3", 6}, Wpos{"w", "2, 3", 6, true}, W3{"w", "3", 3}, W34{"w", "3, 4", 12};

INSTANTIATE_TEST_SUITE_P(
    Ops, GradCheck,
    ::testing::Values(
        Case{"AddBroadcast", {W3}, "  y = Add(x, w)"}, Case{"SubBroadcast", {W3}, "  y = Sub(x, w)"},
        Case{"SubRhs", {W23}, "  y = Sub(x, w)"}, Case{"MulBroadcast", {W3}, "  y = Mul(x, w)"},
        Case{"DivBoth", {Wpos, {"w2", "3", 3, true}}, "  y = Div(w, w2)"}, Case{"Neg", {W23}, "  y = Neg(w)"},
        Case{"Exp", {W23}, "  y = Exp(w)"}, Case{"Log", {Wpos}, "  y = Log(w)"}, Case{"Sqrt", {Wpos}, "  y = Sqrt(w)"},
        Case{"Reciprocal", {Wpos}, "  y = Reciprocal(w)"}, Case{"Tanh", {W23}, "  y = Tanh(w)"},
        Case{"Sigmoid", {W23}, "  y = Sigmoid(w)"}, Case{"Erf", {W23}, "  y = Erf(w)"},
        Case{"Relu", {W23}, "  y = Relu(w)"}, Case{"GeluExact", {W23}, "  y = Gelu(w)"},
        // Both bounds cut some of w (F.normalize's clamp of the norm is a Clip).
        Case{"Clip", {W23}, "  lo = Constant <value = float {-0.3}> ()\n  hi = Constant <value = float {0.4}> ()\n"
                            "  y = Clip(w, lo, hi)"},
        Case{"ClipMinOnly", {W23}, "  lo = Constant <value = float {0.1}> ()\n  y = Clip(w, lo)"},
        // Trained bounds (a learned clipping threshold): each gets dy where it won.
        Case{"ClipTrainedBounds", {W23, {"wl", "3", 3}, {"wh", "2", 2}},
             "  l = ReduceMean <keepdims = 0> (wl)\n  m = ReduceMean <keepdims = 0> (wh)\n"
             "  s = Constant <value = float {0.8}> ()\n  h = Add(m, s)\n  y = Clip(w, l, h)"},
        // Every second element (an interleaved rotary's x[..., 1::2]), and every third from 0.
        Case{"SliceStep2", {{"w", "2, 6", 12}},
             "  st = Constant <value = int64[1] {1}> ()\n  en = Constant <value = int64[1] {6}> ()\n"
             "  ax = Constant <value = int64[1] {1}> ()\n  sp = Constant <value = int64[1] {2}> ()\n"
             "  s = Slice(w, st, en, ax, sp)\n  y = Mul(s, x)"},
        Case{"SliceStep3", {{"w", "2, 8", 16}},
             "  st = Constant <value = int64[1] {0}> ()\n  en = Constant <value = int64[1] {9}> ()\n"
             "  ax = Constant <value = int64[1] {1}> ()\n  sp = Constant <value = int64[1] {3}> ()\n"
             "  s = Slice(w, st, en, ax, sp)\n  y = Mul(s, x)"},
        // F.normalize's norm.
        Case{"ReduceL2", {W23}, "  a = Constant <value = int64[1] {1}> ()\n  n = ReduceL2 <keepdims = 1> (w, a)\n"
                                "  y = Div(w, n)"},
        Case{"GeluTanh", {W23}, "  y = Gelu <approximate = \"tanh\"> (w)"},
        // GPT-2's gelu_new written out, fused by sd-fuse-gelu into the tanh Gelu.
        Case{"GeluTanhFused", {W23},
             "  three = Constant <value = float {3.}> ()\n  k = Constant <value = float {0.044715}> ()\n"
             "  c = Constant <value = float {0.7978845608}> ()\n  one = Constant <value = float {1.}> ()\n"
             "  half = Constant <value = float {0.5}> ()\n  h = Mul(half, w)\n  p = Pow(w, three)\n"
             "  kp = Mul(k, p)\n  s = Add(w, kp)\n  cs = Mul(c, s)\n  t = Tanh(cs)\n  a = Add(one, t)\n"
             "  y = Mul(h, a)"},
        Case{"PowConst", {Wpos}, "  c = Constant <value = float {2.5}> ()\n  y = Pow(w, c)"},
        Case{"Where", {W23}, "  z = Constant <value = float {0.}> ()\n  m = Greater(x, z)\n  y = Where(m, w, x)"},
        Case{"Sum", {W23, {"w2", "3", 3}}, "  y = Sum(w, w2, x)"},
        Case{"MatMulBatched", {{"w", "2, 3, 2", 12}}, "  y = MatMul(x, w)"},
        Case{"MatMulBoth", {{"w", "3, 2", 6}, {"w2", "2, 3", 6}}, "  y = MatMul(w2, w)"},
        Case{"LinearOi", {{"w", "4, 3", 12}, {"wb", "4", 4}},
             "  t = Transpose <perm = [1, 0]> (w)\n  h = MatMul(x, t)\n  y = Add(h, wb)"},
        Case{"LinearIoInputGrad", {W34, {"w2", "2, 3", 6}}, "  a = Mul(x, w2)\n  y = MatMul(a, w)"},
        // A batched A times a 2-D B: both gradients as GEMMs over the flattened batch.
        Case{"MatMulSharedRhs", {W34, {"w2", "2, 3", 6}},
             "  a = Mul(x, w2)\n  s = Constant <value = int64[3] {2, 2, 3}> ()\n  e = Expand(a, s)\n"
             "  y = MatMul(e, w)"},
        Case{"GemmTrans", {{"w", "4, 3", 12}, {"wa", "3, 2", 6}, {"wc", "4", 4}},
             "  y = Gemm <alpha = 0.5, beta = 2.0, transA = 1, transB = 1> (wa, w, wc)"},
        Case{"Softmax", {W23}, "  y = Softmax <axis = -1> (w)"},
        Case{"LogSoftmax", {W23}, "  y = LogSoftmax <axis = 0> (w)"},
        Case{"LayerNorm", {W23, {"ws", "3", 3}, {"wb", "3", 3}},
             "  y = LayerNormalization <axis = -1, epsilon = 0.001> (w, ws, wb)"},
        // LlamaRMSNorm's export, fused into one RMSNormalization by sd-fuse-rmsnorm.
        Case{"RMSNormFused", {W23, {"ws", "3", 3}},
             "  two = Constant <value = float {2.}> ()\n  eps = Constant <value = float {0.001}> ()\n"
             "  one = Constant <value = float {1.}> ()\n  p = Pow(w, two)\n"
             "  m = ReduceMean <axes = [-1], keepdims = 1> (p)\n  a = Add(m, eps)\n  s = Sqrt(a)\n"
             "  r = Div(one, s)\n  n = Mul(w, r)\n  y = Mul(ws, n)"},
        // Hugging Face's apply_rotary_pos_emb, fused into one Rotary by
        // sd-fuse-rotary; its gradient is the transposed rotation. k breaks
        // the loss's invariance under rotations.
        Case{"RotaryFused", {{"w", "1, 2, 3, 4", 24}, {"k", "1, 2, 3, 4", 24}},
             "  cs = Constant <value = float[1, 1, 3, 4] {1., 0.9, 1., 0.9, 0.5, 0.2, 0.5, 0.2, -0.4, 0.7, -0.4, 0.7}> ()\n"
             "  sn = Constant <value = float[1, 1, 3, 4] {0., 0.4, 0., 0.4, 0.8, 0.9, 0.8, 0.9, 0.9, -0.7, 0.9, -0.7}> ()\n"
             "  ax = Constant <value = int64[1] {3}> ()\n  z = Constant <value = int64[1] {0}> ()\n"
             "  h = Constant <value = int64[1] {2}> ()\n  e = Constant <value = int64[1] {4}> ()\n"
             "  lo = Slice(w, z, h, ax)\n  hi = Slice(w, h, e, ax)\n  n = Neg(hi)\n"
             "  rh = Concat <axis = -1> (n, lo)\n  a = Mul(w, cs)\n  b = Mul(rh, sn)\n  r = Add(a, b)\n"
             "  y = Mul(r, k)"},
        // Cohere's interleaved rotation, stack([-w[..., 1::2], w[..., ::2]], -1).flatten(-2),
        // fused into one interleaved Rotary; the angles differ within each pair
        // here, which the fused kernel must follow as the graph does.
        Case{"RotaryInterleavedFused", {{"w", "1, 2, 3, 4", 24}, {"k", "1, 2, 3, 4", 24}},
             "  cs = Constant <value = float[1, 1, 3, 4] {1., 0.9, 0.3, 0.6, 0.5, 0.2, 0.1, 0.7, -0.4, 0.7, 0.8, -0.2}> ()\n"
             "  sn = Constant <value = float[1, 1, 3, 4] {0., 0.4, 0.2, 0.9, 0.8, 0.9, -0.3, 0.5, 0.9, -0.7, 0.6, 0.4}> ()\n"
             "  ax = Constant <value = int64[1] {3}> ()\n  z = Constant <value = int64[1] {0}> ()\n"
             "  o = Constant <value = int64[1] {1}> ()\n  t = Constant <value = int64[1] {2}> ()\n"
             "  e = Constant <value = int64[1] {9223372036854775807}> ()\n  l = Constant <value = int64[1] {-1}> ()\n"
             "  shp = Constant <value = int64[4] {1, 2, 3, 4}> ()\n"
             "  ev = Slice(w, z, e, ax, t)\n  od = Slice(w, o, e, ax, t)\n  n = Neg(od)\n"
             "  un = Unsqueeze(n, l)\n  ue = Unsqueeze(ev, l)\n  st = Concat <axis = -1> (un, ue)\n"
             "  rh = Reshape(st, shp)\n  a = Mul(w, cs)\n  b = Mul(rh, sn)\n  r = Add(a, b)\n  y = Mul(r, k)"},
        // LlamaMLP's silu(gate) * up, fused into one SwiGLU by sd-fuse-swiglu.
        Case{"SwiGLUFused", {W23, {"wu", "2, 3", 6}},
             "  g = Mul(w, x)\n  s = Sigmoid(g)\n  a = Mul(g, s)\n  y = Mul(a, wu)"},
        Case{"Gather", {{"w", "4, 3", 12}},
             "  i = Constant <value = int64[3] {2, 0, 2}> ()\n  y = Gather <axis = 0> (w, i)"},
        Case{"GatherAxis1", {{"w", "3, 4", 12}},
             "  i = Constant <value = int64[2] {3, 3}> ()\n  y = Gather <axis = 1> (w, i)"},
        Case{"ReshapeTranspose", {W23},
             "  s = Constant <value = int64[2] {3, 2}> ()\n  r = Reshape(w, s)\n  t = Transpose(r)\n  y = Mul(t, x)"},
        Case{"FlattenUnsqueezeSqueeze", {W23},
             "  a = Constant <value = int64[1] {0}> ()\n  u = Unsqueeze(w, a)\n  q = Squeeze(u, a)\n"
             "  f = Flatten <axis = 0> (q)\n  y = Exp(f)"},
        Case{"SplitConcat", {W23},
             "  p1, p2 = Split <axis = 1, num_outputs = 2> (w)\n  e = Exp(p2)\n  y = Concat <axis = 1> (e, p1, p1)"},
        // rotate_half in rotary embeddings: torch.cat((-x2, x1), dim=-1).
        Case{"ConcatNegativeAxis", {W23},
             "  p1, p2 = Split <axis = -1, num_outputs = 2> (w)\n  n = Neg(p2)\n  c = Concat <axis = -1> (n, p1)\n"
             "  y = Mul(c, x)"},
        Case{"SplitUnusedPiece", {W23},
             "  sz = Constant <value = int64[2] {1, 2}> ()\n  p1, p2 = Split <axis = 1> (w, sz)\n  y = Exp(p2)"},
        Case{"Slice", {W23},
             "  s = Constant <value = int64[1] {1}> ()\n  e = Constant <value = int64[1] {3}> ()\n"
             "  a = Constant <value = int64[1] {1}> ()\n  y = Slice(w, s, e, a)"},
        Case{"Expand", {W3}, "  s = Constant <value = int64[2] {2, 3}> ()\n  y = Expand(w, s)"},
        Case{"ReduceSum", {W23}, "  a = Constant <value = int64[1] {1}> ()\n  r = ReduceSum <keepdims = 1> (w, a)\n"
                                 "  y = Mul(r, x)"},
        Case{"ReduceMean", {W23}, "  a = Constant <value = int64[1] {0}> ()\n  y = ReduceMean <keepdims = 0> (w, a)"},
        Case{"SoftmaxCrossEntropy", {W23},
             "  l = Constant <value = int64[2] {2, 0}> ()\n  y = SoftmaxCrossEntropyLoss <reduction = \"mean\"> (w, l)"},
        Case{"SoftmaxCrossEntropyIgnore", {{"w", "3, 4", 12}},
             "  l = Constant <value = int64[3] {1, -100, 3}> ()\n"
             "  y = SoftmaxCrossEntropyLoss <reduction = \"sum\", ignore_index = -100> (w, l)"},
        // Conv: a stride that skips the last input row (output_padding in the
        // input gradient), groups with dilation, SAME padding, and 1-D.
        Case{"ConvStridePadBias", {{"w", "1, 2, 6, 5", 60}, {"wk", "3, 2, 3, 3", 54}, {"wb", "3", 3}},
             "  y = Conv <strides = [2, 2], pads = [1, 1, 1, 1]> (w, wk, wb)"},
        Case{"ConvGroupDilation", {{"w", "2, 4, 5, 5", 200}, {"wk", "4, 2, 2, 2", 32}},
             "  y = Conv <group = 2, dilations = [2, 2]> (w, wk)"},
        Case{"ConvSameUpper", {{"w", "1, 1, 4, 4", 16}, {"wk", "2, 1, 2, 3", 12}},
             "  y = Conv <auto_pad = \"SAME_UPPER\", strides = [2, 1]> (w, wk)"},
        Case{"Conv1d", {{"w", "2, 2, 7", 28}, {"wk", "3, 2, 3", 18}}, "  y = Conv <strides = [2], pads = [2, 0]> (w, wk)"},
        Case{"MaxPool", {{"w", "1, 2, 5, 5", 50}},
             "  y = MaxPool <kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]> (w)"},
        Case{"AveragePoolIncludePadCeil", {{"w", "1, 2, 5, 4", 40}},
             "  y = AveragePool <kernel_shape = [2, 3], strides = [2, 2], pads = [1, 0, 0, 1], count_include_pad = 1, "
             "ceil_mode = 1> (w)"},
        Case{"AveragePoolExcludePad", {{"w", "1, 1, 4, 4", 16}},
             "  y = AveragePool <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (w)"},
        Case{"GlobalPools", {{"w", "2, 3, 2, 2", 24}},
             "  a = GlobalAveragePool(w)\n  b = GlobalMaxPool(w)\n  y = Add(a, b)"},
        // Decomposed attention, fused by sd-fuse-attention into one kernel
        // forward and backward (test/lit/transforms/fuse_attention.mlir).
        Case{"AttentionMaskedScaled", {{"wq", "2, 3, 4", 24}, {"wk", "2, 4, 5", 40}, {"wv", "2, 5, 2", 20}},
             "  s = MatMul(wq, wk)\n  c = Constant <value = float {0.5}> ()\n  t = Mul(s, c)\n"
             "  mk = Constant <value = int64[3, 5] {0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0}> ()\n"
             "  zero = Constant <value = int64 {1}> ()\n  m = Equal(mk, zero)\n"
             "  fill = Constant <value = float {-1e9}> ()\n  u = Where(m, fill, t)\n"
             "  p = Softmax <axis = -1> (u)\n  y = MatMul(p, wv)"},
        Case{"AttentionDivScale", {{"wq", "1, 2, 4, 3", 24}, {"wk", "1, 2, 3, 4", 24}, {"wv", "1, 2, 4, 3", 24}},
             "  s = MatMul(wq, wk)\n  c = Constant <value = float {1.7}> ()\n  t = Div(s, c)\n"
             "  p = Softmax <axis = 3> (t)\n  y = MatMul(p, wv)"},
        // Hugging Face's orientation: Where(keep, scores, fill).
        Case{"AttentionKeepMask", {{"wq", "2, 3, 4", 24}, {"wk", "2, 4, 3", 24}, {"wv", "2, 3, 2", 12}},
             "  s = MatMul(wq, wk)\n  mk = Constant <value = int64[3, 3] {1, 0, 0, 1, 1, 0, 1, 1, 1}> ()\n"
             "  one = Constant <value = int64 {1}> ()\n  keep = Equal(mk, one)\n"
             "  fill = Constant <value = float {-3.4e38}> ()\n  u = Where(keep, s, fill)\n"
             "  p = Softmax <axis = -1> (u)\n  y = MatMul(p, wv)"},
        // A causal mask over 40 queries: the kernels work in blocks of 32 rows
        // whose keys end at the block's last row (the masked triangle is skipped).
        Case{"AttentionCausalBlocks", {{"wq", "1, 40, 2", 80}, {"wk", "1, 2, 40", 80}, {"wv", "1, 40, 2", 80}},
             "  s = MatMul(wq, wk)\n  c = Constant <value = float {0.5}> ()\n  t = Mul(s, c)\n"
             "  zero = Constant <value = int64 {0}> ()\n  n = Constant <value = int64 {40}> ()\n"
             "  one = Constant <value = int64 {1}> ()\n  idx = Range(zero, n, one)\n"
             "  ax = Constant <value = int64[1] {1}> ()\n  rows = Unsqueeze(idx, ax)\n  m = Greater(idx, rows)\n"
             "  fill = Constant <value = float {-1e9}> ()\n  u = Where(m, fill, t)\n"
             "  p = Softmax <axis = -1> (u)\n  y = MatMul(p, wv)"},
        // Keys shared across the batch: fused forward, unfused gradient.
        Case{"AttentionSharedKeys", {{"wq", "2, 3, 4", 24}, {"wk", "1, 4, 5", 20}, {"wv", "2, 5, 2", 20}},
             "  s = MatMul(wq, wk)\n  p = Softmax <axis = -1> (s)\n  y = MatMul(p, wv)"},
        // Activations and elementwise ops users train through (ActivationVJP.cpp).
        Case{"Abs", {W23}, "  y = Abs(w)"},
        Case{"LeakyRelu", {W23}, "  y = LeakyRelu <alpha = 0.2> (w)"},
        Case{"Elu", {W23}, "  y = Elu <alpha = 0.7> (w)"},
        Case{"Selu", {W23}, "  y = Selu(w)"},
        Case{"Celu", {W23}, "  y = Celu <alpha = 2.0> (w)"},
        Case{"ThresholdedRelu", {W23}, "  y = ThresholdedRelu <alpha = 0.3> (w)"},
        Case{"Softplus", {W23}, "  y = Softplus(w)"},
        Case{"Softsign", {W23}, "  y = Softsign(w)"},
        // Scaled so both sides of the kinks (+-1 here, +-3 for HardSwish) are hit, none
        // within the finite difference of one (w = -0.25, 0.59, 0.90, -0.63, 0.46, 0.56).
        Case{"HardSigmoid", {W23}, "  c = Constant <value = float {3.}> ()\n  a = Mul(w, c)\n"
                                   "  y = HardSigmoid <alpha = 0.5, beta = 0.5> (a)"},
        Case{"HardSwish", {W23}, "  c = Constant <value = float {6.}> ()\n  a = Mul(w, c)\n  y = HardSwish(a)"},
        Case{"Mish", {W23}, "  y = Mish(w)"},
        Case{"SinCos", {W23, {"w2", "2, 3", 6}}, "  s = Sin(w)\n  c = Cos(w2)\n  y = Add(s, c)"},
        Case{"PRelu", {W23, {"w2", "3", 3}}, "  y = PRelu(w, w2)"},
        Case{"FloorPlusIdentity", {W23}, "  c = Constant <value = float {3.}> ()\n  a = Mul(w, c)\n"
                                         "  f = Floor(a)\n  y = Add(f, w)"},
        Case{"MaxMin", {W23, {"w2", "3", 3}}, "  m = Max(w, w2, x)\n  n = Min(w, x)\n  y = Add(m, n)"},
        Case{"Mean", {W23, {"w2", "3", 3}}, "  y = Mean(w, w2, x)"},
        // Reductions (ReductionVJP.cpp).
        Case{"ReduceMaxMin", {W23}, "  a = Constant <value = int64[1] {1}> ()\n  m = ReduceMax <keepdims = 1> (w, a)\n"
                                    "  n = ReduceMin <keepdims = 0> (w)\n  s = Add(m, n)\n  y = Mul(s, x)"},
        Case{"ReduceSumSquareL1", {W23}, "  a = Constant <value = int64[1] {0}> ()\n"
                                         "  q = ReduceSumSquare <keepdims = 0> (w, a)\n  l = ReduceL1 <keepdims = 0> (w, a)\n"
                                         "  y = Mul(q, l)"},
        Case{"ReduceLogSumExp", {W23}, "  a = Constant <value = int64[1] {1}> ()\n"
                                       "  r = ReduceLogSumExp <keepdims = 1> (w, a)\n  y = Mul(r, x)"},
        Case{"CumSum", {W23}, "  a = Constant <value = int64 {1}> ()\n  c = CumSum(w, a)\n"
                              "  r = CumSum <exclusive = 1, reverse = 1> (w, a)\n  s = Add(c, r)\n  y = Mul(s, x)"},
        // Movement (MovementVJP.cpp).
        Case{"GatherElementsRepeated", {W23},
             "  i = Constant <value = int64[2, 4] {2, 0, 2, -1, 1, 1, 0, 1}> ()\n  y = GatherElements <axis = 1> (w, i)"},
        Case{"Tile", {W23}, "  r = Constant <value = int64[2] {2, 3}> ()\n  y = Tile(w, r)"},
        Case{"PadConstant", {W23}, "  p = Constant <value = int64[4] {1, 0, 0, 2}> ()\n"
                                   "  v = Constant <value = float {0.5}> ()\n  y = Pad(w, p, v)"},
        // ConvTranspose (ConvVJP.cpp): strided with asymmetric pads and output_padding, and grouped.
        Case{"ConvTransposeStridePad", {{"w", "1, 2, 3, 3", 18}, {"wk", "2, 3, 2, 3", 36}, {"wb", "3", 3}},
             "  y = ConvTranspose <strides = [2, 2], pads = [1, 0, 0, 1], output_padding = [1, 0]> (w, wk, wb)"},
        Case{"ConvTransposeGroup", {{"w", "2, 4, 3", 24}, {"wk", "4, 1, 3", 12}},
             "  y = ConvTranspose <group = 2, dilations = [2]> (w, wk)"},
        // InstanceNormalization, as PyTorch's GroupNorm and InstanceNorm export (NormalizationVJP.cpp).
        Case{"InstanceNorm", {{"w", "2, 3, 2, 2", 24}, {"ws", "3", 3}, {"wb", "3", 3}},
             "  y = InstanceNormalization <epsilon = 0.01> (w, ws, wb)"},
        // Losses built from graph ops (LossVJP.cpp): class weights, reduction none, ignore_index, extra dims.
        Case{"NllWeightedIgnore", {{"w", "3, 3", 9}},
             "  t = Constant <value = int64[3] {2, 0, 1}> ()\n  cw = Constant <value = float[3] {0.5, 2., 1.5}> ()\n"
             "  y = NegativeLogLikelihoodLoss <reduction = \"mean\", ignore_index = 0> (w, t, cw)"},
        Case{"NllSumExtraDims", {{"w", "2, 3, 2", 12}},
             "  t = Constant <value = int64[2, 2] {2, 0, 1, 1}> ()\n"
             "  y = NegativeLogLikelihoodLoss <reduction = \"sum\"> (w, t)"},
        Case{"SoftmaxCrossEntropyWeighted", {{"w", "3, 4", 12}},
             "  t = Constant <value = int64[3] {3, 0, 1}> ()\n  cw = Constant <value = float[4] {0.5, 2., 1.5, 1.}> ()\n"
             "  y = SoftmaxCrossEntropyLoss(w, t, cw)"},
        Case{"SoftmaxCrossEntropyNone", {{"w", "3, 4", 12}},
             "  t = Constant <value = int64[3] {3, -1, 1}> ()\n"
             "  y = SoftmaxCrossEntropyLoss <reduction = \"none\", ignore_index = -1> (w, t)"},
        // Resize (F.interpolate) through ResizeGrad, the interpolation's adjoint.
        Case{"ResizeBilinearUp", {{"w", "1, 2, 3, 4", 24}},
             "  s = Constant <value = float[4] {1., 1., 2., 1.5}> ()\n"
             "  y = Resize <mode = \"linear\"> (w, , s)"},
        Case{"ResizeLinearSizesAlignCorners", {{"w", "1, 1, 5, 4", 20}},
             "  z = Constant <value = int64[4] {1, 1, 3, 3}> ()\n"
             "  y = Resize <mode = \"linear\", coordinate_transformation_mode = \"align_corners\"> (w, , , z)"},
        Case{"ResizeCubicAntialias", {{"w", "1, 1, 6, 5", 30}},
             "  s = Constant <value = float[4] {1., 1., 0.5, 0.6}> ()\n"
             "  y = Resize <mode = \"cubic\", antialias = 1> (w, , s)"},
        // Eval-mode BatchNorm: the statistics (m, v) are frozen.
        Case{"BatchNorm", {{"w", "2, 3, 2, 2", 24}, {"ws", "3", 3}, {"wb", "3", 3}, {"m", "3", 3}, {"v", "3", 3, true}},
             "  y = BatchNormalization <epsilon = 0.01> (w, ws, wb, m, v)"},
        // Einsum: a product, a label only one operand has (broadcast back), a
        // size-1 ellipsis dim broadcast against x's 2, the implicit output,
        // three operands.
        Case{"EinsumProduct", {W23, {"w2", "3, 4", 12}}, "  y = Einsum <equation = \"ij,jk->ik\"> (w, w2)"},
        Case{"EinsumSummedLabel", {W23, {"w2", "3, 4", 12}}, "  y = Einsum <equation = \"ij,jk->k\"> (w, w2)"},
        Case{"EinsumEllipsisBroadcast", {{"w", "1, 3", 3}}, "  y = Einsum <equation = \"...j,...j->...\"> (w, x)"},
        Case{"EinsumImplicitThree", {W23, {"w2", "3, 4", 12}, {"w3", "4", 4}},
             "  y = Einsum <equation = \"ij, jk ,k\"> (w, w2, w3)"},
        // Diagonals: a label repeated in one operand.
        Case{"EinsumDiagonal", {{"w", "3, 3", 9}}, "  y = Einsum <equation = \"ii->i\"> (w)"},
        Case{"EinsumTrace", {{"w", "3, 3", 9}}, "  y = Einsum <equation = \"ii\"> (w)"},
        Case{"EinsumBatchedDiagonalTimes", {{"w", "2, 3, 3", 18}, {"w2", "2, 3", 6}},
             "  y = Einsum <equation = \"bii,bi->bi\"> (w, w2)"},
        Case{"EinsumTripleRepeat", {{"w", "2, 2, 3, 2", 24}}, "  y = Einsum <equation = \"iiji->ji\"> (w)"},
        Case{"TopK", {{"w", "2, 4", 8}}, "  k = Constant <value = int64[1] {2}> ()\n  y, i = TopK <axis = 1> (w, k)"},
        Case{"TopKSmallest", {{"w", "4, 2", 8}},
             "  k = Constant <value = int64[1] {3}> ()\n  y, i = TopK <axis = 0, largest = 0> (w, k)"},
        Case{"Trilu", {{"w", "3, 4", 12}}, "  k = Constant <value = int64 {1}> ()\n  y = Trilu <upper = 0> (w, k)"},
        Case{"TriluUpper", {{"w", "2, 3, 3", 18}}, "  y = Trilu (w)"},
        // Pixel shuffles: scaled by a ramp, so a wrong permutation shows.
        Case{"DepthToSpaceDCR", {{"w", "1, 8, 1, 2", 16}},
             "  d = DepthToSpace <blocksize = 2> (w)\n  y = Mul(d, d)"},
        Case{"DepthToSpaceCRD", {{"w", "1, 8, 1, 2", 16}},
             "  d = DepthToSpace <blocksize = 2, mode = \"CRD\"> (w)\n  y = Mul(d, d)"},
        Case{"SpaceToDepth", {{"w", "1, 2, 2, 4", 16}}, "  d = SpaceToDepth <blocksize = 2> (w)\n  y = Mul(d, d)"},
        // Pad in every mode: reflect, edge, wrap (opset 19), and a crop.
        Case{"PadReflect", {{"w", "3, 5", 15}},
             "  p = Constant <value = int64[4] {1, 2, 2, 4}> ()\n  y = Pad <mode = \"reflect\"> (w, p)"},
        Case{"PadEdge", {{"w", "3, 2", 6}},
             "  p = Constant <value = int64[4] {2, 1, 1, 3}> ()\n  y = Pad <mode = \"edge\"> (w, p)"},
        Case{"PadWrap", {{"w", "2, 4", 8}},
             "  p = Constant <value = int64[4] {1, 3, 2, 4}> ()\n  y = Pad <mode = \"wrap\"> (w, p)", 19},
        Case{"PadCrop", {{"w", "3, 4", 12}},
             "  p = Constant <value = int64[4] {-1, 2, 1, -1}> ()\n  y = Pad (w, p)"},
        // Negative steps: torch.flip, and every second element backwards.
        Case{"SliceFlip", {{"w", "2, 6", 12}},
             "  st = Constant <value = int64[1] {-1}> ()\n  en = Constant <value = int64[1] {-9223372036854775807}> ()\n"
             "  ax = Constant <value = int64[1] {1}> ()\n  sp = Constant <value = int64[1] {-1}> ()\n"
             "  s = Slice(w, st, en, ax, sp)\n  y = Mul(s, w)"},
        Case{"SliceBackStep2", {{"w", "2, 7", 14}},
             "  st = Constant <value = int64[2] {5, 1}> ()\n  en = Constant <value = int64[2] {0, -9}> ()\n"
             "  ax = Constant <value = int64[2] {1, 0}> ()\n  sp = Constant <value = int64[2] {-2, -1}> ()\n"
             "  s = Slice(w, st, en, ax, sp)\n  y = Mul(s, x)"},
        // Scatters: the updates get dy where they landed; the data gets dy
        // less what was overwritten (none), or all of it (add, duplicates).
        Case{"ScatterElements", {W23, {"w2", "2, 1", 2}},
             "  i = Constant <value = int64[2, 1] {2, 0}> ()\n  y = ScatterElements <axis = 1> (w, i, w2)"},
        Case{"ScatterElementsAdd", {W23, {"w2", "2, 2", 4}},
             "  i = Constant <value = int64[2, 2] {1, 1, 0, 2}> ()\n"
             "  s = ScatterElements <axis = 1, reduction = \"add\"> (w, i, w2)\n  y = Mul(s, s)"},
        Case{"ScatterND", {W23, {"w2", "1, 3", 3}},
             "  i = Constant <value = int64[1, 1] {1}> ()\n  y = ScatterND(w, i, w2)"},
        Case{"GatherND", {W23},
             "  i = Constant <value = int64[3, 2] {0, 1, 1, 2, 0, 1}> ()\n  y = GatherND(w, i)"},
        // The inverse and hyperbolic trigonometric functions, inside their domains.
        Case{"TanAtanSinhCosh", {W23, {"w2", "2, 3", 6}},
             "  a = Tan(w)\n  b = Atan(w2)\n  c = Sinh(w)\n  d = Cosh(w2)\n  ab = Add(a, b)\n  cd = Add(c, d)\n"
             "  y = Add(ab, cd)"},
        Case{"AsinAcosAtanh", {W23}, "  h = Constant <value = float {0.6}> ()\n  v = Mul(w, h)\n  a = Asin(v)\n"
                                     "  b = Acos(v)\n  c = Atanh(v)\n  ab = Mul(a, b)\n  y = Add(ab, c)"},
        Case{"AsinhAcosh", {Wpos}, "  one = Constant <value = float {1.}> ()\n  v = Add(w, one)\n  a = Asinh(w)\n"
                                   "  b = Acosh(v)\n  y = Add(a, b)"},
        Case{"Shrink", {W23}, "  y = Shrink <lambd = 0.3, bias = 0.1> (w)"},
        // Imported as Casts to double and back.
        Case{"CastLikeDouble", {W23}, "  d = Constant <value = double {1.}> ()\n  c = CastLike(w, d)\n"
                                      "  e = Mul(c, c)\n  y = CastLike(e, x)"},
        // GridSample: the image and the grid both train; the grid reaches
        // past [-1, 1] (times 1.4) so the padding modes act.
        Case{"GridSampleLinearZeros", {{"w", "1, 2, 3, 4", 24}, {"wg", "1, 2, 3, 2", 12}},
             "  s = Constant <value = float {1.4}> ()\n  g = Mul(wg, s)\n"
             "  y = GridSample <mode = \"linear\"> (w, g)", 20},
        // (1.45: no grid point within a finite-difference step of a kink.)
        Case{"GridSampleLinearReflection", {{"w", "1, 1, 3, 4", 12}, {"wg", "1, 3, 2, 2", 12}},
             "  s = Constant <value = float {1.45}> ()\n  g = Mul(wg, s)\n"
             "  y = GridSample <mode = \"linear\", padding_mode = \"reflection\"> (w, g)", 20},
        Case{"GridSampleCubicBorderAligned", {{"w", "1, 2, 4, 4", 32}, {"wg", "1, 2, 2, 2", 8}},
             "  s = Constant <value = float {1.4}> ()\n  g = Mul(wg, s)\n"
             "  y = GridSample <mode = \"cubic\", padding_mode = \"border\", align_corners = 1> (w, g)", 20},
        Case{"GridSampleNearestImage", {{"w", "1, 2, 3, 4", 24}},
             "  g = Constant <value = float[1, 2, 2, 2] {-0.9, 0.1, 0.4, -0.6, 0.7, 0.7, 1.3, -1.2}> ()\n"
             "  y = GridSample <mode = \"nearest\"> (w, g)", 20},
        Case{"GridSample3d", {{"w", "1, 1, 2, 3, 2", 12}, {"wg", "1, 1, 2, 2, 3", 12}},
             "  y = GridSample <mode = \"linear\", padding_mode = \"border\"> (w, wg)", 20},
        // A spatial transformer: theta -> AffineGrid -> GridSample.
        Case{"AffineGridSample", {{"w", "1, 2, 3", 6}, {"wi", "1, 1, 3, 4", 12}},
             "  z = Constant <value = int64[4] {1, 1, 3, 4}> ()\n  g = AffineGrid(w, z)\n  y = GridSample(wi, g)", 20},
        Case{"AffineGrid3dAligned", {{"w", "1, 3, 4", 12}},
             "  z = Constant <value = int64[5] {1, 1, 2, 3, 2}> ()\n  y = AffineGrid <align_corners = 1> (w, z)", 20},
        // Col2Im (F.fold), strided, dilated and padded: its adjoint cuts the blocks back out.
        Case{"Col2Im", {{"w", "1, 8, 9", 72}},
             "  i = Constant <value = int64[2] {4, 5}> ()\n  b = Constant <value = int64[2] {2, 2}> ()\n"
             "  y = Col2Im <strides = [1, 2], dilations = [2, 1], pads = [1, 0, 0, 1]> (w, i, b)", 18},
        // ReduceProd, exact with a zero among the factors (w times a mask
        // zeroing one element); ReduceLogSum; Pow with an integer exponent.
        Case{"ReduceProdWithZero", {{"w", "2, 3, 2", 12}},
             "  z = Constant <value = float[2, 3, 2] {1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1}> ()\n  v = Mul(w, z)\n"
             "  y = ReduceProd <keepdims = 0, axes = [0, 2]> (v)"},
        Case{"ReduceProdAll", {W23}, "  y = ReduceProd <keepdims = 1> (w)"},
        // noop_with_empty_axes: the reduction is its input, and so is the gradient.
        Case{"ReductionsNoop", {W23}, "  a = ReduceMax <noop_with_empty_axes = 1> (w)\n"
                                      "  b = ReduceProd <noop_with_empty_axes = 1> (a)\n"
                                      "  y = ReduceSum <noop_with_empty_axes = 1> (b)", 18},
        Case{"ReduceLogSum", {Wpos}, "  a = Constant <value = int64[1] {1}> ()\n  y = ReduceLogSum <keepdims = 1> (w, a)",
             18},
        Case{"PowIntegerExponent", {W23}, "  e = Constant <value = int64 {3}> ()\n  y = Pow(w, e)"},
        // Opset 11's softmaxes run over the flattened trailing dims.
        Case{"SoftmaxCoerced", {{"w", "2, 2, 3", 12}}, "  y = Softmax <axis = 1> (w)", 11},
        Case{"LogSoftmaxCoerced", {{"w", "2, 2, 3", 12}}, "  l = LogSoftmax <axis = 0> (w)\n  y = Mul(l, w)", 11},
        // ONNX's older normalizations and Lp pooling (ClassicNormVJP.cpp).
        // The loss sums y^2, which a normalized line holds constant: the
        // normalizations' cases add w back so their gradients count.
        Case{"LpNormalizationL2", {W23}, "  n = LpNormalization <axis = 1, p = 2> (w)\n  y = Add(n, w)"},
        Case{"LpNormalizationL1", {W23}, "  n = LpNormalization <axis = 0, p = 1> (w)\n  y = Add(n, w)"},
        Case{"MeanVarianceNormDefaultAxes", {{"w", "2, 3, 2, 2", 24}},
             "  n = MeanVarianceNormalization(w)\n  y = Add(n, w)"},
        Case{"MeanVarianceNormAxes", {{"w", "2, 3, 2", 12}},
             "  n = MeanVarianceNormalization <axes = [0, 2]> (w)\n  y = Add(n, w)"},
        Case{"LrnOddSize", {{"w", "1, 5, 2, 2", 20}},
             "  y = LRN <size = 3, alpha = 0.5, beta = 0.75, bias = 1.5> (w)"},
        Case{"LrnEvenSize", {{"w", "2, 4, 3", 24}}, "  y = LRN <size = 4, alpha = 0.8, beta = 0.6> (w)"},
        Case{"LpPoolP2Strided", {{"w", "1, 2, 4, 4", 32}},
             "  y = LpPool <kernel_shape = [2, 2], strides = [2, 2], p = 2> (w)"},
        Case{"LpPoolP3Padded", {{"w", "1, 1, 3, 4", 12}},
             "  y = LpPool <kernel_shape = [2, 3], pads = [1, 1, 0, 0], p = 3> (w)"},
        Case{"LpPoolP1", {{"w", "1, 2, 5", 10}}, "  y = LpPool <kernel_shape = [3], strides = [2], p = 1> (w)"},
        Case{"LpPoolSameUpperDilated", {{"w", "1, 1, 4, 5", 20}},
             "  y = LpPool <kernel_shape = [2, 3], auto_pad = \"SAME_UPPER\", dilations = [2, 1], p = 2> (w)", 18},
        Case{"GlobalLpPool", {{"w", "2, 2, 2, 3", 24}}, "  y = GlobalLpPool <p = 2> (w)"},
        // GatherND counting its index tuples from each batch item (batch_dims
        // 1 and 2), with a repeated pick.
        Case{"GatherNDBatchDims1", {{"w", "2, 3, 4", 24}},
             "  i = Constant <value = int64[2, 3, 2] {0, 1, 2, 3, 0, 1, 1, 0, 1, 0, 2, 2}> ()\n"
             "  y = GatherND <batch_dims = 1> (w, i)"},
        Case{"GatherNDBatchDims2", {{"w", "2, 3, 4", 24}},
             "  i = Constant <value = int64[2, 3, 1] {3, 0, 0, 1, 2, 1}> ()\n  y = GatherND <batch_dims = 2> (w, i)"}),
    [](const ::testing::TestParamInfo<Case> &info) { return info.param.name; });

} // namespace
