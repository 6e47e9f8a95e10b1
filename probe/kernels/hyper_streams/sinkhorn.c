/* mHC's Sinkhorn-Knopp in C (probe/models/depth_mechanisms/hyper_connections.py's ``sinkhorn``: the same steps;
   probe/kernels/native.py builds this file). logits (M, n_in, n_out) contiguous; per token:
     c = softmax over each input's row of logits + eps, then 2 iters - 1 alternating divisions x / (sum x + eps),
     columns (a sum over the inputs) first, then rows (over the outputs), ...;  out (M, n_out, n_in) = c transposed.
   The backward recomputes the token's steps and runs each division's gradient (g - sum g y) / (sum x + eps) in
   reverse, then the softmax's, p (g - sum g p).

   Why this layout: a token's steps are n x n entries (16 at n = 4) and 2 iters - 1 dependent divisions, too few to
   fill a vector register, and a division per entry per step is what a scalar loop waits on. So LANES tokens run side
   by side: each entry is a row of LANES values, one per token (x[e][lane]), and every step is a loop over lanes that
   the compiler turns into vector divisions and adds, LANES tokens per instruction. A block's entries and every
   step's outputs (the backward's) live in one workspace per block; the tail block pads its unused lanes with zero
   logits, computed and thrown away. */
#include <stdint.h>
#include <stdlib.h>

#include "native_rows.h"

#define LANES 16

/* lg[e][l] = logits of token t0 + l, entry e (zero past the last token) */
#define LOAD_BLOCK(T, src, dst, t0, M, nn)                                                                        \
  for (int64_t e = 0; e < (nn); e++)                                                                              \
    for (int64_t l = 0; l < LANES; l++) (dst)[e * LANES + l] = (t0) + l < (M) ? (src)[((t0) + l) * (nn) + e] : 0;

/* p = softmax over each input's row of lg (n_in x n_out entries, LANES wide), c = p + eps; top and sum: LANES */
#define SOFTMAX_PLUS_EPS(T, EXP, lg, p, c, top, sum, n, eps)                                                      \
  for (int64_t i = 0; i < (n); i++) {                                                                             \
    T *row = (lg) + i * (n) * LANES, *pr = (p) + i * (n) * LANES, *cr = (c) + i * (n) * LANES;                    \
    _Pragma("omp simd") for (int64_t l = 0; l < LANES; l++) top[l] = row[l], sum[l] = 0;                          \
    for (int64_t o = 1; o < (n); o++)                                                                             \
      _Pragma("omp simd") for (int64_t l = 0; l < LANES; l++) top[l] =                                            \
          row[o * LANES + l] > top[l] ? row[o * LANES + l] : top[l];                                              \
    for (int64_t o = 0; o < (n); o++) {                                                                           \
      /* p holds the shifted logit (<= 0), clamped into exp's fast range, then its exp */                        \
      _Pragma("omp simd") for (int64_t l = 0; l < LANES; l++) pr[o * LANES + l] = row[o * LANES + l] - top[l];    \
      CLAMP_ROW(T, pr + o * LANES, pr + o * LANES, LANES)                                                         \
      EXP_ROW(T, EXP, pr + o * LANES, LANES)                                                                      \
      _Pragma("omp simd") for (int64_t l = 0; l < LANES; l++) sum[l] += pr[o * LANES + l];                        \
    }                                                                                                             \
    for (int64_t o = 0; o < (n); o++)                                                                             \
      _Pragma("omp simd") for (int64_t l = 0; l < LANES; l++) {                                                   \
        pr[o * LANES + l] /= sum[l];                                                                              \
        cr[o * LANES + l] = pr[o * LANES + l] + (T)(eps);                                                         \
      }                                                                                                           \
  }

/* y = x / (its sums along dim + eps), dim 0: over the inputs (a column's), 1: over the outputs (a row's), as x times
   the divisor's inverse (n divisions a step, not n x n); the inverses into div (n x LANES) */
