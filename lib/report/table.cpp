#include "report/table.h"

#include <fmt/format.h>

#include <cmath>

#include "core/errors.h"
#include "report/paper_values.h"

namespace memlab {

const char* const kPlusMinus = "\xC2\xB1";

const char* const kReportCsvHeader = "kind,label,task,lr,seed,step,length_min,length_max,seeds,metric,value,mad";

Format parse_format(const std::string& s) {
  if (s == "md") return Format::Markdown;
  if (s == "csv") return Format::Csv;
  if (s == "tex") return Format::Tex;
  throw UserError(fmt::format("unknown report format '{}' (allowed: md, csv, tex)", s));
}

const char* format_extension(Format f) { return f == Format::Markdown ? "md" : f == Format::Csv ? "csv" : "tex"; }

namespace {


std::string metric_phrase(const Report& rep) {
  return rep.options.metric == Metric::Normalized ? "normalised accuracy [%] (0 = chance)" : "accuracy [%]";
}

std::string step_phrase(const Report& rep) {
  return rep.options.select == Select::Final ? "at the final evaluation" : "at the best evaluation over training";
}

std::string headline_phrase(const Report& rep) {
  bool same = true;
  for (const auto& r : rep.eval_len) same = same && r == rep.eval_len.front();
  if (same) return "lengths " + range_name(rep.eval_len.front());
  std::string s = "lengths ";
  for (size_t t = 0; t < rep.tasks.size(); ++t)
    s += fmt::format("{}{} ({})", t ? ", " : "", range_name(rep.eval_len[t]), task_title(rep.tasks[t]));
  return s;
}

// One decimal as the paper; never "-0.0".
std::string num(double v) { return std::fabs(v) < 0.05 ? "0.0" : fmt::format("{:.1f}", v); }

std::vector<TextTable> build_tables(const Report& rep) {
  std::vector<TextTable> out;
  std::vector<std::string> head{"Model"};
  for (const auto& t : rep.tasks) head.push_back(task_title(t));

  TextTable best{fmt::format("Best over seeds: {} {} on {}, at the learning rate whose best seed is highest "
                             "(HQLT paper, Table 3)",
                             metric_phrase(rep), step_phrase(rep), headline_phrase(rep)),
                 head,
                 {}};
  TextTable med{fmt::format("Median {} MAD over seeds: {} {} on {}, at the learning rate whose median is highest "
                            "(HQLT paper, Table 6)",
                            kPlusMinus, metric_phrase(rep), step_phrase(rep), headline_phrase(rep)),
                head,
                {}};
  TextTable lrs{"Learning rate chosen (seeds at it): for the best, and for the median where it differs", head, {}};
  for (const auto& label : rep.labels) {
    std::vector<std::string> b{label}, m{label}, l{label};
    for (const auto& task : rep.tasks) {
      const Cell* c = rep.cell(label, task);
      if (!c) {
        b.push_back("-");
        m.push_back("-");
        l.push_back("-");
        continue;
      }
      b.push_back(num(c->by_max().max));
      m.push_back(fmt::format("{} {} {}", num(c->by_median().median), kPlusMinus, num(c->by_median().mad)));
      const auto& x = c->by_max();
      const auto& y = c->by_median();
      l.push_back(c->best_lr == c->median_lr
                      ? fmt::format("{:g} ({})", x.lr, x.seeds.size())
                      : fmt::format("best {:g} ({}), median {:g} ({})", x.lr, x.seeds.size(), y.lr, y.seeds.size()));
    }
    best.rows.push_back(b);
    med.rows.push_back(m);
    lrs.rows.push_back(l);
  }
  if (rep.options.paper) {
    add_paper_columns(best, "best", rep.tasks, false, *rep.options.paper);
    add_paper_columns(med, "median", rep.tasks, false, *rep.options.paper);
  }
  out.push_back(best);
  out.push_back(med);
  out.push_back(lrs);

  for (size_t t = 0; t < rep.tasks.size(); ++t) {
    const auto& task = rep.tasks[t];
    TextTable len{fmt::format("Length generalisation on {}: {} {} by length range, of the best seed at the best "
                              "learning rate; trained on lengths {}",
                              task_title(task), metric_phrase(rep), step_phrase(rep), range_name(rep.train_len[t])),
                  {"Model"},
                  {}};
    for (const auto& r : rep.ranges[t]) len.header.push_back(range_name(r));
    len.header.push_back("lr / seed / step");
    for (const auto& label : rep.labels) {
      const Cell* c = rep.cell(label, task);
      if (!c) continue;
      const Score& s = c->best_run();
      std::vector<std::string> row{label};
      for (const auto& r : rep.ranges[t]) {
        const EvalPoint* e = find_eval(*s.run, s.step, r);
        row.push_back(e ? num(metric_value(*e, rep.options.metric)) : "-");
      }
      row.push_back(fmt::format("{:g} / {} / {}", s.run->lr, s.run->seed, s.step));
      len.rows.push_back(row);
    }
    out.push_back(len);
  }
  return out;
}

std::string md_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '|') o += '\\';
    o += ch;
  }
  return o;
}

