#include "cpu/gemm_f32.h"

#include <cstring>

namespace nibble::cpu {

namespace {

// GCC/Clang vector extension: eight f32 lanes, one AVX register in the x86-64-v3 clone, two SSE
// registers in the baseline one. Lane arithmetic is the scalar arithmetic of dot_f32.
typedef float V8 __attribute__((vector_size(32)));

// (V8 is passed by reference: a vector by value would change the ABI between the two clones.)
inline void load8(V8& v, const float* p) { std::memcpy(&v, p, sizeof v); }

inline void load8(V8& v, const uint16_t* p) {  // bf16 → f32 is a 16-bit shift of the bits
  float f[8];
  for (int j = 0; j < 8; ++j) {
    const uint32_t u = static_cast<uint32_t>(p[j]) << 16;
    std::memcpy(&f[j], &u, 4);
  }
  load8(v, f);
}

inline float widen(float v) { return v; }
inline float widen(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

// An R×C tile of outputs; each output has its own eight-lane accumulator.
template <int R, int C, class W>
[[gnu::always_inline]] inline void tile(const float* x, int64_t ldx, const W* w, int64_t ldw,
                                        int64_t k, float* y, int64_t ldy) {
  V8 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = V8{0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    V8 wv[C];
    for (int c = 0; c < C; ++c) load8(wv[c], w + c * ldw + i);
    for (int r = 0; r < R; ++r) {
      V8 xv;
      load8(xv, x + r * ldx + i);
      for (int c = 0; c < C; ++c) acc[r][c] += xv * wv[c];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float a[8];
      std::memcpy(a, &acc[r][c], sizeof a);
      for (int64_t t = i; t < k; ++t) a[t % 8] += x[r * ldx + t] * widen(w[c * ldw + t]);
      y[r * ldy + c] = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
    }
}

template <int R, class W>
[[gnu::always_inline]] inline void row_tiles(const float* x, int64_t ldx, const W* w, int64_t ldw,
                                             int64_t n, int64_t k, float* y, int64_t ldy) {
  int64_t c = 0;
  for (; c + 2 <= n; c += 2) tile<R, 2>(x, ldx, w + c * ldw, ldw, k, y + c, ldy);
  if (c < n) tile<R, 1>(x, ldx, w + c * ldw, ldw, k, y + c, ldy);
}

template <class W>
[[gnu::always_inline]] inline void gemm(const float* x, int64_t ldx, int64_t m, const W* w,
                                        int64_t ldw, int64_t n, int64_t k, float* y, int64_t ldy) {
  int64_t r = 0;
  for (; r + 4 <= m; r += 4) row_tiles<4>(x + r * ldx, ldx, w, ldw, n, k, y + r * ldy, ldy);
  switch (m - r) {
    case 3:
      row_tiles<3>(x + r * ldx, ldx, w, ldw, n, k, y + r * ldy, ldy);
      break;
    case 2:
      row_tiles<2>(x + r * ldx, ldx, w, ldw, n, k, y + r * ldy, ldy);
      break;
    case 1:
      row_tiles<1>(x + r * ldx, ldx, w, ldw, n, k, y + r * ldy, ldy);
      break;
    default:
      break;
  }
}

}  // namespace

// The build is portable (no -march): each entry point is compiled twice and picked at load
// time by the CPU's features (GCC function multi-versioning through an ifunc).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define NIBBLE_CPU_MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define NIBBLE_CPU_MULTIVERSION
#endif

NIBBLE_CPU_MULTIVERSION
float dot_f32(const float* a, const float* b, int64_t n) {
  float y = 0.0f;
  tile<1, 1>(a, 0, b, 0, n, &y, 0);
  return y;
}

NIBBLE_CPU_MULTIVERSION
void gemm_f32_nt(const float* x, int64_t ldx, int64_t m, const float* w, int64_t ldw, int64_t n,
                 int64_t k, float* y, int64_t ldy) {
  gemm(x, ldx, m, w, ldw, n, k, y, ldy);
}

NIBBLE_CPU_MULTIVERSION
void gemm_bf16w_nt(const float* x, int64_t ldx, int64_t m, const uint16_t* w, int64_t ldw,
                   int64_t n, int64_t k, float* y, int64_t ldy) {
  gemm(x, ldx, m, w, ldw, n, k, y, ldy);
}

}  // namespace nibble::cpu
