// Host code of the CUDA backend (compiled by the host compiler; the device code is in
// kernels/cuda/). Activations stay on the GPU for a whole step; per layer only Q/K/V leave and
// the attention output O comes back, through pinned buffers on the state's own stream.
#include "runtime/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/launch.h"
#include "kernels/elementwise.h"
#include "kernels/thread_pool.h"
#include "runtime/cuda/buffers.h"
#include "runtime/cuda/check.h"
#include "runtime/cuda/weights.h"
#include "runtime/error.h"

namespace fd::cuda {
namespace {

namespace kc = fd::kernels::cuda;

// Smallest row capacity a state allocates; it then doubles as steps need, up to max_rows.
constexpr int kMinRows = 16;

// Host copies between the pinned buffers and the messages' tensors go in slices of this many
// bytes over the state's copy threads. One thread copied 8-10 GB/s, far below the PCIe copy
// into the pinned buffer, and was most of a layer's time from batch 256 on (H200, 7B shape:
// 3.2 ms per layer at batch 512, of which the GEMMs take about 0.4).
constexpr size_t kCopySlice = size_t(1) << 20;

// Copy threads per state: a few suffice to outrun PCIe, and the node's other cores serve the
// scheduler and, in one-process runs, the R-worker shards.
int copy_threads() {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores / 4, 1, 4);
}

// The copies between the GPU and the pinned buffers go in pieces of about this many bytes (at
// most kMaxPieces), so that the host copies one piece while the next crosses PCIe.
constexpr size_t kPieceBytes = size_t(4) << 20;
constexpr int kMaxPieces = 16;

int pieces_of(size_t n) {
  return static_cast<int>(std::clamp<size_t>(n / kPieceBytes, 1, kMaxPieces));
}

// Bytes [at, end) of a copy of n bytes: piece i of `pieces`.
struct Piece {
  size_t at, end;
};
Piece piece(size_t n, int i, int pieces) {
  const auto begin = [&](int j) { return n * static_cast<size_t>(j) / static_cast<size_t>(pieces); };
  return {begin(i), begin(i + 1)};
}

// dst[0, n) = src[0, n) in kCopySlice slices over the pool's threads.
void parallel_copy(kernels::ThreadPool& pool, void* dst, const void* src, size_t n) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  const size_t slices = (n + kCopySlice - 1) / kCopySlice;
  if (slices <= 1) {
    if (n > 0) std::memcpy(d, s, n);
    return;
  }
  pool.run(slices, [&](size_t i) {
    const size_t at = i * kCopySlice;
    std::memcpy(d + at, s + at, std::min(kCopySlice, n - at));
  });
}

// One mini-batch in flight. All its work and copies go to its own stream through its own cuBLAS
// handle, so the copies of one mini-batch overlap the compute of another.
class CudaState : public SPartState {
 public:
  explicit CudaState(int dev) : device(dev), copier(copy_threads()) {}
  CudaState(const CudaState&) = delete;
  CudaState& operator=(const CudaState&) = delete;

