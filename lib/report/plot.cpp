#include "report/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/errors.h"
#include "core/io.h"

#ifdef MEMLAB_HAVE_CAIRO
#include <cairo-svg.h>
#include <cairo.h>
#endif

namespace memlab {

namespace {

std::string metric_axis(const Report& rep) {
  return rep.options.metric == Metric::Normalized ? "normalised accuracy [%]" : "accuracy [%]";
}

std::string step_words(const Report& rep) {
  return rep.options.select == Select::Final ? "final evaluation" : "best evaluation";
}

// Both metrics are percentages: show 0-100 at least.
std::pair<double, double> metric_span() { return {0.0, 100.0}; }

}  // namespace

Chart length_chart(const Report& rep, size_t t) {
  const auto& task = rep.tasks[t];
  const Range train = rep.train_len[t], head = rep.eval_len[t];
  // Categories: the training range, then the evaluated ranges; the headline range only where no finer
  // range lies inside it (it would repeat their average as a point of its own).
  std::vector<Range> cats;
  bool finer = false;
  for (const auto& r : rep.ranges[t]) finer = finer || (r != head && r.min >= head.min && r.max <= head.max);
  bool train_seen = false;
  for (const auto& c : rep.cells)
    if (c.task == task && find_eval(*c.best_run().run, c.best_run().step, train)) train_seen = true;
  if (train_seen) cats.push_back(train);
  for (const auto& r : rep.ranges[t])
    if (!(finer && r == head)) cats.push_back(r);
  std::sort(cats.begin(), cats.end());

  Chart ch;
  ch.title = fmt::format("{}: {} by length (best seed at the best lr, {})", task_title(task),
                         rep.options.metric == Metric::Normalized ? "normalised accuracy" : "accuracy",
                         step_words(rep));
  ch.x_title = "sequence length (evaluated range)";
  ch.y_title = metric_axis(rep);
  ch.y_span = metric_span();
  for (const auto& r : cats) ch.categories.push_back(range_name(r));
  for (size_t i = 0; i < cats.size(); ++i)
    if (cats[i] == train) {
      ch.shade_x = {i - 0.5, i + 0.5};
      ch.shade_label = "training lengths";
    }
  for (size_t li = 0; li < rep.labels.size(); ++li) {
    const Cell* c = rep.cell(rep.labels[li], task);
    if (!c) continue;
    const Score& s = c->best_run();
    Series se{fmt::format("{} ({}: {:.1f})", rep.labels[li], range_name(s.run->eval_len), s.value), {}, {},
              static_cast<int>(li)};
    for (size_t i = 0; i < cats.size(); ++i) {
      const EvalPoint* e = find_eval(*s.run, s.step, cats[i]);
      se.x.push_back(static_cast<double>(i));
      se.y.push_back(e ? metric_value(*e, rep.options.metric) : std::nan(""));
    }
    ch.series.push_back(se);
  }
  return ch;
}

Chart learning_chart(const Report& rep, size_t t) {
  const auto& task = rep.tasks[t];
  Chart ch;
  ch.title = fmt::format("{}: learning curves on lengths {} (best seed at the best lr)", task_title(task),
                         range_name(rep.eval_len[t]));
  ch.x_title = "training step";
  ch.y_title = metric_axis(rep);
  ch.y_span = metric_span();
  for (size_t li = 0; li < rep.labels.size(); ++li) {
    const Cell* c = rep.cell(rep.labels[li], task);
    if (!c) continue;
    const RunResult& run = *c->best_run().run;
    Series se{fmt::format("{} (lr {:g}, seed {})", rep.labels[li], run.lr, run.seed), {}, {}, static_cast<int>(li)};
    std::vector<std::pair<double, double>> pts;
    for (const auto& e : run.evals)
      if (e.lengths == run.eval_len) pts.emplace_back(static_cast<double>(e.step), metric_value(e, rep.options.metric));
    std::sort(pts.begin(), pts.end());
    for (const auto& [x, y] : pts) {
      se.x.push_back(x);
      se.y.push_back(y);
    }
    ch.series.push_back(se);
  }
  return ch;
}

Chart loss_chart(const Report& rep, size_t t) {
  const auto& task = rep.tasks[t];
  Chart ch;
  ch.title = fmt::format("{}: training loss (best seed at the best lr)", task_title(task));
  ch.x_title = "training step";
  ch.y_title = "training loss (cross-entropy)";
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  for (size_t li = 0; li < rep.labels.size(); ++li) {
    const Cell* c = rep.cell(rep.labels[li], task);
    if (!c || c->best_run().run->train.empty()) continue;
    const RunResult& run = *c->best_run().run;
    Series se{fmt::format("{} (lr {:g}, seed {})", rep.labels[li], run.lr, run.seed), {}, {}, static_cast<int>(li)};
    for (const auto& p : run.train) {
      se.x.push_back(static_cast<double>(p.step));
      se.y.push_back(p.loss);
      lo = std::min(lo, p.loss);
      hi = std::max(hi, p.loss);
    }
    ch.series.push_back(se);
  }
  // Losses span decades once a model learns: a log axis keeps the late part readable.
  ch.log_y = lo > 0 && hi / lo > 20;
  if (!ch.log_y) ch.y_span = std::make_pair(0.0, hi);
  return ch;
}

void require_plotting() {
  if (!plotting_available())
    throw UserError("this memlab was built without cairo, so it cannot draw plots (--plot); rebuild it with "
                    "libcairo2-dev installed (pkg-config cairo), or plot the --format csv output elsewhere");
}

std::vector<std::string> write_report_plots(const Report& rep, const std::string& dir) {
  require_plotting();
  ensure_writable_dir(dir);
  std::vector<std::string> files;
  for (size_t t = 0; t < rep.tasks.size(); ++t) {
    std::vector<std::pair<std::string, Chart>> charts{{"length", length_chart(rep, t)},
                                                      {"learning", learning_chart(rep, t)}};
    Chart loss = loss_chart(rep, t);
    if (!loss.series.empty()) charts.emplace_back("loss", loss);
    for (const auto& [kind, chart] : charts) {
      const std::string base = join_path(dir, rep.tasks[t] + "_" + kind);
      write_chart(chart, base);
      files.push_back(base + ".png");
      files.push_back(base + ".svg");
    }
  }
  return files;
}

#ifndef MEMLAB_HAVE_CAIRO

bool plotting_available() { return false; }
void write_chart(const Chart&, const std::string&) { require_plotting(); }

#else

bool plotting_available() { return true; }

namespace {

struct Rgb {
  double r, g, b;
};
// Colour-blind-safe qualitative palette (Okabe-Ito), then a few darker extras.
const Rgb kColours[] = {{0.000, 0.447, 0.698}, {0.835, 0.369, 0.000}, {0.000, 0.620, 0.451},
                        {0.800, 0.475, 0.655}, {0.902, 0.624, 0.000}, {0.337, 0.706, 0.914},
                        {0.600, 0.150, 0.150}, {0.250, 0.250, 0.250}, {0.450, 0.350, 0.700}};
const int kNumColours = sizeof(kColours) / sizeof(kColours[0]);
const int kNumMarkers = 6;

const double kW = 760;           // plot area + axes, without the legend
const double kH = 560;
const double kLeft = 84, kRight = 28, kTop = 64, kBottom = 76;

std::vector<double> nice_ticks(double lo, double hi, int target) {
  std::vector<double> t;
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

std::string tick_text(double v) {
  if (v != 0 && (std::fabs(v) >= 1e6 || std::fabs(v) < 1e-3)) {
    // 1e-4 rather than 1e-04.
    const int e = static_cast<int>(std::floor(std::log10(std::fabs(v)) + 1e-9));
    const double m = v / std::pow(10.0, e);
    return std::fabs(m - 1) < 1e-9 ? fmt::format("1e{}", e) : fmt::format("{:g}e{}", m, e);
  }
  return fmt::format("{:g}", v);
}

void text_at(cairo_t* cr, const std::string& s, double x, double y, double ax, double ay) {
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  cairo_move_to(cr, x - e.x_advance * ax, y + e.height * ay);
  cairo_show_text(cr, s.c_str());
}

void marker(cairo_t* cr, int kind, double x, double y, double r) {
  switch (kind % kNumMarkers) {
    case 0:
      cairo_arc(cr, x, y, r, 0, 2 * M_PI);
      break;
    case 1:
      cairo_rectangle(cr, x - r * 0.9, y - r * 0.9, 1.8 * r, 1.8 * r);
      break;
    case 2:
      cairo_move_to(cr, x, y - 1.2 * r);
      cairo_line_to(cr, x + 1.1 * r, y + 0.8 * r);
      cairo_line_to(cr, x - 1.1 * r, y + 0.8 * r);
      cairo_close_path(cr);
      break;
    case 3:
      cairo_move_to(cr, x, y - 1.3 * r);
      cairo_line_to(cr, x + 1.1 * r, y);
      cairo_line_to(cr, x, y + 1.3 * r);
      cairo_line_to(cr, x - 1.1 * r, y);
      cairo_close_path(cr);
      break;
    case 4:
      cairo_move_to(cr, x, y + 1.2 * r);
      cairo_line_to(cr, x + 1.1 * r, y - 0.8 * r);
      cairo_line_to(cr, x - 1.1 * r, y - 0.8 * r);
      cairo_close_path(cr);
      break;
    default:
      cairo_move_to(cr, x - r, y - r);
      cairo_line_to(cr, x + r, y + r);
      cairo_move_to(cr, x + r, y - r);
      cairo_line_to(cr, x - r, y + r);
      break;
  }
}

void stroke_marker(cairo_t* cr, int kind, double x, double y, double r) {
  cairo_new_path(cr);
  marker(cr, kind, x, y, r);
  if (kind % kNumMarkers == kNumMarkers - 1) {
    cairo_set_line_width(cr, 2.2);
    cairo_stroke(cr);
  } else {
    cairo_fill_preserve(cr);
    cairo_save(cr);
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_set_line_width(cr, 1.0);
    cairo_stroke(cr);
    cairo_restore(cr);
  }
}

void set_dash(cairo_t* cr, int i) {
  // Past the palette the same colours come back dashed.
  if ((i / kNumColours) % 2 == 1) {
    const double d[] = {7, 4};
    cairo_set_dash(cr, d, 2, 0);
  } else {
    cairo_set_dash(cr, nullptr, 0, 0);
  }
}

struct Layout {
  double legend_w = 0, width = 0, height = kH;
};

const double kTitleSize = 17, kAxisSize = 14, kTickSize = 12.5, kLegendSize = 13;

Layout layout(cairo_t* cr, const Chart& c) {
  Layout l;
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, kLegendSize);
  double w = 0;
  for (const auto& s : c.series) {
    cairo_text_extents_t e;
    cairo_text_extents(cr, s.name.c_str(), &e);
    w = std::max(w, e.x_advance);
  }
  l.legend_w = c.series.empty() ? 0 : w + 64;
  l.width = kW + l.legend_w;
  l.height = std::max(kH, kTop + 30 + 22.0 * static_cast<double>(c.series.size()) + kBottom);
  // The title may be wider than the figure: widen it.
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
  cairo_set_font_size(cr, kTitleSize);
  cairo_text_extents_t e;
  cairo_text_extents(cr, c.title.c_str(), &e);
  l.width = std::max(l.width, e.x_advance + 40);
  return l;
}

// The plot box on the page and the data ranges it shows, with the mapping between them.
struct Frame {
  double x0 = 0, x1 = 0, y0 = 0, y1 = 0;  // the box, in page units
  double xl = 0, xh = 1, yl = 0, yh = 1;  // the data shown
  bool log_y = false;
  double X(double x) const { return x0 + (x - xl) / (xh - xl) * (x1 - x0); }
  double Y(double y) const {
    const double f = log_y ? (std::log10(y) - std::log10(yl)) / (std::log10(yh) - std::log10(yl)) : (y - yl) / (yh - yl);
    return y1 - f * (y1 - y0);
  }
};

Frame frame_of(const Chart& c, const Layout& L) {
  Frame F;
  F.x0 = kLeft, F.x1 = L.width - L.legend_w - kRight, F.y0 = kTop, F.y1 = L.height - kBottom;
  F.log_y = c.log_y;
  double xl = 0, xh = 1, yl = std::numeric_limits<double>::infinity(), yh = -yl;
  if (!c.categories.empty()) {
    xl = -0.5;
    xh = static_cast<double>(c.categories.size()) - 0.5;
  } else {
    xl = std::numeric_limits<double>::infinity();
    xh = -xl;
    for (const auto& s : c.series)
      for (double x : s.x) xl = std::min(xl, x), xh = std::max(xh, x);
    if (!(xh > xl)) xl = std::isfinite(xl) ? xl - 1 : 0, xh = std::isfinite(xh) ? xh + 1 : 1;
    xl = std::min(xl, 0.0);
  }
  for (const auto& s : c.series)
    for (const auto* ys : {&s.y, &s.lo, &s.hi})
      for (double y : *ys)
        if (std::isfinite(y) && (!c.log_y || y > 0)) yl = std::min(yl, y), yh = std::max(yh, y);
  if (c.y_span) yl = std::min(yl, c.y_span->first), yh = std::max(yh, c.y_span->second);
  if (!std::isfinite(yl)) yl = 0, yh = 1;
  if (c.log_y) {
    yl = std::pow(10.0, std::floor(std::log10(yl)));
    yh = std::pow(10.0, std::ceil(std::log10(yh)));
    if (yh <= yl) yh = yl * 10;
  } else {
    if (!(yh > yl)) yh = yl + 1;
    const double pad = 0.04 * (yh - yl);
    yl -= pad;
    yh += pad;
  }
  if (c.categories.empty()) {
    const double pad = 0.02 * (xh - xl);
    xl -= pad;
    xh += pad;
  }
  F.xl = xl, F.xh = xh, F.yl = yl, F.yh = yh;
  return F;
}

// The chart's shaded x interval, behind everything, named below the tick labels where no line can cross it.
void draw_shade(cairo_t* cr, const Chart& c, const Frame& F) {
  if (!c.shade_x) return;
  const double a = F.X(std::max(c.shade_x->first, F.xl)), b = F.X(std::min(c.shade_x->second, F.xh));
  cairo_set_source_rgb(cr, 0.90, 0.92, 0.95);
  cairo_rectangle(cr, a, F.y0, b - a, F.y1 - F.y0);
  cairo_fill(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_ITALIC, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, kTickSize);
  cairo_set_source_rgb(cr, 0.35, 0.40, 0.50);
  text_at(cr, "(" + c.shade_label + ")", (a + b) / 2, F.y1 + 28, 0.5, 1.0);
}

// Grid lines with their tick labels, then the box.
void draw_axes(cairo_t* cr, const Chart& c, const Frame& F) {
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, kTickSize);
  cairo_set_line_width(cr, 1);
  std::vector<double> yt;
  if (c.log_y) {
    for (double v = F.yl; v <= F.yh * 1.0001; v *= 10) yt.push_back(v);
  } else {
    yt = nice_ticks(F.yl, F.yh, 6);
  }
  for (double v : yt) {
    const double y = std::round(F.Y(v)) + 0.5;
    cairo_set_source_rgb(cr, 0.86, 0.86, 0.86);
    cairo_move_to(cr, F.x0, y);
    cairo_line_to(cr, F.x1, y);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    text_at(cr, tick_text(v), F.x0 - 8, y, 1.0, 0.5);
  }
  std::vector<std::pair<double, std::string>> xt;  // position, label
  if (!c.categories.empty()) {
    for (size_t i = 0; i < c.categories.size(); ++i) xt.emplace_back(static_cast<double>(i), c.categories[i]);
  } else {
    for (double v : nice_ticks(std::max(F.xl, 0.0), F.xh, 7)) xt.emplace_back(v, tick_text(v));
  }
  for (const auto& [v, text] : xt) {
    const double x = std::round(F.X(v)) + 0.5;
    cairo_set_source_rgb(cr, 0.93, 0.93, 0.93);
    cairo_move_to(cr, x, F.y0);
    cairo_line_to(cr, x, F.y1);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    text_at(cr, text, x, F.y1 + 10, 0.5, 1.0);
  }
  cairo_set_source_rgb(cr, 0.25, 0.25, 0.25);
  cairo_set_line_width(cr, 1.2);
  cairo_rectangle(cr, F.x0, F.y0, F.x1 - F.x0, F.y1 - F.y0);
  cairo_stroke(cr);
}

// Each series' band (translucent, one polygon per run of points that have one), then every line with its markers,
// clipped to the box. Each series is shifted a little sideways (a fraction of a category, or a few pixels on a
// numeric axis), so models with equal values (all at chance, say) stay visible side by side instead of hiding
// behind the last one drawn.
void draw_series(cairo_t* cr, const Chart& c, const Frame& F) {
  cairo_save(cr);
  cairo_rectangle(cr, F.x0, F.y0, F.x1 - F.x0, F.y1 - F.y0);
  cairo_clip(cr);
  const double n_series = static_cast<double>(c.series.size());
  const double dodge = c.categories.empty() ? std::min(3.0, 18.0 / std::max(1.0, n_series))
                                            : std::min(0.05, 0.4 / std::max(1.0, n_series));
  auto dodged = [&](size_t i) {
    const double dx = dodge * (static_cast<double>(i) - (n_series - 1) / 2);
    return [&, dx](double x) { return c.categories.empty() ? F.X(x) + dx : F.X(x + dx); };
  };
  auto shown = [&](double y) { return std::isfinite(y) && (!c.log_y || y > 0); };
  for (size_t i = 0; i < c.series.size(); ++i) {
    const auto& s = c.series[i];
    if (s.lo.size() != s.x.size() || s.hi.size() != s.x.size()) continue;
    const auto X = dodged(i);
    const Rgb col = kColours[s.style % kNumColours];
    cairo_set_source_rgba(cr, col.r, col.g, col.b, 0.18);
    auto ok = [&](size_t k) { return shown(s.lo[k]) && shown(s.hi[k]); };
    for (size_t a = 0; a < s.x.size();) {
      if (!ok(a)) {
        ++a;
        continue;
      }
      size_t b = a;
      while (b + 1 < s.x.size() && ok(b + 1)) ++b;
      cairo_new_path(cr);
      for (size_t k = a; k <= b; ++k) cairo_line_to(cr, X(s.x[k]), F.Y(s.hi[k]));
      for (size_t k = b + 1; k-- > a;) cairo_line_to(cr, X(s.x[k]), F.Y(s.lo[k]));
      cairo_close_path(cr);
      cairo_fill(cr);
      a = b + 1;
    }
  }
  const double mr = 4.5;
  for (size_t i = 0; i < c.series.size(); ++i) {
    const auto& s = c.series[i];
    const auto X = dodged(i);
    const Rgb col = kColours[s.style % kNumColours];
    cairo_set_source_rgb(cr, col.r, col.g, col.b);
    cairo_set_line_width(cr, 2.2);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    set_dash(cr, s.style);
    bool open = false;
    cairo_new_path(cr);
    for (size_t k = 0; k < s.x.size(); ++k) {
      if (!shown(s.y[k])) {
        open = false;
        continue;
      }
      if (open)
        cairo_line_to(cr, X(s.x[k]), F.Y(s.y[k]));
      else
        cairo_move_to(cr, X(s.x[k]), F.Y(s.y[k]));
      open = true;
    }
    cairo_stroke(cr);
    cairo_set_dash(cr, nullptr, 0, 0);
    const size_t every = std::max<size_t>(1, s.x.size() / 25);  // dense curves: markers on a subset
    for (size_t k = 0; k < s.x.size(); k += every)
      if (shown(s.y[k])) stroke_marker(cr, s.style, X(s.x[k]), F.Y(s.y[k]), mr);
  }
  cairo_restore(cr);
}

void draw_titles(cairo_t* cr, const Chart& c, const Frame& F, const Layout& L) {
  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
  cairo_set_font_size(cr, kTitleSize);
  text_at(cr, c.title, L.width / 2, 22, 0.5, 1.0);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, kAxisSize);
  text_at(cr, c.x_title, (F.x0 + F.x1) / 2, L.height - 18, 0.5, 0.0);
  cairo_save(cr);
  cairo_translate(cr, 26, (F.y0 + F.y1) / 2);
  cairo_rotate(cr, -M_PI / 2);
  text_at(cr, c.y_title, 0, 0, 0.5, 0.5);
  cairo_restore(cr);
}

