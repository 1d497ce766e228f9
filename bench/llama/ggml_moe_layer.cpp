// The Qwen3-30B-A3B MoE layer as llama.cpp builds it (build_moe_ffn: softmax router, top-k,
// renormalised weights, ggml_mul_mat_id for gate, up and down, SwiGLU, the weighted sum of the
// k rows), run on ggml's CPU backend and timed the way `moekit bench` times a case: median of
// the timed runs after warm-up, router logits rotated over 8 sets so that each run routes to
// other experts. Built against a ggml checkout outside this repository
// (bench/llama/compare_ggml.sh); never part of the moekit build.
//
//   ggml_moe_layer --type bf16|q4_0|q4_K|q8_0 [--repack] [--tokens 1,16,512] [--threads 2]
//
// --repack puts the weights in ggml's CPU_REPACK buffer (interleaved rows for its GEMM kernels,
// as llama.cpp loads a model on the CPU by default); types it has no layout for stay as they are.
// Prints one line per T: type, layout, T, median ms, min ms.

#include <ggml-alloc.h>
#include <ggml-backend.h>
#include <ggml-cpu.h>
#include <ggml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace {

constexpr int kExperts = 128, kTopK = 8, kHidden = 2048, kIntermediate = 768;
constexpr int kLogitSets = 8;

struct Options {
  ggml_type type = GGML_TYPE_BF16;
  std::string type_name = "bf16";
  bool repack = false;
  std::vector<int> tokens = {1, 16, 512};
  int threads = 2;
  int repeats = 10;
  int warmup = 2;
};

[[noreturn]] void fail(const char* why) {
  std::fprintf(stderr, "ggml_moe_layer: %s\n", why);
  std::exit(1);
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "ggml_moe_layer: %s\nusage: ggml_moe_layer --type bf16|q4_0|q4_K|q8_0 [--repack] "
               "[--tokens 1,16,512] [--threads N] [--repeats N]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--type") {
      o.type_name = value();
      if (o.type_name == "bf16") {
        o.type = GGML_TYPE_BF16;
      } else if (o.type_name == "q4_0") {
        o.type = GGML_TYPE_Q4_0;
      } else if (o.type_name == "q4_K") {
        o.type = GGML_TYPE_Q4_K;
      } else if (o.type_name == "q8_0") {
        o.type = GGML_TYPE_Q8_0;
      } else {
        usage(("unknown --type " + o.type_name).c_str());
      }
    } else if (a == "--repack") {
      o.repack = true;
    } else if (a == "--tokens") {
      o.tokens.clear();
      std::stringstream list(value());
      for (std::string t; std::getline(list, t, ',');) o.tokens.push_back(std::stoi(t));
    } else if (a == "--threads") {
      o.threads = std::stoi(value());
    } else if (a == "--repeats") {
      o.repeats = std::stoi(value());
    } else {
      usage(("unknown argument " + a).c_str());
    }
  }
  return o;
}

// [n_per_row, rows] of `type` from normal values of standard deviation `sigma`, one expert
// matrix at a time (rows_per_call rows), as a whole-tensor byte image.
std::vector<uint8_t> random_weights(ggml_type type, int64_t n_per_row, int64_t rows,
                                    int64_t rows_per_call, float sigma, std::mt19937& rng) {
  std::vector<uint8_t> bytes(ggml_row_size(type, n_per_row) * rows);
  std::vector<float> values(static_cast<size_t>(n_per_row * rows_per_call));
  std::normal_distribution<float> normal(0.0f, sigma);
  for (int64_t r0 = 0; r0 < rows; r0 += rows_per_call) {
    for (float& v : values) v = normal(rng);
    uint8_t* dst = bytes.data() + ggml_row_size(type, n_per_row) * r0;
    if (type == GGML_TYPE_BF16) {
      ggml_fp32_to_bf16_row(values.data(), reinterpret_cast<ggml_bf16_t*>(dst),
                            n_per_row * rows_per_call);
    } else {
      ggml_quantize_chunk(type, values.data(), dst, 0, rows_per_call, n_per_row, nullptr);
    }
  }
  return bytes;
}