  // Separate from the constructor so that the destructor cleans up after a failure half-way.
  void init() {
    FD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), device);
    FD_CUDA_CHECK(cublasCreate(&blas), device);
    FD_CUDA_CHECK(cublasSetStream(blas, stream), device);
    // Blocking sync: a waiting caller sleeps instead of spinning on a core the R-part may need.
    const unsigned flags = cudaEventDisableTiming | cudaEventBlockingSync;
    for (cudaEvent_t* e : {&inputs_copied, &o_copied, &outputs_ready})
      FD_CUDA_CHECK(cudaEventCreateWithFlags(e, flags), device);
    // The first piece is waited for through the layer's GEMMs, so the caller sleeps; the others
    // follow in quick succession while the host copies, so it does not.
    for (cudaEvent_t& e : piece_ready) {
      const unsigned piece_flags = &e == &piece_ready[0] ? flags : cudaEventDisableTiming;
      FD_CUDA_CHECK(cudaEventCreateWithFlags(&e, piece_flags), device);
    }
  }

  // Errors are ignored: a destructor cannot report them.
  ~CudaState() override {
    (void)cudaSetDevice(device);
    if (stream != nullptr) (void)cudaStreamSynchronize(stream);
    if (blas != nullptr) (void)cublasDestroy(blas);
    for (cudaEvent_t e : {inputs_copied, o_copied, outputs_ready})
      if (e != nullptr) (void)cudaEventDestroy(e);
    for (cudaEvent_t e : piece_ready)
      if (e != nullptr) (void)cudaEventDestroy(e);
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
  }

  const int32_t* tokens() const { return in.get(); }            // [rows]
  const int32_t* pos() const { return in.get() + rows; }        // [rows]
  const int32_t* logit_rows() const { return in.get() + 2 * rows; }  // [n_logits]

  int device;
  kernels::ThreadPool copier;           // host copies of this state's tensors
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;        // bound to stream
  cudaEvent_t inputs_copied = nullptr;  // the copy out of h_in has finished
  cudaEvent_t o_copied = nullptr;       // the copy out of h_o has finished
  cudaEvent_t outputs_ready = nullptr;  // the copy into h_logits (the step's end) has finished
  cudaEvent_t piece_ready[kMaxPieces] = {};  // piece i of the copy into h_qkv has finished

  int rows = 0;        // tokens of the current step
  int n_logits = 0;    // logit rows of the current step
  int cap_rows = 0;    // rows the buffers below have room for
  int cap_logits = 0;  // logit rows they have room for

  DeviceArray<int32_t> in;            // [2*cap_rows + cap_logits]: tokens, pos, logit_rows
  DeviceArray<float> x;               // [cap_rows][dim] residual stream
  DeviceArray<uint16_t> xb;           // [max(cap_rows, cap_logits)][max(dim, q_width)] GEMM input
  DeviceArray<float> work;            // [cap_rows][max(q_width + 2*kv_width, 2*ff)] GEMM output
  DeviceArray<uint16_t> h;            // [cap_rows][ff] SwiGLU output
  DeviceArray<unsigned char> qkv;     // [cap_rows] x qkv_row_bytes: Q [rows][q_width] fp32, then
                                      // K and V [rows][kv_width] fp16, packed for one copy
  DeviceArray<float> o;               // [cap_rows][q_width] attention output
  DeviceArray<float> logits;          // [cap_logits][vocab]
  PinnedArray<int32_t> h_in;          // as in
  PinnedArray<unsigned char> h_qkv;   // as qkv
  PinnedArray<float> h_o;             // as o
  PinnedArray<float> h_logits;        // as logits
};

class CudaBackend : public SPartBackend {
 public:
  CudaBackend(const Model& model, int device, int max_rows)
      : c_(model.cfg), device_(device), max_rows_(max_rows) {
    use_device();
    upload_model(model, device_, w_);
    theta_scale_ = kernels::rope_theta_scale(c_.rope_base, c_.head_dim);
  }
  // The weights are freed after this body, on the device made current here.
  ~CudaBackend() override { (void)cudaSetDevice(device_); }

  const ModelConfig& config() const override { return c_; }
  const char* name() const override { return "cuda"; }

  std::unique_ptr<SPartState> make_state() const override {
    use_device();
    auto s = std::make_unique<CudaState>(device_);
    s->init();
    return s;
  }

  void embed(SPartState& state, const StepInput& in) const override {
    CudaState& s = cast(state);
    validate(in);
    const int rows = static_cast<int>(in.tokens.size());
    const int n = static_cast<int>(in.logit_rows.size());
    if (rows > max_rows_ || n > max_rows_) {
      throw Error("A step of " + std::to_string(rows) + " tokens and " + std::to_string(n) +
                  " logit rows exceeds the CUDA backend's limit of " + std::to_string(max_rows_) +
                  " rows per step.");
    }
    use_device();
    reserve(s, rows, n);
    FD_CUDA_CHECK(cudaEventSynchronize(s.inputs_copied), device_);
    int32_t* h = s.h_in.get();
    std::copy(in.tokens.begin(), in.tokens.end(), h);
    std::copy(in.pos.begin(), in.pos.end(), h + rows);
    std::copy(in.logit_rows.begin(), in.logit_rows.end(), h + 2 * rows);
    s.rows = rows;
    s.n_logits = n;
    FD_CUDA_CHECK(cudaMemcpyAsync(s.in.get(), h, (2 * static_cast<size_t>(rows) + n) * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, s.stream),
                  device_);
    FD_CUDA_CHECK(cudaEventRecord(s.inputs_copied, s.stream), device_);
    FD_CUDA_CHECK(kc::embed(s.tokens(), w_.tok_embd.get(), s.x.get(), rows, c_.dim, s.stream), device_);
  }