// Right of the box: each series' line and marker with its name.
void draw_legend(cairo_t* cr, const Chart& c, const Frame& F) {
  if (c.series.empty()) return;
  const double lx = F.x1 + 22, ly = F.y0 + 4, row = 22;
  cairo_set_font_size(cr, kLegendSize);
  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  for (size_t i = 0; i < c.series.size(); ++i) {
    const int style = c.series[i].style;
    const Rgb col = kColours[style % kNumColours];
    const double y = ly + row * (static_cast<double>(i) + 0.5);
    cairo_set_source_rgb(cr, col.r, col.g, col.b);
    cairo_set_line_width(cr, 2.2);
    set_dash(cr, style);
    cairo_move_to(cr, lx, y);
    cairo_line_to(cr, lx + 34, y);
    cairo_stroke(cr);
    cairo_set_dash(cr, nullptr, 0, 0);
    stroke_marker(cr, style, lx + 17, y, 4.5);
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    text_at(cr, c.series[i].name, lx + 44, y, 0.0, 0.35);
  }
}

void draw_chart(cairo_t* cr, const Chart& c, const Layout& L) {
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  const Frame F = frame_of(c, L);
  draw_shade(cr, c, F);
  draw_axes(cr, c, F);
  draw_series(cr, c, F);
  draw_titles(cr, c, F, L);
  draw_legend(cr, c, F);
}

