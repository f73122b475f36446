// fast/loop._one_row_layers in C++: the same ATen ops in the same order, so the same bits, without TorchScript's
// interpreter between them (forward.py's module docstring says why each op is there; native.py loads this).
// Keep it in step with _one_row_layers, tree_attention, attention_rows, _dense, rms_norm, rotate and _pad_to:
// tests/test_native.py holds the two bitwise equal. Drafts' products and EAGLE's level also have loops of their own
// (int8_product, draft_attention, draft_top), which round differently; draft_loops(false) turns them off for that test.
#include <torch/extension.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

using at::Tensor;
using at::indexing::Slice;
using OptT = std::optional<Tensor>;
using Tensors = std::vector<Tensor>;
using OptTensors = std::vector<OptT>;
using Ints = std::vector<int64_t>;

static Tensor linear_packed(const Tensor& x, const Tensor& w) {
  static auto op = c10::Dispatcher::singleton()
      .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
      .typed<Tensor(const Tensor&, const Tensor&, const std::optional<Tensor>&, std::string_view,
                    c10::List<std::optional<c10::Scalar>>, std::optional<std::string_view>)>();
  return op.call(x, w, std::nullopt, "none", c10::List<std::optional<c10::Scalar>>(), std::string_view(""));
}

static Tensor pad_to(const Tensor& x, int64_t rows) {
  const int64_t extra = (rows - x.size(-2) % rows) % rows;
  if (extra == 0) return x;
  auto shape = x.sizes().vec();
  shape[shape.size() - 2] = extra;
  return at::cat({x, x.new_zeros(shape)}, -2);
}

// rms_norm: w * (xf * rsqrt(mean(xf^2) + eps)).to(x's dtype), xf = x in fp32. Where x and w are contiguous CPU bf16
// or fp32, the elementwise parts are loops around ATen's own sum (whose summation order is its own; ATen's mean is
// that sum divided by H): the same IEEE operations element by element (x * x is what pow(x, 2) computes; the mean a
// division; rsqrt is 1 / sqrt; eps is added in fp32; bf16 rounds to nearest even, as ATen's conversion does), so
// the same bits with fewer ops. add_rms also takes the residual add before it, x + y in x's dtype (ATen's add:
// the sum of the two in fp32, rounded once), and returns (x + y, the norm of it).
// Elementwise bf16 stretches 16 at a time where the CPU has AVX-512 (F, BW): each element sees the same IEEE fp32
// operations as the scalar loop (no FMA), and fp32 -> bf16 is c10's own rounding (to nearest even; NaN -> 0x7FC0),
// so the bits are the scalar loop's.
#define V16_TARGET __attribute__((target("avx512f,avx512bw")))

static bool v16_ok() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return ok;
}

V16_TARGET static inline __m512 v16_load(const at::BFloat16* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

// 16 fp32 -> 16 bf16 as ATen rounds them (nearest even, subnormals kept, NaN 0x7FC0), in the low halves of 16 dwords
V16_TARGET static inline __m512i v16_round(__m512 f) {
  const __m512i u = _mm512_castps_si512(f);
  const __m512i bias = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)),
                                        _mm512_set1_epi32(0x7FFF));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
}

V16_TARGET static inline void v16_store(at::BFloat16* p, __m512 f) {
  _mm256_storeu_si256((__m256i*)p, _mm512_cvtepi32_epi16(v16_round(f)));
}

// 16 fp32 into p as T: as they are, or rounded to bf16 as ATen rounds
V16_TARGET static inline void v16_put(float* p, __m512 f) { _mm512_storeu_ps(p, f); }
V16_TARGET static inline void v16_put(at::BFloat16* p, __m512 f) { v16_store(p, f); }

// o = bf16(x + y), n elements (the residual add)
V16_TARGET static void v16_add(const at::BFloat16* x, const at::BFloat16* y, at::BFloat16* o, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) v16_store(o + i, _mm512_add_ps(v16_load(x + i), v16_load(y + i)));
  for (; i < n; ++i) o[i] = static_cast<at::BFloat16>(static_cast<float>(x[i]) + static_cast<float>(y[i]));
}

// q = x * x in fp32, n elements
V16_TARGET static void v16_squares(const at::BFloat16* x, float* q, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 a = v16_load(x + i);
    _mm512_storeu_ps(q + i, _mm512_mul_ps(a, a));
  }
  for (; i < n; ++i) {
    const float a = static_cast<float>(x[i]);
    q[i] = a * a;
  }
}

// one row: o = bf16(w * bf16(x * r)), H elements
V16_TARGET static void v16_scale(const at::BFloat16* x, const at::BFloat16* w, float r, at::BFloat16* o, int64_t H) {
  int64_t j = 0;
  const __m512 rv = _mm512_set1_ps(r);
  for (; j + 16 <= H; j += 16) {
    alignas(32) at::BFloat16 t[16];
    v16_store(t, _mm512_mul_ps(v16_load(x + j), rv));
    v16_store(o + j, _mm512_mul_ps(v16_load(w + j), v16_load(t)));
  }
  for (; j < H; ++j) {
    const at::BFloat16 t = static_cast<at::BFloat16>(static_cast<float>(x[j]) * r);
    o[j] = static_cast<at::BFloat16>(static_cast<float>(w[j]) * static_cast<float>(t));
  }
}

template <typename T>
static Tensor row_sq_sums(const T* x, int64_t n, int64_t H, const at::TensorOptions& opt) {
  // ATen's sum over each row of x^2 in fp32 [n, 1]: the reduction a mean of squares takes, in ATen's own order
  auto sq = at::empty({n, H}, opt.dtype(at::kFloat));
  float* q = sq.data_ptr<float>();
  if constexpr (std::is_same_v<T, at::BFloat16>) {
    if (v16_ok()) {
      v16_squares(x, q, n * H);
      return at::sum(sq, {-1}, true);
    }
  }
  for (int64_t i = 0; i < n * H; ++i) {
    const float a = static_cast<float>(x[i]);
    q[i] = a * a;
  }
  return at::sum(sq, {-1}, true);
}

template <typename T>
static std::pair<Tensor, Tensor> rms_loops(const Tensor& x, const Tensor* y, const Tensor& w, double eps) {
  const int64_t Np = x.size(0), H = x.size(1);
  const T* xp = x.data_ptr<T>();
  const T* wp = w.data_ptr<T>();
  Tensor xs = x;
  if (y != nullptr) {
    xs = at::empty_like(x);
    const T* yp = y->data_ptr<T>();
    T* sp = xs.data_ptr<T>();
    bool done = false;
    if constexpr (std::is_same_v<T, at::BFloat16>) {
      if (v16_ok()) {
        v16_add(xp, yp, sp, Np * H);
        done = true;
      }
    }
    if (!done)
      for (int64_t i = 0; i < Np * H; ++i) sp[i] = static_cast<T>(static_cast<float>(xp[i]) + static_cast<float>(yp[i]));
    xp = sp;
  }
  const Tensor m = row_sq_sums(xp, Np, H, x.options());                                 // [Np, 1]
  const float* mp = m.data_ptr<float>();
  const float e = static_cast<float>(eps), n = static_cast<float>(H);
  auto out = at::empty_like(x);
  T* o = out.data_ptr<T>();
  for (int64_t i = 0; i < Np; ++i) {
    const float mean = mp[i] / n;
    const float r = 1.0f / std::sqrt(mean + e);
    if constexpr (std::is_same_v<T, at::BFloat16>) {
      if (v16_ok()) {
        v16_scale(xp + i * H, wp, r, o + i * H, H);
        continue;
      }
    }
    for (int64_t j = 0; j < H; ++j) {
      const T t = static_cast<T>(static_cast<float>(xp[i * H + j]) * r);
      o[i * H + j] = static_cast<T>(static_cast<float>(wp[j]) * static_cast<float>(t));
    }
  }
  return {xs, out};
}

static bool rms_loop_ok(const Tensor& x, const Tensor& w) {
  return x.device().is_cpu() && x.dim() == 2 && x.is_contiguous() && w.is_contiguous() && w.dim() == 1 &&
      w.size(0) == x.size(1) && w.scalar_type() == x.scalar_type() &&
      (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat);
}

static Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) {
  if (rms_loop_ok(x, w))
    return (x.scalar_type() == at::kBFloat16 ? rms_loops<at::BFloat16>(x, nullptr, w, eps)
                                             : rms_loops<float>(x, nullptr, w, eps)).second;
  auto xf = x.to(at::kFloat);
  return w * (xf * at::rsqrt(xf.pow(2).mean({-1}, true) + eps)).to(x.scalar_type());
}

static std::pair<Tensor, Tensor> add_rms(const Tensor& x, const Tensor& y, const Tensor& w, double eps) {
  if (rms_loop_ok(x, w) && y.is_contiguous() && y.sizes() == x.sizes() && y.scalar_type() == x.scalar_type())
    return x.scalar_type() == at::kBFloat16 ? rms_loops<at::BFloat16>(x, &y, w, eps) : rms_loops<float>(x, &y, w, eps);
  auto xs = x + y;
  return {xs, rms_norm(xs, w, eps)};
}

static Tensor rotate(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const int64_t h = x.size(-1) / 2;
  return x * cos + at::cat({x.slice(-1, h), x.slice(-1, 0, h)}, -1) * sin;
}

// q|k roped and scaled, fp32 [Np, Hq + Hkv, D], with the first N rows' keys and values written into the cache row
// (kr, vr [Hkv, C, D] from slot s0): _one_row_layers' rotate, scale and two cache writes. One loop where the operands
// are as a CPU call has them (qkv contiguous bf16 or fp32, fp32 tables, an fp32 or bf16 cache), else those ATen ops.
// The loop is bitwise the ops: each element is the same IEEE products and sum, rounded alike (no contraction into an
// FMA: built with -ffp-contract=off), the conversions from bf16 are exact, and a bf16 cache's keys are rounded once
// as copy_ rounds them.

// rope_rows for bf16 inputs, 16 lanes at a time: each number through the same IEEE operations in the same order
// (the two products rounded, then their sum, then the scale), so the same bits as the loop below
template <typename C>
V16_TARGET static void rope_rows16(const at::BFloat16* x, int64_t ld, const float* cos, const float* sin, int64_t crs,
                                   int64_t chs, const float* scale, float* out, C* k, C* v, int64_t ks0, int64_t ks1,
                                   int64_t vs0, int64_t vs1, int64_t Np, int64_t N, int64_t Hq, int64_t Hkv,
                                   int64_t D) {
  const int64_t h2 = D / 2, H = Hq + Hkv;
  for (int64_t i = 0; i < Np; ++i) {
    const at::BFloat16* xi = x + i * ld;
    for (int64_t h = 0; h < H; ++h) {
      const at::BFloat16* xh = xi + h * D;
      const float* c = cos + i * crs + h * chs;
      const float* s = sin + i * crs + h * chs;
      float* o = out + (i * H + h) * D;
      for (int64_t d = 0; d < h2; d += 16) {
        const __m512 a = v16_load(xh + d), b = v16_load(xh + d + h2);
        __m512 lo = _mm512_add_ps(_mm512_mul_ps(a, _mm512_loadu_ps(c + d)), _mm512_mul_ps(b, _mm512_loadu_ps(s + d)));
        __m512 hi = _mm512_add_ps(_mm512_mul_ps(b, _mm512_loadu_ps(c + d + h2)),
                                  _mm512_mul_ps(a, _mm512_loadu_ps(s + d + h2)));
        if (scale != nullptr) {
          lo = _mm512_mul_ps(lo, _mm512_set1_ps(scale[h]));
          hi = _mm512_mul_ps(hi, _mm512_set1_ps(scale[h]));
        }
        _mm512_storeu_ps(o + d, lo);
        _mm512_storeu_ps(o + d + h2, hi);
      }
      if (i < N && h >= Hq) {
        C* kd = k + (h - Hq) * ks0 + i * ks1;
        for (int64_t d = 0; d < D; d += 16) v16_put(kd + d, _mm512_loadu_ps(o + d));
      }
    }
    if (i < N)
      for (int64_t h = 0; h < Hkv; ++h) {
        const at::BFloat16* vh = xi + (H + h) * D;
        C* vd = v + h * vs0 + i * vs1;
        if constexpr (std::is_same_v<C, float>)
          for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(vd + d, v16_load(vh + d));
        else
          std::memcpy(vd, vh, D * sizeof(C));
      }
  }
}

template <typename T, typename C>
static void rope_rows(const T* x, int64_t ld, const float* cos, const float* sin, int64_t crs, int64_t chs,
                      const float* scale, float* out, C* k, C* v, int64_t ks0, int64_t ks1, int64_t vs0,
                      int64_t vs1, int64_t Np, int64_t N, int64_t Hq, int64_t Hkv, int64_t D) {
  // x [Np, (Hq + 2 Hkv) D] rows ld apart; a table row at cos + i crs + h chs (the target's: one per row, every head
  // alike; the EAGLE head's: one per head, pre-scaled); scale: per head, or none
  if constexpr (std::is_same_v<T, at::BFloat16>)
    if (D % 32 == 0 && v16_ok())
      return rope_rows16(x, ld, cos, sin, crs, chs, scale, out, k, v, ks0, ks1, vs0, vs1, Np, N, Hq, Hkv, D);
  const int64_t h2 = D / 2, H = Hq + Hkv;
  for (int64_t i = 0; i < Np; ++i) {
    const T* xi = x + i * ld;
    for (int64_t h = 0; h < H; ++h) {
      const T* xh = xi + h * D;
      const float* c = cos + i * crs + h * chs;
      const float* s = sin + i * crs + h * chs;
      float* o = out + (i * H + h) * D;
      for (int64_t d = 0; d < h2; ++d) {          // the two halves apart, so each loop vectorizes
        const float ac = static_cast<float>(xh[d]) * c[d];
        const float rs = static_cast<float>(xh[d + h2]) * s[d];
        o[d] = ac + rs;
      }
      for (int64_t d = h2; d < D; ++d) {
        const float ac = static_cast<float>(xh[d]) * c[d];
        const float rs = static_cast<float>(xh[d - h2]) * s[d];
        o[d] = ac + rs;
      }
      if (scale != nullptr) {                      // the sum rounded to fp32, then scaled: as the two ops
        const float sc = scale[h];
        for (int64_t d = 0; d < D; ++d) o[d] = o[d] * sc;
      }
      if (i < N && h >= Hq) {
        C* kd = k + (h - Hq) * ks0 + i * ks1;
        for (int64_t d = 0; d < D; ++d) kd[d] = static_cast<C>(o[d]);
      }
    }
    if (i < N) {
      for (int64_t h = 0; h < Hkv; ++h) {
        const T* vh = xi + (H + h) * D;
        C* vd = v + h * vs0 + i * vs1;
        for (int64_t d = 0; d < D; ++d) vd[d] = static_cast<C>(static_cast<float>(vh[d]));
      }
    }
  }
}

// rope_rows over qkv's dtype (bf16 or fp32), into out [Np, Hq + Hkv, D] fp32; k, v: the first row's cache slots
template <typename C>
static void rope_qkv(const Tensor& qkv, const Tensor& cos, const Tensor& sin, int64_t crs, int64_t chs,
                     const float* scale, const Tensor& out, C* k, C* v, int64_t ks0, int64_t ks1, int64_t vs0,
                     int64_t vs1, int64_t N, int64_t Hq, int64_t Hkv, int64_t D) {
  if (qkv.scalar_type() == at::kBFloat16)
    rope_rows(qkv.data_ptr<at::BFloat16>(), qkv.stride(0), cos.data_ptr<float>(), sin.data_ptr<float>(), crs, chs,
              scale, out.data_ptr<float>(), k, v, ks0, ks1, vs0, vs1, qkv.size(0), N, Hq, Hkv, D);
  else
    rope_rows(qkv.data_ptr<float>(), qkv.stride(0), cos.data_ptr<float>(), sin.data_ptr<float>(), crs, chs,
              scale, out.data_ptr<float>(), k, v, ks0, ks1, vs0, vs1, qkv.size(0), N, Hq, Hkv, D);
}