  void attn_in(SPartState& state, int layer, AttnIn& out) const override {
    CudaState& s = cast(state);
    const DeviceLayer& w = weights(layer);
    const size_t rows = static_cast<size_t>(s.rows);
    const size_t qn = rows * c_.q_width(), kvn = rows * c_.kv_width();
    const size_t bytes = rows * qkv_row_bytes();  // of Q, K and V together
    // Fresh buffers are zeroed page by page as they are first touched: from 1 MiB on side by
    // side (H200, 7B, per layer: batch 64, 2 MiB, 0.89 -> 0.61 ms; at batch 16, 0.5 MiB, waking
    // the copy threads cost more than it saved, 0.29 -> 0.35-0.38 ms).
    const auto size_out = [&] {
      const auto size_one = [&](size_t i) {
        if (i == 0) out.q.resize(qn);
        if (i == 1) out.k.resize(kvn);
        if (i == 2) out.v.resize(kvn);
      };
      if (bytes < kCopySlice) {
        for (size_t i = 0; i < 3; ++i) size_one(i);
      } else {
        s.copier.run(3, size_one);
      }
    };
    if (rows == 0) return size_out();
    use_device();
    auto* q = reinterpret_cast<float*>(s.qkv.get());
    auto* k = reinterpret_cast<uint16_t*>(s.qkv.get() + qn * sizeof(float));
    uint16_t* v = k + kvn;
    FD_CUDA_CHECK(kc::rmsnorm(s.x.get(), nullptr, w.attn_norm.get(), s.xb.get(), s.rows, c_.dim,
                              c_.rms_eps, s.stream),
                  device_);
    gemm(s, w.wqkv.get(), s.xb.get(), s.work.get(), s.rows, c_.q_width() + 2 * c_.kv_width(), c_.dim,
         false);
    FD_CUDA_CHECK(kc::qkv_rope(s.work.get(), s.pos(), s.rows, c_.n_heads, c_.n_kv_heads, c_.head_dim,
                               theta_scale_, q, k, v, s.stream),
                  device_);
    const int pieces = pieces_of(bytes);
    for (int i = 0; i < pieces; ++i) {
      const auto [at, end] = piece(bytes, i, pieces);
      FD_CUDA_CHECK(cudaMemcpyAsync(s.h_qkv.get() + at, s.qkv.get() + at, end - at,
                                    cudaMemcpyDeviceToHost, s.stream),
                    device_);
      FD_CUDA_CHECK(cudaEventRecord(s.piece_ready[i], s.stream), device_);
    }
    // K and V are fresh each layer (their bytes leave with the message; Q takes over the returned
    // O's, actors/gpu_stream.cc): sized while the GPU works.
    size_out();
    // h_qkv holds Q, K and V one after the other, as out's three arrays do.
    struct Part {
      unsigned char* dst;
      size_t bytes;
    };
    const Part parts[3] = {{reinterpret_cast<unsigned char*>(out.q.data()), qn * sizeof(float)},
                           {reinterpret_cast<unsigned char*>(out.k.data()), kvn * sizeof(uint16_t)},
                           {reinterpret_cast<unsigned char*>(out.v.data()), kvn * sizeof(uint16_t)}};
    for (int i = 0; i < pieces; ++i) {
      FD_CUDA_CHECK(cudaEventSynchronize(s.piece_ready[i]), device_);
      const auto [at, end] = piece(bytes, i, pieces);
      size_t part0 = 0;  // packed offset of the part
      for (const Part& p : parts) {
        const size_t lo = std::max(at, part0), hi = std::min(end, part0 + p.bytes);
        if (lo < hi) parallel_copy(s.copier, p.dst + (lo - part0), s.h_qkv.get() + lo, hi - lo);
        part0 += p.bytes;
      }
    }
  }

