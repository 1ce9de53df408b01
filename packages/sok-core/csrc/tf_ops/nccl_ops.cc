// SOK's own NCCL collectives on GPU ranks: the exchange of sok.lookup_sparse, and the allreduce of
// sok.allreduce_dense_gradients, so that one communicator carries every GPU collective of a SOK
// step (libsok_tf_nccl.so, built where a CUDA toolkit and NCCL are found).
//
// Horovod's collectives negotiate every call among the ranks on its background thread and wait for
// their inputs on the host; with several all-to-alls per lookup, that is most of a step. These ops
// enqueue NCCL's kernels on TensorFlow's compute stream instead, with counts that the host already
// holds, so an exchange never waits for the GPU. The communicator is set up once per process
// (sok.init: rank 0's ncclUniqueId travels through Horovod's broadcast) and kept per CUDA device.
//
// The ranks must enqueue the collectives of one communicator in the same order: the Python side
// (sparse_operation_kit/lookup/exchange.py) chains them with control dependencies. Counts and sizes
// must match across ranks (what rank a sends b is what b receives from a); the callers derive them
// from values every rank gathered, so they do by construction.
//
// Why the dense allreduce is here too: NCCL's kernels wait on the GPU for their peers, and NCCL
// does not support two communicators whose collectives the ranks enqueue in different orders (a
// device-wide synchronisation, a lazily loaded kernel, can then wait for a kernel that waits for a
// peer that waits for us). Horovod orders its own collectives on its background thread, not with
// the graph's; one communicator for the whole step leaves a single order.
//
// No int32 data: TensorFlow keeps int32 tensors of GPU ops in host memory. Host code compiled by g++
// with TensorFlow's flags, like the *_gpu.cc kernels.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpu_exec.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace sok_tf {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::DEVICE_GPU;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

Status nccl_status(ncclResult_t r, const char* call, const char* file, int line) {
  if (r == ncclSuccess) return Status();
  return errors::Internal(file, ":", line, ": ", call, " failed: ", ncclGetErrorString(r), " (",
                          ncclGetLastError(nullptr), ")");
}
// An NCCL call as a Status naming the call, file and line.
#define SOK_NCCL(call) nccl_status((call), #call, __FILE__, __LINE__)

// The communicator of this process on each CUDA device (one rank per GPU: one entry in practice).
struct Communicator {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int size = 0;
};

class Communicators {
 public:
  static Communicators& get() {
    static Communicators* registry = new Communicators();  // never destroyed: ranks exit with it set
    return *registry;
  }
  bool find(int device, Communicator* out) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = comms_.find(device);
    if (it == comms_.end()) return false;
    *out = it->second;
    return true;
  }
  void set(int device, const Communicator& c) {
    std::lock_guard<std::mutex> lock(mu_);
    comms_[device] = c;
  }

 private:
  std::mutex mu_;
  std::map<int, Communicator> comms_;
};

// Follows the collectives of this process when a bound is set (see the top of the file).
class Watchdog {
 public:
  static Watchdog& get() {
    static Watchdog* watchdog = new Watchdog();  // never destroyed: its thread runs for the process
    return *watchdog;
  }

  void set_bound(int64_t seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    bound_s_ = seconds;
  }