std::string tex_escape(const std::string& s) {
  std::string o;
  for (size_t i = 0; i < s.size(); ++i) {
    const char ch = s[i];
    if (s.compare(i, 2, kPlusMinus) == 0) {
      o += "$\\pm$";
      ++i;
    } else if (ch == '\\') {
      o += "\\textbackslash{}";
    } else if (ch == '~') {
      o += "\\textasciitilde{}";
    } else if (ch == '^') {
      o += "\\textasciicircum{}";
    } else if (std::string("&%$#_{}").find(ch) != std::string::npos) {
      o += '\\';
      o += ch;
    } else if (ch == '-' && s == "-") {
      o += "--";
    } else {
      o += ch;
    }
  }
  return o;
}

}  // namespace

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string o = "\"";
  for (char ch : s) o += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return o + "\"";
}

std::string render_markdown(const std::vector<TextTable>& tables, const std::vector<std::string>& notes) {
  std::string s;
  for (const auto& t : tables) {
    s += md_escape(t.title) + "\n\n|";
    for (const auto& h : t.header) s += " " + md_escape(h) + " |";
    s += "\n|";
    for (size_t i = 0; i < t.header.size(); ++i) s += i ? "---:|" : "---|";
    s += "\n";
    for (const auto& row : t.rows) {
      s += "|";
      for (const auto& c : row) s += " " + md_escape(c) + " |";
      s += "\n";
    }
    s += "\n";
  }
  if (!notes.empty()) {
    s += "Notes:\n\n";
    for (const auto& n : notes) s += "- " + md_escape(n) + "\n";
  }
  return s;
}

std::string render_tex(const std::vector<TextTable>& tables, const std::vector<std::string>& notes) {
  std::string s = "% memlab report; needs \\usepackage{booktabs}\n";
  for (const auto& t : tables) {
    s += "\n% " + t.title + "\n\\begin{tabular}{l" + std::string(t.header.size() - 1, 'r') + "}\n\\toprule\n";
    for (size_t i = 0; i < t.header.size(); ++i) s += (i ? " & " : "") + tex_escape(t.header[i]);
    s += " \\\\\n\\midrule\n";
    for (const auto& row : t.rows) {
      for (size_t i = 0; i < row.size(); ++i) s += (i ? " & " : "") + tex_escape(row[i]);
      s += " \\\\\n";
    }
    s += "\\bottomrule\n\\end{tabular}\n";
  }
  for (const auto& n : notes) s += "% note: " + n + "\n";
  return s;
}

std::string render_csv(const std::vector<TextTable>& tables) {
  std::string s;
  for (size_t i = 0; i < tables.size(); ++i) {
    s += "table";
    for (const auto& h : tables[i].header) s += "," + csv_field(h);
    s += "\n";
    for (const auto& row : tables[i].rows) {
      s += std::to_string(i);
      for (const auto& c : row) s += "," + csv_field(c);
      s += "\n";
    }
  }
  return s;
}

std::string format_markdown(const Report& rep) { return render_markdown(build_tables(rep), rep.notes); }

std::string format_tex(const Report& rep) { return render_tex(build_tables(rep), rep.notes); }

std::string format_csv(const Report& rep) {
  const std::string metric = metric_name(rep.options.metric);
  std::string s = std::string(kReportCsvHeader) + "\n";
  auto line = [&](const char* kind, const std::string& label, const std::string& task, double lr, std::string seed,
                  std::string step, const Range& r, size_t seeds, double value, std::string mad) {
    s += fmt::format("{},{},{},{:g},{},{},{},{},{},{},{:.6g},{}\n", kind, csv_field(label), csv_field(task), lr, seed,
                     step, r.min, r.max, seeds, metric, value, mad);
  };
  for (const auto& c : rep.cells)
    for (const auto& g : c.lrs)
      for (const auto& sc : g.seeds)
        line("run", c.label, c.task, g.lr, std::to_string(sc.run->seed), std::to_string(sc.step), sc.run->eval_len, 1,
             sc.value, "");
  for (const auto& c : rep.cells) {
    const Score& b = c.best_run();
    line("best", c.label, c.task, c.by_max().lr, std::to_string(b.run->seed), std::to_string(b.step), b.run->eval_len,
         c.by_max().seeds.size(), c.by_max().max, "");
    const auto& m = c.by_median();
    line("median", c.label, c.task, m.lr, "", "", m.seeds.front().run->eval_len, m.seeds.size(), m.median,
         fmt::format("{:.6g}", m.mad));
  }
  if (const PaperValues* paper = rep.options.paper) {  // the paper's, as kind paper_best and paper_median
    for (const auto& c : rep.cells)
      for (const char* table : {"best", "median"})
        if (const PaperValue* v = paper->find(table, c.label, c.task))
          s += fmt::format("paper_{},{},{},,,,,,,{},{:.6g},{}\n", table, csv_field(c.label), csv_field(c.task), metric,
                           v->value, v->spread ? fmt::format("{:.6g}", *v->spread) : "");
  }
  for (const auto& c : rep.cells) {
    const Score& b = c.best_run();
    for (const auto& r : rep.ranges[rep.task_index(c.task)]) {
      const EvalPoint* e = find_eval(*b.run, b.step, r);
      if (e)
        line("length", c.label, c.task, b.run->lr, std::to_string(b.run->seed), std::to_string(b.step), r, 1,
             metric_value(*e, rep.options.metric), "");
    }
  }
  return s;
}

std::string format_report(const Report& rep, Format f) {
  return f == Format::Markdown ? format_markdown(rep) : f == Format::Csv ? format_csv(rep) : format_tex(rep);
}

}  // namespace memlab
