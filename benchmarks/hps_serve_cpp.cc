// Times SavedModels served from C++ on TensorFlow's C API, with no Python in the process
// (benchmarks/hps_cpp.py builds and runs it): it loads op libraries (sok-core's, sok-hps's
// libsok_hps_serving.so), one or more SavedModels' "serve" graphs and variables, then per batch size
// runs each model's serving signature on a pool of id batches (int64, or int32 with --ids-dtype)
// read from a file, and for a model given --dense, float batches of as many samples read from a
// second file fed to its second input; warmup calls then timed ones, the models taking turns call by
// call so that load that comes and goes hits them alike. It prints one JSON line: per model and
// batch size the p50 / p99 / mean latency of a call (TF_SessionRun with the feeds ready, plus freeing
// the output it returns), its two phases, and lookups/s; the sum of the output's floats for the
// pool's first batch before the warmup calls and again after the timed ones (`checksum`,
// `checksum_after`); per batch size the cost of making a batch's feeds from the files' bytes;
// whether libpython was mapped.
// With --trace DIR, after the timed calls, --traces calls more per model and batch size run with
// TensorFlow's FULL_TRACE and write their RunMetadata (each op's time) to DIR/m<model>_b<B>_<k>.pb.
//
//   hps_serve_cpp --ids FILE --cols C --batches B1,B2,... [--ids-dtype int64|int32] [--pool P] [--warmup W]
//                 [--iters N] --model DIR INPUT OUTPUT [--dense NAME] [--model DIR INPUT OUTPUT [--dense NAME] ...]
//                 [--floats FILE --float-cols D] [--library PATH ...] [--trace DIR] [--traces K]
//
// The ids FILE holds, for each B in the order given, P batches of B x C ids (--ids-dtype, default
// int64), one after the other. INPUT and OUTPUT are tensor names of the serving signature
// ("serving_default_ids:0"). --dense NAME gives the model before it a second input, NAME, of float32
// [B, D], fed from the --floats FILE: for each B, P batches of B x D float32, in the same order.
// Exit status 0, 1 with what failed on stderr, 2 for a wrong command line.
#include <tensorflow/c/c_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kUsage[] =
    "usage: hps_serve_cpp --ids FILE --cols C --batches B1,B2,... [--ids-dtype int64|int32] [--pool P]\n"
    "                     [--warmup W] [--iters N] --model DIR INPUT OUTPUT [--dense NAME]\n"
    "                     [--model DIR INPUT OUTPUT [--dense NAME] ...] [--floats FILE --float-cols D]\n"
    "                     [--library PATH ...] [--trace DIR] [--traces K]\n";

struct Model {
  std::string path, input_name, output_name, dense_name;  // dense_name "": the ids are the only input
  TF_Graph* graph = nullptr;
  TF_Session* session = nullptr;
  TF_Output input{}, output{}, dense{};
  double load_s = 0, first_call_ms = 0;
};

struct Options {
  std::string ids, floats, trace;
  TF_DataType ids_dtype = TF_INT64;
  int64_t cols = 0, float_cols = 0, pool = 4, warmup = 3, iters = 30, traces = 5;
  std::vector<int64_t> batches;
  std::vector<Model> models;
  std::vector<std::string> libraries;
};

// One batch's feeds: the ids [B, C], and the floats [B, D] where --floats is given (else null).
struct Batch {
  TF_Tensor* ids = nullptr;
  TF_Tensor* floats = nullptr;
};

// The seconds of one model's calls at one batch size: whole calls, and their two phases.
struct Samples {
  std::vector<double> call, run, free;
};

[[noreturn]] void fail(const std::string& what, const TF_Status* status = nullptr) {
  std::cerr << what << (status != nullptr ? std::string(": ") + TF_Message(status) : std::string()) << "\n";
  std::exit(1);
}

[[noreturn]] void usage(const std::string& what) {
  std::cerr << what << "\n" << kUsage;
  std::exit(2);
}

int64_t positive(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || value <= 0) {
    usage(flag + " takes a positive integer, not '" + text + "'");
  }
  return value;
}

