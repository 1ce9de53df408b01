// A checkpoint's manifest.json, validated as format.Manifest.from_json (checkpoint_manifest.hpp).
#include "checkpoint_manifest.hpp"

#include <algorithm>
#include <stdexcept>

#include "checkpoint_format.hpp"
#include "json.hpp"
#include "py_errors.hpp"
#include "py_path.hpp"
#include "py_text.hpp"

namespace sok::hps::checkpoint {
namespace {

using json::Type;

// format._Spec: the JSON types a field may have (a Python int is never a bool), the least integer
// value, and what is valid (in messages).
struct Spec {
  std::vector<Type> types;
  int64_t least;
  std::string what;
};

// format._MANIFEST_FIELDS (beside format_version and tables), in its order.
const std::pair<const char*, Spec> kManifestFields[] = {
    {"world_size", {{Type::kInt}, 1, "an integer >= 1"}},
    {"optimizer", {{Type::kString, Type::kNull}, 0, "a string or null"}},
    {"step", {{Type::kInt, Type::kNull}, 0, "an integer >= 0 or null"}},
    {"optimizer_step", {{Type::kInt, Type::kNull}, 0, "an integer >= 0 or null"}},
};

// format._TABLE_FIELDS, in its order.
const std::vector<std::pair<std::string, Spec>>& table_fields() {
  static const std::vector<std::pair<std::string, Spec>> fields = {
      {"variable", {{Type::kString}, 0, "a string"}},
      {"dim", {{Type::kInt}, 1, "an integer >= 1"}},
      {"rows", {{Type::kInt}, 0, "an integer >= 0"}},
      {"key_dtype", {{Type::kString}, 0, "one of " + joined(kKeyFileDtypes)}},
      {"dtype", {{Type::kString}, 0, "one of " + joined(kRowDtypes)}},
      {"slots", {{Type::kArray}, 0, "a list of slot names"}},
      {"kind", {{Type::kString}, 0, "\"dynamic\" or \"static\""}},
      {"mode", {{Type::kString, Type::kNull}, 0, "a string or null"}},
      {"crc32", {{Type::kObject}, 0, "an object of file name -> 8 hex digits"}},
  };
  return fields;
}

// format._REQUIRED_TABLE_FIELDS.
constexpr const char* kRequiredTableFields[] = {"dim", "rows", "key_dtype", "slots"};

const std::string& what_of(const std::string& field) {
  for (const auto& [name, spec] : table_fields()) {
    if (name == field) return spec.what;
  }
  throw std::logic_error("no table field " + field);
}

// format._bad: the field `name` (its dotted path) of the manifest `path` is `value`, not `what`.
CheckpointError bad(const std::string& path, const std::string& name, const json::Value& value,
                    const std::string& what) {
  return CheckpointError(path + ": field " + name + " is " + py_repr(value) + "; expected " + what +
                         ". The manifest is corrupt");
}

// format._check.
void check(const std::string& path, const std::string& name, const json::Value& value, const Spec& spec) {
  bool typed = false;
  for (const Type t : spec.types) typed = typed || value.type() == t;
  if (!typed || (value.type() == Type::kInt && value.as_int() < spec.least)) throw bad(path, name, value, spec.what);
}

template <size_t N>
bool one_of(const std::string& value, const char* const (&names)[N]) {
  for (const char* name : names) {
    if (value == name) return true;
  }
  return false;
}

bool hex_digits(const std::string& s) {
  for (const char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return false;
  }
  return true;
}

// format.TableEntry.from_dict.
TableEntry table_entry(const std::string& table, const json::Value& data, const std::string& path) {
  const std::string prefix = "tables." + table;
  if (data.type() != Type::kObject) throw bad(path, prefix, data, "an object");
  for (const auto& [name, spec] : table_fields()) {
    if (const json::Value* value = data.find(name)) check(path, prefix + "." + name, *value, spec);
  }
  for (const char* name : kRequiredTableFields) {
    if (data.find(name) == nullptr) {
      throw CheckpointError(path + ": table " + table + " lacks the field " + py_repr(name) +
                            ". The manifest is corrupt");
    }
  }
  const json::Value& key_dtype = *data.find("key_dtype");
  if (!one_of(key_dtype.as_string(), kKeyFileDtypes)) {
    throw bad(path, prefix + ".key_dtype", key_dtype, what_of("key_dtype"));
  }
  const json::Value* dtype = data.find("dtype");
  if (dtype != nullptr && !one_of(dtype->as_string(), kRowDtypes)) {
    throw bad(path, prefix + ".dtype", *dtype, what_of("dtype"));
  }
  const json::Value* kind = data.find("kind");
  if (kind != nullptr && !one_of(kind->as_string(), kTableKinds)) {
    throw bad(path, prefix + ".kind", *kind, what_of("kind"));
  }
  const json::Value& slots = *data.find("slots");
  for (const json::Value& slot : slots.as_array()) {
    if (slot.type() != Type::kString || slot.as_string().empty()) {
      throw bad(path, prefix + ".slots", slots, what_of("slots"));
    }
  }
  TableEntry entry;
  entry.dim = data.find("dim")->as_int();
  entry.rows = data.find("rows")->as_int();
  entry.key_dtype = key_dtype.as_string();
  if (const json::Value* crcs = data.find("crc32")) {
    for (const auto& [text_name, digest] : crcs->as_object()) {
      const std::string name = py_fsencode(text_name);  // as the file's name
      check_name(name, prefix + ".crc32 file", path);
      if (digest.type() != Type::kString || digest.as_string().size() != 8 || !hex_digits(digest.as_string())) {
        throw bad(path, prefix + ".crc32." + name, digest, "8 hex digits");
      }
      entry.crc32.emplace_back(name, digest.as_string());
    }
  }
  return entry;
}

// format.Manifest.from_dict.
Manifest manifest(const json::Value& data, const std::string& path) {
  if (data.type() != Type::kObject) {
    throw CheckpointError(path + " is not a valid manifest: it holds a JSON " + py_type_name(data) + ", not an object");
  }
  const json::Value* version = data.find("format_version");
  // Python's `!=`: 1, 1.0 and true all equal FORMAT_VERSION.
  const bool current = version != nullptr &&
                       ((version->type() == Type::kInt && version->as_int() == kFormatVersion) ||
                        (version->type() == Type::kFloat && version->as_number() == kFormatVersion) ||
                        (version->type() == Type::kBool && int64_t{version->as_bool()} == kFormatVersion));
  if (!current) {
    throw CheckpointError(path + " has format version " + (version ? py_repr(*version) : "None") +
                          "; this sok-core reads version " + std::to_string(kFormatVersion) + ": upgrade sok-core");
  }
  for (const auto& [name, spec] : kManifestFields) {
    if (const json::Value* value = data.find(name)) check(path, name, *value, spec);
  }
  const json::Value* tables = data.find("tables");
  if (tables == nullptr || tables->type() != Type::kObject) {
    throw bad(path, "tables", tables ? *tables : json::Value(), "an object of table name -> entry");
  }
  for (const auto& [table, entry] : tables->as_object()) check_name(py_fsencode(table), "table", path);
  Manifest out;
  for (const auto& [text_table, entry] : tables->as_object()) {
    const std::string table = py_fsencode(text_table);  // as the files' names
    out.tables.emplace_back(table, table_entry(table, entry, path));
  }
  return out;
}

}  // namespace

const std::string* TableEntry::crc32_of(const std::string& name) const {
  for (const auto& [file, digest] : crc32) {
    if (file == name) return &digest;
  }
  return nullptr;
}

const TableEntry* Manifest::find(const std::string& table) const {
  for (const auto& [name, entry] : tables) {
    if (name == table) return &entry;
  }
  return nullptr;
}

const TableEntry* check_against_manifest(const std::string& path, const std::string& table, const Manifest* manifest,
                                         const FileInfo& key_info, const FileInfo& weight_info, int64_t dim) {
  if (manifest == nullptr) return nullptr;
  const std::string where = posixpath::join(path, kManifest);
  const TableEntry* entry = manifest->find(table);
  if (entry == nullptr) {
    std::vector<std::string> listed;
    for (const auto& [name, unused] : manifest->tables) listed.push_back(name);
    std::sort(listed.begin(), listed.end(), py_less);
    std::string names;
    for (const auto& name : listed) names += (names.empty() ? "" : ", ") + py_repr(name);
    throw CheckpointError(where + " does not list table " + py_repr(table) + ", whose files are in " + path +
                          " (listed: [" + names + "]); the files do not belong to this checkpoint");
  }
  const int64_t rows = key_info.elements;
  const auto differs = [&](const std::string& name, const std::string& listed, const std::string& found) {
    throw CheckpointError(where + " says table " + py_repr(table) + " has " + name + " " + listed +
                          " but its files have " + found + ": the checkpoint is inconsistent");
  };
  if (entry->rows != rows) differs("rows", std::to_string(entry->rows), std::to_string(rows));
  const int64_t found_dim = rows ? dim : entry->dim;
  if (entry->dim != found_dim) differs("dim", std::to_string(entry->dim), std::to_string(found_dim));
  if (entry->key_dtype != key_info.dtype) {
    differs("key_dtype", py_repr(entry->key_dtype), py_repr(key_info.dtype));
  }
  for (const FileInfo* info : {&key_info, &weight_info}) {
    if (entry->crc32_of(posixpath::basename(info->path)) == nullptr) {
      throw CheckpointError(where + " has no checksum for " + info->path + ": the checkpoint is inconsistent");
    }
  }
  return entry;
}

Manifest parse_manifest(std::string_view raw, const std::string& path) {
  const std::string invalid = path + " is not a valid manifest (UTF-8 JSON): ";
  if (const std::string error = utf8_decode_error(raw); !error.empty()) throw CheckpointError(invalid + error);
  json::Value data;
  try {
    data = json::parse(raw);
  } catch (const json::ParseError& error) {
    throw CheckpointError(invalid + error.what());
  }
  return manifest(data, path);
}

}  // namespace sok::hps::checkpoint
