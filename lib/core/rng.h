#pragma once
// Deterministic random streams: every sample is a pure function of (seed, stream, index), so data are
// identical on every machine and any example can be regenerated without replaying earlier ones.
#include <boost/random/mersenne_twister.hpp>
#include <boost/random/uniform_int_distribution.hpp>

#include <cstdint>

namespace memlab {

using Rng = boost::random::mt19937_64;

uint64_t splitmix64(uint64_t x);
// Seed for item `index` of stream `stream` (e.g. a data split) under run seed `seed`.
uint64_t derive_seed(uint64_t seed, uint64_t stream, uint64_t index);
inline Rng make_rng(uint64_t seed, uint64_t stream, uint64_t index) { return Rng(derive_seed(seed, stream, index)); }

// Uniform integer in [lo, hi] inclusive; Boost's distribution is the same on every platform.
inline int64_t uniform_int(Rng& rng, int64_t lo, int64_t hi) {
  return boost::random::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

}  // namespace memlab