  // Returns once O is in pinned memory; the rest of the layer runs on the stream.
  void attn_out(SPartState& state, int layer, const float* o) const override {
    CudaState& s = cast(state);
    const DeviceLayer& w = weights(layer);
    if (s.rows == 0) return;
    use_device();
    const int rows = s.rows;
    const size_t on = static_cast<size_t>(rows) * c_.q_width();
    FD_CUDA_CHECK(cudaEventSynchronize(s.o_copied), device_);
    // Each piece crosses PCIe while the host copies the next.
    const size_t bytes = on * sizeof(float);
    const int pieces = pieces_of(bytes);
    auto* h_o = reinterpret_cast<unsigned char*>(s.h_o.get());
    auto* d_o = reinterpret_cast<unsigned char*>(s.o.get());
    for (int i = 0; i < pieces; ++i) {
      const auto [at, end] = piece(bytes, i, pieces);
      parallel_copy(s.copier, h_o + at, reinterpret_cast<const unsigned char*>(o) + at, end - at);
      FD_CUDA_CHECK(cudaMemcpyAsync(d_o + at, h_o + at, end - at, cudaMemcpyHostToDevice, s.stream),
                    device_);
    }
    FD_CUDA_CHECK(cudaEventRecord(s.o_copied, s.stream), device_);
    FD_CUDA_CHECK(kc::f32_to_f16(s.o.get(), s.xb.get(), on, s.stream), device_);
    // The residual adds are the GEMMs' beta = 1 (fp32 accumulation into x).
    gemm(s, w.wo.get(), s.xb.get(), s.x.get(), rows, c_.dim, c_.q_width(), true);
    FD_CUDA_CHECK(kc::rmsnorm(s.x.get(), nullptr, w.ffn_norm.get(), s.xb.get(), rows, c_.dim,
                              c_.rms_eps, s.stream),
                  device_);
    gemm(s, w.w_gate_up.get(), s.xb.get(), s.work.get(), rows, 2 * c_.ff, c_.dim, false);
    FD_CUDA_CHECK(kc::swiglu(s.work.get(), s.h.get(), rows, c_.ff, s.stream), device_);
    gemm(s, w.w_down.get(), s.h.get(), s.x.get(), rows, c_.dim, c_.ff, true);
  }

  void logits(SPartState& state, std::vector<float>& out) const override {
    CudaState& s = cast(state);
    use_device();
    const int n = s.n_logits;
    const size_t count = static_cast<size_t>(n) * c_.vocab;
    if (n > 0) {
      FD_CUDA_CHECK(kc::rmsnorm(s.x.get(), s.logit_rows(), w_.out_norm.get(), s.xb.get(), n, c_.dim,
                                c_.rms_eps, s.stream),
                    device_);
      gemm(s, w_.output, s.xb.get(), s.logits.get(), n, c_.vocab, c_.dim, false);
      FD_CUDA_CHECK(cudaMemcpyAsync(s.h_logits.get(), s.logits.get(), count * sizeof(float),
                                    cudaMemcpyDeviceToHost, s.stream),
                    device_);
    }
    // The end of the step: waiting even without logits reports any failure of queued work.
    FD_CUDA_CHECK(cudaEventRecord(s.outputs_ready, s.stream), device_);
    FD_CUDA_CHECK(cudaEventSynchronize(s.outputs_ready), device_);
    out.resize(count);
    if (n > 0) std::memcpy(out.data(), s.h_logits.get(), count * sizeof(float));
  }

 private:
  static CudaState& cast(SPartState& state) {
    auto* s = dynamic_cast<CudaState*>(&state);
    if (s == nullptr) throw Error("The CUDA backend was given a state made by another backend.");
    return *s;
  }

  void use_device() const { FD_CUDA_CHECK(cudaSetDevice(device_), device_); }

  const DeviceLayer& weights(int layer) const {
    if (layer < 0 || layer >= c_.n_layers) {
      throw Error("Layer " + std::to_string(layer) + " does not exist; the model has " +
                  std::to_string(c_.n_layers) + " layers.");
    }
    return w_.layers[static_cast<size_t>(layer)];
  }

