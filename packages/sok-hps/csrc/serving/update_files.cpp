// The files of online updates (update_files.hpp): reading, checking and writing them.
#include "update_files.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "crc32.hpp"
#include "py_errors.hpp"
#include "py_path.hpp"
#include "py_text.hpp"
#include "utf8.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "update files are little-endian, as this host must be");

namespace sok::hps {
namespace {

constexpr char kMagicBytes[] = "HCTR";  // kUpdateMagic's bytes
constexpr size_t kHeadBytes = 16;        // magic, value size, version, key size, tag length (every version)
constexpr size_t kOrderBytes = 16;       // version 2, after the head: sequence, writer
constexpr size_t kCountBytes = 8;
constexpr size_t kCrcBytes = 4;
constexpr size_t kProbeBytes = kHeadBytes + kOrderBytes;  // the first read of a file
constexpr size_t kKeyBytes = 8;

template <class T>
T load(const unsigned char* at) {
  T value;
  std::memcpy(&value, at, sizeof(value));
  return value;
}

template <class T>
void store(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

std::string decimal(unsigned __int128 value) {
  std::string digits;
  do {
    digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(value % 10)));
    value /= 10;
  } while (value != 0);
  return digits;
}

// bytes.decode("utf-8", errors="replace"): each sequence Python's decoder refuses is one U+FFFD.
std::string decode_replace(std::string_view bytes) {
  std::string out;
  while (!bytes.empty()) {
    const std::optional<Utf8Error> error = first_utf8_error(bytes);
    if (!error) {
      out += bytes;
      break;
    }
    out += bytes.substr(0, error->start);
    append_utf8(out, 0xFFFD);
    bytes.remove_prefix(error->end);
  }
  return out;
}

// updates._TAG: hps_et.<model>.<table>, each name of NAME_PATTERN.
bool is_tag(const std::string& tag) {
  constexpr std::string_view kPrefix = "hps_et.";
  if (tag.compare(0, kPrefix.size(), kPrefix) != 0) return false;
  const std::string_view names = std::string_view(tag).substr(kPrefix.size());
  const size_t dot = names.find('.');
  return dot != std::string_view::npos && is_name(names.substr(0, dot)) && is_name(names.substr(dot + 1));
}

UpdateFileError bad(const std::string& path, const std::string& what) {
  return UpdateFileError("update file " + path + ": " + what);
}

UpdateIncomplete incomplete(const std::string& path, uint64_t size, const std::string& expected) {
  return UpdateIncomplete("update file " + path + ": " + std::to_string(size) + " bytes, but " + expected +
                          ": incomplete (truncated, or still being copied in)");
}

// Up to `bytes` bytes of fd at `out`, fewer only where the file ends; OsError where a read fails.
size_t read_up_to(int fd, void* out, size_t bytes) {
  auto* at = static_cast<char*>(out);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t count = ::read(fd, at + done, bytes - done);
    if (count < 0 && errno == EINTR) continue;
    if (count < 0) throw OsError(errno);
    if (count == 0) break;
    done += static_cast<size_t>(count);
  }
  return done;
}

void write_all(int fd, const char* data, size_t bytes) {
  while (bytes > 0) {
    const ssize_t count = ::write(fd, data, bytes);
    if (count < 0 && errno == EINTR) continue;
    if (count < 0) throw OsError(errno);
    data += count;
    bytes -= static_cast<size_t>(count);
  }
}

// updates._sequence_of_name: the sequence of a version-1 file, the time its name starts with.
uint64_t sequence_of_name(const std::string& path) {
  const std::string name = posixpath::basename(path);
  const bool timed = name.size() > 20 && name[20] == '-' &&
                     std::all_of(name.begin(), name.begin() + 20, [](char c) { return c >= '0' && c <= '9'; });
  if (!timed) {
    throw bad(path, std::string("format version 1 orders a file by the time its name starts with (<20 digits>-<pid>-") +
                        "<counter>" + kUpdateSuffix + "), and " + py_repr(name) +
                        " has none; give it back its name, or write its rows again with write_update");
  }
  unsigned __int128 time = 0;
  for (size_t i = 0; i < 20; ++i) time = time * 10 + static_cast<unsigned>(name[i] - '0');
  if (time > UINT64_MAX) {
    throw bad(path, "format version 1 orders a file by the time its name starts with, and " + py_repr(name) +
                        " starts with " + name.substr(0, 20) +
                        ", beyond 2**64 - 1 ns; give it back its name, or write its rows again with write_update");
  }
  return static_cast<uint64_t>(time);
}