  // Records an event after the collective just enqueued on `stream` (device `device`).
  Status watch(int device, cudaStream_t stream, const std::string& what, const Communicator& comm) {
    std::unique_lock<std::mutex> lock(mu_);
    if (bound_s_ <= 0) return Status();
    cudaEvent_t event = nullptr;
    TF_RETURN_IF_ERROR(SOK_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming)));
    const Status recorded = SOK_CUDA(cudaEventRecord(event, stream));
    if (!recorded.ok()) {
      cudaEventDestroy(event);
      return recorded;
    }
    pending_.push_back(Pending{event, device, std::chrono::steady_clock::now(), what, comm});
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    return Status();
  }

 private:
  struct Pending {
    cudaEvent_t event;
    int device;
    std::chrono::steady_clock::time_point start;
    std::string what;
    Communicator comm;
  };

  // The collectives of one stream complete in order: only the oldest needs a look.
  void loop() {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::lock_guard<std::mutex> lock(mu_);
      while (!pending_.empty()) {
        Pending& oldest = pending_.front();
        sok::gpu::DeviceGuard guard;
        if (guard.enter(oldest.device) != cudaSuccess) break;
        const cudaError_t state = cudaEventQuery(oldest.event);
        if (state == cudaSuccess) {
          cudaEventDestroy(oldest.event);
          pending_.pop_front();
          continue;
        }
        const auto waited = std::chrono::steady_clock::now() - oldest.start;
        if (waited > std::chrono::seconds(bound_s_)) stall(oldest);
        break;
      }
    }
  }

  [[noreturn]] void stall(const Pending& p) {
    std::fprintf(stderr,
                 "sok: SOK's NCCL collective '%s' (rank %d of %d, GPU %d) did not complete within %lld s "
                 "(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS): a rank did not join it (every rank must make the same "
                 "sok.lookup_sparse calls in the same order), or another rank failed or exited. The communicator is "
                 "aborted and this process exits; restart the job. SOK_EXCHANGE=horovod runs the exchange through "
                 "Horovod's collectives, whose stall inspector names the missing ranks.\n",
                 p.what.c_str(), p.comm.rank, p.comm.size, p.device, static_cast<long long>(bound_s_));
    std::fflush(stderr);
    ncclCommAbort(p.comm.comm);
    std::_Exit(EXIT_FAILURE);
  }

  std::mutex mu_;
  std::deque<Pending> pending_;
  std::thread thread_;
  int64_t bound_s_ = 0;
};

Status communicator_of(int device, const char* op, Communicator* out) {
  if (Communicators::get().find(device, out)) return Status();
  return errors::FailedPrecondition(op, " on GPU ", device,
                                    ": SOK's NCCL communicator is not set up in this process. sok.init() sets it "
                                    "up on every rank when SOK_EXCHANGE is 'nccl' or 'auto' (the default) and "
                                    "Horovod runs several GPU ranks; call sok.init() after hvd.init() on every rank");
}

// ---------------------------------------------------------------------------------------------
REGISTER_OP("SokNcclUniqueId")
    .Output("id: uint8")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(NCCL_UNIQUE_ID_BYTES));
      return Status();
    })
    .Doc("A new ncclUniqueId (its bytes), made on rank 0 and broadcast to the others by sok.init.");

class NcclUniqueIdOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    ncclUniqueId id;
    OP_REQUIRES_OK(ctx, SOK_NCCL(ncclGetUniqueId(&id)));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({NCCL_UNIQUE_ID_BYTES}), &out));
    std::memcpy(out->flat<uint8_t>().data(), id.internal, NCCL_UNIQUE_ID_BYTES);
  }
};
REGISTER_KERNEL_BUILDER(Name("SokNcclUniqueId").Device(DEVICE_CPU), NcclUniqueIdOp);

// ---------------------------------------------------------------------------------------------
REGISTER_OP("SokNcclInit")
    .Input("id: uint8")
    .Attr("rank: int >= 0")
    .Attr("size: int >= 1")
    .Attr("timeout_seconds: int >= 0 = 0")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc("Sets up this process's NCCL communicator on the op's GPU: rank `rank` of `size`, from rank 0's id. "
         "Every rank runs it at once (it waits for all). A second call with the same rank and size keeps the "
         "communicator. timeout_seconds > 0: a collective that does not complete within it ends the process "
         "with an error naming it.");

