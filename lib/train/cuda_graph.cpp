#include "train/cuda_graph.h"

#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <mutex>

#include "core/log.h"

namespace memlab {

struct GraphedStep::Graph {
  at::cuda::CUDAGraph graph;
  // What a capture that breaks off must hand back where the graph cannot (see run): its memory pool, named here
  // because the graph tells its pool only after a capture that ended, and the CUDA generator as it was before.
  at::cuda::MempoolId_t pool = at::cuda::graph_pool_handle();
  at::Generator rng_before;
  bool captured = false;
};

namespace {
constexpr int kWarmSteps = 3;  // eager steps on a side stream before capture (allocator, cuBLAS handles)
}

GraphedStep::GraphedStep(bool enabled, std::string eager_reason) : mode_(std::move(eager_reason)) {
  if (enabled) graph_ = std::make_unique<Graph>();
}

GraphedStep::~GraphedStep() = default;

bool GraphedStep::captured() const { return graph_ && graph_->captured; }

void GraphedStep::drop(const std::string& why) {
  if (!graph_) return;
  graph_.reset();
  mode_ = "eager (" + why + ")";
  logf("note: training continues without the CUDA graph: {}", why);
}

void GraphedStep::run(const std::function<void()>& compute) {
  if (!graph_) {
    compute();
    return;
  }
  if (graph_->captured) {
    graph_->graph.replay();
    return;
  }
  // Warm-up steps are real training steps, run eagerly on a side stream as graph capture requires.
  auto side = c10::cuda::getStreamFromPool();
  torch::cuda::synchronize();
  if (warm_steps_ < kWarmSteps) {
    {
      c10::cuda::CUDAStreamGuard guard(side);
      compute();
    }
    torch::cuda::synchronize();
    ++warm_steps_;
    return;
  }
  at::autocast::set_autocast_cache_enabled(false);
  // One capture at a time in the process, in thread-local capture mode, so that another thread's synchronising
  // calls do not invalidate it. Other threads must still draw no random numbers from the CUDA generator while a
  // capture runs (the graph would take their draws as its own): memlab bench rl --runs captures before its threads
  // start.
  static std::mutex capture_mutex;
  std::lock_guard<std::mutex> capturing(capture_mutex);
  // The graph allocates from a pool of its own: blocks the warm-up steps left cached would stay out of its reach
  // (48 packed runs failed to capture with 120 GiB cached and unused).
  c10::cuda::CUDACachingAllocator::emptyCache();
  at::Generator rng = at::cuda::detail::getDefaultCUDAGenerator(side.device_index());
  {
    std::lock_guard<std::mutex> lock(rng.mutex());
    graph_->rng_before = rng.clone();
  }
  try {
    {
      c10::cuda::CUDAStreamGuard guard(side);
      graph_->graph.capture_begin(graph_->pool, cudaStreamCaptureModeThreadLocal);
      compute();
      graph_->graph.capture_end();
    }
    torch::cuda::synchronize();
    graph_->captured = true;
    mode_ = "cuda graph";
    graph_->graph.replay();  // capture recorded this step without running it
  } catch (const std::exception& e) {
    const auto* te = dynamic_cast<const c10::Error*>(&e);
    std::string msg = te ? te->what_without_backtrace() : e.what();
    // A step that broke off inside the capture left the stream capturing, and every later launch on it would fail
    // ("operation not permitted when stream is capturing"). End it through the graph, which also hands back its
    // memory pool and the CUDA generator. A capture that a CUDA error invalidated makes capture_end stop at its
    // first call: then hand the pool back here, unless capture_end got past doing so itself (its reset then
    // releases it), and restore the generator from before the capture.
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(side.stream(), &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      try {
        c10::cuda::CUDAStreamGuard guard(side);
        graph_->graph.capture_end();
      } catch (const std::exception&) {
        bool pool_left = true;
        try {
          c10::cuda::CUDACachingAllocator::endAllocateToPool(side.device_index(), graph_->pool);
        } catch (const std::exception&) {
          pool_left = false;
        }
        if (pool_left) c10::cuda::CUDACachingAllocator::releasePool(side.device_index(), graph_->pool);
        std::lock_guard<std::mutex> lock(rng.mutex());
        rng.graphsafe_set_state(graph_->rng_before);
      }
    }
    (void)cudaGetLastError();  // an invalidated capture's error is not sticky
    graph_.reset();
    c10::cuda::CUDACachingAllocator::emptyCache();
    mode_ = "eager (CUDA graph capture failed: " + msg.substr(0, msg.find('\n')) + ")";
    logf("note: {}", mode_);
    torch::cuda::synchronize();
    compute();  // the step the failed capture did not run
  }
}

}  // namespace memlab
