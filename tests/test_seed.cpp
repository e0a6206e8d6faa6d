// Every test starts from the same torch RNG state. libtorch seeds its default CPU generator nondeterministically,
// so tests that draw random parameters (randomize()) before their own manual_seed got different draws on every
// run and failed intermittently. MEMLAB_TEST_SEED=<n> overrides the seed (to check a test over many draws).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>

namespace {

class SeedEachTest : public ::testing::EmptyTestEventListener {
  void OnTestStart(const ::testing::TestInfo&) override {
    const char* env = std::getenv("MEMLAB_TEST_SEED");
    torch::manual_seed(env ? std::strtoull(env, nullptr, 10) : 0);
  }
};

const bool registered = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new SeedEachTest);
  return true;
}();

}  // namespace
