#pragma once
// Evaluation protocols of the papers besides the HQLT one (report/aggregate.h), as report tables:
//  - subquadratic ("On Subquadratic Architectures", Table 13): per model, task and evaluation length, the
//    best run (max over seeds and learning rates) and the longest length at which that stays at or above
//    a threshold;
//  - mad (MesaNet Table 1, Poli et al.'s MAD; also RegBench): per model, task and setting (the task.*
//    keys of a run: vocabulary, length, training-set size, ...) the best run over the sweep (learning rate x
//    weight decay x seeds), then per model and task the mean over its settings.
#include <string>
#include <vector>

#include "report/aggregate.h"
#include "report/table.h"

namespace memlab {

enum class Protocol { Hqlt, Subquadratic, Mad };
Protocol parse_protocol(const std::string& s);  // UserError on anything but hqlt|subquadratic|mad

struct ProtocolOptions {
  Select select = Select::Final;
  Metric metric = Metric::Accuracy;
  std::string task;        // only this task when non-empty
  double threshold = 0.9;  // subquadratic: accuracy (a fraction) the longest length must keep
  std::string positions;   // subquadratic: which positions the scores count, for the tables' titles
  const PaperValues* paper = nullptr;  // shown beside the best (subquadratic) or summary (mad) table
};

struct ProtocolReport {
  std::vector<TextTable> tables;
  std::vector<std::string> notes;
};

// UserError when no run has anything to report.
ProtocolReport subquadratic_report(const std::vector<RunResult>& runs, const ProtocolOptions& opt);
ProtocolReport mad_report(const std::vector<RunResult>& runs, const ProtocolOptions& opt);

}  // namespace memlab
