// memlab eval: evaluate a trained run's checkpoint at any lengths, on either held-out split, without retraining.
#include <fmt/format.h>

#include <memory>
#include <sstream>

#include "commands.h"
#include "core/config.h"
#include "core/errors.h"
#include "core/io.h"
#include "train/trainer.h"

namespace memlab {

namespace {
struct EvalArgs {
  std::string run, lengths, split, device, n, batch, average, precision;
};

// "40-256,512,2048" -> "[[40, 256], [512, 512], [2048, 2048]]" (eval.ranges), checked there.
std::string ranges_yaml(const std::string& text) {
  std::string out;
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, ',');) {
    const auto dash = part.find('-');
    const std::string a = part.substr(0, dash), b = dash == std::string::npos ? a : part.substr(dash + 1);
    for (const auto& x : {a, b})
      if (x.empty() || x.find_first_not_of("0123456789") != std::string::npos)
        throw UserError(fmt::format("--lengths '{}': expected lengths and ranges like 40-256,512,2048", text));
    out += fmt::format("{}[{}, {}]", out.empty() ? "" : ", ", a, b);
  }
  if (out.empty()) throw UserError("--lengths is empty; give lengths and ranges like 40-256,512,2048");
  return "[" + out + "]";
}
}  // namespace

std::function<int()> add_eval_command(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  auto* cmd = app.add_subcommand("eval", "evaluate a trained run's checkpoint at any lengths, without retraining");
  cmd->add_option("RUN_DIR", a->run, "a run directory of memlab train (or a sweep's RESULTS/runs/<id>)")
      ->required()
      ->check(non_empty("DIR"));
  cmd->add_option("--lengths", a->lengths,
                  "lengths and ranges, e.g. 40-256,512,2048 (default: the run's own evaluation ranges)");
  cmd->add_option("--split", a->split, "val or test (default: the run's eval.split)")
      ->check(CLI::IsMember({"val", "test"}));
  cmd->add_option("--n", a->n, "examples per length range (default: the run's eval.n)");
  cmd->add_option("--batch-size", a->batch, "evaluation batch size (default: the run's eval.batch_size)");
  cmd->add_option("--average", a->average,
                  "tokens, or mad: accuracy as MAD averages it, per batch and per class (default: the run's "
                  "eval.average)")
      ->check(CLI::IsMember({"tokens", "mad"}));
  cmd->add_option("--device", a->device, "cpu, cuda or auto (default: the run's train.device)");
  cmd->add_option("--precision", a->precision,
                  "fp32, bf16 (autocast, CUDA only) or auto (bf16 on CUDA); default: the run's train.precision")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}));
  cmd->footer(
      "Prints the length table and adds its rows to RUN_DIR/evaluation.csv (columns: task, model, seed, step,\n"
      "split, length_min, length_max, n, accuracy, normalized_accuracy, accuracy_all, normalized_all, average,\n"
      "precision; a row of the same step, split, lengths, n, average and precision replaces the earlier one) and\n"
      "the table to RUN_DIR/evaluation.md. precision is the one the evaluation ran in (fp32 or bf16): --precision\n"
      "fp32 beside the run's bf16 tells rounding apart from what the model learned.\n"
      "config.yaml, train.csv, eval.csv, summary.md and the checkpoint are left as they are.");
  return [cmd, a]() -> int {
    if (!cmd->parsed()) return -1;
    const std::string saved = join_path(a->run, "config.yaml");
    if (!path_exists(saved)) throw UserError(fmt::format("cannot evaluate '{}': it holds no config.yaml", a->run));
    Config cfg(full_schema());
    cfg.merge_file(saved);
    if (!a->lengths.empty()) cfg.set_value("eval.ranges", ranges_yaml(a->lengths), "--lengths");
    if (!a->split.empty()) cfg.set_value("eval.split", a->split, "--split");
    if (!a->n.empty()) cfg.set_value("eval.n", a->n, "--n");
    if (!a->batch.empty()) cfg.set_value("eval.batch_size", a->batch, "--batch-size");
    if (!a->average.empty()) cfg.set_value("eval.average", a->average, "--average");
    if (!a->device.empty()) cfg.set_value("train.device", a->device, "--device");
    if (!a->precision.empty()) cfg.set_value("train.precision", a->precision, "--precision");
    return evaluate_saved_run(cfg, a->run);
  };
}

}  // namespace memlab
