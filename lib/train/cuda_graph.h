#pragma once
// A training step run eagerly or, on CUDA, captured once as a CUDA graph and then replayed. The step must
// read its inputs from, and write its outputs to, tensors that stay in place between calls.
#include <functional>
#include <memory>
#include <string>

namespace memlab {

class GraphedStep {
 public:
  // enabled: capture on the first calls after a few eager warm-up steps (CUDA only; the caller decides).
  explicit GraphedStep(bool enabled, std::string eager_reason = "eager");
  ~GraphedStep();
  // Runs one step: eager, a warm-up step on a side stream, the capture (which then replays), or a replay.
  void run(const std::function<void()>& compute);
  // Stops replaying (for example when the inputs no longer fit the captured shapes); `why` goes to mode().
  void drop(const std::string& why);
  bool active() const { return graph_ != nullptr; }
  bool captured() const;
  // "eager", "cuda graph", or why the graph is not used
  const std::string& mode() const { return mode_; }

 private:
  struct Graph;
  std::unique_ptr<Graph> graph_;
  int warm_steps_ = 0;
  std::string mode_;
};

}  // namespace memlab
