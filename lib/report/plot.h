#pragma once
// Line charts of a report, drawn once with cairo onto both a PNG and an SVG surface: accuracy against
// length per model, headline accuracy against training step (learning curves) and training loss
// against step, one figure per task. Without cairo (MEMLAB_HAVE_CAIRO unset) the charts are still
// built, but writing them fails with one clear error.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "report/aggregate.h"

namespace memlab {

struct Series {
  std::string name;
  std::vector<double> x, y;  // NaN in y leaves a gap
  int style = 0;             // colour, marker and dash; a label keeps its style in every chart
  std::vector<double> lo, hi;  // when given (one per x): a band shaded behind the line, e.g. an interval
};

struct Chart {
  std::string title, x_title, y_title;
  std::vector<Series> series;
  std::vector<std::string> categories;  // when set, x holds category indices 0..n-1 labelled with these
  bool log_y = false;
  std::optional<std::pair<double, double>> shade_x;  // an x interval drawn shaded, e.g. the training lengths
  std::string shade_label;
  std::optional<std::pair<double, double>> y_span;  // at least this y range is shown
};

// The charts of one task of the report (index into rep.tasks). The length chart has one category per
// evaluated range in order (the headline range left out where finer ranges cover it), the training
// range shaded; a label whose best run lacks a range has a gap there.
Chart length_chart(const Report& rep, size_t task);
Chart learning_chart(const Report& rep, size_t task);
Chart loss_chart(const Report& rep, size_t task);

bool plotting_available();
// UserError saying this memlab was built without cairo, unless plotting is available.
void require_plotting();
// Writes base.png and base.svg atomically. UserError when this memlab was built without cairo.
void write_chart(const Chart& chart, const std::string& base);
// Writes <task>_length, <task>_learning and <task>_loss (.png and .svg) of every task into dir;
// returns the files written. A task whose runs have no training rows gets no loss chart.
std::vector<std::string> write_report_plots(const Report& rep, const std::string& dir);

}  // namespace memlab