// Copies `bytes` bytes of rows, which start at byte `at` of the rows' part of a file (rows of
// `row_bytes`: a key, then the values), to the keys and values they belong to.
void scatter(const char* data, size_t bytes, uint64_t at, uint64_t row_bytes, int64_t* keys, float* values,
             uint32_t dim) {
  while (bytes > 0) {
    const uint64_t row = at / row_bytes, in_row = at % row_bytes;
    size_t take;
    if (in_row < kKeyBytes) {
      take = static_cast<size_t>(std::min<uint64_t>(bytes, kKeyBytes - in_row));
      std::memcpy(reinterpret_cast<char*>(keys + row) + in_row, data, take);
    } else {
      take = static_cast<size_t>(std::min<uint64_t>(bytes, row_bytes - in_row));
      std::memcpy(reinterpret_cast<char*>(values + row * dim) + (in_row - kKeyBytes), data, take);
    }
    data += take;
    at += take;
    bytes -= take;
  }
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The generation of this process: 0, one more in each forked child (the writer ids drawn before
// the fork are the parent's).
std::atomic<uint64_t> fork_generation{0};

void after_fork_in_child() { fork_generation.fetch_add(1); }

}  // namespace

std::string UpdateHeader::model() const {
  const size_t start = tag.find('.') + 1;  // a checked tag: hps_et.<model>.<table>
  return tag.substr(start, tag.find('.', start) - start);
}

UpdateRows allocate_rows(uint64_t count, uint32_t dim) {
  struct Vectors {
    std::vector<int64_t> keys;
    std::vector<float> values;
  };
  auto rows = std::make_shared<Vectors>();
  rows->keys.resize(count);
  rows->values.resize(count * dim);
  return {rows->keys.data(), rows->values.data(), rows};
}

std::string not_regular_file(const std::string& path, unsigned mode) {
  const char* kind = S_ISLNK(mode) ? "a symbolic link"
                     : S_ISDIR(mode) ? "a directory"
                     : S_ISFIFO(mode) ? "a FIFO"
                                      : "a device or socket";
  return "update file " + path + ": " + kind +
         ", not a regular file: an update is a file written with write_update, never followed or waited on";
}

UpdateFile::UpdateFile(const std::string& path) {
  header_.path = path;
  if (path.find('\0') != std::string::npos) throw std::invalid_argument("embedded null byte");
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ELOOP) throw UpdateFileError(not_regular_file(path, S_IFLNK));
    throw OsError(errno, path);
  }
  fd_ = checkpoint::Fd(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) throw OsError(errno);
  if (!S_ISREG(st.st_mode)) throw UpdateFileError(not_regular_file(path, st.st_mode));
  size_ = static_cast<uint64_t>(st.st_size);
  read_header();
}