cairo_status_t append(void* closure, const unsigned char* data, unsigned int n) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), n);
  return CAIRO_STATUS_SUCCESS;
}

}  // namespace

void write_chart(const Chart& chart, const std::string& base) {
  // Measure with a scratch surface, then draw the same routine onto each surface.
  cairo_surface_t* scratch = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, 1, 1);
  cairo_t* m = cairo_create(scratch);
  const Layout L = layout(m, chart);
  cairo_destroy(m);
  cairo_surface_destroy(scratch);
  const int w = static_cast<int>(std::ceil(L.width)), h = static_cast<int>(std::ceil(L.height));

  std::string png;
  {
    cairo_surface_t* s = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, w, h);
    cairo_t* cr = cairo_create(s);
    draw_chart(cr, chart, L);
    cairo_destroy(cr);
    const cairo_status_t st = cairo_surface_write_to_png_stream(s, append, &png);
    cairo_surface_destroy(s);
    if (st != CAIRO_STATUS_SUCCESS)
      throw UserError(fmt::format("cannot draw '{}.png': {}", base, cairo_status_to_string(st)));
  }
  std::string svg;
  {
    cairo_surface_t* s = cairo_svg_surface_create_for_stream(append, &svg, w, h);
    cairo_t* cr = cairo_create(s);
    draw_chart(cr, chart, L);
    cairo_destroy(cr);
    cairo_surface_finish(s);
    const cairo_status_t st = cairo_surface_status(s);
    cairo_surface_destroy(s);
    if (st != CAIRO_STATUS_SUCCESS)
      throw UserError(fmt::format("cannot draw '{}.svg': {}", base, cairo_status_to_string(st)));
  }
  write_file_atomic(base + ".png", png);
  write_file_atomic(base + ".svg", svg);
}

#endif

}  // namespace memlab
