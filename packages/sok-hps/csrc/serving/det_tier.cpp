// det_storage_api, DetStorage and DetTier (det_tier.hpp).
#include "det_tier.hpp"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "sok/kit/loaded_library.hpp"

namespace sok {
namespace hps {
namespace {

// sok-backend-det's library and its entry point (sok_det_storage.h, which sok-hps does not include:
// det is reached at run time only).
constexpr char kDetLibrary[] = "libsok_det_storage.so";
constexpr char kDetEntry[] = "sok_det_storage_api";
using DetEntry = const sok_storage_api* (*)();

}  // namespace

const sok_storage_api* det_storage_api() {
  static const sok_storage_api* const api = [] {
    auto entry = reinterpret_cast<DetEntry>(loaded_library_symbol(kDetLibrary, kDetEntry));
    const sok_storage_api* found = entry != nullptr ? entry() : nullptr;
    if (found == nullptr) {
      throw std::runtime_error(
          std::string("the C++ server keeps its tables' rows in sok-backend-det's storage, and this process has "
                      "not loaded its library ") +
          kDetLibrary +
          ": load it (TF_LoadLibrary) before libsok_hps_serving.so, as graph_calls.serving_libraries() lists them "
          "(python -c \"from hierarchical_parameter_server import graph_calls; "
          "print(*graph_calls.serving_libraries())\"); it is in the package directory of sok-backend-det");
    }
    if (found->api_version != SOK_STORAGE_API_VERSION || !sok_storage_api_has(found, find)) {
      throw std::runtime_error(std::string(kDetLibrary) + " has storage API version " +
                               std::to_string(found->api_version) + ", and libsok_hps_serving.so was built for " +
                               std::to_string(SOK_STORAGE_API_VERSION) +
                               ": install sok-backend-det and sok-hps of the same release");
    }
    return found;
  }();
  return api;
}

DetStorage::DetStorage(const std::string& what, int64_t dim, int64_t capacity)
    : api_(det_storage_api()), what_(what), dim_(dim) {
  const std::string slots = std::to_string(std::max<int64_t>(capacity, 1));
  const char* names[] = {"init_capacity"};
  const char* values[] = {slots.c_str()};
  sok_storage_config config{};
  config.struct_size = sizeof(sok_storage_config);
  config.key_type = SOK_KEY_INT64;
  config.row_width = static_cast<int32_t>(dim);
  config.device_type = SOK_DEVICE_CPU;
  config.device_id = 0;
  config.num_options = 1;
  config.option_names = names;
  config.option_values = values;
  if (api_->create(&config, &storage_) != SOK_OK) {
    throw std::runtime_error("creating " + what_ + ": " + api_->last_error(nullptr));
  }
}

DetStorage::~DetStorage() {
  if (storage_ != nullptr) api_->destroy(storage_);
}

void DetStorage::check(sok_status status, const char* call) const {
  if (status != SOK_OK) {
    throw std::runtime_error(std::string(call) + " on " + what_ + ": " + api_->last_error(storage_));
  }
}

void DetStorage::find(const int64_t* keys, int64_t n, float* rows, const float* default_row, uint8_t* found) const {
  check(api_->find(storage_, &kHostContext, n, keys, 0, static_cast<int32_t>(dim_), rows, default_row, found), "find");
}

void DetStorage::insert(const int64_t* keys, int64_t n, const float* rows) const {
  check(api_->insert_or_assign(storage_, &kHostContext, n, keys, 0, static_cast<int32_t>(dim_), rows, nullptr, nullptr,
                               0),
        "insert");
}

int64_t DetStorage::size() const {
  int64_t out = 0;
  check(api_->size(storage_, &kHostContext, &out), "size");
  return out;
}

int64_t DetStorage::capacity() const {
  int64_t out = 0;
  check(api_->capacity(storage_, &out), "capacity");
  return out;
}

std::shared_ptr<const DetStorage> DetTier::table(const std::string& tag, int64_t dim, const char* what) {
  check_dim(tag, dim);
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) throw TierClosed("this " + name_ + " is closed and holds no rows; make a new HashMapTier");
  auto it = tables_.find(tag);
  if (it == tables_.end()) return nullptr;
  if (it->second->dim() != dim) {
    throw std::invalid_argument(tag + ": the " + name_ + " holds rows of dim " + std::to_string(it->second->dim()) +
                                ", " + what + " dim " + std::to_string(dim));
  }
  return it->second;
}

void DetTier::fetch(const std::string& tag, const int64_t* keys, int64_t n, int64_t dim, float* rows, bool* found) {
  std::shared_ptr<const DetStorage> t = table(tag, dim, "asked for");
  if (t == nullptr) {
    std::fill(rows, rows + n * dim, 0.0f);
    std::fill(found, found + n, false);
    return;
  }
  static_assert(sizeof(bool) == sizeof(uint8_t), "found masks are one-byte bools");
  t->find(keys, n, rows, nullptr, reinterpret_cast<uint8_t*>(found));
}

void DetTier::insert(const std::string& tag, const int64_t* keys, int64_t n, const float* rows, int64_t dim) {
  storage(tag, dim, n)->insert(keys, n, rows);
}

std::shared_ptr<const DetStorage> DetTier::storage(const std::string& tag, int64_t dim, int64_t capacity) {
  if (std::shared_ptr<const DetStorage> t = table(tag, dim, "got rows of")) return t;
  auto made = std::make_shared<const DetStorage>("the " + name_ + " storage of " + tag, dim, capacity);
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) throw TierClosed("this " + name_ + " is closed and holds no rows; make a new HashMapTier");
  auto [it, inserted] = tables_.emplace(tag, made);  // another thread's, where it made one meanwhile
  if (!inserted && it->second->dim() != dim) {
    throw std::invalid_argument(tag + ": the " + name_ + " holds rows of dim " + std::to_string(it->second->dim()) +
                                ", got rows of dim " + std::to_string(dim));
  }
  return it->second;
}

int64_t DetTier::size(const std::string& tag) {
  std::shared_ptr<const DetStorage> t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) throw TierClosed("this " + name_ + " is closed and holds no rows; make a new HashMapTier");
    auto it = tables_.find(tag);
    if (it == tables_.end()) return 0;
    t = it->second;
  }
  return t->size();
}

void DetTier::close() {
  std::map<std::string, std::shared_ptr<const DetStorage>> dropped;
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  dropped.swap(tables_);
}

}  // namespace hps
}  // namespace sok