class NcclInitOp : public OpKernel {
 public:
  explicit NcclInitOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rank", &rank_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("size", &size_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("timeout_seconds", &timeout_s_));
    OP_REQUIRES(ctx, rank_ < size_,
                errors::InvalidArgument("SokNcclInit: rank ", rank_, " is not below size ", size_,
                                        "; ranks are 0 .. size-1"));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& id = ctx->input(0);
    OP_REQUIRES(ctx, id.NumElements() == NCCL_UNIQUE_ID_BYTES,
                errors::InvalidArgument("SokNcclInit: id has ", id.NumElements(), " bytes; an ncclUniqueId has ",
                                        NCCL_UNIQUE_ID_BYTES, " (SokNcclUniqueId's output)"));
    const sok_exec_context exec = GpuExec::of(ctx);
    Communicator existing;
    if (Communicators::get().find(exec.device_id, &existing)) {
      OP_REQUIRES(ctx, existing.rank == rank_ && existing.size == size_,
                  errors::FailedPrecondition("SokNcclInit on GPU ", exec.device_id, ": this process already has "
                                             "an NCCL communicator there as rank ", existing.rank, " of ",
                                             existing.size, ", not rank ", rank_, " of ", size_,
                                             "; one process takes one rank for its life"));
      Watchdog::get().set_bound(timeout_s_);
      return;
    }
    ncclUniqueId unique;
    std::memcpy(unique.internal, id.flat<uint8_t>().data(), NCCL_UNIQUE_ID_BYTES);
    DeviceGuard guard;
    OP_REQUIRES_OK(ctx, guard.enter(exec.device_id));
    Communicator made;
    made.rank = static_cast<int>(rank_);
    made.size = static_cast<int>(size_);
    OP_REQUIRES_OK(ctx, SOK_NCCL(ncclCommInitRank(&made.comm, made.size, unique, made.rank)));
    Communicators::get().set(exec.device_id, made);
    Watchdog::get().set_bound(timeout_s_);
  }

 private:
  int64_t rank_ = 0;
  int64_t size_ = 1;
  int64_t timeout_s_ = 0;
};
REGISTER_KERNEL_BUILDER(Name("SokNcclInit").Device(DEVICE_GPU).HostMemory("id"), NcclInitOp);

// ---------------------------------------------------------------------------------------------
REGISTER_OP("SokNcclAllToAll")
    .Input("input: T")
    .Input("send_counts: int32")
    .Input("recv_counts: int32")
    .Output("output: T")
    .Attr("T: {float, half, bfloat16, double, int64}")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle input;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &input));
      ShapeHandle rest;
      TF_RETURN_IF_ERROR(c->Subshape(input, 1, &rest));
      ShapeHandle out;
      TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(InferenceContext::kUnknownDim), rest, &out));
      c->set_output(0, out);
      return Status();
    })
    .Doc("Rows send_counts[r] (in order) of `input` to rank r; returns the rows of every rank in rank order, "
         "recv_counts[r] of them from rank r. The counts are in rows of `input` (its first dimension), in host "
         "memory, and must match across ranks: what rank a sends b is what b receives from a.");

// Counts in host memory: checked against the communicator and the input, as offsets in rows.
Status row_offsets(const Tensor& counts, const char* what, int size, std::vector<int64_t>* offsets) {
  if (counts.dims() != 1 || counts.NumElements() != size) {
    return errors::InvalidArgument("SokNcclAllToAll: ", what, " has shape ", counts.shape().DebugString(),
                                   "; it takes one count per rank: [", size, "]");
  }
  const auto c = counts.flat<int32_t>();
  offsets->assign(size + 1, 0);
  for (int r = 0; r < size; ++r) {
    if (c(r) < 0) {
      return errors::InvalidArgument("SokNcclAllToAll: ", what, "[", r, "] = ", c(r), "; counts are >= 0");
    }
    (*offsets)[r + 1] = (*offsets)[r] + c(r);
  }
  return Status();
}

