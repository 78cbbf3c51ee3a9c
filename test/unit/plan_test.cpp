// Plan verification: a compiled plan loads and runs; every single-byte flip and
// every truncation is refused with an error; with the checksum disabled the
// deeper checks still keep corrupt plans from crashing the runtime.
#include "Driver.h"
#include "plan_generated.h"
#include "sd/format/crc32c.h"
#include "sd/runtime/plan.h"
#include "sd/runtime/session.h"
#include <cstring>
#include <fstream>
#include <gtest/gtest.h>
#include <sstream>
#include <unistd.h>

using namespace sd;

namespace {

const char *kModel = R"(<
  ir_version: 8,
  opset_import: ["" : 17]
>
g (float[2, 4] x, int64[2] ids) => (float[2, 3] y, float[2, 4] e)
<float[4, 3] w = {1.,2.,3.,4.,5.,6.,7.,8.,9.,10.,11.,12.}, float[3] b = {0.5, 0.25, 0.125},
 float[5, 4] table = {1.,2.,3.,4.,5.,6.,7.,8.,9.,10.,11.,12.,13.,14.,15.,16.,17.,18.,19.,20.}>
{
  h = MatMul(x, w)
  z = Add(h, b)
  s = Softmax <axis = -1> (z)
  y = Relu(s)
  e = Gather <axis = 0> (table, ids)
}
)";

class PlanTest : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/sd_plan_testXXXXXX";
    dir_ = mkdtemp(tmpl);
    std::ofstream(dir_ + "/m.onnxtxt") << kModel;
    CompileRequest req;
    req.model = dir_ + "/m.onnxtxt";
    req.output = dir_ + "/m.sdp";
    std::string err;
    ASSERT_TRUE(compileModel(req, err)) << err;
    std::ifstream f(req.output, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string s = ss.str();
    bytes_.assign(s.begin(), s.end());
  }
  static std::string dir_;
  static std::vector<uint8_t> bytes_;

  static std::vector<HostTensor> inputs() {
    HostTensor x{"x", DType::F32, {2, 4}, std::vector<uint8_t>(32, 0)};
    HostTensor ids{"ids", DType::I64, {2}, std::vector<uint8_t>(16, 0)};
    int64_t idv[2] = {4, 1};
    std::memcpy(ids.data.data(), idv, 16);
    return {x, ids};
  }
};
std::string PlanTest::dir_;
std::vector<uint8_t> PlanTest::bytes_;

TEST_F(PlanTest, LoadsAndRuns) {
  auto plan = Plan::loadBytes(bytes_.data(), bytes_.size(), "m.sdp");
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  std::shared_ptr<Plan> p(std::move(plan.value()));
  auto session = Session::create(p, SessionOptions{1});
  ASSERT_TRUE(session.isOk());
  auto in = inputs();
  std::vector<HostTensor> out;
  ASSERT_TRUE(session.value()->run(0, {&in[0], &in[1]}, out).isOk());
  ASSERT_EQ(out.size(), 2u);
  // Softmax of (x=0)·w + b: exp(b)/sum(exp(b)).
  const float *y = reinterpret_cast<const float *>(out[0].data.data());
  double z = std::exp(0.5) + std::exp(0.25) + std::exp(0.125);
  EXPECT_NEAR(y[0], std::exp(0.5) / z, 1e-6);
  const float *e = reinterpret_cast<const float *>(out[1].data.data());
  EXPECT_EQ(e[0], 17.f);
  EXPECT_EQ(e[4], 5.f);
}

TEST_F(PlanTest, EveryByteFlipIsRefused) {
  for (size_t i = 0; i < bytes_.size(); ++i) {
    std::vector<uint8_t> b = bytes_;
    b[i] ^= 0xff;
    auto plan = Plan::loadBytes(b.data(), b.size(), "flipped.sdp");
    ASSERT_FALSE(plan.isOk()) << "flip at byte " << i << " was accepted";
    EXPECT_EQ(plan.status().message().find('\n'), std::string::npos);
  }
}

TEST_F(PlanTest, EveryTruncationIsRefused) {
  for (size_t n = 0; n < bytes_.size(); ++n) {
    auto plan = Plan::loadBytes(bytes_.data(), n, "truncated.sdp");
    ASSERT_FALSE(plan.isOk()) << "truncation to " << n << " bytes was accepted";
  }
}

// Without the CRC, corrupt plans reach the structural checks; whatever loads
// must run without touching memory outside its buffers (ASan in the fuzzer
// checks the same more strictly).
TEST_F(PlanTest, CorruptionPastTheChecksumNeverCrashes) {
  PlanLoadOptions noCrc;
  noCrc.verifyChecksum = false;
  size_t loaded = 0;
  for (size_t i = 0; i < bytes_.size(); ++i) {
    for (uint8_t mask : {uint8_t(0xff), uint8_t(0x01), uint8_t(0x80)}) {
      std::vector<uint8_t> b = bytes_;
      b[i] ^= mask;
      auto plan = Plan::loadBytes(b.data(), b.size(), "corrupt.sdp", noCrc);
      if (!plan.isOk()) continue;
      ++loaded;
      std::shared_ptr<Plan> p(std::move(plan.value()));
      auto session = Session::create(p, SessionOptions{1});
      if (!session.isOk()) continue;
      for (size_t e = 0; e < p->entries.size(); ++e) {
        std::vector<HostTensor> in;
        for (auto &bind : p->entries[e].inputs) {
          const BufferDesc &bd = p->entries[e].buffers[size_t(bind.second)];
          in.push_back(HostTensor{bind.first, bd.dtype, bd.dims, std::vector<uint8_t>(bd.bytes, 0)});
        }
        std::vector<const HostTensor *> ptrs;
        for (auto &t : in) ptrs.push_back(&t);
        std::vector<HostTensor> out;
        (void)session.value()->run(e, ptrs, out);
      }
    }
  }
  EXPECT_GT(loaded, 0u); // some flips (weights, padding) load fine without the CRC
}

TEST_F(PlanTest, WrongSchemaVersionIsRefusedByName) {
  std::vector<uint8_t> b = bytes_;
  uint64_t fbSize;
  std::memcpy(&fbSize, b.data() + b.size() - kPlanFooterSize, 8);
  auto *plan = fb::GetMutablePlan(b.data());
  ASSERT_TRUE(plan->mutate_schema_major(kPlanSchemaMajor + 1));
  uint32_t crc = crc32c(b.data(), b.size() - kPlanFooterSize);
  std::memcpy(b.data() + b.size() - kPlanFooterSize + 8, &crc, 4);
  auto loaded = Plan::loadBytes(b.data(), b.size(), "future.sdp");
  ASSERT_FALSE(loaded.isOk());
  std::string want = "schema version " + std::to_string(kPlanSchemaMajor + 1) + "." +
                     std::to_string(kPlanSchemaMinor) + " is not supported";
  EXPECT_NE(loaded.status().message().find(want), std::string::npos) << loaded.status().message();
}

} // namespace