static Tensor rope_kv(const Tensor& qkv, const Tensor& cos, const Tensor& sin, const Tensor& scale, const Tensor& kr,
                      const Tensor& vr, int64_t s0, int64_t N, int64_t Hq, int64_t Hkv, int64_t D) {
  const int64_t Np = qkv.size(0);
  const auto f32 = at::kFloat;
  const bool loop = qkv.device().is_cpu() && qkv.dim() == 2 && qkv.stride(1) == 1 &&
      qkv.size(1) == (Hq + 2 * Hkv) * D && (qkv.scalar_type() == at::kBFloat16 || qkv.scalar_type() == f32) &&
      D % 2 == 0 && cos.scalar_type() == f32 && sin.scalar_type() == f32 && cos.is_contiguous() &&
      sin.is_contiguous() && cos.numel() == Np * D && sin.numel() == Np * D && scale.scalar_type() == f32 &&
      scale.is_contiguous() && scale.numel() == Hq + Hkv && kr.scalar_type() == vr.scalar_type() &&
      (kr.scalar_type() == f32 || kr.scalar_type() == at::kBFloat16) &&
      kr.stride(2) == 1 && vr.stride(2) == 1 && kr.size(1) >= s0 + N && vr.size(1) >= s0 + N;
  if (!loop) {
    auto qk = rotate(qkv.slice(1, 0, (Hq + Hkv) * D).to(at::kFloat).view({Np, Hq + Hkv, D}), cos, sin) * scale;
    kr.slice(1, s0, s0 + N).copy_(qk.slice(0, 0, N).slice(1, Hq).transpose(0, 1));
    vr.slice(1, s0, s0 + N).copy_(qkv.slice(0, 0, N).slice(1, (Hq + Hkv) * D).view({N, Hkv, D}).transpose(0, 1));
    return qk;
  }
  auto out = at::empty({Np, Hq + Hkv, D}, qkv.options().dtype(f32));
  auto run = [&](auto* k, auto* v) {   // the cache's own dtype: fp32, or bf16 (each key rounded once, as copy_ does)
    rope_qkv(qkv, cos, sin, D, 0, scale.data_ptr<float>(), out, k + s0 * kr.stride(1), v + s0 * vr.stride(1),
             kr.stride(0), kr.stride(1), vr.stride(0), vr.stride(1), N, Hq, Hkv, D);
  };
  if (kr.scalar_type() == f32)
    run(kr.data_ptr<float>(), vr.data_ptr<float>());
  else
    run(kr.data_ptr<at::BFloat16>(), vr.data_ptr<at::BFloat16>());
  return out;
}

// The int8-weight product of a draft's few rows, y[i, n] = bf16(x[i] . w[n] * s[n]), as ATen's _weight_int8pack_mm
// computes it but with the activations in int16: each row of x scaled by its largest |x| to 32767 and rounded (16
// bits of precision against bf16's 8, so the sum moves by about what the bf16 rounding of y does), and the sum of
// the int16 x int8 products kept exactly in int32 lanes (AVX-512 VNNI's vpdpwssd, two products a lane and an
// instruction, one sign-extension per 32 weights shared by up to four rows), the lanes then added in int64: the whole
// sum is exact and is rounded once (i8_out). At 1-4 rows ATen's loop converts every weight to fp32 and is bound by
// its instructions, not by the bytes it reads; this one ran 2.3-2.5x faster. With 2+ rows on a CPU with AMX the tile
// kernel below (i8_on_tiles) computes the same exact sums. A row's bits are a function of that row alone, so a
// draft stays batch-invariant.
// Where the CPU lacks AVX-512 VNNI, K is not a multiple of 32, or the draft's loops are off (`draft_loops`, for the
// bitwise tests against the TorchScript loops), ATen's product runs.
static bool own_loops = true;

static bool i8_kernel_ok() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vnni");
  return ok;
}

#define I8_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))

// the lane sums of a, b, c, d [16 fp32 each] -> [sum a, sum b, sum c, sum d]
I8_TARGET static inline __m128 sum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));   // per 128 bits: a b a b
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 t = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xEE));   // a b c d
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(t),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(t), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// e^x for 16 lanes: x = n ln2 + r (|r| <= ln2 / 2), e^r by its Taylor polynomial to r^7 (relative error < 1e-7),
// times 2^n; x clamped to [-104, 88.7] first, so -inf gives 0 (2^-150 underflows) and no lane overflows.
V16_TARGET static inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.7f)), _mm512_set1_ps(-104.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);     // ln 2 in two parts: n ln2 exact enough
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
  __m512 p = _mm512_set1_ps(1.f / 5040);
  for (const float c : {1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f}) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, n);
}

// an output from its exact integer sum: one rounding to fp32, then the two scales, then bf16 (both kernels)
static inline at::BFloat16 i8_out(int64_t sum, float sx, at::BFloat16 s) {
  return at::BFloat16(static_cast<float>(sum) * sx * static_cast<float>(s));
}

// the weight lines a kernel thread fetches a block ahead of its reads, up to the end of its rows. A draft's weights
// come from far caches after each target step, and its rows are short (576 bytes: 9 lines), too short for the
// hardware's own prefetch to start on before the row is read.
struct Ahead {
  const char *p, *end;
  inline void fetch(int64_t lines) {
    for (; lines > 0 && p < end; --lines, p += 64) _mm_prefetch(p, _MM_HINT_T0);
  }
};

// MR rows of xq [., K] int16 (scales sx) against weight rows n .. n + 3 of w [N, K] -> y[., n .. n + 3]. A lane adds
// K / 16 products of at most 32767 * 128 in int32: exact up to K = 8192 (2^31 / 2^22 = 512 a lane); longer rows
// go in chunks of 8192, each chunk's lanes added in int64: the whole sum exact.
template <int MR>
I8_TARGET static void i8_tile(const int16_t* xq, const float* sx, int64_t K, const int8_t* w, const at::BFloat16* s,
                              at::BFloat16* y, int64_t N, int64_t n, Ahead& ahead) {
  int64_t acc[MR][4] = {};
  const int8_t* w0 = w + n * K;
  for (int64_t k0 = 0; k0 < K; k0 += 8192) {
    const int64_t k1 = std::min<int64_t>(K, k0 + 8192);
    __m512i ai[MR][4];
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < 4; ++j) ai[r][j] = _mm512_setzero_si512();
    for (int64_t k = k0; k < k1; k += 32) {
      ahead.fetch(2);   // as many lines as these 4 rows read
      __m512i wv[4];
      for (int j = 0; j < 4; ++j)
        wv[j] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(w0 + j * K + k)));
      for (int r = 0; r < MR; ++r) {
        const __m512i xv = _mm512_loadu_si512((const void*)(xq + r * K + k));
        for (int j = 0; j < 4; ++j) ai[r][j] = _mm512_dpwssd_epi32(ai[r][j], xv, wv[j]);
      }
    }
    for (int r = 0; r < MR; ++r)   // the lanes' sum in int64: exact, as the tile kernel's
      for (int j = 0; j < 4; ++j)
        acc[r][j] += _mm512_reduce_add_epi64(_mm512_add_epi64(
            _mm512_cvtepi32_epi64(_mm512_castsi512_si256(ai[r][j])),
            _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(ai[r][j], 1))));
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 4; ++j) y[r * N + n + j] = i8_out(acc[r][j], sx[r], s[n + j]);
}

// x [K] bf16 -> xq [K] int16 (round to nearest even) and its scale: the largest |x| becomes 32767
I8_TARGET static float i8_quantize(const at::BFloat16* x, int64_t K, int16_t* xq) {
  __m512 amax = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(v16_load(x + k)));
  const float mx = _mm512_reduce_max_ps(amax);
  const float sc = mx > 0.f ? mx / 32767.f : 1.f;
  const __m512 inv = _mm512_set1_ps(1.f / sc);
  for (int64_t k = 0; k < K; k += 16)   // |x / sc| <= 32767 (to rounding): the narrowing never saturates
    _mm256_storeu_si256((__m256i*)(xq + k), _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(v16_load(x + k), inv))));
  return sc;
}

I8_TARGET static void i8_rows(const int16_t* xq, const float* sx, int64_t m, int64_t K, const int8_t* w,
                              const at::BFloat16* s, at::BFloat16* y, int64_t N, int64_t n, Ahead& a) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) i8_tile<4>(xq + i * K, sx + i, K, w, s, y + i * N, N, n, a);
  switch (m - i) {
    case 3: i8_tile<3>(xq + i * K, sx + i, K, w, s, y + i * N, N, n, a); break;
    case 2: i8_tile<2>(xq + i * K, sx + i, K, w, s, y + i * N, N, n, a); break;
    case 1: i8_tile<1>(xq + i * K, sx + i, K, w, s, y + i * N, N, n, a); break;
  }
}

// the draft's own loops (the int8 product above, EAGLE's attention and top-k below) on, or off: ATen's ops, op for op
static bool draft_loops(bool on) {
  const bool was = own_loops;
  own_loops = on;
  return was;
}

// ---- The target's 4-bit products (q4.py packs them): GGUF Q4_1 weights, w = round_bf16(d q + m) per block of 32
// (d, m fp16, q 0..15), multiplied as those bf16 values against bf16 activations with fp32 sums. d q is exact in fp32
// (11 + 4 bits), so one fused d q + m rounds once, as the file's own mul-then-add does: the same bf16 weights, read
// as 0.625 bytes each instead of 2. A weight tile q4 [G, B, 320] u8: for rows 16 g .. 16 g + 15 and k = 32 b ..
// 32 b + 31, 16 lines of 16 bytes (line kk: element e = 2 n + parity, weight (16 g + e / 2, 32 b + 2 kk + e % 2);
// low nibbles are e < 16, high nibbles e >= 16), then d [16] and m [16] fp16: a line unpacks into one row of AMX's
// pair-interleaved B tile. Every output element is one sum over k in one order, whatever rows come with it, so the
// product is batch-invariant with no padding. AMX's tile product where the CPU has it (and the OS grants it): the same
// order as oneDNN's packed bf16 product, whose bits it gives (tests/test_q4.py); else AVX-512 BF16 dot products in
// the same pair order (q4.py attaches tiles for them only when asked), which round differently.
#define Q4_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,f16c")))
#define AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,f16c,amx-tile,amx-bf16")))

static bool q4_on = true;
static bool q4_tiles = true;   // AMX's tiles where granted (off: the dot products, to test them on such a CPU)

static bool q4_fits_cpu() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512bf16");
  return ok;
}

static bool amx_granted() {   // Linux hands out AMX's tile state on request (ARCH_REQ_XCOMP_PERM, XTILEDATA)
  static const bool ok = __builtin_cpu_supports("amx-bf16") && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return ok;
}

// A tile's scales in line order: d and m [16 fp16, row n] -> lanes 2 n + parity, for the low nibbles' rows (n < 8)
// and the high ones' (n >= 8)
struct Q4Scales {
  __m512 dl, dh, ml, mh;
};

Q4_TARGET static inline Q4Scales q4_scales(const uint8_t* t) {
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(t + 256)));
  const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(t + 288)));
  const __m512i lo_i = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i hi_i = _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
  return {_mm512_permutexvar_ps(lo_i, d), _mm512_permutexvar_ps(hi_i, d), _mm512_permutexvar_ps(lo_i, m),
          _mm512_permutexvar_ps(hi_i, m)};
}

// line kk of a tile -> its 32 bf16 weights, pair-interleaved (16 rows x 2 k): d q + m, one rounding each. q as a
// float by a permute of 0.0 .. 15.0 (it reads an index's low 4 bits: the low nibble needs no mask), exactly the
// conversion's value
Q4_TARGET static inline __m512i q4_line(const uint8_t* t, int kk, const Q4Scales& s) {
  const __m512 v = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(t + kk * 16)));
  const __m512 lo = _mm512_fmadd_ps(_mm512_permutexvar_ps(b, v), s.dl, s.ml);
  const __m512 hi = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), v), s.dh, s.mh);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// one weight tile (16 rows x 32 k) -> 16 lines of 32 bf16, pair-interleaved (w: 512 u16)
Q4_TARGET static inline void q4_unpack_tile(const uint8_t* t, uint16_t* w) {
  const Q4Scales s = q4_scales(t);
  for (int kk = 0; kk < 16; ++kk) _mm512_storeu_si512((void*)(w + kk * 32), q4_line(t, kk, s));
}

