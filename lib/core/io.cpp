#include "core/io.h"

#include <fmt/format.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/errors.h"

namespace fs = std::filesystem;

namespace memlab {

std::string write_temporary(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  auto fail = [&](int err) {
    ::unlink(tmp.c_str());
    throw UserError(fmt::format("cannot write '{}': {}", path, std::strerror(err)));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      fail(err);
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) fail(errno);
  return tmp;
}

void commit_temporary(const std::string& tmp, const std::string& path) {
  if (::rename(tmp.c_str(), path.c_str()) == 0) return;
  const int err = errno;
  ::unlink(tmp.c_str());
  throw UserError(fmt::format("cannot write '{}': {}", path, std::strerror(err)));
}

void write_file_atomic(const std::string& path, const std::string& content) {
  commit_temporary(write_temporary(path, content), path);
}

void remove_stale_temporaries(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const auto at = name.rfind(".tmp.");
    if (at == std::string::npos || at + 5 >= name.size()) continue;
    const std::string digits = name.substr(at + 5);
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const long pid = std::strtol(digits.c_str(), nullptr, 10);
    if (pid == ::getpid() || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH))
      ::unlink(e.path().c_str());
  }
}

std::string read_file(const std::string& path) {
  if (is_directory(path)) throw UserError(fmt::format("cannot read '{}': it is a directory, not a file", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(fmt::format("cannot read '{}': {}", path, std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw UserError(fmt::format("cannot read '{}': {}", path, std::strerror(errno)));
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

bool is_directory(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
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
