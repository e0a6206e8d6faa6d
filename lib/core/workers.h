#pragma once
// A process-wide pool of CPU threads for data work that splits into independent pieces (examples drawn by index).
// Its own threads rather than ATen's parallel_for: that one is OpenMP inline in the header, so it runs serially in
// translation units built without -fopenmp, and building memlab with it would load a second OpenMP runtime beside
// the one the PyTorch wheel bundles.
#include <cstdint>
#include <functional>

namespace memlab {

// Threads the pool uses, the caller's included: OMP_NUM_THREADS where set (memlab sweep shares the cores among its
// runs that way), else the machine's cores; at least 1.
int worker_threads();

// fn(lo, hi) over [0, n) in chunks of `grain` items (the last may be shorter), on the pool's threads and the
// caller's; returns when every chunk has run. Once a chunk throws, chunks not yet started are skipped, and the first
// exception is rethrown here when those running have ended. Calls from inside fn run serially.
void parallel_chunks(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace memlab