struct TileConfig {
  uint8_t palette, start;
  uint8_t pad[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// weight row groups g0 .. g1 - 1 of q4 against x [M, K] -> y [M, N] (row stride N). Two groups at a time where there
// are two: each group's sums stay one chain of tile products in k's order (the bits of one group alone), and the two
// chains are independent, so one product need not wait for the last to finish; x's tile is loaded once for both.
AMX_TARGET static void q4_on_tiles(const at::BFloat16* x, int64_t M, int64_t K, const uint8_t* q, at::BFloat16* y,
                              int64_t N, int64_t g0, int64_t g1) {
  const int64_t B = K / 32;
  const bool one = M <= 16;   // up to 16 rows: each tile's lines go to the tile product while in L1; more: all first
  std::vector<uint16_t> w(2 * (one ? 2 : B) * 512);   // per group of the pair: its unpacked tiles
  alignas(64) float c[16 * 16];
  int64_t shape = -1;
  for (int64_t g = g0; g < g1;) {
    const int64_t ng = std::min<int64_t>(2, g1 - g);
    uint16_t* wg[2] = {w.data(), w.data() + (one ? 2 : B) * 512};
    if (!one)
      for (int64_t h = 0; h < ng; ++h)
        for (int64_t b = 0; b < B; ++b) q4_unpack_tile(q + ((g + h) * B + b) * 320, wg[h] + b * 512);
    for (int64_t r0 = 0; r0 < M; r0 += 16) {
      const int64_t R = std::min<int64_t>(16, M - r0);
      if (R != shape) {   // tiles: 0, 3 the sums [R, 16] fp32; 1 x [R, 32] bf16; 2, 4 w [16 pairs, 16 x 2] bf16
        TileConfig t{};
        t.palette = 1;
        t.rows[0] = t.rows[1] = t.rows[3] = R;
        t.rows[2] = t.rows[4] = 16;
        t.colsb[0] = t.colsb[1] = t.colsb[2] = t.colsb[3] = t.colsb[4] = 64;
        _tile_loadconfig(&t);
        shape = R;
      }
      _tile_zero(0);
      _tile_zero(3);
      for (int64_t b = 0; b < B; ++b) {
        uint16_t* w0 = one ? wg[0] + (b & 1) * 512 : wg[0] + b * 512;
        uint16_t* w1 = one ? wg[1] + (b & 1) * 512 : wg[1] + b * 512;
        if (one) {
          q4_unpack_tile(q + (g * B + b) * 320, w0);
          if (ng == 2) q4_unpack_tile(q + ((g + 1) * B + b) * 320, w1);
        }
        _tile_loadd(1, x + r0 * K + b * 32, K * 2);
        _tile_loadd(2, w0, 64);
        _tile_dpbf16ps(0, 1, 2);
        if (ng == 2) {
          _tile_loadd(4, w1, 64);
          _tile_dpbf16ps(3, 1, 4);
        }
      }
      _tile_stored(0, c, 64);
      for (int64_t r = 0; r < R; ++r) v16_store(y + (r0 + r) * N + g * 16, _mm512_load_ps(c + r * 16));
      if (ng == 2) {
        _tile_stored(3, c, 64);
        for (int64_t r = 0; r < R; ++r) v16_store(y + (r0 + r) * N + (g + 1) * 16, _mm512_load_ps(c + r * 16));
      }
    }
    g += ng;
  }
  if (shape >= 0) _tile_release();
}

// Without AMX: AVX-512 BF16 dot products, each output one fp32 sum over k's pairs in order from 0 (one vdpbf16ps a
// pair), whatever rows come with it. R rows (a compile-time count, so the sums stay in registers) against NG weight
// groups at once, each line of 32 weights used by all R rows. LINES false: the lines unpacked in registers from the
// groups' tiles (src: group g's first tile, the rest after it): at one row the step reads 0.625 bytes a weight and
// keeps NG independent chains of sums in flight; at 16 one line serves 16 products. LINES true: the lines read from a
// buffer where they were unpacked once (src: group g's P lines, the rest after it), for more rows than one block (a
// prompt's prefill): every block of rows reuses them from the thread's L2 instead of unpacking them again (the
// unpacking is most of a one-row product's work). The sums are the same either way. Outputs: groups g .. g + NG - 1,
// rows r0 .. r0 + R - 1.
template <int R, int NG, bool LINES>
Q4_TARGET static void q4_dots_block(const int32_t* xp, int64_t P, const void* src, at::BFloat16* y, int64_t N,
                                    int64_t g, int64_t r0) {
  const int64_t B = P / 16;   // tiles a group
  __m512 acc[NG][R];
  for (int j = 0; j < NG; ++j)
    for (int r = 0; r < R; ++r) acc[j][r] = _mm512_setzero_ps();
  const int32_t* xr = xp + r0 * P;
  for (int64_t b = 0; b < B; ++b) {
    Q4Scales s[NG];
    const uint8_t* t[NG];
    if constexpr (!LINES)
      for (int j = 0; j < NG; ++j) {
        t[j] = static_cast<const uint8_t*>(src) + (j * B + b) * 320;
        s[j] = q4_scales(t[j]);
      }
    for (int kk = 0; kk < 16; ++kk) {
      const int64_t p = b * 16 + kk;
      __m512bh w[NG];
      for (int j = 0; j < NG; ++j)
        if constexpr (LINES)
          w[j] = (__m512bh)_mm512_loadu_si512(static_cast<const uint16_t*>(src) + (j * P + p) * 32);
        else
          w[j] = (__m512bh)q4_line(t[j], kk, s[j]);
      for (int r = 0; r < R; ++r) {
        const __m512bh xv = (__m512bh)_mm512_set1_epi32(xr[r * P + p]);
        for (int j = 0; j < NG; ++j) acc[j][r] = _mm512_dpbf16_ps(acc[j][r], xv, w[j]);
      }
    }
  }
  for (int j = 0; j < NG; ++j)
    for (int r = 0; r < R; ++r) v16_store(y + (r0 + r) * N + (g + j) * 16, acc[j][r]);
}

// rows r0 .. r0 + R - 1 (a runtime count: R <= 16 from tiles, R <= 8 from lines) against groups g0 .. g1 - 1, their
// tiles or lines from src: as many groups at once as keep 16 sums in registers (from lines, 24: nothing to unpack)
template <int R, bool LINES>
Q4_TARGET static void q4_dots_rows(const int32_t* xp, int64_t P, const void* src, at::BFloat16* y, int64_t N,
                                   int64_t g0, int64_t g1, int64_t r0) {
  constexpr int NG = LINES ? (R <= 4 ? 6 : R <= 6 ? 4 : 3) : (R <= 4 ? 4 : R <= 8 ? 2 : 1);
  const int64_t step = LINES ? P * 64 : P / 16 * 320;   // bytes a group
  auto at = [&](int64_t g) { return static_cast<const uint8_t*>(src) + (g - g0) * step; };
  int64_t g = g0;
  for (; g + NG <= g1; g += NG) q4_dots_block<R, NG, LINES>(xp, P, at(g), y, N, g, r0);
  if constexpr (NG > 2)
    for (; g + 2 <= g1; g += 2) q4_dots_block<R, 2, LINES>(xp, P, at(g), y, N, g, r0);
  for (; g < g1; ++g) q4_dots_block<R, 1, LINES>(xp, P, at(g), y, N, g, r0);
}

using DotRows = void (*)(const int32_t*, int64_t, const void*, at::BFloat16*, int64_t, int64_t, int64_t, int64_t);
constexpr int64_t LINE_GROUPS = 6;   // groups a thread's chunk of lines holds: 288 KiB at K = 1536, in its L2

// all M rows, in blocks of up to 8, against groups c0 .. c1 - 1 whose lines start at src (one chunk)
Q4_TARGET static void line_blocks(const int32_t* xp, int64_t M, int64_t P, const void* src, at::BFloat16* y,
                                  int64_t N, int64_t c0, int64_t c1) {
  static constexpr DotRows rows[9] = {nullptr, q4_dots_rows<1, true>, q4_dots_rows<2, true>, q4_dots_rows<3, true>,
                                      q4_dots_rows<4, true>, q4_dots_rows<5, true>, q4_dots_rows<6, true>,
                                      q4_dots_rows<7, true>, q4_dots_rows<8, true>};
  for (int64_t r0 = 0; r0 < M; r0 += 8) rows[std::min<int64_t>(8, M - r0)](xp, P, src, y, N, c0, c1, r0);
}

Q4_TARGET static void q4_dots(const at::BFloat16* x, int64_t M, int64_t K, const uint8_t* q, at::BFloat16* y,
                              int64_t N, int64_t g0, int64_t g1) {
  const int32_t* xp = reinterpret_cast<const int32_t*>(x);   // x's pairs
  const int64_t B = K / 32, P = K / 2;
  if (M > 16) {   // lines unpacked once per chunk of groups, then every block of 8 rows
    thread_local std::vector<uint16_t> w;   // kept: a new one each call was mapped and zeroed each call
    if (w.size() < static_cast<size_t>(LINE_GROUPS * P * 32)) w.resize(LINE_GROUPS * P * 32);
    for (int64_t c0 = g0; c0 < g1; c0 += LINE_GROUPS) {
      const int64_t c1 = std::min(g1, c0 + LINE_GROUPS);
      for (int64_t g = c0; g < c1; ++g)
        for (int64_t b = 0; b < B; ++b) q4_unpack_tile(q + (g * B + b) * 320, w.data() + ((g - c0) * P + b * 16) * 32);
      line_blocks(xp, M, P, w.data(), y, N, c0, c1);
    }
    return;
  }
  static constexpr DotRows rows[17] = {nullptr, q4_dots_rows<1, false>, q4_dots_rows<2, false>,
                                       q4_dots_rows<3, false>, q4_dots_rows<4, false>, q4_dots_rows<5, false>,
                                       q4_dots_rows<6, false>, q4_dots_rows<7, false>, q4_dots_rows<8, false>,
                                       q4_dots_rows<9, false>, q4_dots_rows<10, false>, q4_dots_rows<11, false>,
                                       q4_dots_rows<12, false>, q4_dots_rows<13, false>, q4_dots_rows<14, false>,
                                       q4_dots_rows<15, false>, q4_dots_rows<16, false>};
  if (M > 0) rows[M](xp, P, q + g0 * B * 320, y, N, g0, g1, 0);
}

// The LM head's product from its bf16 weights laid out as the dot products' lines, lines [G, P, 32] (P = K / 2; line
// p of group g: element 2 n + parity is weight (16 g + n, 2 p + parity)): the same kernel as the 4-bit layers' with
// nothing to unpack. oneDNN's packed product, which the head took before, needs its rows padded to a multiple of 4
// for batch invariance, and read the 57 MB more slowly (side by side on the 2-core AMD EPYC, caches flushed: 2.64
// against 1.80 ms a row, 2.88 against 1.97 at 6 rows); here each output is one fp32 sum over k's pairs in order
// from 0 whatever rows come with it, so nothing is padded. Each thread runs its groups in chunks (110 KiB at
// K = 576, in its L2) through every block of up to 8 rows, so the weights are read from memory once whatever the
// row count.
static Tensor lines_product(const Tensor& x_, const Tensor& lines) {
  const Tensor x = x_.contiguous();
  const int64_t M = x.size(0), G = lines.size(0), P = lines.size(1), N = G * 16;
  auto y = at::empty({M, N}, x.options());
  const int32_t* xp = reinterpret_cast<const int32_t*>(x.data_ptr<at::BFloat16>());
  const uint16_t* lp = reinterpret_cast<const uint16_t*>(lines.data_ptr<at::BFloat16>());
  at::BFloat16* yp = y.data_ptr<at::BFloat16>();
  at::parallel_for(0, G, LINE_GROUPS, [&](int64_t g0, int64_t g1) {
    for (int64_t c0 = g0; c0 < g1; c0 += LINE_GROUPS)
      line_blocks(xp, M, P, lp + c0 * P * 32, yp, N, c0, std::min(g1, c0 + LINE_GROUPS));
  });
  return y;
}

static bool is_lines(const Tensor& l) {   // [G, P, 32] bf16, as q4.attach lays out the head
  return l.scalar_type() == at::kBFloat16 && l.dim() == 3 && l.size(2) == 32 && l.size(1) % 16 == 0 &&
         l.is_contiguous();
}

static bool lines_fit(const Tensor& x, const Tensor& l) {
  return q4_on && q4_fits_cpu() && is_lines(l) && x.is_cpu() && x.dim() == 2 && x.scalar_type() == at::kBFloat16 &&
         x.size(1) == 2 * l.size(1);
}

static bool is_q4_tiles(const Tensor& q) {   // [G, B, 320] u8, as q4.py packs them
  return q.scalar_type() == at::kByte && q.dim() == 3 && q.size(2) == 320 && q.is_contiguous();
}

static bool q4_fits(const Tensor& x, const Tensor& q) {
  return q4_on && q4_fits_cpu() && is_q4_tiles(q) && x.is_cpu() && x.dim() == 2 &&
         x.scalar_type() == at::kBFloat16 && x.size(1) == q.size(1) * 32;
}

static Tensor q4_product(const Tensor& x_, const Tensor& q) {
  const Tensor x = x_.contiguous();
  const int64_t M = x.size(0), K = x.size(1), G = q.size(0), N = G * 16;
  auto y = at::empty({M, N}, x.options());
  const at::BFloat16* xp = x.data_ptr<at::BFloat16>();
  at::BFloat16* yp = y.data_ptr<at::BFloat16>();
  const uint8_t* qp = q.data_ptr<uint8_t>();
  const bool amx = q4_tiles && amx_granted();
  at::parallel_for(0, G, 4, [&](int64_t g0, int64_t g1) {
    if (amx)
      q4_on_tiles(xp, M, K, qp, yp, N, g0, g1);
    else
      q4_dots(xp, M, K, qp, yp, N, g0, g1);
  });
  return y;
}

// q4 [G, B, 320] -> its lines as the kernel unpacks them, [G, B, 16, 32] bf16 (element 2 n + parity of line kk;
// q4.py puts them back in row order and checks them against the weights they stand for)
static Tensor q4_lines(const Tensor& q) {
  TORCH_CHECK(q4_fits_cpu() && is_q4_tiles(q), "q4_lines: a packed 4-bit weight on a CPU with AVX-512 BF16");
  const int64_t G = q.size(0), B = q.size(1);
  auto w = at::empty({G, B, 16, 32}, q.options().dtype(at::kBFloat16));
  uint16_t* wp = reinterpret_cast<uint16_t*>(w.data_ptr<at::BFloat16>());
  const uint8_t* qp = q.data_ptr<uint8_t>();
  at::parallel_for(0, G * B, 64, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) q4_unpack_tile(qp + t * 320, wp + t * 512);
  });
  return w;
}

// the target's 4-bit products on, or off (the oneDNN-packed bf16 weights they stand for), or as they are; -> were
// they on
static bool q4_products(std::optional<bool> on) {
  const bool was = q4_on;
  if (on.has_value()) q4_on = *on;
  return was;
}

// -> whether the 4-bit products run on AMX's tiles; tiles false: the dot products from now on (tests only: each
// kernel rounds its own way, and a process keeps one)
static bool q4_amx(std::optional<bool> tiles) {
  if (tiles.has_value()) q4_tiles = *tiles;
  return q4_tiles && amx_granted();
}

// The same product on AMX's int8 tiles, for 2 or more rows: the weight rows are the A tiles as they lie (16 rows x 64
// k, the row stride K), x's int16 rows split exactly into a signed high byte and an unsigned low one (xq = 256 hi +
// lo) the B tiles (16 lines of 4 k x the rows). tdpbssd sums w hi, tdpbsud w lo, each exactly in int32 (|w| <= 127, K
// <= 32768), and their int64 combination is the VNNI kernel's exact sum: the same bits whatever kernel a row takes.
// At a few rows the VNNI kernel is bound by its multiplies (16 per 4 weight rows x 32 k at 4 rows); a tile product
// multiplies 32 weight rows x 64 k by up to 16 rows in two instructions, so the weights' bytes bound it.
#define I8_AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,amx-tile,amx-int8")))

constexpr int64_t i8_amx_rows = 2;   // from here the tiles beat VNNI's multiplies (0.069 against 0.110 ms a level)
static bool i8_tiles = true;   // AMX's int8 tiles where granted (off: the VNNI kernel at every row count; the same bits)

static bool i8_amx_granted() {
  static const bool ok = __builtin_cpu_supports("amx-int8") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512dq") && amx_granted();
  return ok;
}

// -> whether a draft's int8 products of 2 or more rows run on AMX's tiles; tiles: set that first (false: the VNNI
// kernel at every row count, to compare the two)
static bool int8_amx(std::optional<bool> tiles) {
  if (tiles.has_value()) i8_tiles = *tiles;
  return i8_tiles && i8_amx_granted();
}

// xq [M, K] int16 (M <= 16) -> its B tiles: per 64 k, the high bytes' tile then the low bytes' ([16 lines, 4 M] each;
// line kk holds row r's k = 4 kk .. 4 kk + 3 at 4 r)
I8_AMX_TARGET static void i8_b_tiles(const int16_t* xq, int64_t M, int64_t K, int8_t* b) {
  const int64_t L = 4 * M;
  const __m512i lines = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32(static_cast<int>(L)));
  for (int64_t c = 0; c < K / 64; ++c) {
    int8_t* hi = b + c * 32 * L;
    for (int64_t r = 0; r < M; ++r) {
      const __m512i v0 = _mm512_loadu_si512((const void*)(xq + r * K + c * 64));
      const __m512i v1 = _mm512_loadu_si512((const void*)(xq + r * K + c * 64 + 32));
      const __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srai_epi16(v0, 8))),
                                           _mm512_cvtepi16_epi8(_mm512_srai_epi16(v1, 8)), 1);
      const __m512i l = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(v0)),   // the low bytes
                                           _mm512_cvtepi16_epi8(v1), 1);
      _mm512_i32scatter_epi32(hi + r * 4, lines, h, 1);        // 16 lines of 4 bytes
      _mm512_i32scatter_epi32(hi + 16 * L + r * 4, lines, l, 1);
    }
  }
}

// weight rows n0 .. n1 - 1 (multiples of 16) against M <= 16 rows whose B tiles are bt -> y[., n0 .. n1 - 1]
I8_AMX_TARGET static void i8_on_tiles(const int8_t* bt, const float* sx, int64_t M, int64_t K, const int8_t* w,
                                      const at::BFloat16* s, at::BFloat16* y, int64_t N, int64_t n0, int64_t n1,
                                      Ahead& ahead) {
  TileConfig t{};   // 0, 1: weight rows (16 x 64 k); 2, 3: x's high and low bytes; 4-7: the sums [16, M] int32
  t.palette = 1;
  for (int i = 0; i < 2; ++i) t.rows[i] = 16, t.colsb[i] = 64;
  for (int i = 2; i < 4; ++i) t.rows[i] = 16, t.colsb[i] = 4 * M;
  for (int i = 4; i < 8; ++i) t.rows[i] = 16, t.colsb[i] = 4 * M;
  _tile_loadconfig(&t);
  const int64_t L = 4 * M;
  alignas(64) int32_t c[4][16 * 16];
  const __m512i col = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                         _mm512_set1_epi32(static_cast<int>(M)));   // a weight row's sums in c
  for (int64_t n = n0; n < n1; n += 32) {
    const bool two = n + 32 <= n1;
    _tile_zero(4); _tile_zero(5); _tile_zero(6); _tile_zero(7);
    for (int64_t k = 0; k < K; k += 64) {
      ahead.fetch(32);   // as many lines as this step reads: a block ahead
      const int8_t* b = bt + (k / 64) * 32 * L;
      _tile_loadd(2, b, L);
      _tile_loadd(3, b + 16 * L, L);
      _tile_loadd(0, w + n * K + k, K);
      _tile_dpbssd(4, 0, 2);
      _tile_dpbsud(5, 0, 3);
      if (two) {
        _tile_loadd(1, w + (n + 16) * K + k, K);
        _tile_dpbssd(6, 1, 2);
        _tile_dpbsud(7, 1, 3);
      }
    }
    _tile_stored(4, c[0], L); _tile_stored(5, c[1], L);
    if (two) { _tile_stored(6, c[2], L); _tile_stored(7, c[3], L); }
    for (int h = 0; h < (two ? 2 : 1); ++h) {
      const __m512 sc = v16_load(s + n + 16 * h);
      for (int64_t r = 0; r < M; ++r) {   // row r's 16 sums: 256 hi + lo in int64, to fp32 (one rounding), scaled
        const __m512i at = _mm512_add_epi32(col, _mm512_set1_epi32(static_cast<int>(r)));
        const __m512i hi = _mm512_i32gather_epi32(at, c[2 * h], 4), lo = _mm512_i32gather_epi32(at, c[2 * h + 1], 4);
        const __m256 a = _mm512_cvtepi64_ps(_mm512_add_epi64(
            _mm512_slli_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(hi)), 8),
            _mm512_cvtepi32_epi64(_mm512_castsi512_si256(lo))));
        const __m256 b = _mm512_cvtepi64_ps(_mm512_add_epi64(
            _mm512_slli_epi64(_mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(hi, 1)), 8),
            _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(lo, 1))));
        const __m512 f = _mm512_insertf32x8(_mm512_castps256_ps512(a), b, 1);
        v16_store(y + r * N + n + 16 * h, _mm512_mul_ps(_mm512_mul_ps(f, _mm512_set1_ps(sx[r])), sc));
      }
    }
  }
  _tile_release();
}

