// The NCCL communicator: device buffers, one GPU per rank, every exchange as grouped
// ncclSend/ncclRecv on the caller's stream, then waited for against the step's deadline.
// NCCL is opened at run time (dlopen) and never linked, so a CUDA build still starts where NCCL
// or a GPU is absent, and resolve says why there is no NCCL communicator there. The
// communicator is non-blocking (ncclConfig_t::blocking = 0), so no NCCL call holds the host
// past a deadline: every wait polls ncclCommGetAsyncError and cudaStreamQuery, and a step that
// times out or fails aborts the communicator (ncclCommAbort) and throws Error(Errc::comm)
// naming this rank and the step. The only file that includes nccl.h.

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/nccl/segment_sum.hpp"
#include "moekit/error.hpp"
#include "moekit/platform.hpp"

namespace moekit {
namespace {

// ncclCommInitRankConfig with blocking = 0 and ncclCommFinalize came with NCCL 2.14.
constexpr int kMinVersion = 21400;
// How long the ranks may take to find each other (the id's exchange and NCCL's own
// bootstrap): the plan's timeout is not known when the world communicator is made.
constexpr int64_t kBootstrapTimeoutMs = 60000;
// How long a wait polls busily, then yielding the core, before it sleeps between polls (as the
// MPI communicator does).
constexpr std::chrono::microseconds kSpin{500};
constexpr std::chrono::milliseconds kYield{20};

// The entry points used, looked up in the shared library; declared by nccl.h, never linked.
struct NcclLibrary {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclGetLastError) last_error = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) init_rank_config = nullptr;
  decltype(&ncclCommGetAsyncError) async_error = nullptr;
  decltype(&ncclCommFinalize) finalize = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  std::string path;         // the file it was opened as
  std::string unavailable;  // why it cannot be used; empty when it can
};

// Where libnccl.so.2 is looked for: MOEKIT_NCCL_LIBRARY alone where it is set; otherwise the
// dynamic loader's path (LD_LIBRARY_PATH, ldconfig, or a copy already loaded into the process,
// e.g. by torch from the nvidia-nccl-cu13 wheel), then the CUDA toolkit's lib directories.
std::vector<std::string> library_candidates() {
  if (const char* path = std::getenv("MOEKIT_NCCL_LIBRARY"); path != nullptr && *path != '\0') {
    return {path};
  }
  std::vector<std::string> names{"libnccl.so.2"};
  if (const char* home = std::getenv("CUDA_HOME"); home != nullptr && *home != '\0') {
    names.push_back(std::string(home) + "/lib64/libnccl.so.2");
    names.push_back(std::string(home) + "/lib/libnccl.so.2");
  }
  names.emplace_back("/usr/local/cuda/lib64/libnccl.so.2");
  names.emplace_back("/usr/local/cuda/lib/libnccl.so.2");
  return names;
}

template <typename F>
bool find(void* library, F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(library, name));
  return f != nullptr;
}

NcclLibrary open_library() {
  NcclLibrary lib;
  void* library = nullptr;
  std::string tried;
  for (const std::string& name : library_candidates()) {
    library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) {
      lib.path = name;
      break;
    }
    tried += (tried.empty() ? "" : ", ") + name;
  }
  if (library == nullptr) {
    lib.unavailable = fmt::format(
        "NCCL could not be loaded (tried {}): put the directory of libnccl.so.2 (the CUDA "
        "toolkit's lib, or the nvidia-nccl-cu13 wheel's) on LD_LIBRARY_PATH, or name the file in "
        "MOEKIT_NCCL_LIBRARY",
        tried);
    return lib;
  }
  const bool all = find(library, lib.get_version, "ncclGetVersion") &&
                   find(library, lib.error_string, "ncclGetErrorString") &&
                   find(library, lib.last_error, "ncclGetLastError") &&
                   find(library, lib.get_unique_id, "ncclGetUniqueId") &&
                   find(library, lib.init_rank_config, "ncclCommInitRankConfig") &&
                   find(library, lib.async_error, "ncclCommGetAsyncError") &&
                   find(library, lib.finalize, "ncclCommFinalize") &&
                   find(library, lib.destroy, "ncclCommDestroy") &&
                   find(library, lib.abort, "ncclCommAbort") &&
                   find(library, lib.group_start, "ncclGroupStart") &&
                   find(library, lib.group_end, "ncclGroupEnd") &&
                   find(library, lib.send, "ncclSend") && find(library, lib.recv, "ncclRecv");
  int version = 0;
  if (!all || lib.get_version(&version) != ncclSuccess || version < kMinVersion) {
    lib.unavailable = fmt::format(
        "{} is not a usable NCCL: moekit needs NCCL 2.14 or later (non-blocking "
        "communicators){}",
        lib.path,
        all && version > 0 ? fmt::format(", and this one is version code {}", version)
                           : std::string(", and this one lacks an entry point"));
  }
  // The library stays loaded for the life of the process: the communicator may be destroyed at
  // exit, after any owner of the handle would have gone.
  return lib;
}

