// moekit run: one MoE layer of a Hugging Face checkpoint over hidden states from a safetensors
// file, its output, top-k ids and weights written to another. Under mpirun with --a2a mpi (or nccl)
// each rank takes its slice of the tokens and rank 0 gathers the results into the one output file;
// in the reduce form (--a2a none with --ep-size/--tp-size) every rank computes the whole output
// and rank 0 writes it (docs/EXPERT_PARALLEL.md).

#include <algorithm>
#include <cstdio>
#include <vector>

#include "comm/communicator.hpp"
#include "commands.hpp"
#include "moekit/checkpoint.hpp"
#include "moekit/layer.hpp"
#include "moekit/safetensors.hpp"

namespace moekit::cli {
namespace {

struct RunFlags {
  PlanFlags plan;
  std::string model;
  int layer = -1;
  std::string input;
  std::string output;
};

bool is_float_activation(DType dtype) {
  return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
}

// A [rows, cols] float tensor of the input file, named in every complaint.
TensorView input_matrix(const SafetensorsFile& file, const char* name, int64_t rows, int64_t cols) {
  const TensorView t = file.view(name);
  const bool rows_ok = rows < 0 || (t.rank() == 2 && t.dim(0) == rows);
  if (t.rank() != 2 || t.dim(1) != cols || !rows_ok) {
    fail(Errc::invalid_argument, "{}: '{}' must have shape [{}, {}], got {}", file.path(), name,
         rows < 0 ? std::string("T") : std::to_string(rows), cols, t.shape.str());
  }
  if (!is_float_activation(t.dtype)) {
    fail(Errc::invalid_argument, "{}: '{}' must be f32, bf16 or f16, got {}", file.path(), name,
         dtype_name(t.dtype));
  }
  return t;
}

// A GPU layer reads and writes its device's memory: the inputs go up, the results come back.
void forward_on_device(MoeLayer& layer, const TensorView& hidden, const TensorView& logits,
                       Tensor& output, Tensor& ids, Tensor& weights) {
  const Device device = layer.plan().options.device;
  const auto on_device = [&device](const TensorView& host) {
    Tensor t = Tensor::empty(host.dtype, host.shape, device);
    copy(t.view(), host);
    return t;
  };
  const Tensor hidden_d = on_device(hidden), logits_d = on_device(logits);
  Tensor output_d = Tensor::empty(output.view().dtype, output.view().shape, device);
  Tensor ids_d = Tensor::empty(DType::i32, ids.view().shape, device);
  Tensor weights_d = Tensor::empty(DType::f32, weights.view().shape, device);
  const RoutingResult routing{ids_d.view(), weights_d.view()};
  layer.forward(hidden_d, logits_d, output_d.view(), &routing);
  copy(output.view(), output_d.view());
  copy(ids.view(), ids_d.view());
  copy(weights.view(), weights_d.view());
}

// The tokens of each rank under --a2a mpi or nccl: contiguous slices, the first T % ranks one
// longer.
struct Slice {
  int64_t first = 0;
  int64_t count = 0;
};
std::vector<Slice> token_slices(int64_t T, int ranks) {
  std::vector<Slice> slices(static_cast<size_t>(ranks));
  int64_t first = 0;
  for (int r = 0; r < ranks; ++r) {
    const int64_t count = T / ranks + (r < T % ranks ? 1 : 0);
    slices[static_cast<size_t>(r)] = {first, count};
    first += count;
  }
  return slices;
}

// Every rank's rows of a [rows, cols] tensor into rank 0's `all` (only rank 0's is used).
void gather_rows(Communicator& comm, const TensorView& mine, const Tensor& all,
                 const std::vector<Slice>& slices, int64_t timeout_ms) {
  const int size = comm.size();
  const bool root = comm.rank() == 0;
  const int64_t row_bytes = dtype_storage_bytes(mine.dtype, mine.dim(1));
  ExchangeArrays a(size);
  for (int p = 0; p < size; ++p) {
    const Slice& s = slices[static_cast<size_t>(p)];
    a.send_offsets[p] = 0;
    a.send_bytes[p] = p == 0 ? mine.dim(0) * row_bytes : 0;
    a.recv_offsets[p] = root ? s.first * row_bytes : 0;
    a.recv_capacity[p] = root ? s.count * row_bytes : 0;
  }
  const CommStep step{"run: gather the outputs on rank 0", timeout_ms};
  if (comm.buffers() == DeviceKind::cpu) {
    comm.all_to_all({}, a.view(mine.data, root ? all.view().data : nullptr), step);
    return;
  }
  // Over NCCL the rows travel between copies on this rank's GPU.
  const Device gpu = Device::cuda(Platform::probe().world_local_rank);
  Tensor sent = Tensor::empty(mine.dtype, mine.shape, gpu);
  copy(sent, mine);
  Tensor received = Tensor::empty(all.view().dtype, root ? all.view().shape : Shape{0}, gpu);
  comm.all_to_all({.device = gpu}, a.view(sent.view().data, received.view().data), step);
  if (root) copy(all, received);
}

int run(const RunFlags& flags) {
  const Checkpoint checkpoint = Checkpoint::open(flags.model);
  const ModelSpec spec = checkpoint.spec(flags.layer);
  const SafetensorsFile input = SafetensorsFile::open(flags.input);
  const TensorView all_hidden = input_matrix(input, "hidden_states", -1, spec.hidden);
  const int64_t all_T = all_hidden.dim(0);
  const Platform platform = Platform::probe();

  Options options = flags.plan.options();
  options.weights = checkpoint.format_for(flags.layer, flags.plan.requested_quant());
  const bool sliced = owns_its_tokens(options);
  const std::vector<Slice> slices = token_slices(all_T, sliced ? platform.world_size : 1);
  const Slice mine = slices[sliced ? static_cast<size_t>(platform.world_rank) : 0];
  // Every rank plans the same largest slice: the all-to-all's buffers must agree.
  options.max_tokens = std::max<int64_t>(slices.front().count, 1);
  const Plan plan = resolve(spec, options, platform);
  const TensorView hidden = all_hidden.narrow(0, mine.first, mine.count);
  const int64_t T = mine.count;

  const bool logits_given = input.find("router_logits") != nullptr;
  Tensor computed_logits;
  TensorView logits;
  if (logits_given) {
    logits = input_matrix(input, "router_logits", all_T, spec.n_experts)
                 .narrow(0, mine.first, mine.count);
  } else {
    computed_logits = Tensor::empty(DType::f32, {T, spec.n_experts});
    checkpoint.router(flags.layer).logits(hidden, computed_logits.view());
    logits = computed_logits.view();
  }

  MoeLayer layer = checkpoint.load(flags.layer, plan);
  const int k = spec.routing.top_k;
  Tensor output = Tensor::empty(hidden.dtype, {T, spec.hidden});
  Tensor ids = Tensor::empty(DType::i32, {T, k});
  Tensor weights = Tensor::empty(DType::f32, {T, k});
  if (plan.options.device.kind == DeviceKind::cpu) {
    const RoutingResult routing{ids.view(), weights.view()};
    layer.forward(hidden, logits, output.view(), &routing);
  } else {
    forward_on_device(layer, hidden, logits, output, ids, weights);
  }

  std::map<std::string, std::string> metadata{
      {"model", flags.model},
      {"layer", std::to_string(flags.layer)},
      {"weights", plan.quant.describe()},
      {"router_logits",
       computed_logits.view().data ? "computed by the checkpoint's gate" : "from the input"},
  };
  if (plan.comm != CommKind::none) {
    Communicator& comm = world_communicator(plan.comm);
    metadata["ranks"] =
        sliced ? fmt::format(
                     "{} ranks, a2a {}: each rank computed its slice of the tokens, rank "
                     "0 gathered them",
                     comm.size(), a2a_name(plan.options.a2a))
               : fmt::format(
                     "{} ranks, the reduce form: every rank computed the whole output, rank "
                     "0 wrote it",
                     comm.size());
    if (sliced) {
      Tensor all_output = Tensor::empty(output.view().dtype, {all_T, spec.hidden});
      Tensor all_ids = Tensor::empty(DType::i32, {all_T, k});
      Tensor all_weights = Tensor::empty(DType::f32, {all_T, k});
      const int64_t timeout = plan.options.comm_timeout_ms;
      gather_rows(comm, output.view(), all_output, slices, timeout);
      gather_rows(comm, ids.view(), all_ids, slices, timeout);
      gather_rows(comm, weights.view(), all_weights, slices, timeout);
      output = std::move(all_output);
      ids = std::move(all_ids);
      weights = std::move(all_weights);
    }
    if (comm.rank() != 0) {
      std::printf("rank %d: %lld tokens computed; rank 0 writes %s\n", comm.rank(),
                  static_cast<long long>(T), flags.output.c_str());
      return 0;
    }
  } else if (plan.options.ep.size > 1 || plan.options.tp.size > 1) {
    metadata["ep"] = fmt::format(
        "ep rank {} of {}, tp rank {} of {}: output is this rank's partial sum",
        plan.options.ep.rank, plan.options.ep.size, plan.options.tp.rank, plan.options.tp.size);
  }
  write_safetensors(
      flags.output,
      {{"output", output.view()}, {"topk_ids", ids.view()}, {"topk_weights", weights.view()}},
      metadata);
  std::printf("%s\nlayer %d: %lld tokens, weights %s, router logits %s; wrote %s\n",
              spec.summary().c_str(), flags.layer, static_cast<long long>(all_T),
              plan.quant.describe().c_str(), metadata["router_logits"].c_str(),
              flags.output.c_str());
  if (metadata.count("ranks") != 0) std::printf("%s\n", metadata["ranks"].c_str());
  return 0;
}

}  // namespace

Command add_run_command(CLI::App& app) {
  auto flags = std::make_shared<RunFlags>();
  CLI::App* cmd = app.add_subcommand(
      "run", "run one MoE layer of a Hugging Face checkpoint on hidden states from a file");
  cmd->add_option("--model", flags->model, "model directory: config.json and *.safetensors")
      ->required();
  cmd->add_option("--layer", flags->layer, "decoder layer index (an MoE layer)")->required();
  cmd->add_option("--input", flags->input,
                  "safetensors file: hidden_states [T, H], optional router_logits [T, E]")
      ->required();
  cmd->add_option("--output", flags->output,
                  "safetensors file to write: output [T, H], topk_ids, topk_weights")
      ->required();
  flags->plan.add_deployment(*cmd, "--quantize");
  return {cmd, [flags] { return run(*flags); }};
}

}  // namespace moekit::cli