ggml_backend_buffer_type_t repack_buffer_type(ggml_backend_t cpu) {
  ggml_backend_dev_t dev = ggml_backend_get_device(cpu);
  auto get = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(ggml_backend_reg_get_proc_address(
      ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts"));
  if (get == nullptr) return nullptr;
  for (ggml_backend_buffer_type_t* b = get(dev); b != nullptr && *b != nullptr; ++b) {
    if (std::strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) return *b;
  }
  return nullptr;
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  ggml_backend_t cpu = ggml_backend_cpu_init();
  ggml_backend_cpu_set_n_threads(cpu, o.threads);
  std::mt19937 rng(2024);

  // The experts' weights, in the CPU buffer or the repacking one.
  ggml_init_params weight_params{
      .mem_size = 4 * ggml_tensor_overhead(), .mem_buffer = nullptr, .no_alloc = true};
  ggml_context* wctx = ggml_init(weight_params);
  ggml_tensor* gate = ggml_new_tensor_3d(wctx, o.type, kHidden, kIntermediate, kExperts);
  ggml_tensor* up = ggml_new_tensor_3d(wctx, o.type, kHidden, kIntermediate, kExperts);
  ggml_tensor* down = ggml_new_tensor_3d(wctx, o.type, kIntermediate, kHidden, kExperts);
  ggml_backend_buffer_type_t buft = ggml_backend_cpu_buffer_type();
  std::string layout = "plain";
  if (o.repack && o.type != GGML_TYPE_BF16) {
    buft = repack_buffer_type(cpu);
    if (buft == nullptr) fail("this ggml has no CPU_REPACK buffer type");
    layout = "repacked";
  }
  ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, buft);
  ggml_backend_buffer_set_usage(wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
  const float sigma_in = 1.0f / std::sqrt(static_cast<float>(kHidden));
  const float sigma_out = 1.0f / std::sqrt(static_cast<float>(kIntermediate));
  for (auto [t, n_per_row, rows, sigma] : {std::tuple{gate, kHidden, kIntermediate, sigma_in},
                                           std::tuple{up, kHidden, kIntermediate, sigma_in},
                                           std::tuple{down, kIntermediate, kHidden, sigma_out}}) {
    const std::vector<uint8_t> bytes =
        random_weights(o.type, n_per_row, int64_t{rows} * kExperts, rows, sigma, rng);
    ggml_backend_tensor_set(t, bytes.data(), 0, bytes.size());
  }

  for (const int T : o.tokens) {
    ggml_init_params graph_params{
        .mem_size = 64 * ggml_tensor_overhead() + ggml_graph_overhead_custom(256, false),
        .mem_buffer = nullptr,
        .no_alloc = true};
    ggml_context* ctx = ggml_init(graph_params);
    ggml_tensor* x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, kHidden, T);
    ggml_tensor* logits = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, kExperts, T);
    ggml_set_input(x);
    ggml_set_input(logits);
    // llama.cpp's build_moe_ffn for a softmax router with normalised top-k weights.
    ggml_tensor* probs = ggml_soft_max(ctx, logits);
    ggml_tensor* selected = ggml_top_k(ctx, probs, kTopK);  // [k, T]
    ggml_tensor* weights =
        ggml_get_rows(ctx, ggml_reshape_3d(ctx, probs, 1, kExperts, T), selected);  // [1, k, T]
    weights = ggml_reshape_2d(ctx, weights, kTopK, T);
    weights = ggml_div(ctx, weights, ggml_sum_rows(ctx, weights));
    weights = ggml_reshape_3d(ctx, weights, 1, kTopK, T);
    ggml_tensor* cur = ggml_reshape_3d(ctx, x, kHidden, 1, T);
    ggml_tensor* g = ggml_mul_mat_id(ctx, gate, cur, selected);  // [I, k, T]
    ggml_tensor* u = ggml_mul_mat_id(ctx, up, cur, selected);
    ggml_tensor* act = ggml_swiglu_split(ctx, g, u);
    ggml_tensor* experts = ggml_mul_mat_id(ctx, down, act, selected);  // [H, k, T]
    experts = ggml_mul(ctx, experts, weights);
    ggml_tensor* out = nullptr;
    for (int j = 0; j < kTopK; ++j) {
      ggml_tensor* row = ggml_view_2d(ctx, experts, kHidden, T, experts->nb[2], j * experts->nb[1]);
      out = out == nullptr ? row : ggml_add(ctx, out, row);
    }
    ggml_set_output(out);
    ggml_cgraph* graph = ggml_new_graph_custom(ctx, 256, false);
    ggml_build_forward_expand(graph, out);
    ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_cpu_buffer_type());
    if (!ggml_gallocr_alloc_graph(galloc, graph)) fail("could not allocate the graph");

    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> hidden(static_cast<size_t>(kHidden) * T);
    for (float& v : hidden) v = normal(rng);
    ggml_backend_tensor_set(x, hidden.data(), 0, hidden.size() * sizeof(float));
    std::vector<std::vector<float>> logit_sets(
        kLogitSets, std::vector<float>(static_cast<size_t>(kExperts) * T));
    for (auto& set : logit_sets)
      for (float& v : set) v = normal(rng);

    std::vector<double> times;
    for (int run = 0; run < o.warmup + o.repeats; ++run) {
      const auto& set = logit_sets[run % kLogitSets];
      ggml_backend_tensor_set(logits, set.data(), 0, set.size() * sizeof(float));
      const auto start = std::chrono::steady_clock::now();
      if (ggml_backend_graph_compute(cpu, graph) != GGML_STATUS_SUCCESS) {
        fail("graph compute failed");
      }
      if (run >= o.warmup) times.push_back(ms_since(start));
    }
    std::vector<float> result(static_cast<size_t>(kHidden) * T);
    ggml_backend_tensor_get(out, result.data(), 0, result.size() * sizeof(float));
    const bool finite =
        std::all_of(result.begin(), result.end(), [](float v) { return std::isfinite(v); });
    std::sort(times.begin(), times.end());
    std::printf("ggml %-5s %-8s T=%-5d median %9.3f ms  min %9.3f ms  threads %d%s\n",
                o.type_name.c_str(), layout.c_str(), T, times[times.size() / 2], times.front(),
                o.threads, finite ? "" : "  (non-finite output!)");
    std::fflush(stdout);
    ggml_gallocr_free(galloc);
    ggml_free(ctx);
  }
  ggml_backend_buffer_free(wbuf);
  ggml_free(wctx);
  ggml_backend_free(cpu);
  return 0;
}