const NcclLibrary& library() {
  static const NcclLibrary lib = open_library();
  return lib;
}

// Makes the communicator's GPU current for the scope; the caller's device comes back after.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceScope() {
    int current = previous_;
    cudaGetDevice(&current);
    if (current != previous_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

void device_segment_sum(const ExecContext& ctx, float* out, const float* parts, int64_t stride,
                        int n_parts, int64_t n) {
  comm::cuda::segment_sum(out, parts, stride, n_parts, n, ctx.stream);
}

// Which ranks there are and how they share NCCL's id.
struct World {
  int size = 1;
  int rank = 0;
  int device = 0;               // the GPU of this rank: its local rank
  Communicator* mpi = nullptr;  // under mpirun: the id travels over MPI
  std::string id_file;          // a launcher without MPI: the id travels through this file
};

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(const World& world)
      : lib_(library()),
        size_(world.size),
        rank_(world.rank),
        device_(world.device),
        mpi_(world.mpi) {
    if (!lib_.unavailable.empty()) fail(Errc::comm, "{}", lib_.unavailable);
    const DeviceScope scope(device_);
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    const CommStep init{"nccl: communicator init", kBootstrapTimeoutMs};
    const ncclUniqueId id = share_id(world, init);
    // From the toolkit's headers (2.28): an older NCCL at run time reads the fields it knows, up
    // to its own sizeof(ncclConfig_t) (the struct's size field says where ours ends).
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = "moekit";
    call(lib_.init_rank_config(&comm_, size_, id, rank_, &config), init, "ncclCommInitRankConfig");
    wait(init, std::nullopt, size_ > 1 ? "the other ranks" : "");
    // Every rank has joined: none will read the file again.
    if (rank_ == 0 && !world.id_file.empty()) std::remove(world.id_file.c_str());
    check_cuda(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaMalloc(&barrier_bytes_, static_cast<size_t>(2 * size_)), "cudaMalloc");
    reduce_arrays_ = ExchangeArrays(size_);
    barrier_arrays_ = ExchangeArrays(size_);
    sent_to_.assign(static_cast<size_t>(size_), 0);
  }

  // NCCL's teardown waits for the communicator's work to end; a rank whose exchanges failed has
  // already aborted it, and one whose teardown does not end in time aborts it then.
  ~NcclCommunicator() override {
    const DeviceScope scope(device_);
    cudaFree(barrier_bytes_);
    cudaStreamDestroy(own_stream_);
    if (comm_ == nullptr) return;
    const ncclResult_t finalized = lib_.finalize(comm_);
    if ((finalized != ncclSuccess && finalized != ncclInProgress) ||
        poll(std::nullopt, kBootstrapTimeoutMs)) {
      lib_.abort(comm_);
      return;
    }
    lib_.destroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view name() const override { return "nccl"; }
  DeviceKind buffers() const override { return DeviceKind::cuda; }

  void all_to_all(const ExecContext& ctx, const Exchange& x, const CommStep& step) override {
    exchange(ctx, x, step);
    count_sent(x);
  }

  bool enqueues() const override { return true; }

  // NCCL's calls on a non-blocking communicator are through once its state leaves
  // ncclInProgress: a wait on the host that takes no stream operation, so a capture goes on.
  void enqueue_all_to_all(const ExecContext& ctx, const Exchange& x,
                          const CommStep& step) override {
    const std::string peers = post(ctx, x, step, /*capturable=*/true);
    wait(step, std::nullopt, peers);
    count_sent(x);
  }

  void wait(const ExecContext& ctx, const CommStep& step) override {
    if (comm_ == nullptr) {
      fail(Errc::comm, "rank {}: step '{}' cannot run: an earlier exchange failed", rank_,
           step.name);
    }
    const DeviceScope scope(device_);
    wait(step, ctx.stream, size_ > 1 ? "the other ranks" : "");
  }

  void all_reduce_sum(const ExecContext& ctx, float* data, int64_t count, float* scratch,
                      const CommStep& step) override {
    const DeviceScope scope(device_);
    fixed_order_all_reduce(*this, reduce_arrays_, ctx, data, count, scratch, step,
                           device_segment_sum);
  }

  void enqueue_all_reduce_sum(const ExecContext& ctx, float* data, int64_t count, float* scratch,
                              const CommStep& step) override {
    const DeviceScope scope(device_);
    fixed_order_all_reduce(*this, reduce_arrays_, ctx, data, count, scratch, step,
                           device_segment_sum, /*enqueued=*/true);
  }

  int64_t all_reduce_scratch(int64_t count) const override {
    return fixed_order_reduce_scratch(size_, count);
  }

  // One byte to and from every rank, on a stream of its own: the layer's stream may be the one
  // that failed.
  bool barrier(const CommStep& step) override {
    if (comm_ == nullptr) return false;
    for (int p = 0; p < size_; ++p) {
      barrier_arrays_.send_offsets[p] = p;
      barrier_arrays_.send_bytes[p] = 1;
      barrier_arrays_.recv_offsets[p] = p;
      barrier_arrays_.recv_capacity[p] = 1;
    }
    try {
      exchange(own_context(), barrier_arrays_.view(barrier_bytes_, barrier_bytes_ + size_), step);
    } catch (const Error&) {
      return false;
    }
    return true;
  }

  const std::vector<int64_t>& bytes_sent_to() const override { return sent_to_; }

  // The grouped ncclSend/ncclRecv alone, of exactly these bytes: the counts are exchanged first
  // (NCCL's receives need them), then each timed call follows a barrier.
  double bare_all_to_all_seconds(const std::vector<int64_t>& bytes_to, int repeats) override {
    const DeviceScope scope(device_);
    const CommStep step{"bare all-to-all", kBootstrapTimeoutMs};
    constexpr auto kCount = static_cast<int64_t>(sizeof(int64_t));
    std::vector<int64_t> counts(static_cast<size_t>(2 * size_));
    ExchangeArrays a(size_);
    for (int p = 0; p < size_; ++p) {
      counts[p] = p == rank_ ? 0 : bytes_to[p];
      a.send_offsets[p] = p * kCount;
      a.send_bytes[p] = kCount;
      a.recv_offsets[p] = p * kCount;
      a.recv_capacity[p] = kCount;
    }
    const DeviceBytes count_bytes(2 * size_ * kCount);
    copy_sync(count_bytes.data, counts.data(), size_ * kCount, cudaMemcpyHostToDevice);
    exchange(own_context(), a.view(count_bytes.data, count_bytes.data + size_ * kCount), step);
    copy_sync(counts.data() + size_, count_bytes.data + size_ * kCount, size_ * kCount,
              cudaMemcpyDeviceToHost);
    int64_t sent = 0, received = 0;
    for (int p = 0; p < size_; ++p) {
      a.send_offsets[p] = sent;
      a.send_bytes[p] = counts[p];
      a.recv_offsets[p] = received;
      a.recv_capacity[p] = counts[size_ + p];
      sent += counts[p];
      received += counts[size_ + p];
    }
    const DeviceBytes send(std::max<int64_t>(sent, 1)), recv(std::max<int64_t>(received, 1));
    std::vector<double> seconds;
    for (int r = -1; r < repeats; ++r) {  // one untimed call first
      if (!barrier(step)) fail(Errc::comm, "rank {}: step '{}' lost a rank", rank_, step.name);
      const auto start = std::chrono::steady_clock::now();
      exchange(own_context(), a.view(send.data, recv.data), step);
      const auto end = std::chrono::steady_clock::now();
      if (r >= 0) seconds.push_back(std::chrono::duration<double>(end - start).count());
    }
    std::sort(seconds.begin(), seconds.end());
    return seconds.empty() ? 0.0 : seconds[seconds.size() / 2];
  }

  [[noreturn]] void abort(int code) override {
    abort_comm();
    if (mpi_ != nullptr) mpi_->abort(code);
    std::_Exit(code);
  }

 private:
  void count_sent(const Exchange& x) {
    for (int p = 0; p < size_; ++p) {
      if (p != rank_) sent_to_[p] += x.send_bytes[p];
    }
  }

  // all_to_all without counting its bytes as a dispatcher's.
  void exchange(const ExecContext& ctx, const Exchange& x, const CommStep& step) {
    const std::string peers = post(ctx, x, step, /*capturable=*/false);
    const DeviceScope scope(device_);
    wait(step, ctx.stream, peers);
    for (int p = 0; p < size_; ++p) x.received[p] = x.recv_capacity[p];
  }

  // The exchange's grouped sends and receives on ctx.stream; returns the peers it involves, for
  // the errors of the wait that follows.
  std::string post(const ExecContext& ctx, const Exchange& x, const CommStep& step,
                   bool capturable) {
    check_usable(ctx, step, capturable);
    for (int p = 0; p < size_; ++p) {
      if (x.send_bytes[p] < 0 || x.recv_capacity[p] < 0) {
        fail(Errc::internal, "rank {}: step '{}' exchanges a negative byte count with rank {}",
             rank_, step.name, p);
      }
    }
    if (x.send_bytes[rank_] != x.recv_capacity[rank_]) {
      fail(Errc::internal,
           "rank {}: step '{}' sends itself {} bytes into room for {}: over NCCL a receive "
           "takes the exact size",
           rank_, step.name, x.send_bytes[rank_], x.recv_capacity[rank_]);
    }
    const DeviceScope scope(device_);
    std::string peers;
    call(lib_.group_start(), step, "ncclGroupStart");
    for (int p = 0; p < size_; ++p) {
      const int64_t out = x.send_bytes[p], in = x.recv_capacity[p];
      if (out > 0) {
        call(lib_.send(x.send + x.send_offsets[p], static_cast<size_t>(out), ncclUint8, p, comm_,
                       ctx.stream),
             step, "ncclSend");
      }
      if (in > 0) {
        call(lib_.recv(x.recv + x.recv_offsets[p], static_cast<size_t>(in), ncclUint8, p, comm_,
                       ctx.stream),
             step, "ncclRecv");
      }
      if (p != rank_ && (out > 0 || in > 0)) {
        peers += (peers.empty() ? "rank " : ", ") + std::to_string(p);
      }
    }
    call(lib_.group_end(), step, "ncclGroupEnd");
    return peers;
  }

  ExecContext own_context() const {
    return {.device = Device::cuda(device_), .stream = own_stream_};
  }

  struct DeviceBytes {
    std::byte* data = nullptr;
    explicit DeviceBytes(int64_t bytes) {
      if (cudaMalloc(&data, static_cast<size_t>(bytes)) != cudaSuccess) {
        cudaGetLastError();
        fail(Errc::internal, "cudaMalloc of {} bytes for the bare all-to-all failed", bytes);
      }
    }
    ~DeviceBytes() { cudaFree(data); }
    DeviceBytes(const DeviceBytes&) = delete;
    DeviceBytes& operator=(const DeviceBytes&) = delete;
  };

  void copy_sync(void* to, const void* from, int64_t bytes, cudaMemcpyKind kind) {
    check_cuda(cudaMemcpyAsync(to, from, static_cast<size_t>(bytes), kind, own_stream_),
               "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(own_stream_), "cudaStreamSynchronize");
  }

  // The id comes from rank 0: over MPI under mpirun, through the file otherwise; one rank
  // makes its own.
  ncclUniqueId share_id(const World& world, const CommStep& step) {
    ncclUniqueId id{};
    if (rank_ == 0) call(lib_.get_unique_id(&id), step, "ncclGetUniqueId");
    if (size_ == 1) return id;
    if (world.mpi != nullptr) {
      constexpr auto kId = static_cast<int64_t>(sizeof(ncclUniqueId));
      ExchangeArrays a(size_);
      for (int p = 0; p < size_; ++p) {
        a.send_bytes[p] = rank_ == 0 && p != 0 ? kId : 0;
        a.recv_capacity[p] = p == 0 && rank_ != 0 ? kId : 0;
      }
      ncclUniqueId received{};
      world.mpi->all_to_all({}, a.view(&id, &received), step);
      return rank_ == 0 ? id : received;
    }
    return rank_ == 0 ? write_id_file(world.id_file, id, step) : read_id_file(world.id_file, step);
  }

  ncclUniqueId write_id_file(const std::string& path, const ncclUniqueId& id,
                             const CommStep& step) {
    if (std::filesystem::exists(path)) {
      fail(Errc::comm,
           "rank 0: step '{}': MOEKIT_NCCL_ID_FILE {} already exists; a file left by an earlier "
           "run would hand the other ranks a stale id: remove it, or name a fresh path",
           step.name, path);
    }
    // Written whole under another name, then renamed: a reader sees all of it or nothing.
    const std::string partial = path + ".partial." + std::to_string(getpid());
    {
      std::ofstream out(partial, std::ios::binary);
      out.write(reinterpret_cast<const char*>(&id), sizeof(id));
      if (!out) fail(Errc::comm, "rank 0: step '{}' could not write {}", step.name, partial);
    }
    std::error_code error;
    std::filesystem::rename(partial, path, error);
    if (error) {
      fail(Errc::comm, "rank 0: step '{}' could not rename {} to {}: {}", step.name, partial, path,
           error.message());
    }
    return id;
  }

  ncclUniqueId read_id_file(const std::string& path, const CommStep& step) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(step.timeout_ms);
    for (;;) {
      std::ifstream in(path, std::ios::binary);
      ncclUniqueId id{};
      if (in.read(reinterpret_cast<char*>(&id), sizeof(id))) return id;
      if (std::chrono::steady_clock::now() > deadline) {
        fail(Errc::comm,
             "rank {}: step '{}' timed out after {} ms waiting for rank 0 to write NCCL's id to "
             "MOEKIT_NCCL_ID_FILE {}",
             rank_, step.name, step.timeout_ms, path);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  void check_usable(const ExecContext& ctx, const CommStep& step, bool capturable) const {
    if (comm_ == nullptr) {
      fail(Errc::comm, "rank {}: step '{}' cannot run: an earlier exchange failed", rank_,
           step.name);
    }
    if (capturable) return;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(ctx.stream, &capture) == cudaSuccess &&
        capture != cudaStreamCaptureStatusNone) {
      fail(Errc::invalid_argument,
           "rank {}: step '{}' cannot be captured in a CUDA graph: the NCCL communicator waits "
           "for each exchange on the host, against its deadline",
           rank_, step.name);
    }
  }

  void check_cuda(cudaError_t status, const char* what) {
    if (status == cudaSuccess) return;
    cudaGetLastError();
    fail(Errc::comm, "rank {} on cuda:{}: {} failed: {}", rank_, device_, what,
         cudaGetErrorString(status));
  }

  std::string describe(ncclResult_t result) const {
    std::string text = lib_.error_string(result);
    if (comm_ != nullptr) {
      if (const char* last = lib_.last_error(comm_); last != nullptr && *last != '\0') {
        text += fmt::format(" ({})", last);
      }
    }
    return text;
  }

  // A call that NCCL accepted answers ncclSuccess, or ncclInProgress on a non-blocking
  // communicator until wait() sees it through.
  void call(ncclResult_t result, const CommStep& step, const char* what) {
    if (result == ncclSuccess || result == ncclInProgress) return;
    fail_step(step, fmt::format("{} failed: {}", what, describe(result)));
  }

  // Polls until NCCL has finished the calls it accepted (the communicator's state leaves
  // ncclInProgress) and, given a stream, until the stream has run the work NCCL put on it:
  // busily for kSpin, then yielding, and after kYield sleeping between polls. Nothing when
  // done; otherwise what went wrong.
  std::optional<std::string> poll(std::optional<cudaStream_t> stream, int64_t timeout_ms) {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      ncclResult_t state = ncclSuccess;
      if (const ncclResult_t r = lib_.async_error(comm_, &state); r != ncclSuccess) {
        return "ncclCommGetAsyncError failed: " + describe(r);
      }
      if (state != ncclSuccess && state != ncclInProgress) {
        return "NCCL reported an error: " + describe(state);
      }
      if (state == ncclSuccess) {
        if (!stream) return std::nullopt;
        const cudaError_t status = cudaStreamQuery(*stream);
        if (status == cudaSuccess) return std::nullopt;
        if (status != cudaErrorNotReady) {
          cudaGetLastError();
          return fmt::format("the stream failed: {}", cudaGetErrorString(status));
        }
      }
      const auto now = std::chrono::steady_clock::now();
      if (now > deadline) return fmt::format("timed out after {} ms", timeout_ms);
      if (now < start + kSpin) continue;
      if (now < start + kYield) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
  }

  void wait(const CommStep& step, std::optional<cudaStream_t> stream, const std::string& peers) {
    const std::optional<std::string> why = poll(stream, step.timeout_ms);
    if (!why) return;
    const std::string waiting = peers.empty()
                                    ? std::string()
                                    : fmt::format(
                                          " in its exchange with {} (a rank that died, stopped "
                                          "answering, or took another path)",
                                          peers);
    fail_step(step, *why + waiting);
  }

  [[noreturn]] void fail_step(const CommStep& step, const std::string& why) {
    abort_comm();
    fail(Errc::comm, "rank {}: step '{}' {}", rank_, step.name, why);
  }

  void abort_comm() {
    if (comm_ == nullptr) return;
    const DeviceScope scope(device_);
    lib_.abort(comm_);
    comm_ = nullptr;
  }

  const NcclLibrary& lib_;
  int size_ = 1;
  int rank_ = 0;
  int device_ = 0;
  Communicator* mpi_ = nullptr;
  ncclComm_t comm_ = nullptr;  // nullptr once aborted
  cudaStream_t own_stream_ = nullptr;
  std::byte* barrier_bytes_ = nullptr;
  std::vector<int64_t> sent_to_;
  ExchangeArrays reduce_arrays_{0};
  ExchangeArrays barrier_arrays_{0};
};

std::mutex& world_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::unique_ptr<NcclCommunicator>& world_slot() {
  static std::unique_ptr<NcclCommunicator> world;
  return world;
}

}  // namespace

std::string nccl_unavailable_reason() {
  return library().unavailable;
}

Communicator& nccl_world(Communicator& (*mpi)()) {
  const std::lock_guard<std::mutex> lock(world_mutex());
  std::unique_ptr<NcclCommunicator>& slot = world_slot();
  if (slot) return *slot;
  // NVLink multicast (NVLS) off unless the user set it: on the shared multi-GPU machines a
  // multicast object left behind by a process that died can take the GPUs out of service.
  // Before the first NCCL call, which reads the environment once.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  const Platform platform = Platform::probe();
  World world{.size = platform.world_size,
              .rank = platform.world_rank,
              .device = platform.world_local_rank,
              .mpi = nullptr,
              .id_file = {}};
  if (const char* file = std::getenv("MOEKIT_NCCL_ID_FILE"); file != nullptr && *file != '\0') {
    world.id_file = file;
  } else if (world.size > 1) {
    if (mpi == nullptr) {
      fail(Errc::comm,
           "the NCCL communicator over {} ranks needs NCCL's id shared: this build has no MPI to "
           "share it under mpirun, so set MOEKIT_NCCL_ID_FILE to a path every rank can read "
           "(docs/EXPERT_PARALLEL.md)",
           world.size);
    }
    world.mpi = &mpi();
    if (world.mpi->size() != world.size || world.mpi->rank() != world.rank) {
      fail(Errc::comm,
           "MPI sees rank {} of {}, the launcher's environment rank {} of {}: start the ranks "
           "with mpirun, or with a launcher without MPI set MOEKIT_NCCL_ID_FILE",
           world.mpi->rank(), world.mpi->size(), world.rank, world.size);
    }
  }
  slot = std::make_unique<NcclCommunicator>(world);
  return *slot;
}

Communicator* nccl_world_if_made() {
  const std::lock_guard<std::mutex> lock(world_mutex());
  return world_slot().get();
}

}  // namespace moekit