#define DIVIDE(T, x, y, div, n, dim, eps)                                                                         \
  for (int64_t a = 0; a < (n); a++) {                                                                             \
    T *da = (div) + a * LANES;                                                                                    \
    _Pragma("omp simd") for (int64_t l = 0; l < LANES; l++) da[l] = 0;                                            \
    for (int64_t b = 0; b < (n); b++) {                                                                           \
      const T *xe = (x) + ((dim) == 0 ? b * (n) + a : a * (n) + b) * LANES;                                       \
      _Pragma("omp simd") for (int64_t l = 0; l < LANES; l++) da[l] += xe[l];                                     \
    }                                                                                                             \
    _Pragma("omp simd") for (int64_t l = 0; l < LANES; l++) da[l] = (T)1 / (da[l] + (T)(eps));                    \
  }                                                                                                               \
  for (int64_t i = 0; i < (n); i++)                                                                               \
    for (int64_t o = 0; o < (n); o++) {                                                                           \
      const T *xe = (x) + (i * (n) + o) * LANES, *da = (div) + ((dim) == 0 ? o : i) * LANES;                      \
      T *ye = (y) + (i * (n) + o) * LANES;                                                                        \
      _Pragma("omp simd") for (int64_t l = 0; l < LANES; l++) ye[l] = xe[l] * da[l];                              \
    }

/* dst[(t0 + l), o, i] = x[i * n + o][l] for the block's real tokens: out (M, n_out, n_in) is c transposed */
#define STORE_TRANSPOSED(x, dst, t0, M, n)                                                                        \
  for (int64_t l = 0; l < LANES && (t0) + l < (M); l++)                                                           \
    for (int64_t i = 0; i < (n); i++)                                                                             \
      for (int64_t o = 0; o < (n); o++) (dst)[((t0) + l) * (n) * (n) + o * (n) + i] = (x)[(i * (n) + o) * LANES + l];

