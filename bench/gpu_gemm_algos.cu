// Does cuBLASLt have faster algorithms for the reference step's GEMMs than the one its heuristic
// ranks first (the one cuBLAS, and so torch, runs)?
//
// For each of the 15 GEMMs of the 1.1B reference step (QKV, proj, fc1, fc2, output layer; each
// forward, input gradient and weight gradient into an fp32 main_grad, as megatron.cpp issues
// them) it asks cuBLASLt's heuristic for up to --algos candidates, times each alone (CUDA events,
// after warm-up), and prints the first candidate against the fastest. Then it runs the whole
// step's GEMMs back to back, with the first candidates and with the fastest, alternated, because
// one-by-one speed on a rested GPU is not the speed under a step's sustained load.
//
//   nvcc -O2 -arch=sm_90 bench/gpu_gemm_algos.cu -lcublasLt -o gemm_algos && ./gemm_algos [--algos 32]
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <algorithm>
#include <string>
#include <vector>

#define CHECK_CUDA(x)                                                                  \
  do {                                                                                 \
    cudaError_t e = (x);                                                               \
    if (e != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)
#define CHECK_LT(x)                                                                        \
  do {                                                                                     \
    cublasStatus_t s = (x);                                                                \
    if (s != CUBLAS_STATUS_SUCCESS) {                                                      \
      std::fprintf(stderr, "%s:%d %s: cublas status %d\n", __FILE__, __LINE__, #x, (int)s); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;

// One column-major GEMM D = alpha op(A) op(B) + beta C, as cuBLASLt sees a row-major one.
struct Gemm {
  std::string name;
  cublasOperation_t trans_a, trans_b;
  int m, n, k, lda, ldb, ldc;
  cudaDataType_t out_type;  // bf16, or fp32 for the weight gradient into main_grad
  float beta;
  int count;  // how many per step
  void *a = nullptr, *b = nullptr, *c = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> candidates;
  int fastest = 0;
};

// Normally distributed values (sum of four uniforms, random sign and mantissa): a GEMM's power
// draw, and with it the clock under sustained load, depends on how many bits toggle, so the data
// must look like a training step's (torch.randn in bench/gpu_gemm_ceiling.py), not like a constant.
void* device_random(size_t elements, cudaDataType_t type) {
  const size_t bytes = elements * (type == CUDA_R_32F ? 4 : 2);
  std::vector<unsigned char> host(bytes);
  uint64_t state = 0x9e3779b97f4a7c15ull ^ elements;
  auto uniform = [&] {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return (state >> 11) * (1.0 / 9007199254740992.0);
  };
  for (size_t i = 0; i < elements; ++i) {
    const float x = float((uniform() + uniform() + uniform() + uniform() - 2.0) * 1.7320508);
    if (type == CUDA_R_32F) {
      std::memcpy(&host[4 * i], &x, 4);
    } else {
      const __nv_bfloat16 b = __float2bfloat16(x);
      std::memcpy(&host[2 * i], &b, 2);
    }
  }
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, bytes));
  CHECK_CUDA(cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice));
  return p;
}

void setup(cublasLtHandle_t lt, Gemm& g, int max_algos) {
  CHECK_LT(cublasLtMatmulDescCreate(&g.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CHECK_LT(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSA, &g.trans_a, sizeof(g.trans_a)));
  CHECK_LT(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSB, &g.trans_b, sizeof(g.trans_b)));
  const int a_rows = g.trans_a == CUBLAS_OP_N ? g.m : g.k, a_cols = g.trans_a == CUBLAS_OP_N ? g.k : g.m;
  const int b_rows = g.trans_b == CUBLAS_OP_N ? g.k : g.n, b_cols = g.trans_b == CUBLAS_OP_N ? g.n : g.k;
  CHECK_LT(cublasLtMatrixLayoutCreate(&g.la, CUDA_R_16BF, a_rows, a_cols, g.lda));
  CHECK_LT(cublasLtMatrixLayoutCreate(&g.lb, CUDA_R_16BF, b_rows, b_cols, g.ldb));
  CHECK_LT(cublasLtMatrixLayoutCreate(&g.lc, g.out_type, g.m, g.n, g.ldc));
  g.a = device_random((size_t)a_rows * a_cols, CUDA_R_16BF);
  g.b = device_random((size_t)b_rows * b_cols, CUDA_R_16BF);
  g.c = device_random((size_t)g.m * g.n, g.out_type);

  cublasLtMatmulPreference_t pref;
  CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kWorkspaceBytes;
  CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  g.candidates.resize(max_algos);
  int found = 0;
  CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, g.op, g.la, g.lb, g.lc, g.lc, pref, max_algos, g.candidates.data(), &found));
  if (found == 0) {
    std::fprintf(stderr, "%s: cuBLASLt offers no algorithm for this GEMM\n", g.name.c_str());
    std::exit(1);
  }
  g.candidates.resize(found);
  cublasLtMatmulPreferenceDestroy(pref);
}

