// Fused CPU float32 kernels for the lean forward (engine/lean.py): the small per-layer operators
// (RMSNorm, residual add, rotary embedding, KV-cache write, SiLU gate) that cost more in operator
// dispatch than in arithmetic at draft/verify sizes. Each computes exactly what the eager operators
// it replaces compute; only the order of float32 additions in the RMSNorm sum differs.
#include <torch/extension.h>

#include <cmath>
#include <vector>

namespace {

void check_f32(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat, name, " must be a CPU float32 tensor");
  TORCH_CHECK(t.stride(-1) == 1, name, " must have a contiguous last dimension");
}

// sum_i a[i] * b[i] in eight running partial sums (so the compiler can keep them in one vector register).
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int u = 0; u < 8; ++u) acc[u] += a[i + u] * b[i + u];
  float sum = 0;
  for (; i < n; ++i) sum += a[i] * b[i];
  for (int u = 0; u < 8; ++u) sum += acc[u];
  return sum;
}

// RMSNorm of one row: out[j] = w[j] * (x[j] * rsqrt(mean(x^2) + eps)), as HF's LlamaRMSNorm.
inline void norm_row(const float* x, const float* w, float* out, int64_t n, float eps) {
  const float r = 1.0f / std::sqrt(dot(x, x, n) / static_cast<float>(n) + eps);
  for (int64_t j = 0; j < n; ++j) out[j] = w[j] * (x[j] * r);
}

}  // namespace

// x [rows..., n] contiguous; returns rms_norm(x) * w.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  check_f32(x, "x");
  check_f32(w, "w");
  TORCH_CHECK(x.is_contiguous(), "x must be contiguous");
  const int64_t n = x.size(-1);
  auto out = at::empty_like(x);
  const int64_t rows = x.numel() / n;
  const float* px = x.data_ptr<float>();
  float* po = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) norm_row(px + r * n, w.data_ptr<float>(), po + r * n, n, (float)eps);
  return out;
}

// The residual step: x += delta (in place), then returns rms_norm(x) * w.
at::Tensor add_rms_norm(at::Tensor& x, const at::Tensor& delta, const at::Tensor& w, double eps) {
  check_f32(x, "x");
  check_f32(delta, "delta");
  check_f32(w, "w");
  TORCH_CHECK(x.is_contiguous() && delta.is_contiguous() && x.sizes() == delta.sizes(),
              "x and delta must be contiguous and of one shape");
  const int64_t n = x.size(-1);
  const int64_t rows = x.numel() / n;
  float* px = x.data_ptr<float>();
  const float* pd = delta.data_ptr<float>();
  for (int64_t i = 0; i < rows * n; ++i) px[i] += pd[i];
  auto out = at::empty_like(x);
  float* po = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) norm_row(px + r * n, w.data_ptr<float>(), po + r * n, n, (float)eps);
  return out;
}

