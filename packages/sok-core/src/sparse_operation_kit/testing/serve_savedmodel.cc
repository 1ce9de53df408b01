// Serves one batch of a SavedModel from C++ with TensorFlow's C API and no Python in the process
// (tests/test_serving_cpp.py builds and runs it): it loads op libraries (SOK's), the SavedModel's
// "serve" graph and variables, runs one int64 input through one output, writes the output's bytes,
// and says whether libpython was ever mapped into the process.
//
//   serve_savedmodel SAVED_MODEL INPUT OUTPUT IDS_FILE ROWS COLS OUT_FILE [OP_LIBRARY ...]
//
// INPUT and OUTPUT are tensor names ("serving_default_ids:0"); IDS_FILE holds ROWS x COLS int64.
// Prints "output: <dims>" and "libpython: absent|present"; exit status 0, or 1 with the error.
#include <tensorflow/c/c_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 8) {
    std::cerr << "usage: " << argv[0] << " SAVED_MODEL INPUT OUTPUT IDS_FILE ROWS COLS OUT_FILE [OP_LIBRARY ...]\n";
    return 2;
  }
  const int64_t rows = std::atoll(argv[5]);
  const int64_t cols = std::atoll(argv[6]);
  TF_Status* status = TF_NewStatus();
  for (int i = 8; i < argc; ++i) {
    TF_LoadLibrary(argv[i], status);
    if (TF_GetCode(status) != TF_OK) return fail(std::string("loading ") + argv[i], status);
  }
  TF_Graph* graph = TF_NewGraph();
  TF_SessionOptions* options = TF_NewSessionOptions();
  const char* tags[] = {"serve"};
  TF_Session* session = TF_LoadSessionFromSavedModel(options, nullptr, argv[1], tags, 1, graph, nullptr, status);
  if (TF_GetCode(status) != TF_OK) return fail(std::string("loading the SavedModel ") + argv[1], status);
  TF_Output input{}, output{};
  if (!output_of(graph, argv[2], &input)) return fail(std::string("no tensor ") + argv[2] + " in the graph", nullptr);
  if (!output_of(graph, argv[3], &output)) return fail(std::string("no tensor ") + argv[3] + " in the graph", nullptr);

  std::vector<int64_t> ids(static_cast<size_t>(rows * cols));
  std::ifstream in(argv[4], std::ios::binary);
  in.read(reinterpret_cast<char*>(ids.data()), static_cast<std::streamsize>(ids.size() * sizeof(int64_t)));
  if (!in) return fail(std::string("reading ") + argv[4], nullptr);
  const int64_t dims[2] = {rows, cols};
  TF_Tensor* feed = TF_AllocateTensor(TF_INT64, dims, 2, ids.size() * sizeof(int64_t));
  std::memcpy(TF_TensorData(feed), ids.data(), ids.size() * sizeof(int64_t));

  TF_Tensor* fetched = nullptr;
  TF_SessionRun(session, nullptr, &input, &feed, 1, &output, &fetched, 1, nullptr, 0, nullptr, status);
  if (TF_GetCode(status) != TF_OK) return fail("running the serving signature", status);
  std::ofstream out(argv[7], std::ios::binary);
  out.write(static_cast<const char*>(TF_TensorData(fetched)), static_cast<std::streamsize>(TF_TensorByteSize(fetched)));
  std::cout << "output:";
  for (int d = 0; d < TF_NumDims(fetched); ++d) std::cout << " " << TF_Dim(fetched, d);
  std::cout << "\nlibpython: " << (libpython_mapped() ? "present" : "absent") << "\n";

  TF_DeleteTensor(fetched);
  TF_DeleteTensor(feed);
  TF_CloseSession(session, status);
  TF_DeleteSession(session, status);
  TF_DeleteSessionOptions(options);
  TF_DeleteGraph(graph);
  TF_DeleteStatus(status);
  return 0;
}