static Tensor i8_product(const Tensor& x, const Tensor& w, const Tensor& s) {
  const int64_t m = x.size(0), K = x.size(1), N = w.size(0);
  std::vector<int16_t> xq(m * K);
  std::vector<float> sx(m);
  const at::BFloat16* xp = x.data_ptr<at::BFloat16>();
  for (int64_t i = 0; i < m; ++i) sx[i] = i8_quantize(xp + i * K, K, xq.data() + i * K);
  auto y = at::empty({m, N}, x.options());
  const int8_t* wp = w.data_ptr<int8_t>();
  const at::BFloat16* sp = s.data_ptr<at::BFloat16>();
  at::BFloat16* yp = y.data_ptr<at::BFloat16>();
  if (m >= i8_amx_rows && K % 64 == 0 && K <= 32768 && N % 16 == 0 && i8_tiles && i8_amx_granted()) {
    std::vector<int8_t> bt(m * 2 * K);   // each 16 rows' B tiles
    for (int64_t r0 = 0; r0 < m; r0 += 16) i8_b_tiles(xq.data() + r0 * K, std::min<int64_t>(16, m - r0), K, bt.data() + r0 * 2 * K);
    at::parallel_for(0, N / 16, 2, [&](int64_t b0, int64_t b1) {   // blocks of 16 weight rows
      for (int64_t r0 = 0; r0 < m; r0 += 16) {
        Ahead a{reinterpret_cast<const char*>(wp + std::min(b0 + 2, b1) * 16 * K),
                reinterpret_cast<const char*>(wp + b1 * 16 * K)};
        i8_on_tiles(bt.data() + r0 * 2 * K, sx.data() + r0, std::min<int64_t>(16, m - r0), K, wp, sp, yp + r0 * N,
                    N, 16 * b0, 16 * b1, a);
      }
    });
    return y;
  }
  at::parallel_for(0, N / 4, 16, [&](int64_t b0, int64_t b1) {   // blocks of 4 weight rows
    Ahead a{reinterpret_cast<const char*>(wp + std::min(b0 + 1, b1) * 4 * K),
            reinterpret_cast<const char*>(wp + b1 * 4 * K)};
    for (int64_t b = b0; b < b1; ++b) i8_rows(xq.data(), sx.data(), m, K, wp, sp, yp, N, 4 * b, a);
  });
  return y;
}

static Tensor int8_product(const Tensor& x, const Tensor& w, const Tensor& s) {
  const bool fits = own_loops && i8_kernel_ok() && x.is_cpu() && x.dim() == 2 && x.scalar_type() == at::kBFloat16 &&
                    x.is_contiguous() && w.scalar_type() == at::kChar && w.is_contiguous() &&
                    s.scalar_type() == at::kBFloat16 && s.is_contiguous() && x.size(1) % 32 == 0 &&
                    w.size(0) % 4 == 0;
  return fits ? i8_product(x, w, s) : at::_weight_int8pack_mm(x, w, s);
}

static Tensor weight_product(const Tensor& x, const Tensor& w, const OptT& s, bool packed = true) {
  if (s.has_value()) return int8_product(x, w, *s);
  return packed ? linear_packed(x, w) : at::linear(x, w);
}

// s: an int8 weight's row scales, or a weight that stands for the packed bf16 one in our kernels' layout: 4-bit
// tiles (q4 [G, B, 320] u8) or bf16 lines (the head's, [G, P, 32]); where x does not fit them, the packed one runs
static Tensor dense(const Tensor& x, const Tensor& w, OptT s, const OptT& b, int64_t max_rows, int64_t rows) {
  const int64_t n = x.size(0);
  Tensor y;
  const bool tiles = s.has_value() && s->scalar_type() == at::kByte;
  if (tiles || (s.has_value() && is_lines(*s))) {
    if (tiles ? q4_fits(x, *s) : lines_fit(x, *s)) {
      y = tiles ? q4_product(x, *s) : lines_product(x, *s);
      return b.has_value() ? y + *b : y;
    }
    s.reset();
  }
  if (s.has_value()) {
    y = weight_product(x, w, s);
  } else if (n > max_rows && x.scalar_type() != at::kFloat) {
    Tensors parts;
    for (int64_t i = 0; i < n; i += max_rows) {
      auto xi = x.slice(0, i, i + max_rows);
      parts.push_back(weight_product(pad_to(xi, rows), w, s).slice(0, 0, xi.size(0)));
    }
    y = at::cat(parts);
  } else {
    y = weight_product(pad_to(x, rows), w, s).slice(0, 0, n);
  }
  return b.has_value() ? y + *b : y;
}

// Attention's query rows and output rows, moved by plain loops (copies and one rounding each, so the same bits as
// the permutes, reshapes, pads and conversions of _one_row_layers and tree_attention, in one pass each).
//
// head_rows: q [n, Hq, D] fp32 (heads D apart, any row stride) -> [Hkv, R', D], the G query heads of key/value head
// h as its rows: row i G + g for node i (a tree's layout) or g n + i (a chain's), zero rows up to a multiple of
// `rows` (_pad_to)
static Tensor head_rows(const Tensor& q, int64_t Hkv, int64_t rows, bool by_node) {
  const int64_t n = q.size(0), Hq = q.size(1), D = q.size(2), G = Hq / Hkv, R = G * n;
  const int64_t Rp = R + (rows - R % rows) % rows, s0 = q.stride(0);
  TORCH_CHECK(q.scalar_type() == at::kFloat && q.stride(2) == 1 && q.stride(1) == D, "head_rows: fp32 heads");
  auto x = at::empty({Hkv, Rp, D}, q.options());
  const float* src = q.data_ptr<float>();
  float* dst = x.data_ptr<float>();
  for (int64_t h = 0; h < Hkv; ++h) {
    for (int64_t g = 0; g < G; ++g)
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(dst + (h * Rp + (by_node ? i * G + g : g * n + i)) * D, src + i * s0 + (h * G + g) * D,
                    D * sizeof(float));
    std::memset(dst + (h * Rp + R) * D, 0, (Rp - R) * D * sizeof(float));
  }
  return x;
}

// head_out: attention output o (fp32; node i's query head g of key/value head h at o + h os[0] + i os[1] + g os[2],
// D floats) -> att's row a + i, or idx[i] where idx is given, heads in q's order, in att's dtype
template <typename T>
static void head_out(const float* o, const int64_t* os, T* att, const int64_t* idx, int64_t a, int64_t n,
                     int64_t Hq, int64_t Hkv, int64_t D) {
  const int64_t G = Hq / Hkv;
  for (int64_t i = 0; i < n; ++i) {
    T* row = att + (idx != nullptr ? idx[i] : a + i) * Hq * D;
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t g = 0; g < G; ++g) {
        const float* src = o + h * os[0] + i * os[1] + g * os[2];
        T* d = row + (h * G + g) * D;
        for (int64_t e = 0; e < D; ++e) d[e] = static_cast<T>(src[e]);
      }
  }
}

static void scatter_heads(const float* o, const int64_t* os, const Tensor& att, const int64_t* idx, int64_t a,
                          int64_t n, int64_t Hq, int64_t Hkv, int64_t D) {
  if (att.scalar_type() == at::kBFloat16)
    head_out(o, os, att.data_ptr<at::BFloat16>(), idx, a, n, Hq, Hkv, D);
  else
    head_out(o, os, att.data_ptr<float>(), idx, a, n, Hq, Hkv, D);
}

// silu(gu[:, :I]) * gu[:, I:] for gu [n, 2 I]. In bf16, silu takes one of 2^16 inputs, so its results are a table
// ATen's own silu fills once; the product is then the one ATen's bf16 mul computes (the two in fp32, whose exact
// product is rounded once to fp32, then to bf16): the same bits in one pass instead of three ops
static const at::BFloat16* silu_table() {
  static const Tensor table = [] {
    c10::InferenceMode guard;
    auto x = at::arange(-32768, 32768, at::TensorOptions().dtype(at::kInt)).to(at::kShort).view(at::kBFloat16);
    return at::silu(x.view({2048, 32})).contiguous().view({-1});    // index: the input's bits ^ 0x8000
  }();
  return table.data_ptr<at::BFloat16>();
}

static const float* silu_table32() {   // the same table as fp32 (a bf16's bits in the high half), for gathers
  static const std::vector<float> t = [] {
    const at::BFloat16* b = silu_table();
    std::vector<float> f(65536);
    for (int i = 0; i < 65536; ++i) f[i] = static_cast<float>(b[i]);
    return f;
  }();
  return t.data();
}

// o [n, I] = bf16(silu(gate) * up) for gu [n, 2 I] (gate | up), 16 at a time: the table's value gathered
V16_TARGET static void swiglu16(const float* t32, const at::BFloat16* g, at::BFloat16* o, int64_t n, int64_t I) {
  for (int64_t i = 0; i < n; ++i) {
    const at::BFloat16* gi = g + i * 2 * I;
    int64_t j = 0;
    for (; j + 16 <= I; j += 16) {
      const __m512i ix = _mm512_xor_si512(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(gi + j))),
                                          _mm512_set1_epi32(0x8000));
      v16_store(o + i * I + j, _mm512_mul_ps(_mm512_i32gather_ps(ix, t32, 4), v16_load(gi + I + j)));
    }
    for (; j < I; ++j)
      o[i * I + j] = static_cast<at::BFloat16>(t32[gi[j].x ^ 0x8000] * static_cast<float>(gi[I + j]));
  }
}

static Tensor swiglu(const Tensor& gu) {
  const int64_t n = gu.size(0), I = gu.size(-1) / 2;
  if (!(gu.device().is_cpu() && gu.dim() == 2 && gu.is_contiguous() && gu.scalar_type() == at::kBFloat16)) {
    auto c = gu.chunk(2, -1);
    return at::silu(c[0]) * c[1];
  }
  const at::BFloat16* table = silu_table();
  auto out = at::empty({n, I}, gu.options());
  const at::BFloat16* g = gu.data_ptr<at::BFloat16>();
  at::BFloat16* o = out.data_ptr<at::BFloat16>();
  if (v16_ok()) {
    swiglu16(silu_table32(), g, o, n, I);
    return out;
  }
  for (int64_t i = 0; i < n; ++i) {
    const at::BFloat16* gi = g + i * 2 * I;
    for (int64_t j = 0; j < I; ++j)
      o[i * I + j] = static_cast<at::BFloat16>(static_cast<float>(table[gi[j].x ^ 0x8000]) *
                                               static_cast<float>(gi[I + j]));
  }
  return out;
}

// attention_rows for queries head_rows has already padded: softmax(q k^T + bias) v, every padded row kept
static Tensor attention_rows(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias) {
  auto s = at::matmul(q, k.transpose(-1, -2));
  return at::matmul(at::softmax(s.add_(bias), -1), v);
}

// -> o [Hkv, n, G, D] fp32 (tree_attention's before its final transpose and reshape)
static Tensor tree_attention(const Tensor& q, const Tensor& kc, const Tensor& vc, int64_t Hkv, int64_t S, int64_t Sk,
                             int64_t base, const Tensor& gather, const Tensor& bias, const OptT& inv,
                             const OptT& slow, const OptT& slow_gather, bool rescore, int64_t rows) {
  const int64_t n = q.size(0), Hq = q.size(1), D = q.size(2), G = Hq / Hkv;
  auto x = head_rows(q, Hkv, rows, true);                                                // [Hkv, R', D]
  auto s = at::matmul(x, kc.slice(1, 0, Sk).to(at::kFloat).transpose(-1, -2));
  const int64_t w = gather.size(-1);
  auto tail = s.slice(-1, base).gather(-1, gather.expand({Hkv, -1, -1})).add_(bias);
  s = Sk == S ? s.slice(-1, 0, S) : s.slice(-1, 0, S).contiguous();
  s.slice(-1, base, base + w).copy_(tail);
  s.slice(-1, base + w).fill_(-std::numeric_limits<double>::infinity());
  auto p = at::softmax(s, -1);
  Tensor o;
  if (inv.has_value()) {
    auto t = at::constant_pad_nd(p.slice(-1, base, base + w), {0, 1}, 0).gather(-1, inv->expand({Hkv, -1, -1}));
    auto ps = slow.has_value() ? p.clone() : p;
    ps.slice(-1, base, base + inv->size(-1)).copy_(t);
    o = at::matmul(ps, vc.slice(1, 0, S).to(at::kFloat)).slice(1, 0, n * G).view({Hkv, n, G, D});
  } else {
    o = q.new_empty({Hkv, n, G, D});
  }
  if (slow.has_value()) {
    auto v = vc.index({Slice(), *slow_gather}).to(at::kFloat);
    auto pm = p.slice(1, 0, n * G).view({Hkv, n, G, S}).index({Slice(), *slow});
    if (rescore) {
      auto k = kc.index({Slice(), *slow_gather}).to(at::kFloat);
      auto qm = q.view({n, Hkv, G, D}).transpose(0, 1).index({Slice(), *slow});
      auto b = at::zeros({n * G, S}, q.options());
      b.slice(1, base, base + w).copy_(bias.slice(0, 0, n * G));
      b.slice(1, base + w).fill_(-std::numeric_limits<double>::infinity());
      b = b.view({n, G, S}).index({*slow});
      auto sm = at::matmul(pad_to(qm, rows), k.transpose(-1, -2)).slice(-2, 0, G);
      pm = at::softmax(sm + b, -1);
    }
    o.index_put_({Slice(), *slow}, at::matmul(pad_to(pm, rows), v).slice(-2, 0, G));
  }
  return o;                                                     // [Hkv, n, G, D]: the caller puts it in row order
}

// ---- The target's attention as one loop per query, where `own_attention` is on (the default) and the CPU runs the
// draft loops (AVX-512); ATen's ops above otherwise (off for the bitwise tests against the TorchScript loop).
//
// A query's output is computed from its own visible keys only, compacted in position order, by the same
// instructions whatever else is in the call: each score a dot product over D (16 lanes, then a fixed tree), the max,
// e^(s - max) and their sum (the c-th visible key in lane c % 16), and sum_c p_c v_c accumulated in that order, over
// the sum. So a position scores the same bits alone, in a chain of any length, as a tree node (whose ancestors' keys
// sit at other slots: compacted, they are the same sequence) and as a row of a batch (Forward._attend calls the same
// loop): the invariance the ATen path gets from row padding, key blocks and gathers, here by construction. Its sums
// round differently from ATen's, so the logits differ from the TorchScript loop's in their last bits; speculative
// decoding is still compared with plain decoding run by the same loop.
static bool own_att = true;

static bool own_attention(std::optional<bool> on) {   // None: only asks
  const bool was = own_att;
  if (on.has_value()) own_att = *on;
  return was;
}

static bool tile_attention_fits(int64_t D);

// half: the model computes in bf16 (then the tiles where they fit, over an fp32 or a bf16 cache)
static bool own_attention_fits(const Tensor& q, const Tensor& kr, int64_t D, bool half) {
  const bool cache = kr.scalar_type() == at::kFloat || (kr.scalar_type() == at::kBFloat16 && half &&
                                                        tile_attention_fits(D));
  return own_att && i8_kernel_ok() && D % 16 == 0 && D <= 128 && q.is_cpu() && q.scalar_type() == at::kFloat &&
         q.stride(-1) == 1 && q.stride(-2) == D && cache && kr.stride(-1) == 1 && kr.stride(-2) == D;
}

// a row's nv scores s with bias[c] added in place where given -> their max in 16 lanes (the max in any order: a
// zero's sign changes no e^(s - max))
V16_TARGET static inline __m512 biased_max(float* s, int64_t nv, const float* bias) {
  __m512 top = _mm512_set1_ps(-INFINITY);
  for (int64_t c = 0; c < nv; c += 16) {
    const __mmask16 mk = nv - c >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nv - c)) - 1);
    __m512 v = _mm512_maskz_loadu_ps(mk, s + c);
    if (bias != nullptr) {
      v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, bias + c));
      _mm512_mask_storeu_ps(s + c, mk, v);
    }
    top = _mm512_mask_max_ps(top, mk, top, v);
  }
  const __m512 mxv = _mm512_set1_ps(_mm512_reduce_max_ps(top));
  return mxv;
}