// Rotary embedding of q and k (HF's half rotation: x * cos + cat(-x2, x1) * sin), k and v written
// into the KV-cache buffers at positions [start_b, start_b + T) of each row b. q, k, v: [B, T, heads * D]
// with any token/batch strides (views of one fused projection work); kbuf, vbuf: [rows >= B, Hkv,
// max_len, D] contiguous; row b's token t reads cos/sin row (offset_b + t). Returns the rotated q as
// [B, Hq, T, D].
static at::Tensor rope_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
                            const at::Tensor& sin, at::Tensor& kbuf, at::Tensor& vbuf,
                            const std::vector<int64_t>& starts, const std::vector<int64_t>& offsets) {
  for (auto* t : {&q, &k, &v, &cos, &sin}) check_f32(*t, "q/k/v/cos/sin");
  check_f32(kbuf, "kbuf");
  check_f32(vbuf, "vbuf");
  TORCH_CHECK(kbuf.is_contiguous() && vbuf.is_contiguous(), "cache buffers must be contiguous");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous(), "cos/sin must be contiguous");
  const int64_t B = q.size(0), T = q.size(1), D = kbuf.size(3), Hkv = kbuf.size(1), maxlen = kbuf.size(2);
  const int64_t Hq = q.size(2) / D, half = D / 2;
  TORCH_CHECK(k.size(2) == Hkv * D && v.size(2) == Hkv * D && q.size(2) == Hq * D, "head sizes disagree");
  TORCH_CHECK(cos.size(1) == D && kbuf.size(0) >= B, "cos/sin must be [positions, D], the cache hold B rows");
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(starts[b] + T <= maxlen && offsets[b] + T <= cos.size(0), "KV cache or rotary table overflow");
  auto out = at::empty({B, Hq, T, D}, q.options());
  const float* pc = cos.data_ptr<float>();
  const float* ps = sin.data_ptr<float>();
  auto rotate = [&](const float* x, float* y, const float* c, const float* s) {
    for (int64_t j = 0; j < half; ++j) {
      y[j] = x[j] * c[j] + (-x[j + half]) * s[j];
      y[j + half] = x[j + half] * c[j + half] + x[j] * s[j + half];
    }
  };
  float* po = out.data_ptr<float>();
  float* pk = kbuf.data_ptr<float>();
  float* pv = vbuf.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const float* c = pc + (offsets[b] + t) * D;
      const float* s = ps + (offsets[b] + t) * D;
      const float* qrow = q.data_ptr<float>() + b * q.stride(0) + t * q.stride(1);
      const float* krow = k.data_ptr<float>() + b * k.stride(0) + t * k.stride(1);
      const float* vrow = v.data_ptr<float>() + b * v.stride(0) + t * v.stride(1);
      for (int64_t h = 0; h < Hq; ++h) rotate(qrow + h * D, po + ((b * Hq + h) * T + t) * D, c, s);
      for (int64_t h = 0; h < Hkv; ++h) {
        const int64_t at = ((b * Hkv + h) * maxlen + starts[b] + t) * D;
        rotate(krow + h * D, pk + at, c, s);
        for (int64_t j = 0; j < D; ++j) pv[at + j] = vrow[h * D + j];
      }
    }
  }
  return out;
}

// One sequence length for the batch: positions [start, start + T); cos, sin: [T, D] (those positions).
at::Tensor rope_cache(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
                      const at::Tensor& sin, at::Tensor& kbuf, at::Tensor& vbuf, int64_t start) {
  TORCH_CHECK(cos.size(0) == q.size(1), "cos/sin must be [T, D]");
  return rope_rows(q, k, v, cos, sin, kbuf, vbuf, std::vector<int64_t>(q.size(0), start),
                   std::vector<int64_t>(q.size(0), 0));
}

// Ragged rows (engine/ragged.py): row b at positions [starts[b], starts[b] + T); cos, sin: the whole
// rotary tables [positions, D].
at::Tensor ragged_rope_cache(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
                             const at::Tensor& sin, at::Tensor& kbuf, at::Tensor& vbuf, std::vector<int64_t> starts) {
  TORCH_CHECK((int64_t)starts.size() == q.size(0), "one start per row");
  return rope_rows(q, k, v, cos, sin, kbuf, vbuf, starts, starts);
}

// silu(gate) * up for views gate, up: [B, T, I] (any token/batch strides); returns [B, T, I].
at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  check_f32(gate, "gate");
  check_f32(up, "up");
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.dim() == 3, "gate and up must be [B, T, I] of one shape");
  const int64_t B = gate.size(0), T = gate.size(1), I = gate.size(2);
  auto out = at::empty({B, T, I}, gate.options());
  float* po = out.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const float* g = gate.data_ptr<float>() + b * gate.stride(0) + t * gate.stride(1);
      const float* u = up.data_ptr<float>() + b * up.stride(0) + t * up.stride(1);
      float* o = po + (b * T + t) * I;
      for (int64_t j = 0; j < I; ++j) o[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
    }
  return out;
}

