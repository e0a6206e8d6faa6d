#include "core/io.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstring>
#include <ftw.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/errors.h"

namespace fs = std::filesystem;

namespace memlab {

void write_file_atomic(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw UserError(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
    out << content;
    out.flush();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw UserError(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw UserError(fmt::format("cannot write '{}': {}", path, ec.message()));
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(fmt::format("cannot read '{}': {}", path, std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void ensure_writable_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw UserError(fmt::format("output directory '{}' cannot be created: {}", dir,
                                ec ? ec.message() : "a file of that name exists"));
  if (::access(dir.c_str(), W_OK) != 0)
    throw UserError(fmt::format("output directory '{}' is not writable: {}", dir, std::strerror(errno)));
}

bool path_exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

bool dir_non_empty(const std::string& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::directory_iterator(dir, ec) != fs::directory_iterator();
}

// POSIX nftw, not std::filesystem::remove_all: libtorch.so exports its own build of the latter, which the
// dynamic linker may pick and which crashed in memlab_tests.
void remove_tree(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return;
  nftw(
      path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) {
        ::remove(p);
        return 0;
      }, 64,
      FTW_DEPTH | FTW_PHYS);
}

std::string join_path(const std::string& a, const std::string& b) { return (fs::path(a) / b).string(); }

}  // namespace memlab