// a query head's nv scores s (bias[c] added where given) -> e^(s - max) in place; -> 1 / their sum in 16 lanes
I8_TARGET static inline __m512 softmax_in(float* s, int64_t nv, const float* bias) {
  const __m512 z = _mm512_setzero_ps();
  const __m512 mxv = biased_max(s, nv, bias);
  int64_t c;
  __m512 sum = z;
  for (c = 0; c + 16 <= nv; c += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + c), mxv));
    _mm512_storeu_ps(s + c, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (c < nv) {
    const __mmask16 mk = (__mmask16)((1u << (nv - c)) - 1);
    const __m512 e = _mm512_maskz_mov_ps(mk, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + c), mxv)));
    _mm512_mask_storeu_ps(s + c, mk, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_set1_ps(1.f / _mm512_reduce_add_ps(sum));
}

// NG query heads q[g] [D] of one key/value head against the visible slots vis[0 .. nv) (position order) of keys and
// values kc, vc (rows D apart) -> out[g] [D] in T; bias[c] added to the c-th visible score where given; cs: scratch
// of NG (nv + 16) floats. Each head's numbers go through the same operations in the same order whatever NG is (a
// query's bits do not depend on the heads beside it); the heads side by side share each key's loads and keep
// NG times the independent sums in flight.
template <int NG, int CC, typename T>   // CC: D / 16 where known when compiled (its loops unrolled), else 0
I8_TARGET static void attend_heads(const float* const* q, const float* kc, const float* vc, int64_t D,
                                   const int64_t* vis, int64_t nv, const float* bias, float* cs, T* const* out) {
  const int64_t C = CC ? CC : D / 16, W = nv + 16;
  __m512 qv[NG][8];
  for (int g = 0; g < NG; ++g)
    for (int64_t j = 0; j < C; ++j) qv[g][j] = _mm512_loadu_ps(q[g] + 16 * j);
  auto dot = [&](int g, const float* k) I8_TARGET {   // q . k in 16 lanes
    __m512 a = _mm512_mul_ps(qv[g][0], _mm512_loadu_ps(k));
    for (int64_t j = 1; j < C; ++j) a = _mm512_fmadd_ps(qv[g][j], _mm512_loadu_ps(k + 16 * j), a);
    return a;
  };
  const __m512 z = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 4 <= nv; c += 4) {   // the lanes' sums by sum4's tree, four keys at a time (each its own tree)
    const float *k0 = kc + vis[c] * D, *k1 = kc + vis[c + 1] * D, *k2 = kc + vis[c + 2] * D, *k3 = kc + vis[c + 3] * D;
    for (int g = 0; g < NG; ++g) _mm_storeu_ps(cs + g * W + c, sum4(dot(g, k0), dot(g, k1), dot(g, k2), dot(g, k3)));
  }
  for (; c < nv; ++c)
    for (int g = 0; g < NG; ++g) {
      float t[4];
      _mm_storeu_ps(t, sum4(dot(g, kc + vis[c] * D), z, z, z));
      cs[g * W + c] = t[0];
    }
  __m512 iv[NG];
  for (int g = 0; g < NG; ++g) iv[g] = softmax_in(cs + g * W, nv, bias);
  __m512 acc[NG][8];
  for (int g = 0; g < NG; ++g)
    for (int64_t j = 0; j < C; ++j) acc[g][j] = z;
  for (c = 0; c < nv; ++c) {
    const float* v = vc + vis[c] * D;
    for (int g = 0; g < NG; ++g) {
      const __m512 p = _mm512_set1_ps(cs[g * W + c]);
      for (int64_t j = 0; j < C; ++j) acc[g][j] = _mm512_fmadd_ps(p, _mm512_loadu_ps(v + 16 * j), acc[g][j]);
    }
  }
  for (int g = 0; g < NG; ++g) {
    float o[128];
    for (int64_t j = 0; j < C; ++j) _mm512_storeu_ps(o + 16 * j, _mm512_mul_ps(acc[g][j], iv[g]));
    for (int64_t d = 0; d < D; ++d) out[g][d] = static_cast<T>(o[d]);
  }
}

// attend_heads for ng (1 .. 4) heads, its loops unrolled where D is 64 (SmolLM2's and most small models' head size)
template <typename T>
static void attend_some(int ng, const float* const* q, const float* kc, const float* vc, int64_t D, const int64_t* vis,
                        int64_t nv, const float* bias, float* cs, T* const* o) {
  auto run = [&](auto cc) {
    constexpr int CC = decltype(cc)::value;
    switch (ng) {
      case 4: attend_heads<4, CC, T>(q, kc, vc, D, vis, nv, bias, cs, o); break;
      case 3: attend_heads<3, CC, T>(q, kc, vc, D, vis, nv, bias, cs, o); break;
      case 2: attend_heads<2, CC, T>(q, kc, vc, D, vis, nv, bias, cs, o); break;
      default: attend_heads<1, CC, T>(q, kc, vc, D, vis, nv, bias, cs, o); break;
    }
  };
  if (D == 64)
    run(std::integral_constant<int, 4>());
  else
    run(std::integral_constant<int, 0>());
}

// G heads, up to 4 side by side where D <= 64 (their registers fit), else 2
template <typename T>
static void attend_group(const float* q0, const float* kc, const float* vc, int64_t D, int64_t G, const int64_t* vis,
                         int64_t nv, const float* bias, float* cs, T* out0) {
  const int most = D <= 64 ? 4 : 2;
  for (int64_t g = 0; g < G;) {
    const int ng = static_cast<int>(std::min<int64_t>(most, G - g));
    const float* q[4];
    T* o[4];
    for (int t = 0; t < ng; ++t) {
      q[t] = q0 + (g + t) * D;
      o[t] = out0 + (g + t) * D;
    }
    attend_some(ng, q, kc, vc, D, vis, nv, bias, cs, o);
    g += ng;
  }
}

// nodes i = 0 .. n - 1: query row qrow[i] of q [., Hq, D] (heads D apart), visible slots vis[i] (bias[i] where not
// all zero) of one cache row kr, vr [Hkv, C, D] -> row orow[i] of out [., Hq D], every query head
template <typename T>
static void attend_nodes(const Tensor& q, const Tensor& kr, const Tensor& vr, const std::vector<int64_t>& qrow,
                         const std::vector<std::vector<int64_t>>& vis, const std::vector<std::vector<float>>& bias,
                         T* out, int64_t ors, const std::vector<int64_t>& orow, int64_t Hq, int64_t Hkv, int64_t D) {
  const int64_t n = qrow.size(), G = Hq / Hkv, qs = q.stride(0);
  const float* qp = q.data_ptr<float>();
  int64_t work = 0, most = 0;
  for (const auto& v : vis) {
    work += v.size();
    most = std::max<int64_t>(most, v.size());
  }
  // small calls (a decode step: a few thousand key dot products a layer) run on this thread: a parallel region
  // costs more than they do
  const int64_t grain = work * Hq * D < (1 << 17) ? n * Hkv : 1;
  at::parallel_for(0, n * Hkv, grain, [&](int64_t u0, int64_t u1) {
    std::vector<float> cs(4 * (most + 16));
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t i = u / Hkv, h = u % Hkv;
      const float* kc = kr.data_ptr<float>() + h * kr.stride(0);
      const float* vc = vr.data_ptr<float>() + h * vr.stride(0);
      const float* b = bias[i].empty() ? nullptr : bias[i].data();
      attend_group(qp + qrow[i] * qs + h * G * D, kc, vc, D, G, vis[i].data(), vis[i].size(), b, cs.data(),
                   out + orow[i] * ors + h * G * D);
    }
  });
}

// ---- The target's attention on AMX's bf16 tiles (a bf16 model on a CPU with AMX)
// Queries and keys rounded to bf16, p = e^(s - max) rounded to bf16, the values (bf16 numbers) as they are; sums in
// fp32 (transformers' bf16 attention rounds the same three). Per key/value head and block of 16 query rows: scores
// as tile products of 16 rows x 16 keys (32 dims a product), p . v as 16 rows x 16 dims (32 positions a product).
// Each element of a tile product is a function of its own row and column alone, and a query's p sits at its own
// position (blocks of 32 positions from 0), so a query's bits are the same alone, in a chain, as a tree node (its
// ancestors' values gathered into position order) and beside any other rows; the blocks past a query's last
// position add p = 0 (+0) to its sums. The fp32 loop above serves fp32 models and CPUs without AMX.
static bool tile_att = true;

static bool tile_attention(std::optional<bool> on) {   // -> whether a bf16 model's attention runs on the tiles
  if (on.has_value()) tile_att = *on;
  return tile_att && amx_granted();
}

static bool tile_attention_fits(int64_t D) { return tile_att && D % 32 == 0 && D <= 128 && amx_granted(); }

// 16 rows of 16 dwords, transposed in place (r[c] becomes column c)
AMX_TARGET static inline void transpose16(__m512i* r) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {   // u[4 g + j], 128-bit lane k: column 4 k + j of rows 4 g .. 4 g + 3
    u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i s0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x44), s1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xEE);
    const __m512i s2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x44);
    const __m512i s3 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xEE);
    r[j] = _mm512_shuffle_i32x4(s0, s2, 0x88);
    r[4 + j] = _mm512_shuffle_i32x4(s0, s2, 0xDD);
    r[8 + j] = _mm512_shuffle_i32x4(s1, s3, 0x88);
    r[12 + j] = _mm512_shuffle_i32x4(s1, s3, 0xDD);
  }
}

// 32 numbers -> 32 bf16 in order (fp32 rounded to nearest even; bf16 as it is)
AMX_TARGET static inline __m512i bf16x32(const float* x) {
  return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
}
AMX_TARGET static inline __m512i bf16x32(const at::BFloat16* x) { return _mm512_loadu_si512((const void*)x); }

// a key's 32 numbers -> bf16 as a bf16 cache holds them (so a key has the same bits from either cache)
AMX_TARGET static inline __m512i key_bf16x32(const float* x) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(v16_round(_mm512_loadu_ps(x)))),
                            _mm512_cvtepi32_epi16(v16_round(_mm512_loadu_ps(x + 16))), 1);
}
AMX_TARGET static inline __m512i key_bf16x32(const at::BFloat16* x) { return bf16x32(x); }

// 16 numbers of rows a and b -> the 16 pairs (a[d], b[d]) as bf16: a value tile's line
AMX_TARGET static inline __m512i pair_lanes(__m512i ab) {   // [a 16 | b 16] bf16 -> a0 b0 a1 b1 ..
  const __m512i ix = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                      5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(ix, ab);
}
AMX_TARGET static inline __m512i bf16_pairs(const float* a, const float* b) {
  return pair_lanes((__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(b), _mm512_loadu_ps(a)));
}
AMX_TARGET static inline __m512i bf16_pairs(const at::BFloat16* a, const at::BFloat16* b) {
  return pair_lanes(_mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)a)),
                                       _mm256_loadu_si256((const __m256i*)b), 1));
}

template <typename C>
static inline void prefetch_row(const C* r, int64_t D) {
  for (int64_t l = 0; l < D * (int64_t)sizeof(C); l += 64) _mm_prefetch((const char*)r + l, _MM_HINT_T0);
}

// keys [S, D] as the bf16 rows a tile product reads, 16 a block: block b's at(b). A bf16 cache's whole blocks are
// read in place; what must be made goes into kb: an fp32 cache's keys (rounded as a bf16 cache holds them), and a
// bf16 cache's last partial block (its rows past S zeros: the cache may end at S)
struct KeyRows {
  const uint16_t* made;    // block b at made + (b - first) 16 D
  const uint16_t* cache;   // block b < first at cache + b 16 D
  int64_t first, D;
  const uint16_t* at(int64_t b) const { return b < first ? cache + b * 16 * D : made + (b - first) * 16 * D; }
};

template <typename C>
AMX_TARGET static KeyRows key_rows(const C* kc, int64_t S, int64_t D, std::vector<uint16_t>& kb) {
  const int64_t SK = (S + 15) / 16, first = std::is_same_v<C, float> ? 0 : S / 16;
  kb.resize((SK - first) * 16 * D);
  for (int64_t s = first * 16; s < SK * 16; ++s)
    for (int64_t d = 0; d < D; d += 32)
      _mm512_storeu_si512((void*)(kb.data() + (s - first * 16) * D + d),
                          s < S ? key_bf16x32(kc + s * D + d) : _mm512_setzero_si512());
  return {kb.data(), reinterpret_cast<const uint16_t*>(kc), first, D};
}

// one block of 32 positions' values (rows[c]: position c's row, nullptr: zeros) -> vt [D / 16][16 lines][32 bf16]
template <typename C>
AMX_TARGET static void value_tiles(const C* const* rows, int64_t D, uint16_t* vt) {
  alignas(64) static const C zero[128] = {};
  for (int p = 0; p < 16; ++p) {   // each row read once, in order
    const C* a = rows[2 * p] ? rows[2 * p] : zero;
    const C* b = rows[2 * p + 1] ? rows[2 * p + 1] : zero;
    for (int64_t t = 0; t < D / 16; ++t)
      _mm512_storeu_si512((void*)(vt + (t * 16 + p) * 32), bf16_pairs(a + 16 * t, b + 16 * t));
  }
}