template <typename T>
class NcclAllToAllOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    OP_REQUIRES(ctx, input.dims() >= 1,
                errors::InvalidArgument("SokNcclAllToAll: input is a scalar; it takes rows (rank >= 1)"));
    const sok_exec_context exec = GpuExec::of(ctx);
    Communicator comm;
    OP_REQUIRES_OK(ctx, communicator_of(exec.device_id, "SokNcclAllToAll", &comm));
    std::vector<int64_t> send, recv;
    OP_REQUIRES_OK(ctx, row_offsets(ctx->input(1), "send_counts", comm.size, &send));
    OP_REQUIRES_OK(ctx, row_offsets(ctx->input(2), "recv_counts", comm.size, &recv));
    OP_REQUIRES(ctx, send[comm.size] == input.dim_size(0),
                errors::InvalidArgument("SokNcclAllToAll: send_counts add up to ", send[comm.size],
                                        " rows but the input has ", input.dim_size(0)));
    TensorShape shape = input.shape();
    shape.set_dim(0, recv[comm.size]);
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &output));
    int64_t row_elements = 1;
    for (int d = 1; d < input.dims(); ++d) row_elements *= input.dim_size(d);
    const size_t row_bytes = static_cast<size_t>(row_elements) * sizeof(T);
    if (row_bytes == 0) return;
    const char* from = reinterpret_cast<const char*>(input.flat<T>().data());
    char* to = reinterpret_cast<char*>(output->flat<T>().data());
    DeviceGuard guard;
    OP_REQUIRES_OK(ctx, guard.enter(exec.device_id));
    const cudaStream_t stream = stream_of(exec);
    OP_REQUIRES_OK(ctx, SOK_NCCL(ncclGroupStart()));
    Status posted;
    for (int r = 0; r < comm.size && posted.ok(); ++r) {
      const size_t out_bytes = static_cast<size_t>(send[r + 1] - send[r]) * row_bytes;
      const size_t in_bytes = static_cast<size_t>(recv[r + 1] - recv[r]) * row_bytes;
      if (out_bytes > 0) {
        posted = SOK_NCCL(ncclSend(from + send[r] * row_bytes, out_bytes, ncclUint8, r, comm.comm, stream));
      }
      if (posted.ok() && in_bytes > 0) {
        posted = SOK_NCCL(ncclRecv(to + recv[r] * row_bytes, in_bytes, ncclUint8, r, comm.comm, stream));
      }
    }
    const Status ended = SOK_NCCL(ncclGroupEnd());  // always closes the group, also after an error
    OP_REQUIRES_OK(ctx, posted);
    OP_REQUIRES_OK(ctx, ended);
    OP_REQUIRES_OK(ctx, Watchdog::get().watch(exec.device_id, stream, name(), comm));
  }
};

// ---------------------------------------------------------------------------------------------
REGISTER_OP("SokNcclAllGather")
    .Input("input: T")
    .Output("output: T")
    .Attr("T: {float, double, int64}")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle input;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &input));
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      return Status();
    })
    .Doc("Every rank's `input` (a vector of one length on every rank), in rank order.");

template <typename T>
class NcclAllGatherOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    OP_REQUIRES(ctx, input.dims() == 1,
                errors::InvalidArgument("SokNcclAllGather: input has shape ", input.shape().DebugString(),
                                        "; it takes a vector"));
    const sok_exec_context exec = GpuExec::of(ctx);
    Communicator comm;
    OP_REQUIRES_OK(ctx, communicator_of(exec.device_id, "SokNcclAllGather", &comm));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({input.dim_size(0) * comm.size}), &output));
    const size_t bytes = static_cast<size_t>(input.NumElements()) * sizeof(T);
    if (bytes == 0) return;
    DeviceGuard guard;
    OP_REQUIRES_OK(ctx, guard.enter(exec.device_id));
    OP_REQUIRES_OK(ctx, SOK_NCCL(ncclAllGather(input.flat<T>().data(), output->flat<T>().data(), bytes, ncclUint8,
                                               comm.comm, stream_of(exec))));
    OP_REQUIRES_OK(ctx, Watchdog::get().watch(exec.device_id, stream_of(exec), name(), comm));
  }
};

