#include "train/checkpoint.h"

#include <fmt/format.h>

#include <cstring>
#include <sstream>

#include "core/config.h"
#include "core/errors.h"
#include "core/io.h"
#include "core/zip_check.h"

namespace memlab {

std::string torch_message(const c10::Error& e) {
  std::string msg = e.what_without_backtrace();
  return msg.substr(0, msg.find('\n'));
}

void save_archive_atomic(torch::serialize::OutputArchive& ar, const std::string& path) {
  std::ostringstream bytes;
  ar.save_to(bytes);
  write_file_atomic(path, bytes.str());
}

void load_archive(torch::serialize::InputArchive& ar, const std::string& path, const torch::Device& device) {
  if (!path_exists(path)) throw UserError(fmt::format("no checkpoint at '{}'", path));
  const std::string bytes = read_file(path);
  const std::string problem = zip_problem(bytes);
  if (!problem.empty()) throw UserError(fmt::format("checkpoint '{}' cannot be used: {}", path, problem));
  try {
    ar.load_from(bytes.data(), bytes.size(), device);
  } catch (const c10::Error& e) {
    throw UserError(fmt::format("checkpoint '{}' cannot be read: {}", path, torch_message(e)));
  }
}

void write_config(torch::serialize::OutputArchive& ar, const Config& cfg) {
  const std::string text = cfg.dump();
  auto t = torch::empty({static_cast<int64_t>(text.size())}, torch::kUInt8);
  std::memcpy(t.data_ptr<uint8_t>(), text.data(), text.size());
  ar.write("memlab.config", t);
}

std::string read_config(torch::serialize::InputArchive& ar) {
  torch::Tensor t;
  if (!ar.try_read("memlab.config", t)) return "";
  t = t.cpu().contiguous();
  return std::string(reinterpret_cast<const char*>(t.data_ptr<uint8_t>()), static_cast<size_t>(t.numel()));
}

std::string checkpoint_bytes(SequenceModel& model, const AdamW& opt, int64_t step, const Config& cfg) {
  torch::serialize::OutputArchive ar;
  model->save(ar);
  opt.save(ar);
  ar.write("memlab.step", torch::tensor(step));
  write_config(ar, cfg);
  std::ostringstream bytes;
  ar.save_to(bytes);
  return bytes.str();
}

CheckpointReader::CheckpointReader(const std::string& path, const torch::Device& device) : path_(path) {
  load_archive(ar_, path, device);
  torch::Tensor step;
  if (!ar_.try_read("memlab.step", step)) throw UserError(fmt::format("'{}' is not a memlab training checkpoint", path));
  step_ = step.item<int64_t>();
  config_ = read_config(ar_);
}

void CheckpointReader::restore(SequenceModel& model, AdamW* opt) {
  try {
    model->load(ar_);
    if (opt) opt->load(ar_);
  } catch (const c10::Error& e) {
    throw UserError(fmt::format("checkpoint '{}' does not fit the model of this config (a model.* key differs from "
                                "the run that wrote it): {}",
                                path_, torch_message(e)));
  }
}

}  // namespace memlab
