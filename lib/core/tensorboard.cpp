#include "core/tensorboard.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/crc.h"
#include "core/errors.h"
#include "core/io.h"

namespace memlab {
namespace {

// Protobuf wire format, the few pieces an Event needs.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
void tag(std::string& out, int field, int wire) { varint(out, static_cast<uint64_t>(field) << 3 | wire); }
template <typename T>
void fixed(std::string& out, int field, int wire, T v) {
  tag(out, field, wire);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64, arm64)
  out.append(b, sizeof(T));
}
void bytes_field(std::string& out, int field, const std::string& v) {
  tag(out, field, 2);
  varint(out, v.size());
  out += v;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event: wall_time = 1 (double), step = 2 (int64), file_version = 3, summary = 5, session_log = 6.
std::string event(int64_t step) {
  std::string e;
  fixed(e, 1, 1, now_s());
  tag(e, 2, 0);
  varint(e, static_cast<uint64_t>(step));
  return e;
}

uint32_t masked_crc(const std::string& s) {
  const uint32_t c = crc32c(s.data(), s.size());
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string host_name() {
  char buf[256] = {0};
  return gethostname(buf, sizeof(buf) - 1) == 0 ? std::string(buf) : std::string("localhost");
}

}  // namespace

bool is_event_file(const std::string& name) { return name.rfind("events.out.tfevents.", 0) == 0; }

EventWriter::EventWriter(const std::string& dir, int64_t resume_step) {
  if (dir.empty()) return;
  path_ = join_path(dir, fmt::format("events.out.tfevents.{}.{}.{}.memlab", static_cast<int64_t>(now_s()), host_name(),
                                     static_cast<long>(::getpid())));
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw UserError(fmt::format("cannot write '{}': {}", path_, std::strerror(errno)));
  std::string e = event(resume_step);
  bytes_field(e, 3, "brain.Event:2");
  write_event(e);
  if (resume_step > 0) {  // SessionLog{status: START} at step s: TensorBoard drops the points at s and after
    std::string log;
    tag(log, 1, 0);
    varint(log, 1);
    std::string s = event(resume_step + 1);
    bytes_field(s, 6, log);
    write_event(s);
  }
}

EventWriter::~EventWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void EventWriter::scalar(const std::string& name, int64_t step, double value) {
  if (fd_ < 0) return;
  std::string v;  // Summary.Value: tag = 1, simple_value = 2 (float)
  bytes_field(v, 1, name);
  fixed(v, 2, 5, static_cast<float>(value));
  std::string summary;  // Summary: value = 1 (repeated)
  bytes_field(summary, 1, v);
  std::string e = event(step);
  bytes_field(e, 5, summary);
  write_event(e);
}

void EventWriter::write_event(const std::string& data) {
  std::string rec;
  const uint64_t n = data.size();
  rec.append(reinterpret_cast<const char*>(&n), 8);
  const uint32_t len_crc = masked_crc(rec);
  rec.append(reinterpret_cast<const char*>(&len_crc), 4);
  rec += data;
  const uint32_t data_crc = masked_crc(data);
  rec.append(reinterpret_cast<const char*>(&data_crc), 4);
  size_t done = 0;
  while (done < rec.size()) {
    const ssize_t w = ::write(fd_, rec.data() + done, rec.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw UserError(fmt::format("cannot write '{}': {}", path_, std::strerror(w < 0 ? errno : EIO)));
    done += static_cast<size_t>(w);
  }
}

}  // namespace memlab