// ---------------------------------------------------------------------------------------------
REGISTER_OP("SokNcclAllReduce")
    .Input("input: T")
    .Output("output: T")
    .Attr("T: {float, half, bfloat16, double, int64}")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape)
    .Doc("The sum over the ranks of `input` (of one shape on every rank), on every rank.");

template <typename T>
struct NcclType;
template <>
struct NcclType<float> {
  static constexpr ncclDataType_t value = ncclFloat32;
};
template <>
struct NcclType<Eigen::half> {
  static constexpr ncclDataType_t value = ncclFloat16;
};
template <>
struct NcclType<Eigen::bfloat16> {
  static constexpr ncclDataType_t value = ncclBfloat16;
};
template <>
struct NcclType<double> {
  static constexpr ncclDataType_t value = ncclFloat64;
};
template <>
struct NcclType<int64_t> {
  static constexpr ncclDataType_t value = ncclInt64;
};

template <typename T>
class NcclAllReduceOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    const sok_exec_context exec = GpuExec::of(ctx);
    Communicator comm;
    OP_REQUIRES_OK(ctx, communicator_of(exec.device_id, "SokNcclAllReduce", &comm));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, input.shape(), &output));
    if (input.NumElements() == 0) return;
    DeviceGuard guard;
    OP_REQUIRES_OK(ctx, guard.enter(exec.device_id));
    OP_REQUIRES_OK(ctx, SOK_NCCL(ncclAllReduce(input.flat<T>().data(), output->flat<T>().data(),
                                               static_cast<size_t>(input.NumElements()), NcclType<T>::value,
                                               ncclSum, comm.comm, stream_of(exec))));
    OP_REQUIRES_OK(ctx, Watchdog::get().watch(exec.device_id, stream_of(exec), name(), comm));
  }
};

#define SOK_REGISTER_NCCL_ALL_TO_ALL(T)                                                    \
  REGISTER_KERNEL_BUILDER(Name("SokNcclAllToAll")                                          \
                              .Device(DEVICE_GPU)                                          \
                              .TypeConstraint<T>("T")                                      \
                              .HostMemory("send_counts")                                   \
                              .HostMemory("recv_counts"),                                  \
                          NcclAllToAllOp<T>);
SOK_REGISTER_NCCL_ALL_TO_ALL(float)
SOK_REGISTER_NCCL_ALL_TO_ALL(Eigen::half)
SOK_REGISTER_NCCL_ALL_TO_ALL(Eigen::bfloat16)
SOK_REGISTER_NCCL_ALL_TO_ALL(double)
SOK_REGISTER_NCCL_ALL_TO_ALL(int64_t)
#undef SOK_REGISTER_NCCL_ALL_TO_ALL

#define SOK_REGISTER_NCCL_ALL_GATHER(T) \
  REGISTER_KERNEL_BUILDER(Name("SokNcclAllGather").Device(DEVICE_GPU).TypeConstraint<T>("T"), NcclAllGatherOp<T>);
SOK_REGISTER_NCCL_ALL_GATHER(float)
SOK_REGISTER_NCCL_ALL_GATHER(double)
SOK_REGISTER_NCCL_ALL_GATHER(int64_t)
#undef SOK_REGISTER_NCCL_ALL_GATHER

#define SOK_REGISTER_NCCL_ALL_REDUCE(T) \
  REGISTER_KERNEL_BUILDER(Name("SokNcclAllReduce").Device(DEVICE_GPU).TypeConstraint<T>("T"), NcclAllReduceOp<T>);
SOK_REGISTER_NCCL_ALL_REDUCE(float)
SOK_REGISTER_NCCL_ALL_REDUCE(Eigen::half)
SOK_REGISTER_NCCL_ALL_REDUCE(Eigen::bfloat16)
SOK_REGISTER_NCCL_ALL_REDUCE(double)
SOK_REGISTER_NCCL_ALL_REDUCE(int64_t)
#undef SOK_REGISTER_NCCL_ALL_REDUCE

}  // namespace
}  // namespace sok_tf
