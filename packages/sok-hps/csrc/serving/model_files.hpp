// The embedding tables a ps_config's sparse_files name, read in chunks, in C++ (no Python, no
// TensorFlow) for the C++ server of docs/design/hps-serving.md. It mirrors
// hierarchical_parameter_server/model_files.py: the same formats, checks, keys, rows and messages,
// word for word (tests/test_model_files_cpp.py holds the two equal).
//
// An entry of sparse_files is one of:
//  * the original's sparse-model directory: <entry>/key (int64 [N]) and <entry>/emb_vector (float32
//    [N, dim], row i for key[i]), both without header; format() "hps";
//  * one table of a sok.dump (or NVIDIA SOK) checkpoint, named <checkpoint dir>/<table>: the files
//    <table>-key and <table>-weight, read and checked as sok-core's checkpoint/format.py and
//    directory.py read them (checkpoint_format.hpp, checkpoint_manifest.hpp, checkpoint_directory.hpp:
//    headers, sizes, the manifest, the CRC-32 checksums; only the weights); format() "sok". The key
//    file is checksummed at open, the weight file by verify() (call it before storing any row) and
//    while chunks are read.
// Keys come out as int64 in file order (uint64 keys keep their bits, int32 and uint32 keys widen);
// the weights are memory-mapped, never read whole into memory.
//
// An error of the system other than a missing file (permission denied, an I/O error, a checkpoint
// file that is a directory) is an OsError (py_errors.hpp), with the str() of Python's OSError.
//
// Differences from model_files.py: chunks(n) refuses n < 1 when called (Python's generator at its
// first item); a checkpoint file that is a directory is "[Errno 21] Is a directory" (Python's adds
// the number of the descriptor os.fdopen was given); a file truncated between the check of its size
// and its reading is CheckpointError's "ended N bytes early" (NumPy's memmap and np.fromfile fail
// their own ways); those of checkpoint_directory.hpp; a file name holding the 3-byte code of a
// surrogate is written as that surrogate (utf8.hpp); an integer of manifest.json outside
// [-2**63, 2**64 - 1] is a parse error (json.hpp), and one above int64 where a count or a width is
// read says it does not fit int64 (Python names the field's value).
//
// Example:
//   sok::hps::TableSource table = sok::hps::open_table("model/emb0", 16);
//   table.rows();                                       // 30000
//   table.verify();                                     // ModelFileError if the weights are corrupt
//   std::vector<int64_t> keys(4096);
//   std::vector<float> rows(4096 * 16);
//   sok::hps::TableChunks chunks = table.chunks(4096);
//   while (int64_t n = chunks.next(keys.data(), rows.data())) tier.insert("emb0", n, keys.data(), rows.data());
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace sok::hps {

// model_files.KEY_FILE, model_files.VECTOR_FILE: the files of a sparse-model directory.
constexpr char kKeyFile[] = "key";
constexpr char kVectorFile[] = "emb_vector";

// model_files.ModelFileError: a table's files cannot be served; the message names the file, what is
// wrong and how to fix it.
class ModelFileError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class TableChunks;

// model_files.TableSource: the rows of one table on disk (cheap to copy: the copies share the files).
class TableSource {
 public:
  // The sparse_files entry, as given.
  const std::string& path() const;
  // Keys in the table.
  int64_t rows() const;
  // Floats per row.
  int64_t dim() const;
  // "hps" (a sparse-model directory) or "sok" (a checkpoint table).
  const std::string& format() const;
  // Every key, in file order.
  const std::vector<int64_t>& keys() const;
  // Check a checkpoint's weight file against the manifest's checksum, reading it once (nothing to
  // check for a sparse-model directory or a checkpoint without manifest). ModelFileError on a mismatch.
  void verify() const;
  // The rows in file order, chunk_rows at a time (std::invalid_argument when below 1).
  TableChunks chunks(int64_t chunk_rows) const;

  struct Data;  // what open_table read

 private:
  friend TableSource open_table(const std::string& path, int64_t dim);
  friend class TableChunks;
  explicit TableSource(std::shared_ptr<const Data> data) : data_(std::move(data)) {}
  std::shared_ptr<const Data> data_;
};

// model_files.TableSource.chunks: a table's rows in file order, read chunk by chunk; a checkpoint's
// weight file is checksummed while it is read too.
class TableChunks {
 public:
  // Copy the next rows (at most chunk_rows) to keys [n] and rows [n, dim]; returns n, 0 after the last
  // chunk, once the weight file's checksum is checked (ModelFileError on a mismatch: a file changed
  // since verify).
  int64_t next(int64_t* keys, float* rows);
  // The rows the next call of next() copies (0: none left).
  int64_t next_size() const;

 private:
  friend class TableSource;
  TableChunks(std::shared_ptr<const TableSource::Data> data, int64_t chunk_rows);
  std::shared_ptr<const TableSource::Data> data_;
  int64_t chunk_rows_;
  int64_t first_ = 0;
  uint32_t crc_ = 0;
  bool done_ = false;
};

// model_files.open_table: open one table of sparse_files (a sparse-model directory, or
// <checkpoint dir>/<table> of a sok.dump checkpoint) and check its files against `dim`, the row width
// of the ps_config. ModelFileError: the entry is neither; a file is empty, truncated, or not
// rows x dim; the checkpoint is inconsistent.
TableSource open_table(const std::string& path, int64_t dim);

}  // namespace sok::hps
