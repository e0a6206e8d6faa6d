#pragma once
// A report as text: Markdown tables, booktabs LaTeX tabulars, or one long (tidy) CSV.
#include <string>

#include "report/aggregate.h"

namespace memlab {

enum class Format { Markdown, Csv, Tex };
Format parse_format(const std::string& s);  // UserError on anything but md|csv|tex
const char* format_extension(Format f);     // "md" | "csv" | "tex"

// Markdown: "Best" (max over seeds at the lr with the best max; the paper's Table 3), "Median ± MAD"
// (at the lr with the best median; Table 6), the learning rates and seed counts behind them, and one
// length-generalisation table per task; each under a line saying what its numbers are, then the notes.
std::string format_markdown(const Report& rep);

// The CSV columns, documented in `memlab report --help`.
extern const char* const kReportCsvHeader;
// One line per run (kind=run) and per aggregate (best, median, length); notes are not part of it.
std::string format_csv(const Report& rep);

// The same tables as format_markdown, as booktabs tabulars with their header lines as comments.
std::string format_tex(const Report& rep);

std::string format_report(const Report& rep, Format f);

}  // namespace memlab