// a row's softmax numbers for the tiles: bias added, the max, e^(s - max) (softmax_in's operations), rounded to bf16
// into p (zeros up to a multiple of 32); -> 1 / the fp32 sum of the e's taken one at a time in position order
AMX_TARGET static float softmax_bf16(float* s, int64_t nv, const float* bias, uint16_t* p) {
  const __m512 mxv = biased_max(s, nv, bias);
  auto e16 = [&](int64_t c) AMX_TARGET {   // lanes past nv: 0
    if (c >= nv) return _mm512_setzero_ps();
    const __mmask16 mk = nv - c >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nv - c)) - 1);
    return _mm512_maskz_mov_ps(mk, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + c), mxv)));
  };
  for (int64_t c = 0; c < nv; c += 32) {
    const __m512 lo = e16(c), hi = e16(c + 16);
    _mm512_storeu_ps(s + c, lo);   // s [nv rounded up to 16 + 16]
    _mm512_storeu_ps(s + c + 16, hi);
    _mm512_storeu_si512((void*)(p + c), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
  float sum = 0.f;   // in position order, one at a time: a row's sum is the same in lanes (attend_lanes)
  for (int64_t c = 0; c < nv; ++c) sum += s[c];
  return 1.f / sum;
}

// what every head of a call shares: the slots read [0, S), the longest visible run, and per node the first position
// whose slot is not that position (a tree node's first ancestor past the prefix)
struct TileCall {
  int64_t S = 0, most = 0, n = 0, G = 0, R = 0, RB = 0, work = 0;
  std::vector<int64_t> same;
};

// a thread's scratch, kept between calls; the key and shared value tiles belong to (call, head)
struct TileScratch {
  std::vector<uint16_t> qb, kt, pb, vsh, vt, pt, vsht, vtt, pl;
  std::vector<float> sc, o, cs, iv, st;
  std::vector<char> made, madet;
  int64_t call = -1, head = -1;
};

// a value block's tiles (value_tiles) transposed into p . v's other operand: 16 dims x 16 position pairs
AMX_TARGET static void transpose_tiles(const uint16_t* vt, int64_t DT, uint16_t* out) {
  for (int64_t t = 0; t < DT; ++t) {
    __m512i x[16];
    for (int j = 0; j < 16; ++j) x[j] = _mm512_loadu_si512((const void*)(vt + (t * 16 + j) * 32));
    transpose16(x);
    for (int d = 0; d < 16; ++d) _mm512_storeu_si512((void*)(out + (t * 16 + d) * 32), x[d]);
  }
}

// a shared block b's value tiles, made once per (call, head) on this thread: as value_tiles lays them (the rows'
// path) or transposed (the lanes')
template <bool LANES, typename C>
AMX_TARGET static const uint16_t* shared_values(TileScratch& w, int64_t b, const C* vc, int64_t S, int64_t D) {
  const int64_t DT = D / 16;
  uint16_t* vb = w.vsh.data() + b * DT * 512;
  if (!w.made[b]) {
    const C* rows[32];
    for (int c = 0; c < 32; ++c) {
      const int64_t s = 32 * b + c;
      rows[c] = s < S ? vc + s * D : nullptr;
      if (s + 32 < S) prefetch_row(vc + (s + 32) * D, D);
    }
    value_tiles(rows, D, vb);
    w.made[b] = 1;
  }
  if constexpr (!LANES) {
    return vb;
  } else {
    uint16_t* vt = w.vsht.data() + b * DT * 512;
    if (!w.madet[b]) {
      transpose_tiles(vb, DT, vt);
      w.madet[b] = 1;
    }
    return vt;
  }
}

// sum tile t += p (tile 4) and values (tile 5): rows x dims in the rows' path, dims x rows in the lanes'
template <bool LANES>
AMX_TARGET static inline void pv_product(int64_t t) {
  if constexpr (LANES) {
    switch (t) {   // tile numbers are literals: the intrinsics paste them into the instruction
      case 0: _tile_dpbf16ps(0, 5, 4); break;
      case 1: _tile_dpbf16ps(1, 5, 4); break;
      case 2: _tile_dpbf16ps(2, 5, 4); break;
      default: _tile_dpbf16ps(3, 5, 4); break;
    }
  } else {
    switch (t) {
      case 0: _tile_dpbf16ps(0, 4, 5); break;
      case 1: _tile_dpbf16ps(1, 4, 5); break;
      case 2: _tile_dpbf16ps(2, 4, 5); break;
      default: _tile_dpbf16ps(3, 4, 5); break;
    }
  }
}

// p . v for rows r0 .. r0 + 15 (nodes i0 .. i1 - 1) over nb blocks of 32 positions: a block where every node here that
// sees into it sees its own slots is one product for all rows, else one per node (its ancestors' values gathered,
// the other rows' p zero). p: the rows' [16, pw] bf16 (rows' path) or the lanes' pair tiles [nb][512]; the sums
// into o: [16 rows, D] (rows) or [D / 16][16 dims][16 rows] (lanes). Tiles 0-3 the sums of four dim tiles, 4 p,
// 5 values.
template <bool LANES, typename C>
AMX_TARGET static void pv_tiles(const TileCall& tc, TileScratch& w, const C* vc,
                                const std::vector<std::vector<int64_t>>& vis, int64_t r0, int64_t i0, int64_t i1,
                                int64_t nb, int64_t D, const uint16_t* p, int64_t pw, float* o) {
  const int64_t DT = D / 16, G = tc.G;
  w.vt.resize(DT * 512);
  w.vtt.resize(DT * 512);
  w.pt.resize(512);
  for (int64_t t0 = 0; t0 < DT; t0 += 4) {
    const int64_t nt = std::min<int64_t>(4, DT - t0);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t b = 0; b < nb; ++b) {
      bool shared = true;
      for (int64_t i = i0; i < i1 && shared; ++i) shared = std::min<int64_t>(vis[i].size(), 32 * b + 32) <= tc.same[i];
      if (shared) {
        const uint16_t* vb = shared_values<LANES>(w, b, vc, tc.S, D);
        if constexpr (LANES)
          _tile_loadd(4, p + b * 512, 64);
        else
          _tile_loadd(4, p + 32 * b, pw * 2);
        for (int64_t t = 0; t < nt; ++t) {
          _tile_loadd(5, vb + (t0 + t) * 512, 64);
          pv_product<LANES>(t);
        }
        continue;
      }
      for (int64_t i = i0; i < i1; ++i) {   // each node's own
        const auto& v = vis[i];
        if ((int64_t)v.size() <= 32 * b) continue;
        const C* rows[32];
        for (int c = 0; c < 32; ++c) rows[c] = 32 * b + c < (int64_t)v.size() ? vc + v[32 * b + c] * D : nullptr;
        value_tiles(rows, D, w.vt.data());
        const uint16_t* vb = w.vt.data();
        if constexpr (LANES) {
          transpose_tiles(w.vt.data(), DT, w.vtt.data());
          vb = w.vtt.data();
        }
        __mmask16 own = 0;
        for (int64_t g = 0; g < G; ++g) {
          const int64_t r = i * G + g - r0;
          if (r >= 0 && r < 16) own |= (__mmask16)(1u << r);
        }
        for (int j = 0; j < 16; ++j) {   // lanes: line j's dwords are rows; rows' path: row j's 32 positions
          const __m512i x = _mm512_loadu_si512((const void*)(LANES ? p + b * 512 + j * 32 : p + j * pw + 32 * b));
          const bool keep = (own >> j) & 1;
          _mm512_storeu_si512((void*)(w.pt.data() + j * 32),
                              LANES ? _mm512_maskz_mov_epi32(own, x) : (keep ? x : _mm512_setzero_si512()));
        }
        _tile_loadd(4, w.pt.data(), 64);
        for (int64_t t = 0; t < nt; ++t) {
          _tile_loadd(5, vb + (t0 + t) * 512, 64);
          pv_product<LANES>(t);
        }
      }
    }
    float* ot = LANES ? o + t0 * 256 : o + t0 * 16;
    const int64_t os = LANES ? 64 : D * 4;
    const int64_t step = LANES ? 256 : 16;
    _tile_stored(0, ot, os);
    if (nt > 1) _tile_stored(1, ot + step, os);
    if (nt > 2) _tile_stored(2, ot + 2 * step, os);
    if (nt > 3) _tile_stored(3, ot + 3 * step, os);
  }
}

// The rows' path below with the rows in lanes (8 or more rows): the scores as the score tiles hold them (a key's 16
// rows side by side), one position at a time for all rows: the bias, the max, e^(s - max) and each row's sum in
// position order are the rows' path's operations on the same numbers; then p . v as its transpose (16 dims x 16 rows:
// the values' tiles transposed, p's pairs of positions straight from the lanes). A tile element sums the same
// products in the same order either way, so a row gets the same bits in either path.
template <typename T, typename C>
AMX_TARGET static void attend_lanes(const TileCall& tc, TileScratch& w, const C* vc,
                                    const std::vector<std::vector<int64_t>>& vis,
                                    const std::vector<std::vector<float>>& bias, T* out, int64_t ors,
                                    const std::vector<int64_t>& orow, int64_t h, int64_t r0, int64_t nr, int64_t D,
                                    const int64_t* node, const int64_t* head) {
  const int64_t G = tc.G, DT = D / 16;
  alignas(64) int32_t nvr[16] = {}, samer[16] = {};
  const int64_t* visr[16] = {};
  const float* biasr[16] = {};
  __mmask16 hasb = 0;
  int64_t most = 0, minsame = INT64_MAX;
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t i = node[r];
    nvr[r] = vis[i].size();
    samer[r] = tc.same[i];
    visr[r] = vis[i].data();
    biasr[r] = bias[i].empty() ? nullptr : bias[i].data();
    if (biasr[r] != nullptr) hasb |= (__mmask16)(1u << r);
    most = std::max<int64_t>(most, nvr[r]);
    minsame = std::min<int64_t>(minsame, samer[r]);
  }
  const int64_t nb = (most + 31) / 32;
  const __m512i nvv = _mm512_load_si512(nvr);
  const float* sc = w.sc.data();
  w.st.resize(nb * 32 * 16);
  float* st = w.st.data();
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  __m512 mx = ninf;
  for (int64_t c = 0; c < most; ++c) {   // row r's score at position c: slot c, or its ancestor's slot
    const __mmask16 mk = _mm512_cmpgt_epi32_mask(nvv, _mm512_set1_epi32(c));
    __m512 x;
    if (c < minsame) {
      x = _mm512_loadu_ps(sc + c * 16);
    } else {
      alignas(64) int32_t ix[16];
      for (int r = 0; r < 16; ++r)
        ix[r] = static_cast<int32_t>((r < nr && c < nvr[r] && c >= samer[r] ? visr[r][c] : c) * 16 + r);
      x = _mm512_mask_i32gather_ps(ninf, mk, _mm512_load_si512(ix), sc, 4);
    }
    const __mmask16 mb = hasb & mk;
    if (mb) {
      alignas(64) float bv[16] = {};
      for (int r = 0; r < nr; ++r)
        if ((mb >> r) & 1) bv[r] = biasr[r][c];
      x = _mm512_mask_add_ps(x, mb, x, _mm512_load_ps(bv));
    }
    x = _mm512_mask_mov_ps(ninf, mk, x);
    _mm512_storeu_ps(st + c * 16, x);
    mx = _mm512_mask_max_ps(mx, mk, mx, x);
  }
  __m512 sum = _mm512_setzero_ps();
  for (int64_t c = 0; c < most; ++c) {
    const __mmask16 mk = _mm512_cmpgt_epi32_mask(nvv, _mm512_set1_epi32(c));
    const __m512 e = _mm512_maskz_mov_ps(mk, exp16(_mm512_sub_ps(_mm512_loadu_ps(st + c * 16), mx)));
    sum = _mm512_add_ps(sum, e);   // each lane: its row's e's in position order, one at a time
    _mm512_storeu_ps(st + c * 16, e);
  }
  std::fill(st + most * 16, st + nb * 32 * 16, 0.f);
  const __m512 iv = _mm512_div_ps(_mm512_set1_ps(1.f), sum);
  // p's pairs of positions as tiles [nb][16 lines][16 rows x 2]
  w.pl.resize(nb * 512);
  for (int64_t b = 0; b < nb; ++b)
    for (int j = 0; j < 16; ++j)
      _mm512_storeu_si512((void*)(w.pl.data() + b * 512 + j * 32),
                          bf16_pairs(st + (32 * b + 2 * j) * 16, st + (32 * b + 2 * j + 1) * 16));
  w.o.resize(DT * 256);
  pv_tiles<true>(tc, w, vc, vis, r0, r0 / G, (r0 + nr - 1) / G + 1, nb, D, w.pl.data(), 0, w.o.data());
  for (int64_t t = 0; t < DT; ++t) {   // times 1 / sum (a row's lane), back to rows, in the output's dtype
    __m512i x[16];
    for (int d = 0; d < 16; ++d)
      x[d] = _mm512_castps_si512(_mm512_mul_ps(_mm512_loadu_ps(w.o.data() + (t * 16 + d) * 16), iv));
    transpose16(x);
    for (int64_t r = 0; r < nr; ++r) {
      v16_put(out + orow[node[r]] * ors + (h * G + head[r]) * D + 16 * t, _mm512_castsi512_ps(x[r]));
    }
  }
}

// rows rb 16 .. rb 16 + 15 (node i's heads h G + g are rows i G + g) of key/value head h
template <typename T, typename C>
AMX_TARGET static void attend_rows_tiles(const TileCall& tc, int64_t call, TileScratch& w, const Tensor& q,
                                         const C* kc, const C* vc, int64_t h, int64_t rb,
                                         const std::vector<int64_t>& qrow, const std::vector<std::vector<int64_t>>& vis,
                                         const std::vector<std::vector<float>>& bias, T* out, int64_t ors,
                                         const std::vector<int64_t>& orow, int64_t Hq, int64_t D) {
  const int64_t S = tc.S, G = tc.G, KS = D / 32, DT = D / 16, SK = (S + 15) / 16;
  const int64_t NB = (tc.most + 31) / 32, PW = NB * 32, r0 = rb * 16, nr = std::min<int64_t>(16, tc.R - r0);
  if (w.call != call || w.head != h) {   // no value tiles made yet for this head
    w.vsh.resize(NB * DT * 512);
    w.made.assign(NB, 0);
    w.vsht.resize(NB * DT * 512);
    w.madet.assign(NB, 0);
    w.call = call;
    w.head = h;
  }
  const KeyRows keys = key_rows(kc, S, D, w.kt);
  // the query rows as tiles [D / 32][16 lines][16 rows x 2] (line p: dims 2p, 2p + 1), zeros past the last row
  int64_t node[16], head[16];   // row r: node node[r]'s query head h G + head[r]
  for (int64_t r = 0, i = r0 / G, g = r0 % G; r < 16; ++r) {
    node[r] = i;
    head[r] = g;
    if (++g == G) {
      g = 0;
      ++i;
    }
  }
  w.qb.resize(KS * 512);
  const float* qp = q.data_ptr<float>();
  const int64_t qs = q.stride(0);
  for (int64_t k = 0; k < KS; ++k) {
    __m512i x[16];
    for (int64_t r = 0; r < 16; ++r)
      x[r] = r < nr ? bf16x32(qp + qrow[node[r]] * qs + (h * G + head[r]) * D + 32 * k) : _mm512_setzero_si512();
    transpose16(x);
    for (int p = 0; p < 16; ++p) _mm512_storeu_si512((void*)(w.qb.data() + (k * 16 + p) * 32), x[p]);
  }
  TileConfig cfg{};
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  // scores [SK 16 keys, 16 rows]: the queries stay in tiles 6, 7 (D <= 64) or are loaded per product into 6;
  // three key blocks at a time, three sums in flight (tiles 0-2 the sums, 3-5 keys read in place)
  w.sc.resize(SK * 256);
  const bool resident = KS <= 2;
  if (resident) {
    _tile_loadd(6, w.qb.data(), 64);
    if (KS > 1) _tile_loadd(7, w.qb.data() + 512, 64);
  }
  for (int64_t b = 0; b < SK; b += 3) {
    const int64_t nt = std::min<int64_t>(3, SK - b);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    for (int64_t k = 0; k < KS; ++k) {
      if (!resident) _tile_loadd(6, w.qb.data() + k * 512, 64);
      // (tile numbers are literals: the intrinsics paste them into the instruction)
      _tile_loadd(3, keys.at(b) + 32 * k, D * 2);
      if (k == 1 && resident) _tile_dpbf16ps(0, 3, 7); else _tile_dpbf16ps(0, 3, 6);
      if (nt > 1) {
        _tile_loadd(4, keys.at(b + 1) + 32 * k, D * 2);
        if (k == 1 && resident) _tile_dpbf16ps(1, 4, 7); else _tile_dpbf16ps(1, 4, 6);
      }
      if (nt > 2) {
        _tile_loadd(5, keys.at(b + 2) + 32 * k, D * 2);
        if (k == 1 && resident) _tile_dpbf16ps(2, 5, 7); else _tile_dpbf16ps(2, 5, 6);
      }
    }
    _tile_stored(0, w.sc.data() + b * 256, 64);
    if (nt > 1) _tile_stored(1, w.sc.data() + (b + 1) * 256, 64);
    if (nt > 2) _tile_stored(2, w.sc.data() + (b + 2) * 256, 64);
  }
  if (nr >= 8) {
    attend_lanes(tc, w, vc, vis, bias, out, ors, orow, h, r0, nr, D, node, head);
    _tile_release();
    return;
  }
  // each row's softmax over its visible slots in position order; p as bf16 rows [16, PW]
  w.pb.assign(16 * PW, 0);
  w.cs.resize(PW + 32);
  w.iv.resize(16);
  int64_t i0 = r0 / G, i1 = (r0 + nr - 1) / G + 1, nb = 0;   // the nodes with rows here, their blocks
  const __m512i ix = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                        _mm512_set1_epi32(16));   // 16 slots' scores, 16 floats apart
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t i = node[r];
    const auto& v = vis[i];
    const int64_t nv = v.size(), same = tc.same[i];
    const float* sr = w.sc.data() + r;   // slot s's score at sr[16 s]
    float* cs = w.cs.data();
    int64_t c = 0;
    for (; c + 16 <= same; c += 16) _mm512_storeu_ps(cs + c, _mm512_i32gather_ps(ix, sr + 16 * c, 4));
    for (; c < nv; ++c) cs[c] = sr[16 * v[c]];
    w.iv[r] = softmax_bf16(cs, nv, bias[i].empty() ? nullptr : bias[i].data(), w.pb.data() + r * PW);
  }
  for (int64_t i = i0; i < i1; ++i) nb = std::max<int64_t>(nb, (vis[i].size() + 31) / 32);
  w.o.resize(16 * D);
  pv_tiles<false>(tc, w, vc, vis, r0, i0, i1, nb, D, w.pb.data(), PW, w.o.data());
  _tile_release();
  for (int64_t r = 0; r < nr; ++r) {   // times 1 / sum, in the output's dtype
    T* dst = out + orow[node[r]] * ors + (h * G + head[r]) * D;
    const __m512 s = _mm512_set1_ps(w.iv[r]);
    for (int64_t d = 0; d < D; d += 16) v16_put(dst + d, _mm512_mul_ps(_mm512_loadu_ps(w.o.data() + r * D + d), s));
  }
}

// a call's TileCall from its nodes' visible slots (the same in every layer: one_row_layers makes it once)
static TileCall tile_call(const std::vector<std::vector<int64_t>>& vis, int64_t Hq, int64_t Hkv) {
  TileCall tc;
  tc.n = vis.size();
  tc.G = Hq / Hkv;
  tc.R = tc.n * tc.G;
  tc.RB = (tc.R + 15) / 16;
  tc.same.resize(tc.n);
  for (int64_t i = 0; i < tc.n; ++i) {
    const auto& v = vis[i];
    tc.work += v.size();
    tc.most = std::max<int64_t>(tc.most, v.size());
    int64_t c = 0;
    while (c < (int64_t)v.size() && v[c] == c) ++c;
    tc.same[i] = c;
    for (const int64_t s : v) tc.S = std::max(tc.S, s + 1);
  }
  return tc;
}