bool run(cublasLtHandle_t lt, const Gemm& g, int which, void* workspace, cudaStream_t stream) {
  const float alpha = 1.0f;
  return cublasLtMatmul(lt, g.op, &alpha, g.a, g.la, g.b, g.lb, &g.beta, g.c, g.lc, g.c, g.lc,
                        &g.candidates[which].algo, workspace, kWorkspaceBytes, stream) == CUBLAS_STATUS_SUCCESS;
}

float time_ms(cudaStream_t stream, int reps, const std::function<void()>& body) {
  cudaEvent_t start, end;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&end));
  CHECK_CUDA(cudaEventRecord(start, stream));
  for (int r = 0; r < reps; ++r) body();
  CHECK_CUDA(cudaEventRecord(end, stream));
  CHECK_CUDA(cudaEventSynchronize(end));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, end));
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  return ms / reps;
}

std::string describe(const cublasLtMatmulAlgo_t& algo) {
  int id = 0, tile = 0, stages = 0, splitk = 0, swizzle = 0;
  size_t got = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &got);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &got);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &got);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &got);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof(swizzle), &got);
  char text[96];
  std::snprintf(text, sizeof(text), "algo %d tile %d stages %d splitk %d swizzle %d", id, tile, stages, splitk, swizzle);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  int max_algos = 32, reps = 20, rounds = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--algos")) max_algos = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
    else { std::fprintf(stderr, "unknown flag %s (--algos N, --reps N, --rounds N)\n", argv[i]); return 2; }
  }
  const int t = 8192, hidden = 2048, ffn = 5632, layers = 22, vocab = 32000, qkv = 2048 + 2 * 4 * 64;
  struct Linear { const char* name; int in, out, count; };
  const Linear linears[] = {{"qkv", hidden, qkv, layers}, {"proj", hidden, hidden, layers},
                            {"fc1", hidden, 2 * ffn, layers}, {"fc2", ffn, hidden, layers},
                            {"output", hidden, vocab, 1}};
  std::vector<Gemm> gemms;
  for (const Linear& l : linears) {
    const int k = l.in, n = l.out;
    // Row-major Y[t, n] = X[t, k] W[n, k]^T is column-major Y^T = op_T(W) X^T.
    gemms.push_back({std::string(l.name) + " forward", CUBLAS_OP_T, CUBLAS_OP_N, n, t, k, k, k, n, CUDA_R_16BF, 0.f, l.count});
    // dX[t, k] = dY[t, n] W[n, k]: column-major dX^T = W^T dY^T.
    gemms.push_back({std::string(l.name) + " dgrad", CUBLAS_OP_N, CUBLAS_OP_N, k, t, n, k, n, k, CUDA_R_16BF, 0.f, l.count});
    // dW[n, k] += dY^T X in fp32: column-major dW^T = X^T op_T(dY^T).
    gemms.push_back({std::string(l.name) + " wgrad", CUBLAS_OP_N, CUBLAS_OP_T, k, n, t, k, n, k, CUDA_R_32F, 1.f, l.count});
  }

  cublasLtHandle_t lt;
  CHECK_LT(cublasLtCreate(&lt));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  void* workspace = nullptr;
  CHECK_CUDA(cudaMalloc(&workspace, kWorkspaceBytes));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("cuBLASLt %zu on %s: up to %d heuristic candidates per GEMM, %d reps each\n",
              cublasLtGetVersion(), prop.name, max_algos, reps);
  std::printf("%-15s %5s %10s %10s %8s %8s  %s\n", "GEMM", "cands", "first ms", "best ms", "gain", "TFLOP/s", "fastest");

  double first_step = 0, best_step = 0;
  for (Gemm& g : gemms) {
    setup(lt, g, max_algos);
    std::vector<float> ms(g.candidates.size(), 1e30f);
    for (size_t i = 0; i < g.candidates.size(); ++i) {
      if (!run(lt, g, (int)i, workspace, stream)) continue;  // not runnable with this workspace
      for (int w = 0; w < 2; ++w) run(lt, g, (int)i, workspace, stream);
      ms[i] = time_ms(stream, reps, [&] { run(lt, g, (int)i, workspace, stream); });
    }
    // Time the first again last, so that a warming GPU does not favour later candidates.
    if (!ms.empty() && ms[0] < 1e30f) ms[0] = std::min(ms[0], time_ms(stream, reps, [&] { run(lt, g, 0, workspace, stream); }));
    for (size_t i = 0; i < ms.size(); ++i) if (ms[i] < ms[g.fastest]) g.fastest = (int)i;
    const double flops = 2.0 * g.m * g.n * g.k;
    std::printf("%-15s %5zu %10.4f %10.4f %7.1f%% %8.1f  #%d %s\n", g.name.c_str(), g.candidates.size(), ms[0],
                ms[g.fastest], 100.0 * (ms[0] / ms[g.fastest] - 1.0), flops / ms[g.fastest] / 1e9, g.fastest,
                describe(g.candidates[g.fastest].algo).c_str());
    first_step += ms[0] * g.count;
    best_step += ms[g.fastest] * g.count;
  }
  std::printf("one by one, per step: first candidates %.2f ms, fastest %.2f ms (%.1f%% less)\n", first_step, best_step,
              100.0 * (1.0 - best_step / first_step));

  // The step's order: forward through the layers, then backward (dgrad and wgrad per linear).
  auto step = [&](bool fastest) {
    for (int layer = 0; layer < layers; ++layer)
      for (int l = 0; l < 4; ++l) run(lt, gemms[3 * l], fastest ? gemms[3 * l].fastest : 0, workspace, stream);
    for (int d = 0; d < 3; ++d) run(lt, gemms[12 + d], fastest ? gemms[12 + d].fastest : 0, workspace, stream);
    for (int layer = 0; layer < layers; ++layer)
      for (int l = 3; l >= 0; --l)
        for (int d = 1; d <= 2; ++d) run(lt, gemms[3 * l + d], fastest ? gemms[3 * l + d].fastest : 0, workspace, stream);
  };
  step(false);
  step(true);
  for (int round = 1; round <= rounds; ++round) {
    const float first = time_ms(stream, 3, [&] { step(false); });
    const float best = time_ms(stream, 3, [&] { step(true); });
    std::printf("back to back, round %d: first candidates %.2f ms per step, fastest %.2f ms (%.1f%% less)\n", round,
                first, best, 100.0 * (1.0 - best / first));
  }
  // The same GEMMs on all-zero operands: if the step is limited by power rather than by the
  // tensor cores' clock-for-clock speed, it runs faster on data that toggles no bits.
  for (Gemm& g : gemms) {
    const size_t a_elems = size_t(g.trans_a == CUBLAS_OP_N ? g.m : g.k) * (g.trans_a == CUBLAS_OP_N ? g.k : g.m);
    const size_t b_elems = size_t(g.trans_b == CUBLAS_OP_N ? g.k : g.n) * (g.trans_b == CUBLAS_OP_N ? g.n : g.k);
    CHECK_CUDA(cudaMemset(g.a, 0, a_elems * 2));
    CHECK_CUDA(cudaMemset(g.b, 0, b_elems * 2));
  }
  step(false);
  for (int round = 1; round <= rounds; ++round) {
    std::printf("back to back on all-zero operands, round %d: first candidates %.2f ms per step\n", round,
                time_ms(stream, 3, [&] { step(false); }));
  }
  return 0;
}