// updates._read_header: a 32-byte read, then the rest of the tag if it is longer; the size the
// header declares checked against the file's; leaves the file at its first row.
void UpdateFile::read_header() {
  const std::string& path = header_.path;
  std::string head(kProbeBytes, '\0');
  head.resize(read_up_to(fd_.get(), head.data(), kProbeBytes));
  if (head.size() < kHeadBytes) {
    const std::string first = head.substr(0, 4);
    if (std::string_view(kMagicBytes).substr(0, first.size()) != first) {
      throw bad(path, "it starts with " + py_bytes_repr(first) + ", not " + py_bytes_repr(kMagicBytes) +
                          ": not an update file");
    }
    throw incomplete(path, size_, "the header alone is " + std::to_string(kHeadBytes) + " bytes");
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(head.data());
  const auto magic = load<uint32_t>(bytes);
  const auto value_size = load<uint32_t>(bytes + 4);
  const auto version = load<uint16_t>(bytes + 8);
  const auto key_size = load<uint16_t>(bytes + 10);
  const auto tag_length = load<uint32_t>(bytes + 12);
  if (magic != kUpdateMagic) {
    throw bad(path, "magic " + py_hex(magic, 10) + " is not " + py_hex(kUpdateMagic, 10) + ": not an update file");
  }
  if (version != 1 && version != kUpdateFormatVersion) {
    throw bad(path, "format version " + std::to_string(version) + " is not 1 or " +
                        std::to_string(kUpdateFormatVersion) + "; write it with this version of sok-hps");
  }
  if (key_size != kKeyBytes || value_size < 4 || value_size % 4 != 0) {
    throw bad(path, "key size " + std::to_string(key_size) + " / value size " + std::to_string(value_size) +
                        ": expected 8-byte keys and float32 rows");
  }
  if (tag_length > kMaxTagBytes) {
    throw bad(path, "tag length " + std::to_string(tag_length) + " is over " + std::to_string(kMaxTagBytes) +
                        ": not an update file");
  }
  const size_t fixed = kHeadBytes + (version >= 2 ? kOrderBytes : 0);
  const size_t header_bytes = fixed + tag_length + kCountBytes;
  if (size_ < header_bytes) throw incomplete(path, size_, "its header is " + std::to_string(header_bytes) + " bytes");
  if (head.size() < header_bytes) {
    const size_t had = head.size();
    head.resize(header_bytes);
    if (had + read_up_to(fd_.get(), head.data() + had, header_bytes - had) < header_bytes) {
      throw incomplete(path, size_, "it ended while it was read");
    }
  } else {
    head.resize(header_bytes);
    if (::lseek(fd_.get(), static_cast<off_t>(header_bytes), SEEK_SET) < 0) throw OsError(errno);
  }
  bytes = reinterpret_cast<const unsigned char*>(head.data());
  const std::string tag = decode_replace(head.substr(fixed, tag_length));
  if (!is_tag(tag)) throw bad(path, "tag " + py_repr(tag) + " is not hps_et.<model>.<table>");
  const auto count = load<uint64_t>(bytes + fixed + tag_length);
  const uint32_t dim = value_size / 4;
  const unsigned __int128 expected =
      header_bytes + static_cast<unsigned __int128>(count) * (kKeyBytes + uint64_t{4} * dim) + kCrcBytes;
  const std::string what = "its header says " + std::to_string(count) + " rows of dim " + std::to_string(dim) + " (" +
                           decimal(expected) + " bytes)";
  if (size_ < expected) throw incomplete(path, size_, what);
  if (size_ > expected) throw bad(path, std::to_string(size_) + " bytes, but " + what + ": data after the end");
  header_.version = version;
  header_.dim = dim;
  header_.tag = tag;
  header_.count = count;
  if (version >= 2) {
    header_.sequence = load<uint64_t>(bytes + kHeadBytes);
    header_.writer = load<uint64_t>(bytes + kHeadBytes + 8);
  } else {
    header_.sequence = sequence_of_name(path);
    header_.writer = 0;
  }
  header_crc_ = update_crc32(head.data(), head.size());
}

// updates.read_update after the header: the rows in chunks of kUpdateChunkBytes, then the checksum.
Update UpdateFile::read(const RowAllocator& allocate) {
  const UpdateHeader& h = header_;
  UpdateRows rows = allocate(h.count, h.dim);
  const uint64_t row_bytes = kKeyBytes + uint64_t{4} * h.dim;
  const uint64_t total = h.count * row_bytes;  // below the file's size: read_header checked it
  std::vector<char> chunk(static_cast<size_t>(std::min<uint64_t>(total, kUpdateChunkBytes)));
  uint32_t crc = header_crc_;
  for (uint64_t done = 0; done < total;) {
    const size_t got =
        read_up_to(fd_.get(), chunk.data(), static_cast<size_t>(std::min<uint64_t>(total - done, chunk.size())));
    if (got == 0) throw incomplete(h.path, size_, "it ended while it was read");
    crc = update_crc32(chunk.data(), got, crc);
    scatter(chunk.data(), got, done, row_bytes, rows.keys, rows.values, h.dim);
    done += got;
  }
  unsigned char stored[kCrcBytes];
  if (read_up_to(fd_.get(), stored, kCrcBytes) != kCrcBytes || load<uint32_t>(stored) != crc) {
    throw bad(h.path, "checksum mismatch: the file is corrupt");
  }
  Update update;
  update.tag = h.tag;
  update.count = h.count;
  update.dim = h.dim;
  update.keys = rows.keys;
  update.values = rows.values;
  update.path = h.path;
  update.sequence = h.sequence;
  update.version = h.version;
  update.checksum = crc;
  update.writer = h.writer;
  update.rows = std::move(rows.owner);
  return update;
}

Update read_update(const std::string& path, const RowAllocator& allocate) { return UpdateFile(path).read(allocate); }

void check_update_name(const char* what, const std::string& name) {
  if (!is_name(name)) throw std::invalid_argument(update_name_error(what, py_repr(name)));
}

std::string update_name_error(const char* what, const std::string& name_repr) {
  return std::string(what) + " name " + name_repr + " is not 1 to " + std::to_string(kMaxNameLength) +
         " letters, digits, '_' or '-'";
}

uint64_t next_update_sequence() {
  static std::atomic<uint64_t> last{0};  // lock-free: a forked child never finds it held
  const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  uint64_t previous = last.load();
  uint64_t next;
  do {
    next = std::max(static_cast<uint64_t>(now), previous + 1);
  } while (!last.compare_exchange_weak(previous, next));
  return next;
}

uint64_t update_writer_id() {
  // Registered before the first id is drawn: a child forked before has no id to replace.
  static const int registered = ::pthread_atfork(nullptr, nullptr, after_fork_in_child);
  (void)registered;
  thread_local uint64_t id = 0, generation = 0;
  const uint64_t now = fork_generation.load();
  if (id == 0 || generation != now) {
    id = 0;
    generation = now;
    while (id == 0) {
      if (::getrandom(&id, sizeof(id), 0) != static_cast<ssize_t>(sizeof(id))) {
        if (errno == EINTR) continue;
        throw OsError(errno);
      }
    }
  }
  return id;
}

void make_directories(const std::string& path) {
  if (path.find('\0') != std::string::npos) throw std::invalid_argument("embedded null byte");
  auto [head, tail] = posixpath::split(path);
  if (tail.empty()) std::tie(head, tail) = posixpath::split(head);
  struct stat st;
  if (!head.empty() && !tail.empty() && ::stat(head.c_str(), &st) != 0) {
    try {
      make_directories(head);
    } catch (const OsError& error) {  // made meanwhile by another
      if (error.code() != EEXIST) throw;
    }
    if (tail == ".") return;
  }
  if (::mkdir(path.c_str(), 0777) != 0) {
    const int error = errno;
    if (!is_directory(path)) throw OsError(error, path);
  }
}

StagedUpdate stage_update(const std::string& directory, const std::string& model, const std::string& table,
                          const int64_t* keys, const float* values, uint64_t count, uint64_t dim) {
  check_update_name("model", model);
  check_update_name("table", table);
  if (dim < 1 || dim > kMaxUpdateDim) {
    throw std::invalid_argument("values must have dim >= 1 and <= " + std::to_string(kMaxUpdateDim) +
                                " (the format's value size is a u32 of 4 * dim), got dim " + std::to_string(dim));
  }
  const std::string tag = "hps_et." + model + "." + table;
  const uint64_t sequence = next_update_sequence();
  std::string head;
  store<uint32_t>(head, kUpdateMagic);
  store<uint32_t>(head, static_cast<uint32_t>(4 * dim));
  store<uint16_t>(head, kUpdateFormatVersion);
  store<uint16_t>(head, kKeyBytes);
  store<uint32_t>(head, static_cast<uint32_t>(tag.size()));
  store<uint64_t>(head, sequence);
  store<uint64_t>(head, update_writer_id());
  head += tag;
  store<uint64_t>(head, count);

  make_directories(directory);
  static std::atomic<uint64_t> counter{0};
  char name[96];
  std::snprintf(name, sizeof(name), "%020llu-%ld-%06llu%s", static_cast<unsigned long long>(sequence),
                static_cast<long>(::getpid()), static_cast<unsigned long long>(counter.fetch_add(1)), kUpdateSuffix);
  std::string temporary = posixpath::join(directory, ".XXXXXX.tmp");
  const int fd = ::mkostemps(temporary.data(), 4, O_CLOEXEC);
  if (fd < 0) throw OsError(errno, temporary);
  checkpoint::Fd file(fd);
  try {
    uint32_t crc = update_crc32(head.data(), head.size());
    write_all(fd, head.data(), head.size());
    const uint64_t row_bytes = kKeyBytes + uint64_t{4} * dim;
    const uint64_t rows_per_chunk = std::max<uint64_t>(1, kUpdateChunkBytes / row_bytes);
    std::vector<char> chunk(static_cast<size_t>(std::min(count, rows_per_chunk) * row_bytes));
    for (uint64_t first = 0; first < count; first += rows_per_chunk) {
      const uint64_t rows = std::min(rows_per_chunk, count - first);
      char* at = chunk.data();
      for (uint64_t i = first; i < first + rows; ++i) {
        std::memcpy(at, keys + i, kKeyBytes);
        std::memcpy(at + kKeyBytes, values + i * dim, row_bytes - kKeyBytes);
        at += row_bytes;
      }
      const size_t bytes = static_cast<size_t>(rows * row_bytes);
      crc = update_crc32(chunk.data(), bytes, crc);
      write_all(fd, chunk.data(), bytes);
    }
    write_all(fd, reinterpret_cast<const char*>(&crc), kCrcBytes);
    if (::fsync(fd) != 0) throw OsError(errno);
    if (::close(file.release()) != 0) throw OsError(errno);
  } catch (...) {
    ::unlink(temporary.c_str());
    throw;
  }
  return {temporary, posixpath::join(directory, name)};
}

std::string write_update(const std::string& directory, const std::string& model, const std::string& table,
                         const int64_t* keys, const float* values, uint64_t count, uint64_t dim) {
  const StagedUpdate staged = stage_update(directory, model, table, keys, values, count, dim);
  if (::rename(staged.temporary.c_str(), staged.path.c_str()) != 0) {
    const int error = errno;
    ::unlink(staged.temporary.c_str());
    throw OsError(error, staged.temporary, staged.path);
  }
  return staged.path;
}

}  // namespace sok::hps
