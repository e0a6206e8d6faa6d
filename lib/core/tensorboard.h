#pragma once
// TensorBoard event files, written without TensorFlow: `tensorboard --logdir runs/` shows a run's curves
// live, and W&B imports them (wandb sync --sync-tensorboard). Each process appends to its own file
// DIR/events.out.tfevents.<unix time>.<host>.<pid>.memlab of TFRecord frames (length, masked CRC-32C of the
// length, an Event protobuf, masked CRC-32C of the data) holding scalar summaries.
#include <cstdint>
#include <string>

namespace memlab {

class EventWriter {
 public:
  // An empty dir makes a writer that writes nothing. `resume_step` > 0 marks a run resumed from that step:
  // TensorBoard then drops the earlier files' points after it, which the checkpoint did not keep.
  explicit EventWriter(const std::string& dir = "", int64_t resume_step = 0);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;
  // One scalar; UserError naming the file when it cannot be written.
  void scalar(const std::string& tag, int64_t step, double value);
  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& event);
  std::string path_;
  int fd_ = -1;
};

// True for names EventWriter writes (events.out.tfevents.*).
bool is_event_file(const std::string& name);

}  // namespace memlab