Options parse(int argc, char** argv) {
  Options o;
  auto take = [&](int* i, const std::string& flag) -> std::string {
    if (*i + 1 >= argc) usage(flag + " needs a value");
    return argv[++*i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--ids") {
      o.ids = take(&i, flag);
    } else if (flag == "--ids-dtype") {
      const std::string dtype = take(&i, flag);
      if (dtype != "int64" && dtype != "int32") usage("--ids-dtype takes int64 or int32, not '" + dtype + "'");
      o.ids_dtype = dtype == "int32" ? TF_INT32 : TF_INT64;
    } else if (flag == "--floats") {
      o.floats = take(&i, flag);
    } else if (flag == "--float-cols") {
      o.float_cols = positive(flag, take(&i, flag));
    } else if (flag == "--dense") {
      if (o.models.empty()) usage("--dense NAME names an input of the --model before it; give that --model first");
      if (!o.models.back().dense_name.empty()) usage("--dense is given twice for --model " + o.models.back().path);
      o.models.back().dense_name = take(&i, flag);
    } else if (flag == "--cols") {
      o.cols = positive(flag, take(&i, flag));
    } else if (flag == "--pool") {
      o.pool = positive(flag, take(&i, flag));
    } else if (flag == "--warmup") {
      o.warmup = std::atoll(take(&i, flag).c_str());
    } else if (flag == "--iters") {
      o.iters = positive(flag, take(&i, flag));
    } else if (flag == "--batches") {
      std::stringstream list(take(&i, flag));
      for (std::string b; std::getline(list, b, ',');) o.batches.push_back(positive("--batches", b));
    } else if (flag == "--model") {
      Model m;
      m.path = take(&i, flag);
      m.input_name = take(&i, flag);
      m.output_name = take(&i, flag);
      o.models.push_back(m);
    } else if (flag == "--trace") {
      o.trace = take(&i, flag);
    } else if (flag == "--traces") {
      o.traces = positive(flag, take(&i, flag));
    } else if (flag == "--library") {
      o.libraries.push_back(take(&i, flag));
    } else {
      usage("unknown argument '" + flag + "'");
    }
  }
  if (o.ids.empty() || o.cols == 0 || o.batches.empty() || o.models.empty()) {
    usage("--ids, --cols, --batches and at least one --model are required");
  }
  const bool dense =
      std::any_of(o.models.begin(), o.models.end(), [](const Model& m) { return !m.dense_name.empty(); });
  if (dense && (o.floats.empty() || o.float_cols == 0)) {
    usage("--dense needs --floats FILE and --float-cols D (the float batches its input is fed)");
  }
  if (!dense && (!o.floats.empty() || o.float_cols != 0)) {
    usage("--floats and --float-cols feed the input that --dense NAME names after a --model; no --model has one");
  }
  return o;
}

// "name:index" as the graph's output it names.
bool output_of(TF_Graph* graph, const std::string& tensor, TF_Output* out) {
  const size_t colon = tensor.rfind(':');
  const std::string name = colon == std::string::npos ? tensor : tensor.substr(0, colon);
  out->oper = TF_GraphOperationByName(graph, name.c_str());
  out->index = colon == std::string::npos ? 0 : std::atoi(tensor.c_str() + colon + 1);
  return out->oper != nullptr;
}