#define SINKHORN(T, EXP)                                                                                          \
  int sinkhorn_forward_##T(const T *logits, T *out, int64_t M, int64_t n, int64_t iters, double eps,              \
                           int threads) {                                                                         \
    int64_t nn = n * n, blocks = (M + LANES - 1) / LANES;                                                         \
    int failed = 0;                                                                                               \
    _Pragma("omp parallel num_threads(threads)") {                                                                \
      T *work = malloc(sizeof(T) * LANES * (3 * nn + 3 * n)); /* lg, x[2]; div, top, sum */                       \
      if (!work) {                                                                                                \
        _Pragma("omp atomic write") failed = 1;                                                                   \
      } else {                                                                                                    \
        T *lg = work, *x[2] = {work + LANES * nn, work + 2 * LANES * nn}, *div = work + 3 * LANES * nn;           \
        T *top = div + LANES * n, *sum = top + LANES * n;                                                         \
        _Pragma("omp for schedule(static)") for (int64_t blk = 0; blk < blocks; blk++) {                          \
          int64_t t0 = blk * LANES;                                                                               \
          LOAD_BLOCK(T, logits, lg, t0, M, nn)                                                                    \
          SOFTMAX_PLUS_EPS(T, EXP, lg, x[1], x[0], top, sum, n, eps)                                              \
          int cur = 0;                                                                                            \
          for (int64_t k = 0; k < 2 * iters - 1; k++, cur ^= 1) {                                                 \
            DIVIDE(T, x[cur], x[cur ^ 1], div, n, k % 2 == 0 ? 0 : 1, eps)                                        \
          }                                                                                                       \
          STORE_TRANSPOSED(x[cur], out, t0, M, n)                                                                 \
        }                                                                                                         \
        free(work);                                                                                               \
      }                                                                                                           \
    }                                                                                                             \
    return failed;                                                                                                \
  }                                                                                                               \
                                                                                                                  \
  /* grad (M, n_out, n_in) on the output -> glogits (M, n_in, n_out) */                                           \
  int sinkhorn_backward_##T(const T *logits, const T *grad, T *glogits, int64_t M, int64_t n, int64_t iters,       \
                            double eps, int threads) {                                                            \
    int64_t nn = n * n, steps = 2 * iters - 1, blocks = (M + LANES - 1) / LANES;                                  \
    int failed = 0;                                                                                               \
    _Pragma("omp parallel num_threads(threads)") {                                                                \
      /* lg, p, g; y[steps + 1]; div[steps], dot, top, sum */                                                     \
      T *work = malloc(sizeof(T) * LANES * ((steps + 4) * nn + (steps + 3) * n));                                 \
      if (!work) {                                                                                                \
        _Pragma("omp atomic write") failed = 1;                                                                   \
      } else {                                                                                                    \
        T *lg = work, *p = lg + LANES * nn, *g = p + LANES * nn, *y = g + LANES * nn;                             \
        T *div = y + (steps + 1) * LANES * nn, *dot = div + steps * LANES * n, *top = dot + LANES * n;            \
        T *sum = top + LANES * n;                                                                                 \
        _Pragma("omp for schedule(static)") for (int64_t blk = 0; blk < blocks; blk++) {                          \
          int64_t t0 = blk * LANES;                                                                               \
          LOAD_BLOCK(T, logits, lg, t0, M, nn)                                                                    \
          SOFTMAX_PLUS_EPS(T, EXP, lg, p, y, top, sum, n, eps)                                                    \
          for (int64_t k = 0; k < steps; k++) {                                                                   \
            DIVIDE(T, y + k * LANES * nn, y + (k + 1) * LANES * nn, div + k * LANES * n, n, k % 2 == 0 ? 0 : 1, eps) \
          }                                                                                                       \
          for (int64_t i = 0; i < n; i++) /* g[i * n + o][l] = grad[t0 + l, o, i] */                              \
            for (int64_t o = 0; o < n; o++)                                                                       \
              for (int64_t l = 0; l < LANES; l++)                                                                 \
                g[(i * n + o) * LANES + l] = t0 + l < M ? grad[(t0 + l) * nn + o * n + i] : 0;                    \
          for (int64_t k = steps - 1; k >= 0; k--) { /* y[k + 1] = y[k] * div[k] (an inverse) along dim */        \
            int dim = k % 2 == 0 ? 0 : 1;                                                                         \
            const T *yk = y + (k + 1) * LANES * nn, *dk = div + k * LANES * n;                                    \
            for (int64_t a = 0; a < n; a++) {                                                                     \
              T *da = dot + a * LANES;                                                                            \
              _Pragma("omp simd") for (int64_t l = 0; l < LANES; l++) da[l] = 0;                                  \
              for (int64_t b = 0; b < n; b++) {                                                                   \
                int64_t e = (dim == 0 ? b * n + a : a * n + b) * LANES;                                           \
                _Pragma("omp simd") for (int64_t l = 0; l < LANES; l++) da[l] += g[e + l] * yk[e + l];            \
              }                                                                                                   \
            }                                                                                                     \
            for (int64_t i = 0; i < n; i++)                                                                       \
              for (int64_t o = 0; o < n; o++) {                                                                   \
                int64_t a = (dim == 0 ? o : i) * LANES;                                                           \
                T *ge = g + (i * n + o) * LANES;                                                                  \
                _Pragma("omp simd") for (int64_t l = 0; l < LANES; l++) ge[l] =                                   \
                    (ge[l] - dot[a + l]) * dk[a + l];                                                             \
              }                                                                                                   \
          }                                                                                                       \
          for (int64_t i = 0; i < n; i++) { /* through softmax(row) + eps: p (g - sum_o g p) */                   \
            T *gi = g + i * n * LANES, *pi = p + i * n * LANES;                                                   \
            _Pragma("omp simd") for (int64_t l = 0; l < LANES; l++) sum[l] = 0;                                   \
            for (int64_t o = 0; o < n; o++)                                                                       \
              _Pragma("omp simd") for (int64_t l = 0; l < LANES; l++) sum[l] += gi[o * LANES + l] * pi[o * LANES + l]; \
            for (int64_t o = 0; o < n; o++)                                                                       \
              for (int64_t l = 0; l < LANES && t0 + l < M; l++)                                                   \
                glogits[(t0 + l) * nn + i * n + o] = pi[o * LANES + l] * (gi[o * LANES + l] - sum[l]);            \
          }                                                                                                       \
        }                                                                                                         \
        free(work);                                                                                               \
      }                                                                                                           \
    }                                                                                                             \
    return failed;                                                                                                \
  }

SINKHORN(float, expf)
SINKHORN(double, exp)