// Causal attention of T new queries over the cache: query t of row b (at position starts[b] + t) attends
// to positions [0, starts[b] + t] of its row. q: [B, Hq, T, D] contiguous; kbuf, vbuf: [rows >= B, Hkv,
// max_len, D] contiguous (grouped-query heads share kv head h / (Hq / Hkv)). Returns [B, T, Hq * D], the
// layout o_proj reads.
static at::Tensor attention_rows(const at::Tensor& q, const at::Tensor& kbuf, const at::Tensor& vbuf,
                                 const std::vector<int64_t>& starts, double scale) {
  check_f32(q, "q");
  check_f32(kbuf, "kbuf");
  check_f32(vbuf, "vbuf");
  TORCH_CHECK(q.is_contiguous() && kbuf.is_contiguous() && vbuf.is_contiguous(), "q and the cache must be contiguous");
  const int64_t B = q.size(0), Hq = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t Hkv = kbuf.size(1), maxlen = kbuf.size(2), group = Hq / Hkv;
  TORCH_CHECK(kbuf.size(3) == D && Hq == group * Hkv && kbuf.size(0) >= B, "attention shapes disagree");
  int64_t most = 0;
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(starts[b] + T <= maxlen, "attention beyond the cache");
    most = starts[b] > most ? starts[b] : most;
  }
  auto out = at::zeros({B, T, Hq * D}, q.options());
  std::vector<float> scores(T * (most + T));  // [T, len]: row t uses its first start + t + 1 entries
  std::vector<float> mx(T), total(T);
  const float sc = (float)scale;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t start = starts[b], len = start + T;
      const float* kb = kbuf.data_ptr<float>() + (b * Hkv + h / group) * maxlen * D;
      const float* vb = vbuf.data_ptr<float>() + (b * Hkv + h / group) * maxlen * D;
      const float* qh = q.data_ptr<float>() + (b * Hq + h) * T * D;
      for (int64_t t = 0; t < T; ++t) mx[t] = -INFINITY, total[t] = 0;
      for (int64_t j = 0; j < len; ++j) {  // each key row is read once for all queries that see it
        const float* kr = kb + j * D;
        for (int64_t t = (j > start ? j - start : 0); t < T; ++t) {
          const float score = dot(qh + t * D, kr, D) * sc;
          scores[t * len + j] = score;
          mx[t] = score > mx[t] ? score : mx[t];
        }
      }
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j <= start + t; ++j) {
          const float p = std::exp(scores[t * len + j] - mx[t]);
          scores[t * len + j] = p;
          total[t] += p;
        }
      float* ob = out.data_ptr<float>() + b * T * Hq * D + h * D;
      for (int64_t j = 0; j < len; ++j) {
        const float* vr = vb + j * D;
        for (int64_t t = (j > start ? j - start : 0); t < T; ++t) {
          const float p = scores[t * len + j];
          float* o = ob + t * Hq * D;
          for (int64_t e = 0; e < D; ++e) o[e] += p * vr[e];
        }
      }
      for (int64_t t = 0; t < T; ++t) {
        const float inv = 1.0f / total[t];
        float* o = ob + t * Hq * D;
        for (int64_t e = 0; e < D; ++e) o[e] *= inv;
      }
    }
  return out;
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& kbuf, const at::Tensor& vbuf, int64_t start,
                     double scale) {
  return attention_rows(q, kbuf, vbuf, std::vector<int64_t>(q.size(0), start), scale);
}

at::Tensor ragged_attention(const at::Tensor& q, const at::Tensor& kbuf, const at::Tensor& vbuf,
                            std::vector<int64_t> starts, double scale) {
  TORCH_CHECK((int64_t)starts.size() == q.size(0), "one start per row");
  return attention_rows(q, kbuf, vbuf, starts, scale);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "RMSNorm (float32, CPU)");
  m.def("add_rms_norm", &add_rms_norm, "x += delta in place, then RMSNorm (float32, CPU)");
  m.def("rope_cache", &rope_cache, "rotary embedding of q, k; k and v written into the cache (float32, CPU)");
  m.def("attention", &attention, "causal attention over the KV cache (float32, CPU)");
  m.def("silu_mul", &silu_mul, "silu(gate) * up (float32, CPU)");
  m.def("ragged_rope_cache", &ragged_rope_cache, "rope_cache with one start per row (float32, CPU)");
  m.def("ragged_attention", &ragged_attention, "attention with one start per row (float32, CPU)");
}