template <typename T, typename C>
static void attend_tiles(const TileCall& tc, const Tensor& q, const C* kc, int64_t ks0, const C* vc, int64_t vs0,
                         const std::vector<int64_t>& qrow, const std::vector<std::vector<int64_t>>& vis,
                         const std::vector<std::vector<float>>& bias, T* out, int64_t ors,
                         const std::vector<int64_t>& orow, int64_t Hq, int64_t Hkv, int64_t D) {
  static std::atomic<int64_t> calls{0};
  const int64_t call = calls++;
  // units of (key/value head, 16 query rows) over the threads, a decode step's too (its heads split 2 + 1 on two
  // threads: plain decoding 1.9% faster than on one, side by side); only the smallest calls on this thread
  const int64_t units = Hkv * tc.RB, grain = tc.work * Hq * D < (1 << 14) ? units : 1;
  at::parallel_for(0, units, grain, [&](int64_t u0, int64_t u1) {
    thread_local TileScratch w;
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t h = u / tc.RB, rb = u % tc.RB;
      attend_rows_tiles(tc, call, w, q, kc + h * ks0, vc + h * vs0, h, rb, qrow, vis, bias, out, ors, orow, Hq, D);
    }
  });
}

static void attend_any(const Tensor& q, const Tensor& kr, const Tensor& vr, const std::vector<int64_t>& qrow,
                       const std::vector<std::vector<int64_t>>& vis, const std::vector<std::vector<float>>& bias,
                       const Tensor& out, const std::vector<int64_t>& orow, int64_t Hq, int64_t Hkv, int64_t D,
                       bool half, const TileCall* plan = nullptr) {
  TORCH_CHECK(out.stride(-1) == 1, "attention output rows");
  if (half && tile_attention_fits(D)) {
    const TileCall tc = plan != nullptr ? TileCall() : tile_call(vis, Hq, Hkv);
    const TileCall& t = plan != nullptr ? *plan : tc;
    auto run = [&](auto* o) {
      if (kr.scalar_type() == at::kBFloat16)
        attend_tiles(t, q, kr.data_ptr<at::BFloat16>(), kr.stride(0), vr.data_ptr<at::BFloat16>(), vr.stride(0), qrow,
                     vis, bias, o, out.stride(0), orow, Hq, Hkv, D);
      else
        attend_tiles(t, q, kr.data_ptr<float>(), kr.stride(0), vr.data_ptr<float>(), vr.stride(0), qrow, vis, bias,
                     o, out.stride(0), orow, Hq, Hkv, D);
    };
    if (out.scalar_type() == at::kBFloat16)
      run(out.data_ptr<at::BFloat16>());
    else
      run(out.data_ptr<float>());
    return;
  }
  if (out.scalar_type() == at::kBFloat16)
    attend_nodes(q, kr, vr, qrow, vis, bias, out.data_ptr<at::BFloat16>(), out.stride(0), orow, Hq, Hkv, D);
  else
    attend_nodes(q, kr, vr, qrow, vis, bias, out.data_ptr<float>(), out.stride(0), orow, Hq, Hkv, D);
}

// the slots of bias row r [w] that are not -inf (slot at + t, or at + gather[t]) appended to vis, their biases to bs;
// -> whether any of those biases is not 0 (else the caller drops bs: a mask's zeros need no adding)
static bool visible_tail(const float* r, int64_t w, int64_t at, const int64_t* gather, std::vector<int64_t>& vis,
                         std::vector<float>& bs) {
  bool any = false;
  for (int64_t t = 0; t < w; ++t)
    if (r[t] != -INFINITY) {
      vis.push_back(at + (gather != nullptr ? gather[t] : t));
      bs.push_back(r[t]);
      any = any || r[t] != 0.f;
    }
  return any;
}

// a chain's node j sees the slots where its bias row (row j of bias [G n', S]: its query heads' rows are alike) is
// not -inf, in slot order (= position order)
static void chain_visible(const Tensor& bias, int64_t n, int64_t S, std::vector<std::vector<int64_t>>& vis,
                          std::vector<std::vector<float>>& bs) {
  const Tensor b = bias.reshape({-1, bias.size(-1)}).to(at::kFloat).contiguous();
  const float* bp = b.data_ptr<float>();
  const int64_t w = b.size(1);
  vis.assign(n, {});
  bs.assign(n, {});
  for (int64_t j = 0; j < n; ++j)
    if (!visible_tail(bp + j * w, std::min(S, w), 0, nullptr, vis[j], bs[j])) bs[j].clear();
}

// a tree's node j (rows j G .. of gather, bias [G n', w]) sees the prefix [0, base), then its tail positions t where
// bias is not -inf, at slots base + gather[t], in position order
static void tree_visible(const Tensor& gather, const Tensor& bias, int64_t n, int64_t G, int64_t base,
                         std::vector<std::vector<int64_t>>& vis, std::vector<std::vector<float>>& bs) {
  const Tensor gt = gather.reshape({-1, gather.size(-1)}).to(at::kLong).contiguous();
  const Tensor b = bias.reshape({-1, bias.size(-1)}).to(at::kFloat).contiguous();
  const int64_t w = gt.size(1);
  vis.assign(n, {});
  bs.assign(n, {});
  for (int64_t j = 0; j < n; ++j) {
    const int64_t* gr = gt.data_ptr<int64_t>() + j * G * w;
    const float* br = b.data_ptr<float>() + j * G * w;
    for (int64_t t = 0; t < base; ++t) vis[j].push_back(t);
    bs[j].assign(base, 0.f);
    if (!visible_tail(br, w, base, gr, vis[j], bs[j])) bs[j].clear();
  }
}

// Forward._attend's entries (the batched path's): -> false where the loop does not fit (ATen's ops then)
static bool attend_chain(const Tensor& q, const Tensor& kr, const Tensor& vr, const Tensor& bias, int64_t S,
                         const std::vector<int64_t>& qrow, const Tensor& out, const std::vector<int64_t>& orow,
                         bool half) {
  const int64_t Hq = q.size(1), D = q.size(2), Hkv = kr.size(0);
  if (!own_attention_fits(q, kr, D, half)) return false;
  std::vector<std::vector<int64_t>> vis;
  std::vector<std::vector<float>> bs;
  chain_visible(bias, qrow.size(), S, vis, bs);
  attend_any(q, kr, vr, qrow, vis, bs, out, orow, Hq, Hkv, D, half);
  return true;
}

static bool attend_tree(const Tensor& q, const Tensor& kr, const Tensor& vr, const Tensor& gather, const Tensor& bias,
                        int64_t base, const std::vector<int64_t>& qrow, const Tensor& out,
                        const std::vector<int64_t>& orow, bool half) {
  const int64_t Hq = q.size(1), D = q.size(2), Hkv = kr.size(0);
  if (!own_attention_fits(q, kr, D, half)) return false;
  std::vector<std::vector<int64_t>> vis;
  std::vector<std::vector<float>> bs;
  tree_visible(gather, bias, qrow.size(), Hq / Hkv, base, vis, bs);
  attend_any(q, kr, vr, qrow, vis, bs, out, orow, Hq, Hkv, D, half);
  return true;
}

Tensor one_row_layers(Tensor x, const Tensor& cos, const Tensor& sin, const Tensor& scale, const Tensors& biases,
                   const Ints& starts, const Ints& counts, const Ints& key_lens, const Tensors& ln1,
                   const Tensors& qkv_w, const OptTensors& qkv_b, const Tensors& o_w, const OptTensors& o_b,
                   const Tensors& ln2, const Tensors& gu_w, const Tensors& down_w,
                   const std::vector<OptTensors>& sc, const Tensors& ks, const Tensors& vs, int64_t row, int64_t s0,
                   int64_t N, int64_t Hq, int64_t Hkv, int64_t D, double eps, int64_t max_rows,
                   const Tensors& t_idx, const Ints& t_S, const Ints& t_Sk, const Ints& t_base,
                   const Tensors& t_gather, const Tensors& t_bias, const OptTensors& t_inv,
                   const OptTensors& t_slow, const OptTensors& t_slow_gather, const std::vector<bool>& t_rescore,
                   const Ints& t_first, int64_t rows) {
  c10::InferenceMode guard;
  const int64_t Np = x.size(0);
  const bool many = starts.size() + t_idx.size() > 1 || N != Np;
  const size_t L = ln1.size();
  Tensor h = L ? rms_norm(x, ln1[0], eps) : x;                 // layer l's normed input (a residual add's, below)
  // the attention loop's rows and visible slots per chain and tree: the same in every layer, made at the first
  struct Seen {
    std::vector<int64_t> rows;
    std::vector<std::vector<int64_t>> vis;
    std::vector<std::vector<float>> bs;
    TileCall tc;
  };
  std::vector<Seen> seen;
  for (size_t l = 0; l < L; ++l) {
    auto qkv = dense(h, qkv_w[l], sc[l][0], qkv_b[l], max_rows, rows);
    auto kr = ks[l].select(0, row), vr = vs[l].select(0, row);
    auto qk = rope_kv(qkv, cos, sin, scale, kr, vr, s0, N, Hq, Hkv, D);                  // [Np, Hq + Hkv, D]
    // the attention output in x's dtype, [Np, Hq D]: each element converted once, as .to(dtype) converts it
    auto att = many ? at::zeros({Np, Hq * D}, x.options()) : at::empty({Np, Hq * D}, x.options());
    TORCH_CHECK(qk.is_contiguous() && qk.scalar_type() == at::kFloat &&
                (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat), "one_row_layers: bf16 or fp32");
    const bool half = x.scalar_type() == at::kBFloat16, own = own_attention_fits(qk, kr, D, half);
    if (own && seen.empty()) {
      seen.resize(starts.size() + t_idx.size());
      for (size_t j = 0; j < starts.size(); ++j) {
        Seen& e = seen[j];
        for (int64_t i = 0; i < counts[j]; ++i) e.rows.push_back(starts[j] + i);
        chain_visible(biases[j], counts[j], key_lens[j], e.vis, e.bs);
        e.tc = tile_call(e.vis, Hq, Hkv);
      }
      for (size_t j = 0; j < t_idx.size(); ++j) {   // t_first[j] >= 0: the nodes are queries a .. a + n - 1
        Seen& e = seen[starts.size() + j];
        const int64_t a = t_first[j], n = t_idx[j].size(0);
        const Tensor idx = t_idx[j].to(at::kLong).contiguous();
        for (int64_t i = 0; i < n; ++i) e.rows.push_back(a >= 0 ? a + i : idx.data_ptr<int64_t>()[i]);
        tree_visible(t_gather[j], t_bias[j], n, Hq / Hkv, t_base[j], e.vis, e.bs);
        e.tc = tile_call(e.vis, Hq, Hkv);
      }
    }
    for (size_t j = 0; j < starts.size(); ++j) {
      const int64_t a = starts[j], n = counts[j], S = key_lens[j];
      if (own) {
        const Seen& e = seen[j];
        attend_any(qk, kr, vr, e.rows, e.vis, e.bs, att, e.rows, Hq, Hkv, D, half, &e.tc);
        continue;
      }
      auto k = kr.slice(1, 0, S).to(at::kFloat).unsqueeze(0), v = vr.slice(1, 0, S).to(at::kFloat).unsqueeze(0);
      auto q = head_rows(qk.slice(0, a, a + n).slice(1, 0, Hq), Hkv, rows, false).unsqueeze(0);   // [1, Hkv, R', D]
      auto o = attention_rows(q, k, v, biases[j]);                                              // [1, Hkv, R', D]
      TORCH_CHECK(o.stride(3) == 1, "one_row_layers: attention output rows");
      const int64_t os[3] = {o.stride(1), o.stride(2), n * o.stride(2)};
      scatter_heads(o.data_ptr<float>(), os, att, nullptr, a, n, Hq, Hkv, D);
    }
    for (size_t j = 0; j < t_idx.size(); ++j) {
      const int64_t a = t_first[j], n = t_idx[j].size(0);   // a >= 0: the nodes are queries a .. a + n - 1
      if (own) {
        const Seen& e = seen[starts.size() + j];
        attend_any(qk, kr, vr, e.rows, e.vis, e.bs, att, e.rows, Hq, Hkv, D, half, &e.tc);
        continue;
      }
      auto q = a >= 0 ? qk.slice(0, a, a + n).slice(1, 0, Hq) : qk.slice(1, 0, Hq).index({t_idx[j]});
      auto o = tree_attention(q, kr, vr, Hkv, t_S[j], t_Sk[j], t_base[j], t_gather[j], t_bias[j], t_inv[j],
                              t_slow[j], t_slow_gather[j], t_rescore[j], rows);                 // [Hkv, n, G, D]
      TORCH_CHECK(o.stride(3) == 1, "one_row_layers: tree output rows");
      const int64_t os[3] = {o.stride(0), o.stride(1), o.stride(2)};
      const auto idx = a >= 0 ? Tensor() : t_idx[j].to(at::kLong).contiguous();
      scatter_heads(o.data_ptr<float>(), os, att, a >= 0 ? nullptr : idx.data_ptr<int64_t>(), a, n, Hq, Hkv, D);
    }
    auto x2 = add_rms(x, dense(att, o_w[l], sc[l][1], o_b[l], max_rows, rows), ln2[l], eps);
    auto gu = dense(x2.second, gu_w[l], sc[l][2], std::nullopt, max_rows, rows);           // [Np, 2 I]
    auto y = dense(swiglu(gu), down_w[l], sc[l][3], std::nullopt, max_rows, rows);
    if (l + 1 < L) {
      auto x3 = add_rms(x2.first, y, ln1[l + 1], eps);
      x = x3.first;
      h = x3.second;
    } else {
      x = x2.first + y;
    }
  }
  return x;
}

// ---- drafters/eagle_packed._rows: the EAGLE head's layer for one tree level, op for op (bitwise: test_native)

static Tensor product_of(const Tensor& x, const Tensor& w, const OptT& s, const OptT& b, bool packed) {
  auto y = weight_product(x, w, s, packed);
  return b.has_value() ? y + *b : y;
}

// torch.rms_norm of fp32 x [n, H] (x * rsqrt(mean(x^2) + eps) * w, as ATen composes it on the CPU), in dtype `out`:
// loops around ATen's sum (as rms_loops) where x and w are contiguous CPU fp32, else torch.rms_norm itself
template <typename O>
static void rms_f32_loop(const float* x, const float* w, const float* m, float eps, O* o, int64_t n, int64_t H) {
  const float h = static_cast<float>(H);
  for (int64_t i = 0; i < n; ++i) {
    const float mean = m[i] / h;
    const float r = 1.0f / std::sqrt(mean + eps);
    for (int64_t j = 0; j < H; ++j) {
      const float t = x[i * H + j] * r;
      o[i * H + j] = static_cast<O>(t * w[j]);
    }
  }
}

static Tensor rms_f32(const Tensor& x, const Tensor& w, double eps, at::ScalarType out) {
  const int64_t H = x.size(-1);
  if (!(x.device().is_cpu() && x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat &&
        w.is_contiguous() && w.scalar_type() == at::kFloat && w.numel() == H &&
        (out == at::kFloat || out == at::kBFloat16)))
    return at::rms_norm(x, {H}, w, eps).to(out);
  const int64_t n = x.size(0);
  const float* xp = x.data_ptr<float>();
  auto m = row_sq_sums(xp, n, H, x.options());          // ATen's mean: this sum, divided by H (in the loop)
  auto o = at::empty_like(x, x.options().dtype(out));
  if (out == at::kFloat)
    rms_f32_loop(xp, w.data_ptr<float>(), m.data_ptr<float>(), static_cast<float>(eps), o.data_ptr<float>(), n, H);
  else
    rms_f32_loop(xp, w.data_ptr<float>(), m.data_ptr<float>(), static_cast<float>(eps), o.data_ptr<at::BFloat16>(),
                 n, H);
  return o;
}

