// A checkpoint's manifest.json, read and validated whole as sok-core's format.Manifest.from_json does
// (sparse_operation_kit/checkpoint/format.py): UTF-8 JSON of format version 1, every field of the
// manifest and of each table entry checked for its type and value, with format.py's messages word for
// word (tests/test_model_files_cpp.py holds them equal). Kept: what the model files read of a table.
//
// Example:
//   Manifest m = parse_manifest(bytes, "ckpt/manifest.json");   // CheckpointError if invalid
//   const TableEntry* entry = m.find("emb_0");                  // nullptr if not listed
//   check_against_manifest("ckpt", "emb_0", &m, key_info, weight_info, 8);
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "checkpoint_format.hpp"

namespace sok::hps::checkpoint {

// format.FORMAT_VERSION, format.MANIFEST: the version of manifest.json this reader reads, its name.
constexpr int64_t kFormatVersion = 1;
constexpr char kManifest[] = "manifest.json";
// sparse_operation_kit.dtypes.STATIC_ROW_DTYPES: a table entry's row dtypes.
constexpr const char* kRowDtypes[] = {"float32", "float16", "bfloat16"};
// format.TABLE_KINDS: a table entry's kinds.
constexpr const char* kTableKinds[] = {"dynamic", "static"};

// format.TableEntry, the fields the model files read.
struct TableEntry {
  int64_t dim = 0;
  int64_t rows = 0;
  std::string key_dtype;
  std::vector<std::pair<std::string, std::string>> crc32;  // file name -> 8 hex digits, in the file's order

  // The checksum of the file `name`, nullptr where the entry has none.
  const std::string* crc32_of(const std::string& name) const;
};

// format.Manifest: its tables, in the file's order. Table and file names are os.fsencode's of
// the JSON's strs (py_fsencode), to compare with the names of files.
struct Manifest {
  std::vector<std::pair<std::string, TableEntry>> tables;

  // The entry of `table`, nullptr where the manifest does not list it.
  const TableEntry* find(const std::string& table) const;
};

// format.check_against_manifest(path, table, manifest, [key_info, weight_info], dim): the manifest's
// entry of `table` (nullptr without a manifest) must describe its files (rows, dim, key dtype, one
// checksum per file); CheckpointError naming the manifest and what differs.
const TableEntry* check_against_manifest(const std::string& path, const std::string& table, const Manifest* manifest,
                                         const FileInfo& key_info, const FileInfo& weight_info, int64_t dim);

// format.Manifest.from_json(raw, path): CheckpointError naming `path`, the field, its value and what is valid.
Manifest parse_manifest(std::string_view raw, const std::string& path);

}  // namespace sok::hps::checkpoint
