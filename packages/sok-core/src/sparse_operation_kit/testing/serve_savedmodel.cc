// Serves one batch of a SavedModel from C++ with TensorFlow's C API and no Python in the process
// (serving_cpp.py builds and runs it): it loads op libraries (SOK's, HPS's), the SavedModel's
// "serve" graph and variables, feeds its inputs, runs one output, writes the output's bytes, and
// says whether libpython was ever mapped into the process.
//
//   serve_savedmodel SAVED_MODEL OUTPUT OUT_FILE [--feed TENSOR FILE DTYPE DIMS]... [--library PATH]...
//                    [--runs N --pause-ms MS] [--every-run]
//
// TENSOR and OUTPUT are tensor names ("serving_default_ids:0"); FILE holds the raw values of DTYPE
// (int64, int32 or float32) of shape DIMS ("6x4"). --runs: the batch is run N times (default 1),
// MS milliseconds apart, and the last run's output is written (what a server serves once its
// background work, e.g. online updates, had time to run); --every-run writes every run's output,
// one after the other. Prints "output: <dims>" and
// "libpython: absent|present"; exit status 0, or 1 with the error.
#include <tensorflow/c/c_api.h>

#include <cstdint>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

namespace {

int fail(const std::string& what, TF_Status* status) {
  std::cerr << what << (status != nullptr ? std::string(": ") + TF_Message(status) : std::string()) << "\n";
  return 1;
}

// "name:index" as the graph's output it names.
bool output_of(TF_Graph* graph, const std::string& tensor, TF_Output* out) {
  const size_t colon = tensor.rfind(':');
  const std::string name = colon == std::string::npos ? tensor : tensor.substr(0, colon);
  const int index = colon == std::string::npos ? 0 : std::atoi(tensor.c_str() + colon + 1);
  out->oper = TF_GraphOperationByName(graph, name.c_str());
  out->index = index;
  return out->oper != nullptr;
}

// Whether any mapping of this process is a libpython.
bool libpython_mapped() {
  std::ifstream maps("/proc/self/maps");
  const std::string text((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
  return text.find("libpython") != std::string::npos;
}

struct Feed {
  std::string tensor;
  std::string file;
  std::string dtype;
  std::vector<int64_t> dims;
};

// "6x4" as {6, 4}.
std::vector<int64_t> dims_of(const std::string& text) {
  std::vector<int64_t> dims;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = text.find('x', begin);
    dims.push_back(std::atoll(text.substr(begin, end - begin).c_str()));
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return dims;
}

// The tensor of `feed`'s file, or nullptr (the reason on stderr).
TF_Tensor* tensor_of(const Feed& feed) {
  TF_DataType type;
  size_t item = 0;
  if (feed.dtype == "int64") {
    type = TF_INT64, item = 8;
  } else if (feed.dtype == "int32") {
    type = TF_INT32, item = 4;
  } else if (feed.dtype == "float32") {
    type = TF_FLOAT, item = 4;
  } else {
    std::cerr << "dtype " << feed.dtype << " of " << feed.tensor << ": use int64, int32 or float32\n";
    return nullptr;
  }
  size_t bytes = item;
  for (int64_t d : feed.dims) bytes *= static_cast<size_t>(d);
  TF_Tensor* t = TF_AllocateTensor(type, feed.dims.data(), static_cast<int>(feed.dims.size()), bytes);
  std::ifstream in(feed.file, std::ios::binary);
  in.read(static_cast<char*>(TF_TensorData(t)), static_cast<std::streamsize>(bytes));
  if (!in) {
    std::cerr << "reading " << bytes << " bytes of " << feed.file << " failed\n";
    TF_DeleteTensor(t);
    return nullptr;
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage =
      " SAVED_MODEL OUTPUT OUT_FILE [--feed TENSOR FILE DTYPE DIMS]... [--library PATH]... [--runs N --pause-ms MS]"
      " [--every-run]\n";
  if (argc < 4) {
    std::cerr << "usage: " << argv[0] << usage;
    return 2;
  }
  std::vector<Feed> feeds;
  std::vector<std::string> libraries;
  int runs = 1, pause_ms = 0;
  bool every_run = false;
  for (int i = 4; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--feed" && i + 4 < argc) {
      feeds.push_back({argv[i + 1], argv[i + 2], argv[i + 3], dims_of(argv[i + 4])});
      i += 4;
    } else if (flag == "--library" && i + 1 < argc) {
      libraries.push_back(argv[++i]);
    } else if (flag == "--runs" && i + 1 < argc && std::atoi(argv[i + 1]) >= 1) {
      runs = std::atoi(argv[++i]);
    } else if (flag == "--pause-ms" && i + 1 < argc && std::atoi(argv[i + 1]) >= 0) {
      pause_ms = std::atoi(argv[++i]);
    } else if (flag == "--every-run") {
      every_run = true;
    } else {
      std::cerr << "unknown or incomplete argument " << flag << "; usage: " << argv[0] << usage;
      return 2;
    }
  }
  TF_Status* status = TF_NewStatus();
  for (const std::string& library : libraries) {
    TF_LoadLibrary(library.c_str(), status);
    if (TF_GetCode(status) != TF_OK) return fail("loading " + library, status);
  }
  TF_Graph* graph = TF_NewGraph();
  TF_SessionOptions* options = TF_NewSessionOptions();
  const char* tags[] = {"serve"};
  TF_Session* session = TF_LoadSessionFromSavedModel(options, nullptr, argv[1], tags, 1, graph, nullptr, status);
  if (TF_GetCode(status) != TF_OK) return fail(std::string("loading the SavedModel ") + argv[1], status);
  TF_Output output{};
  if (!output_of(graph, argv[2], &output)) return fail(std::string("no tensor ") + argv[2] + " in the graph", nullptr);
  std::vector<TF_Output> inputs(feeds.size());
  std::vector<TF_Tensor*> values(feeds.size());
  for (size_t i = 0; i < feeds.size(); ++i) {
    if (!output_of(graph, feeds[i].tensor, &inputs[i])) return fail("no tensor " + feeds[i].tensor, nullptr);
    values[i] = tensor_of(feeds[i]);
    if (values[i] == nullptr) return 1;
  }

  TF_Tensor* fetched = nullptr;
  std::ofstream out(argv[3], std::ios::binary);
  for (int run = 0; run < runs; ++run) {
    if (run > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    if (fetched != nullptr) TF_DeleteTensor(fetched);
    fetched = nullptr;
    TF_SessionRun(session, nullptr, inputs.data(), values.data(), static_cast<int>(feeds.size()), &output, &fetched,
                  1, nullptr, 0, nullptr, status);
    if (TF_GetCode(status) != TF_OK) return fail("running the serving signature", status);
    if (every_run || run == runs - 1) {
      out.write(static_cast<const char*>(TF_TensorData(fetched)),
                static_cast<std::streamsize>(TF_TensorByteSize(fetched)));
    }
  }
  std::cout << "output:";
  for (int d = 0; d < TF_NumDims(fetched); ++d) std::cout << " " << TF_Dim(fetched, d);
  std::cout << "\nlibpython: " << (libpython_mapped() ? "present" : "absent") << "\n";

  TF_DeleteTensor(fetched);
  for (TF_Tensor* value : values) TF_DeleteTensor(value);
  TF_CloseSession(session, status);
  TF_DeleteSession(session, status);
  TF_DeleteSessionOptions(options);
  TF_DeleteGraph(graph);
  TF_DeleteStatus(status);
  return 0;
}
