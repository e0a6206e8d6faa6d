#include "train/checkpoint.h"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>

#include "core/errors.h"
#include "core/io.h"

namespace memlab {

void save_checkpoint(const std::string& path, SequenceModel& model, const AdamW& opt, int64_t step) {
  torch::serialize::OutputArchive ar;
  model->save(ar);
  opt.save(ar);
  ar.write("memlab.step", torch::tensor(step));
  save_archive_atomic(ar, path);
}

void save_archive_atomic(torch::serialize::OutputArchive& ar, const std::string& path) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  ar.save_to(tmp);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw UserError(fmt::format("cannot write checkpoint '{}': {}", path, ec.message()));
}

int64_t load_checkpoint(const std::string& path, SequenceModel& model, AdamW& opt) {
  if (!path_exists(path)) throw UserError(fmt::format("no checkpoint at '{}'", path));
  try {
    torch::serialize::InputArchive ar;
    ar.load_from(path, model->parameters().at(0).device());
    model->load(ar);
    opt.load(ar);
    torch::Tensor step;
    ar.read("memlab.step", step);
    return step.item<int64_t>();
  } catch (const c10::Error& e) {
    std::string msg = e.what_without_backtrace();
    msg = msg.substr(0, msg.find('\n'));
    throw UserError(fmt::format("checkpoint '{}' does not fit this model/config: {}", path, msg));
  }
}

}  // namespace memlab
