#include "train/cuda_graph.h"

#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include "core/log.h"

namespace memlab {

struct GraphedStep::Graph {
  at::cuda::CUDAGraph graph;
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
  // The graph allocates from a pool of its own: blocks the warm-up steps left cached would stay out of its reach
  // (48 packed runs failed to capture with 120 GiB cached and unused).
  c10::cuda::CUDACachingAllocator::emptyCache();
  try {
    {
      c10::cuda::CUDAStreamGuard guard(side);
      graph_->graph.capture_begin();
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
    {
      // End the broken capture, or every later launch on the stream fails ("operation not permitted when stream
      // is capturing").
      c10::cuda::CUDAStreamGuard guard(side);
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(side.stream(), &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
        try {
          graph_->graph.capture_end();
        } catch (const std::exception&) {
          // An invalidated capture ends with an error before the graph hands its memory pool back: do that here,
          // so that allocations stop going to the pool and its blocks can be freed.
          c10::cuda::CUDACachingAllocator::endAllocateToPool(side.device_index(), graph_->graph.pool());
          c10::cuda::CUDACachingAllocator::releasePool(side.device_index(), graph_->graph.pool());
        }
      }
      (void)cudaGetLastError();
    }
    graph_.reset();
    c10::cuda::CUDACachingAllocator::emptyCache();
    mode_ = "eager (CUDA graph capture failed: " + msg.substr(0, msg.find('\n')) + ")";
    logf("note: {}", mode_);
    torch::cuda::synchronize();
    compute();  // the step the failed capture did not run
  }
}

}  // namespace memlab