// Whether any mapping of this process is a libpython.
bool libpython_mapped() {
  std::ifstream maps("/proc/self/maps");
  const std::string text((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
  return text.find("libpython") != std::string::npos;
}

double seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// NumPy's default percentile (linear between the closest ranks).
double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double rank = q / 100.0 * static_cast<double>(v.size() - 1);
  const size_t below = static_cast<size_t>(rank);
  const size_t above = std::min(below + 1, v.size() - 1);
  return v[below] + (rank - static_cast<double>(below)) * (v[above] - v[below]);
}

double mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

void load(Model* m, TF_Status* status) {
  const auto start = Clock::now();
  m->graph = TF_NewGraph();
  TF_SessionOptions* options = TF_NewSessionOptions();
  const char* tags[] = {"serve"};
  m->session = TF_LoadSessionFromSavedModel(options, nullptr, m->path.c_str(), tags, 1, m->graph, nullptr, status);
  TF_DeleteSessionOptions(options);
  if (TF_GetCode(status) != TF_OK) fail("loading the SavedModel " + m->path, status);
  if (!output_of(m->graph, m->input_name, &m->input)) {
    fail("no tensor " + m->input_name + " in the graph of " + m->path + "; pass its serving signature's input");
  }
  if (!output_of(m->graph, m->output_name, &m->output)) {
    fail("no tensor " + m->output_name + " in the graph of " + m->path + "; pass its serving signature's output");
  }
  if (!m->dense_name.empty() && !output_of(m->graph, m->dense_name, &m->dense)) {
    fail("no tensor " + m->dense_name + " in the graph of " + m->path + "; pass its serving signature's float input");
  }
  m->load_s = seconds(start, Clock::now());
}

// The model's inputs and their feeds from `batch`: the ids, then the floats where it has --dense. Returns
// how many.
int inputs_of(const Model& m, const Batch& batch, TF_Output inputs[2], TF_Tensor* values[2]) {
  inputs[0] = m.input;
  values[0] = batch.ids;
  if (m.dense_name.empty()) return 1;
  inputs[1] = m.dense;
  values[1] = batch.floats;
  return 2;
}

// One call of the model's serving signature on `batch`; adds its seconds to `samples` when given,
// and the sum of the output's floats to `checksum` when given.
void call(const Model& m, const Batch& batch, TF_Status* status, Samples* samples, double* checksum = nullptr) {
  TF_Output inputs[2];
  TF_Tensor* values[2];
  const int n = inputs_of(m, batch, inputs, values);
  TF_Tensor* fetched = nullptr;
  const auto start = Clock::now();
  TF_SessionRun(m.session, nullptr, inputs, values, n, &m.output, &fetched, 1, nullptr, 0, nullptr, status);
  const auto ran = Clock::now();
  if (TF_GetCode(status) != TF_OK) fail("running the serving signature of " + m.path, status);
  if (checksum != nullptr) {
    const float* rows = static_cast<const float*>(TF_TensorData(fetched));
    const size_t n = TF_TensorByteSize(fetched) / sizeof(float);
    *checksum = 0;
    for (size_t i = 0; i < n; ++i) *checksum += rows[i];
  }
  TF_DeleteTensor(fetched);
  const auto freed = Clock::now();
  if (samples != nullptr) {
    samples->call.push_back(seconds(start, freed));
    samples->run.push_back(seconds(start, ran));
    samples->free.push_back(seconds(ran, freed));
  }
}

// The next [rows, cols] tensor of `dtype` in `file` (the `what` file at `path`, holding `layout` per
// batch size): batch `p` of B = rows. Adds the seconds of making the tensor from the bytes read to
// *made_s.
TF_Tensor* next_feed(std::istream& file, const std::string& what, const std::string& path, TF_DataType dtype,
                     int64_t rows, int64_t cols, int64_t p, const std::string& layout, double* made_s) {
  const size_t bytes = static_cast<size_t>(rows * cols) * TF_DataTypeSize(dtype);
  std::vector<char> buffer(bytes);
  if (!file.read(buffer.data(), static_cast<std::streamsize>(bytes))) {
    fail("the " + what + " file " + path + " ends before batch " + std::to_string(p) + " of B=" + std::to_string(rows) +
         "; it must hold " + layout + " per --batches entry, in order");
  }
  const int64_t dims[2] = {rows, cols};
  const auto start = Clock::now();
  TF_Tensor* feed = TF_AllocateTensor(dtype, dims, 2, bytes);
  std::copy(buffer.begin(), buffer.end(), static_cast<char*>(TF_TensorData(feed)));
  *made_s += seconds(start, Clock::now());
  return feed;
}

// One call with FULL_TRACE, its RunMetadata (a serialized tensorflow.RunMetadata) written to `path`.
void traced_call(const Model& m, const Batch& batch, TF_Status* status, const std::string& path) {
  static const char kFullTrace[] = {0x08, 0x03};  // RunOptions{trace_level: FULL_TRACE}
  TF_Buffer* options = TF_NewBufferFromString(kFullTrace, sizeof(kFullTrace));
  TF_Buffer* metadata = TF_NewBuffer();
  TF_Output inputs[2];
  TF_Tensor* values[2];
  const int n = inputs_of(m, batch, inputs, values);
  TF_Tensor* fetched = nullptr;
  TF_SessionRun(m.session, options, inputs, values, n, &m.output, &fetched, 1, nullptr, 0, metadata, status);
  if (TF_GetCode(status) != TF_OK) fail("running the serving signature of " + m.path + " traced", status);
  TF_DeleteTensor(fetched);
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(metadata->data), static_cast<std::streamsize>(metadata->length));
  if (!out) fail("cannot write the trace " + path + "; pass a writable --trace folder");
  TF_DeleteBuffer(metadata);
  TF_DeleteBuffer(options);
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  TF_Status* status = TF_NewStatus();
  for (const std::string& library : o.libraries) {
    TF_LoadLibrary(library.c_str(), status);
    if (TF_GetCode(status) != TF_OK) fail("loading the op library " + library, status);
  }
  for (Model& m : o.models) load(&m, status);

  std::ifstream ids(o.ids, std::ios::binary);
  if (!ids) fail("cannot open the ids file " + o.ids);
  std::ifstream floats;
  if (!o.floats.empty()) {
    floats.open(o.floats, std::ios::binary);
    if (!floats) fail("cannot open the floats file " + o.floats);
  }
  const std::string ids_layout =
      "--pool batches of B x --cols " + std::string(o.ids_dtype == TF_INT32 ? "int32" : "int64");
  std::ostringstream json;
  json.precision(6);
  std::ostringstream feeds;
  feeds.precision(6);
  std::vector<std::ostringstream> per_model(o.models.size());
  for (std::ostringstream& s : per_model) s.precision(6);
  for (size_t b = 0; b < o.batches.size(); ++b) {
    const int64_t batch = o.batches[b];
    std::vector<Batch> pool;
    std::vector<double> feed_s;
    for (int64_t p = 0; p < o.pool; ++p) {
      Batch feed;  // the data phase: feeds made from the files' bytes
      double made_s = 0;
      feed.ids = next_feed(ids, "ids", o.ids, o.ids_dtype, batch, o.cols, p, ids_layout, &made_s);
      if (!o.floats.empty()) {
        feed.floats = next_feed(floats, "floats", o.floats, TF_FLOAT, batch, o.float_cols, p,
                                "--pool batches of B x --float-cols float32", &made_s);
      }
      feed_s.push_back(made_s);
      pool.push_back(feed);
    }
    for (Model& m : o.models) {  // the first call (at the first B) starts HPS's server
      if (b != 0) break;
      Samples first;
      call(m, pool[0], status, &first);
      m.first_call_ms = first.call[0] * 1e3;
    }
    std::vector<double> checksums(o.models.size());
    for (size_t i = 0; i < o.models.size(); ++i) call(o.models[i], pool[0], status, nullptr, &checksums[i]);
    for (int64_t w = 0; w < o.warmup; ++w) {
      for (const Model& m : o.models) call(m, pool[w % o.pool], status, nullptr);
    }
    std::vector<Samples> samples(o.models.size());
    for (int64_t t = 0; t < o.iters; ++t) {
      for (size_t i = 0; i < o.models.size(); ++i) call(o.models[i], pool[t % o.pool], status, &samples[i]);
    }
    for (size_t i = 0; !o.trace.empty() && i < o.models.size(); ++i) {
      for (int64_t k = 0; k < o.traces; ++k) {
        const std::string name = "m" + std::to_string(i) + "_b" + std::to_string(batch) + "_" + std::to_string(k);
        traced_call(o.models[i], pool[k % o.pool], status, o.trace + "/" + name + ".pb");
      }
    }
    // The first batch again after the timed and traced calls (an evicting cache has evicted by now).
    std::vector<double> checksums_after(o.models.size());
    for (size_t i = 0; i < o.models.size(); ++i) call(o.models[i], pool[0], status, nullptr, &checksums_after[i]);
    const double keys = static_cast<double>(batch * o.cols);
    for (size_t i = 0; i < o.models.size(); ++i) {
      const Samples& s = samples[i];
      per_model[i] << (b == 0 ? "" : ", ") << "\"" << batch << "\": {\"p50_ms\": " << percentile(s.call, 50) * 1e3
                   << ", \"p99_ms\": " << percentile(s.call, 99) * 1e3 << ", \"mean_ms\": " << mean(s.call) * 1e3
                   << ", \"mlookups_s\": " << keys / mean(s.call) / 1e6
                   << ", \"run_p50_ms\": " << percentile(s.run, 50) * 1e3
                   << ", \"free_p50_ms\": " << percentile(s.free, 50) * 1e3
                   << ", \"checksum\": " << std::setprecision(17) << checksums[i]
                   << ", \"checksum_after\": " << checksums_after[i] << std::setprecision(6) << "}";
    }
    feeds << (b == 0 ? "" : ", ") << "\"" << batch << "\": " << percentile(feed_s, 50) * 1e3;
    for (const Batch& feed : pool) {
      TF_DeleteTensor(feed.ids);
      if (feed.floats != nullptr) TF_DeleteTensor(feed.floats);
    }
  }

  json << "{\"libpython\": \"" << (libpython_mapped() ? "present" : "absent") << "\", \"feed_ms\": {" << feeds.str()
       << "}, \"models\": [";
  for (size_t i = 0; i < o.models.size(); ++i) {
    const Model& m = o.models[i];
    json << (i == 0 ? "" : ", ") << "{\"saved_model\": \"" << m.path << "\", \"load_s\": " << m.load_s
         << ", \"first_call_ms\": " << m.first_call_ms << ", \"batches\": {" << per_model[i].str() << "}}";
  }
  json << "]}";
  std::cout << json.str() << std::endl;

  for (Model& m : o.models) {
    TF_CloseSession(m.session, status);
    TF_DeleteSession(m.session, status);
    TF_DeleteGraph(m.graph);
  }
  TF_DeleteStatus(status);
  return 0;
}
