#pragma once
// A report as text: Markdown tables, booktabs LaTeX tabulars, or one long (tidy) CSV.
#include <string>
#include <vector>

#include "report/aggregate.h"

namespace memlab {

enum class Format { Markdown, Csv, Tex };
Format parse_format(const std::string& s);  // UserError on anything but md|csv|tex
const char* format_extension(Format f);     // "md" | "csv" | "tex"

// Markdown: "Best" (max over seeds at the lr with the best max; the paper's Table 3), "Median ± MAD"
// (at the lr with the best median; Table 6), the learning rates and seed counts behind them, and one
// length-generalisation table per task; each under a line saying what its numbers are, then the notes.
std::string format_markdown(const Report& rep);

// "±" in UTF-8, as the tables print a median and its MAD.
extern const char* const kPlusMinus;

// The CSV columns, documented in `memlab report --help`.
extern const char* const kReportCsvHeader;
// One line per run (kind=run) and per aggregate (best, median, length); notes are not part of it.
std::string format_csv(const Report& rep);

// The same tables as format_markdown, as booktabs tabulars with their header lines as comments.
std::string format_tex(const Report& rep);

std::string format_report(const Report& rep, Format f);

// A table before rendering: a line saying what its numbers are, a header row, body rows; the first
// column is left-aligned, the others right-aligned. Other protocols' tables (report/protocol.h) render
// through the same functions.
struct TextTable {
  std::string title;
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
};
std::string render_markdown(const std::vector<TextTable>& tables, const std::vector<std::string>& notes);
std::string render_tex(const std::vector<TextTable>& tables, const std::vector<std::string>& notes);
// s as one CSV field: quoted where it holds a comma, a quote or a newline.
std::string csv_field(const std::string& s);
// Each table as CSV lines "table,<header...>" then "<title index>,<row...>": one block per table.
std::string render_csv(const std::vector<TextTable>& tables);

}  // namespace memlab