  // The same checks, with the same messages, as the CPU backend.
  void validate(const StepInput& in) const { check_step(c_, in); }

  size_t qkv_row_bytes() const {
    return static_cast<size_t>(c_.q_width()) * sizeof(float) +
           2 * static_cast<size_t>(c_.kv_width()) * sizeof(uint16_t);
  }

  int grown(int n) const {
    int cap = kMinRows;
    while (cap < n) cap *= 2;
    return std::min(cap, max_rows_);
  }

  // Grows the state's buffers to hold a step of rows tokens and n logit rows. Growing waits for
  // the state's queued work and frees (device-synchronising) the old buffers; capacities double,
  // so that happens a few times per state at most.
  void reserve(CudaState& s, int rows, int n) const {
    if (s.cap_rows > 0 && rows <= s.cap_rows && n <= s.cap_logits) return;
    const int cap_rows = std::max(s.cap_rows, grown(rows));
    const int cap_logits = std::max(s.cap_logits, grown(n));
    FD_CUDA_CHECK(cudaStreamSynchronize(s.stream), device_);
    s.cap_rows = s.cap_logits = 0;  // until every buffer is reallocated
    const size_t r = static_cast<size_t>(cap_rows), l = static_cast<size_t>(cap_logits);
    const size_t dim = c_.dim, qw = c_.q_width(), kvw = c_.kv_width(), ff = c_.ff;
    s.in.reset(2 * r + l, device_);
    s.h_in.reset(2 * r + l, device_);
    s.x.reset(r * dim, device_);
    s.xb.reset(std::max(r, l) * std::max(dim, qw), device_);
    s.work.reset(r * std::max(qw + 2 * kvw, 2 * ff), device_);
    s.h.reset(r * ff, device_);
    s.qkv.reset(r * qkv_row_bytes(), device_);
    s.h_qkv.reset(r * qkv_row_bytes(), device_);
    s.o.reset(r * qw, device_);
    s.h_o.reset(r * qw, device_);
    s.logits.reset(l * c_.vocab, device_);
    s.h_logits.reset(l * c_.vocab, device_);
    s.cap_rows = cap_rows;
    s.cap_logits = cap_logits;
  }

  // y[m][n] = x[m][k] · w[n][k]ᵀ (+ y when accumulate); w, x fp16, y fp32, fp32 accumulation.
  // cuBLAS is column-major: there y is yᵀ [n][m] = op(w) · x with w read as a [k][n] matrix.
  void gemm(const CudaState& s, const uint16_t* w, const uint16_t* x, float* y, int m, int n, int k,
            bool accumulate) const {
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    FD_CUDA_CHECK(cublasGemmEx(s.blas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16F, k, x,
                               CUDA_R_16F, k, &beta, y, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT),
                  device_);
  }

  ModelConfig c_;
  int device_;
  int max_rows_;
  float theta_scale_ = 0.0f;
  DeviceModel w_;
};

}  // namespace

std::unique_ptr<SPartBackend> make_cuda_backend(const Model& model, int device, int max_rows) {
  if (max_rows <= 0) throw Error("The CUDA backend needs a positive row limit, got " + std::to_string(max_rows) + ".");
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    throw Error(std::string("No usable CUDA GPU: cudaGetDeviceCount reports ") +
                (err != cudaSuccess ? cudaGetErrorString(err) : "no devices") + ".");
  }
  if (device < 0 || device >= count) {
    throw Error("GPU " + std::to_string(device) + " does not exist; this machine has " +
                std::to_string(count) + " CUDA GPUs.");
  }
  cudaDeviceProp prop{};
  FD_CUDA_CHECK(cudaGetDeviceProperties(&prop, device), device);
  if (prop.major < 8) {
    throw Error("GPU " + std::to_string(device) + " (" + prop.name + ") has compute capability " +
                std::to_string(prop.major) + "." + std::to_string(prop.minor) +
                "; the CUDA backend is built for 8.0 (Ampere) and newer.");
  }
  return std::make_unique<CudaBackend>(model, device, max_rows);
}

}  // namespace fd::cuda
