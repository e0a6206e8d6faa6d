#pragma once
// File output that never leaves a half-written result: write to a temporary then rename.
#include <string>

namespace memlab {

// Writes path.tmp.<pid>, then renames it over path; on any failure (a full disk, say) the temporary is removed
// and a UserError names the path and the reason.
void write_file_atomic(const std::string& path, const std::string& content);
// write_file_atomic in two halves, for files that must change together: write each one's temporary, then commit
// them all. A kill leaves all old or all new but within the renames' microseconds. write_temporary returns the
// temporary's name; on failure it removes it and throws as above, and so does commit_temporary.
std::string write_temporary(const std::string& path, const std::string& content);
void commit_temporary(const std::string& tmp, const std::string& path);
// Removes dir's temporaries (NAME.tmp.<pid>) left by processes that are gone, or by this one.
void remove_stale_temporaries(const std::string& dir);
std::string read_file(const std::string& path);
// Create `dir` (and parents) and check a file can be written there; UserError naming the path otherwise.
void ensure_writable_dir(const std::string& dir);
bool path_exists(const std::string& path);
bool is_directory(const std::string& path);
// True when dir exists and holds at least one entry.
bool dir_non_empty(const std::string& dir);
void remove_tree(const std::string& path);
std::string join_path(const std::string& a, const std::string& b);

}  // namespace memlab