// qk = q|k * cos + roll(q|k, D / 2) * sin in fp32 (cos, sin pre-scaled per head: [Hq + Hkv, D] for every row or
// [m, Hq + Hkv, D]), and the m rows' keys and values into the scratch k, v [Hkv, N, D] from row R0: rope_rows
static Tensor head_rope(const Tensor& qkv, const Tensor& cos, const Tensor& sin, const Tensor& k, const Tensor& v,
                        int64_t R0, int64_t Hq, int64_t Hkv, int64_t D) {
  const int64_t m = qkv.size(0), R = R0 + m, H = Hq + Hkv;
  const bool loop = qkv.device().is_cpu() && qkv.dim() == 2 && qkv.stride(1) == 1 && qkv.size(1) == (H + Hkv) * D &&
      (qkv.scalar_type() == at::kBFloat16 || qkv.scalar_type() == at::kFloat) && D % 2 == 0 &&
      cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
      sin.is_contiguous() && cos.sizes() == sin.sizes() &&
      (cos.numel() == H * D || (cos.dim() == 3 && cos.numel() == m * H * D)) &&
      k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat && k.is_contiguous() && v.is_contiguous() &&
      k.size(0) == Hkv && v.size(0) == Hkv && k.size(2) == D && v.size(2) == D && k.size(1) >= R && v.size(1) >= R;
  if (!loop) {
    auto qk = qkv.slice(1, 0, H * D).view({m, H, D});
    qk = qk * cos + qk.roll(D / 2, -1) * sin;
    k.slice(1, R0, R).copy_(qk.slice(1, Hq).transpose(0, 1));
    v.slice(1, R0, R).copy_(qkv.slice(1, H * D).view({m, Hkv, D}).transpose(0, 1));
    return qk;
  }
  auto out = at::empty({m, H, D}, qkv.options().dtype(at::kFloat));
  rope_qkv(qkv, cos, sin, cos.dim() == 3 ? H * D : 0, D, nullptr, out, k.data_ptr<float>() + R0 * D,
           v.data_ptr<float>() + R0 * D, k.stride(0), D, v.stride(0), D, m, Hq, Hkv, D);
  return out;
}

// EAGLE's level attention (the target's loop, attend_nodes, over the head's scratch) and top-k as loops, where the
// draft's loops are on and the CPU has AVX-512: a level has a few query rows against a few hundred keys, where ATen's
// two batched products, softmax and views cost more to call than to compute, and a top-k of 2 over a 4096-token row
// took 30 us. They round differently from ATen's ops, which only moves the draft: verification is exact whatever it
// proposes.

// the level's attention: rows n0.. of qk [m, Hq + Hkv, D] (query heads first) against the scratch's first R rows
// (k, v [Hkv, N, D]) with bias [m, c] -> [n, Hq D] in dtype dt (heads in q's order), or an undefined tensor where
// the loop does not apply (ATen's ops then)
static Tensor draft_attention(const Tensor& qk, const Tensor& k, const Tensor& v, const Tensor& bias, int64_t n0,
                              int64_t R, int64_t Hq, int64_t Hkv, int64_t D, at::ScalarType dt) {
  if (!(own_loops && i8_kernel_ok() && D % 16 == 0 && D <= 128 && qk.is_contiguous() && k.stride(2) == 1 &&
        k.stride(1) == D && v.stride(2) == 1 && v.stride(1) == D && bias.is_contiguous() &&
        bias.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat &&
        (dt == at::kBFloat16 || dt == at::kFloat)))
    return Tensor();
  const int64_t m = qk.size(0), n = m - n0, c = bias.size(1);
  auto out = at::empty({n, Hq * D}, qk.options().dtype(dt));
  std::vector<int64_t> qrow(n), orow(n);
  std::vector<std::vector<int64_t>> vis(n);
  std::vector<std::vector<float>> bs(n);   // empty where every visible key's bias is 0 (a mask's)
  for (int64_t i = 0; i < n; ++i) {   // row i sees every row before the last c, and those of the c its bias lets
    qrow[i] = n0 + i;
    orow[i] = i;
    for (int64_t t = 0; t < R - c; ++t) vis[i].push_back(t);
    bs[i].assign(R - c, 0.f);
    if (!visible_tail(bias.data_ptr<float>() + (n0 + i) * c, c, R - c, nullptr, vis[i], bs[i])) bs[i].clear();
  }
  // a key head's G query heads share its key loads; the rows and heads split over the threads
  if (dt == at::kBFloat16)
    attend_nodes(qk, k, v, qrow, vis, bs, out.data_ptr<at::BFloat16>(), Hq * D, orow, Hq, Hkv, D);
  else
    attend_nodes(qk, k, v, qrow, vis, bs, out.data_ptr<float>(), Hq * D, orow, Hq, Hkv, D);
  return out;
}

// the k_top largest log-softmax values of each row of y [n, V] (bf16 or fp32) and their indices, largest first (ties:
// the lower index first): one pass for the row's max and the k_top best, one for the sum of exps
template <typename T>
I8_TARGET static void top_logprobs(const T* y, int64_t V, int64_t k_top, float* lp, int64_t* ix) {
  std::vector<float> val(k_top, -INFINITY);
  std::vector<int64_t> at_(k_top, -1);
  std::vector<float> row(V + 16);
  for (int64_t j = 0; j < V; ++j) row[j] = static_cast<float>(y[j]);
  for (int64_t j = 0; j < V; ++j) {
    const float x = row[j];
    if (!(x > val[k_top - 1]) && at_[k_top - 1] >= 0) continue;
    int64_t p = k_top - 1;
    while (p > 0 && (x > val[p - 1] || at_[p - 1] < 0)) {
      val[p] = val[p - 1];
      at_[p] = at_[p - 1];
      --p;
    }
    val[p] = x;
    at_[p] = j;
  }
  const float mx = val[0];
  const __m512 mxv = _mm512_set1_ps(mx);
  __m512 sum = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= V; j += 16) sum = _mm512_add_ps(sum, exp16(_mm512_sub_ps(_mm512_loadu_ps(row.data() + j), mxv)));
  float tail = 0.f;
  for (; j < V; ++j) tail += std::exp(row[j] - mx);
  const float lse = std::log(_mm512_reduce_add_ps(sum) + tail);
  for (int64_t t = 0; t < k_top; ++t) {
    lp[t] = val[t] - mx - lse;
    ix[t] = at_[t];
  }
}

static std::pair<Tensor, Tensor> draft_top(const Tensor& y, int64_t k_top) {
  if (!(own_loops && i8_kernel_ok() && y.is_contiguous() && y.dim() == 2 && k_top <= y.size(1) &&
        (y.scalar_type() == at::kBFloat16 || y.scalar_type() == at::kFloat))) {
    auto top = at::topk(at::log_softmax(y, -1, at::kFloat), k_top, -1);
    return {std::get<0>(top), std::get<1>(top)};
  }
  const int64_t n = y.size(0), V = y.size(1);
  auto lp = at::empty({n, k_top}, y.options().dtype(at::kFloat));
  auto ix = at::empty({n, k_top}, y.options().dtype(at::kLong));
  at::parallel_for(0, n, 1, [&](int64_t i0, int64_t i1) {   // a level's few rows over the threads
    for (int64_t i = i0; i < i1; ++i) {
      if (y.scalar_type() == at::kBFloat16)
        top_logprobs(y.data_ptr<at::BFloat16>() + i * V, V, k_top, lp.data_ptr<float>() + i * k_top,
                     ix.data_ptr<int64_t>() + i * k_top);
      else
        top_logprobs(y.data_ptr<float>() + i * V, V, k_top, lp.data_ptr<float>() + i * k_top,
                     ix.data_ptr<int64_t>() + i * k_top);
    }
  });
  return {lp, ix};
}

// o = x + y for fp32 x [n, H] (row i at x + i * xs; xs = 0: one row for all, fc's bias) and bf16 y [n, H]: ATen's
// mixed add (y widened to fp32, one fp32 add: the same bits) as a loop where it fits, else that add. EAGLE's
// residual adds, in place where asked.
V16_TARGET static void add_rows(const float* x, int64_t xs, const at::BFloat16* y, float* o, int64_t n, int64_t H) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < H; j += 16)
      _mm512_storeu_ps(o + i * H + j, _mm512_add_ps(_mm512_loadu_ps(x + i * xs + j), v16_load(y + i * H + j)));
}

static Tensor residual(const Tensor& x, const Tensor& y, bool in_place) {
  const int64_t H = y.size(-1);
  const bool row = x.dim() == 1 && !in_place;
  if (!(v16_ok() && x.device().is_cpu() && x.scalar_type() == at::kFloat && y.scalar_type() == at::kBFloat16 &&
        y.dim() == 2 && y.is_contiguous() && x.stride(-1) == 1 && H % 16 == 0 && x.size(-1) == H &&
        (row || (x.dim() == 2 && x.size(0) == y.size(0) && x.stride(0) == H))))
    return in_place ? x.add_(y) : x + y;
  auto o = in_place ? x : at::empty(y.sizes(), x.options());
  add_rows(x.data_ptr<float>(), row ? 0 : H, y.data_ptr<at::BFloat16>(), o.data_ptr<float>(), y.size(0), H);
  return o;
}

// eagle_rows' conversions and gathers as loops where they fit (the same values as ATen's ops, without their
// dispatch and iterators, which cost more than a draft's few rows): x [m, H] fp32 -> bf16 (c10's rounding)
static bool bf16_loop_fits(const Tensor& x) {
  return i8_kernel_ok() && x.device().is_cpu() && x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat &&
         x.size(1) % 16 == 0;
}

V16_TARGET static void to_bf16_rows(const float* x, int64_t n, at::BFloat16* o) {
  for (int64_t i = 0; i < n; i += 16) v16_store(o + i, _mm512_loadu_ps(x + i));
}

static Tensor to_dtype(const Tensor& x, at::ScalarType dt) {
  if (dt != at::kBFloat16 || !bf16_loop_fits(x)) return x.to(dt);
  auto o = at::empty(x.sizes(), x.options().dtype(dt));
  to_bf16_rows(x.data_ptr<float>(), x.numel(), o.data_ptr<at::BFloat16>());
  return o;
}

// [f.to(dt), e] along the last dim (fc's input)
static Tensor fc_input(const Tensor& f, const Tensor& e, at::ScalarType dt) {
  if (dt != at::kBFloat16 || !bf16_loop_fits(f) || !e.is_contiguous() || e.scalar_type() != dt ||
      !e.device().is_cpu() || e.sizes() != f.sizes())
    return at::cat({f.to(dt), e}, -1);
  const int64_t m = f.size(0), H = f.size(1);
  auto o = at::empty({m, 2 * H}, e.options());
  at::BFloat16* op = o.data_ptr<at::BFloat16>();
  for (int64_t i = 0; i < m; ++i) {
    to_bf16_rows(f.data_ptr<float>() + i * H, H, op + i * 2 * H);
    std::memcpy(op + i * 2 * H + H, e.data_ptr<at::BFloat16>() + i * H, H * sizeof(at::BFloat16));
  }
  return o;
}

// ids[ix]: a draft row's target id
static Tensor target_ids(const Tensor& ids, const Tensor& ix) {
  if (!(ids.device().is_cpu() && ix.device().is_cpu() && ids.scalar_type() == at::kLong && ids.dim() == 1 &&
        ids.is_contiguous() && ix.scalar_type() == at::kLong && ix.is_contiguous()))
    return ids.index({ix});
  auto o = at::empty_like(ix);
  const int64_t* ip = ix.data_ptr<int64_t>();
  const int64_t* dp = ids.data_ptr<int64_t>();
  int64_t* out = o.data_ptr<int64_t>();
  const int64_t V = ids.size(0);
  for (int64_t i = 0; i < ix.numel(); ++i) {
    TORCH_CHECK(ip[i] >= 0 && ip[i] < V, "target_ids: a draft row out of range");
    out[i] = dp[ip[i]];
  }
  return o;
}

std::tuple<Tensor, Tensor, Tensor> eagle_rows(
    const Tensor& f, const Tensor& e, const Tensor& cos, const Tensor& sin, const Tensor& bias, const Tensor& k,
    const Tensor& v, int64_t R0, const Tensors& w, const OptTensors& s, const OptTensors& b,
    const std::vector<bool>& packed, const Tensor& ln1, const Tensor& ln2, const Tensor& norm, const Tensor& fc_b,
    int64_t Hq, int64_t Hkv, int64_t D, double eps, int64_t last, int64_t k_top, const OptT& ids) {
  c10::InferenceMode guard;
  const int64_t m = f.size(0), G = Hq / Hkv, R = R0 + m;
  const auto dt = e.scalar_type();
  auto x = residual(fc_b, product_of(fc_input(f, e, dt), w[0], s[0], b[0], packed[0]), false);   // [m, H] fp32
  auto qkv = product_of(rms_f32(x, ln1, eps, dt), w[1], s[1], b[1], packed[1]);          // [m, (Hq + 2 Hkv) D]
  auto qk = head_rope(qkv, cos, sin, k, v, R0, Hq, Hkv, D);                              // fp32, roped, q scaled
  const int64_t n0 = last > 0 ? m - last : 0, n = m - n0;
  auto a = draft_attention(qk, k, v, bias, n0, R, Hq, Hkv, D, dt);                       // [n, Hq D] in dt
  if (!a.defined()) {
    auto q = qk.slice(0, n0).slice(1, 0, Hq).view({n, Hkv, G, D}).transpose(0, 1).reshape({Hkv, n * G, D});
    auto sc = at::matmul(q, k.slice(1, 0, R).transpose(1, 2));                            // [Hkv, n G, R]
    sc.view({Hkv, n, G, R}).slice(3, R - bias.size(1)).add_(bias.slice(0, n0).unsqueeze(1));
    a = at::matmul(at::softmax(sc, -1), v.slice(1, 0, R));                                // [Hkv, n G, D]
    a = a.view({Hkv, n, G * D}).transpose(0, 1).reshape({n, Hq * D}).to(dt);
  }
  x = residual(x.slice(0, n0), product_of(a, w[2], s[2], b[2], packed[2]), false);         // [n, H]
  auto gu = product_of(rms_f32(x, ln2, eps, dt), w[3], s[3], b[3], packed[3]);          // [n, 2 I]
  residual(x, product_of(swiglu(gu), w[4], s[4], b[4], packed[4]), true);
  auto h = rms_f32(x, norm, eps, at::kFloat);                                            // [n, H] fp32
  auto y = product_of(to_dtype(h, dt), w[5], s[5], b[5], packed[5]);                     // [n, v] logits
  if (k_top == 0) return {h, y, y};
  auto [lp, ix] = draft_top(y, k_top);
  return {h, lp, ids.has_value() ? target_ids(*ids, ix) : ix};
}

// Both release the GIL while they run, as a TorchScript call does: a forward is ~20 ms of work that touches no
// Python object, and the app's other sessions and its server keep going meanwhile.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("one_row_layers", &one_row_layers, "fast/loop._one_row_layers, op for op", py::call_guard<py::gil_scoped_release>());
  m.def("eagle_rows", &eagle_rows, "drafters/eagle_packed._rows, op for op", py::call_guard<py::gil_scoped_release>());
  m.def("int8_product", &int8_product, "x @ (w * s)^T for a draft's int8 weights (the kernel where it fits, else ATen's)",
        py::call_guard<py::gil_scoped_release>());
  m.def("draft_top", &draft_top, "(the k largest log-softmax values of each row of y [n, V], their indices)");
  m.def("own_attention", &own_attention, "the target's attention loop on, or off (ATen's ops), or as it is; -> was it on",
        py::arg("on") = py::none());
  m.def("attend_chain", &attend_chain, "Forward._attend's chain rows through the attention loop (false: not here)");
  m.def("tile_attention", &tile_attention, "whether a bf16 model's attention runs on AMX's tiles (on: set that first)",
        py::arg("on") = py::none());
  m.def("attend_tree", &attend_tree, "Forward._attend's tree nodes through the attention loop (false: not here)");
  m.def("draft_loops_fit", &i8_kernel_ok, "whether this CPU runs the draft's loops (AVX-512 F, BW and VNNI)");
  m.def("dense", &dense, "forward._dense: a layer's product, the 4-bit kernel where its weight has one",
        py::call_guard<py::gil_scoped_release>());
  m.def("q4_lines", &q4_lines, "a 4-bit tile array's lines as the kernel unpacks them, [G, B, 16, 32] bf16");
  m.def("q4_products", &q4_products, "the target's 4-bit products on, or off (its packed bf16 ones); -> were they on",
        py::arg("on") = py::none());
  m.def("int8_amx", &int8_amx, "whether a draft's int8 products of 2+ rows run on AMX's tiles (tiles: set that first)",
        py::arg("tiles") = py::none());
  m.def("q4_amx", &q4_amx, "whether the 4-bit products run on AMX's tiles (else AVX-512 BF16 dot products)",
        py::arg("tiles") = py::none());
  m.def("draft_loops", &draft_loops, "the draft's own loops on, or off (ATen's ops, op for op); -> were they on");
}
