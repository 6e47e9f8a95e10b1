/* mHC's Sinkhorn-Knopp per token in C (probe/models/depth_mechanisms/hyper_connections.py's ``sinkhorn``: the same
   steps; probe/kernels/native.py builds this file). logits (M, n_in, n_out) contiguous; per token:
     c = softmax over each input's row of logits + eps, then 2 iters - 1 alternating divisions x / (sum x + eps),
     columns (a sum over the inputs) first, then rows (over the outputs), ...;  out (M, n_out, n_in) = c transposed.
   The backward recomputes the token's steps (its n x n entries, on the stack) and runs each division's gradient
   (g - sum g y) / (sum x + eps) in reverse, then the softmax's, p (g - sum g p). Torch runs these as 2 iters - 1
   tiny ops over all tokens per direction; here each token's steps run in registers and L1. */
#include <math.h>
#include <stdint.h>

#define MAX_STEP_ENTRIES 65536 /* steps x n x n kept per token on the stack; larger: the caller's torch path */

/* p = softmax over each input's row of the token's logits lt (n_in x n_out), c = p + eps */
#define SOFTMAX_PLUS_EPS(T, EXP, lt, p, c, n, eps)                                                                \
  for (int64_t i = 0; i < (n); i++) {                                                                             \
    T top = lt[i * (n)], sum = 0;                                                                                 \
    for (int64_t o = 1; o < (n); o++) top = lt[i * (n) + o] > top ? lt[i * (n) + o] : top;                        \
    for (int64_t o = 0; o < (n); o++) sum += (p[i * (n) + o] = EXP(lt[i * (n) + o] - top));                      \
    for (int64_t o = 0; o < (n); o++) {                                                                           \
      p[i * (n) + o] /= sum;                                                                                      \
      c[i * (n) + o] = p[i * (n) + o] + (T)(eps);                                                                 \
    }                                                                                                             \
  }

/* one division of x (n_in x n_out) by its sums along dim (0: over the inputs, 1: over the outputs) + eps, into y,
   the divisors into div (n) */
#define DIVIDE(T, x, y, div, n, dim, eps)                                                                         \
  for (int64_t a = 0; a < (n); a++) {                                                                             \
    T s = 0;                                                                                                      \
    for (int64_t b = 0; b < (n); b++) s += (dim) == 0 ? x[b * (n) + a] : x[a * (n) + b];                          \
    div[a] = s + (T)(eps);                                                                                        \
  }                                                                                                               \
  for (int64_t i = 0; i < (n); i++)                                                                               \
    for (int64_t o = 0; o < (n); o++) y[i * (n) + o] = x[i * (n) + o] / div[(dim) == 0 ? o : i];

#define SINKHORN(T, EXP)                                                                                          \
  int sinkhorn_forward_##T(const T *logits, T *out, int64_t M, int64_t n, int64_t iters, double eps,              \
                           int threads) {                                                                         \
    if (3 * n * n > MAX_STEP_ENTRIES) return 1;                                                                   \
    _Pragma("omp parallel for num_threads(threads) schedule(static)") for (int64_t t = 0; t < M; t++) {           \
      T x[2][n * n], div[n];                                                                                      \
      const T *lt = logits + t * n * n;                                                                           \
      SOFTMAX_PLUS_EPS(T, EXP, lt, x[1], x[0], n, eps)                                                            \
      int cur = 0;                                                                                                \
      for (int64_t k = 0; k < 2 * iters - 1; k++, cur ^= 1) {                                                     \
        DIVIDE(T, x[cur], x[cur ^ 1], div, n, k % 2 == 0 ? 0 : 1, eps)                                            \
      }                                                                                                           \
      T *ot = out + t * n * n;                                                                                    \
      for (int64_t i = 0; i < n; i++)                                                                             \
        for (int64_t o = 0; o < n; o++) ot[o * n + i] = x[cur][i * n + o];                                        \
    }                                                                                                             \
    return 0;                                                                                                     \
  }                                                                                                               \
                                                                                                                  \
  /* grad (M, n_out, n_in) on the output -> glogits (M, n_in, n_out) */                                           \
  int sinkhorn_backward_##T(const T *logits, const T *grad, T *glogits, int64_t M, int64_t n, int64_t iters,       \
                            double eps, int threads) {                                                            \
    int64_t steps = 2 * iters - 1;                                                                                \
    if ((steps + 3) * n * (n + 1) > MAX_STEP_ENTRIES) return 1;                                                   \
    _Pragma("omp parallel for num_threads(threads) schedule(static)") for (int64_t t = 0; t < M; t++) {           \
      T y[steps + 1][n * n], div[steps][n], g[n * n], p[n * n];                                                   \
      const T *lt = logits + t * n * n;                                                                           \
      SOFTMAX_PLUS_EPS(T, EXP, lt, p, y[0], n, eps)                                                               \
      for (int64_t k = 0; k < steps; k++) {                                                                       \
        DIVIDE(T, y[k], y[k + 1], div[k], n, k % 2 == 0 ? 0 : 1, eps)                                             \
      }                                                                                                           \
      const T *gt = grad + t * n * n;                                                                             \
      for (int64_t i = 0; i < n; i++)                                                                             \
        for (int64_t o = 0; o < n; o++) g[i * n + o] = gt[o * n + i];                                             \
      for (int64_t k = steps - 1; k >= 0; k--) { /* y[k + 1] = y[k] / div[k] along dim */                         \
        int dim = k % 2 == 0 ? 0 : 1;                                                                             \
        T dot[n];                                                                                                 \
        for (int64_t a = 0; a < n; a++) {                                                                         \
          T s = 0;                                                                                                \
          for (int64_t b = 0; b < n; b++) {                                                                       \
            int64_t e = dim == 0 ? b * n + a : a * n + b;                                                         \
            s += g[e] * y[k + 1][e];                                                                              \
          }                                                                                                       \
          dot[a] = s;                                                                                             \
        }                                                                                                         \
        for (int64_t i = 0; i < n; i++)                                                                           \
          for (int64_t o = 0; o < n; o++) {                                                                       \
            int64_t a = dim == 0 ? o : i;                                                                         \
            g[i * n + o] = (g[i * n + o] - dot[a]) / div[k][a];                                                   \
          }                                                                                                       \
      }                                                                                                           \
      T *gl = glogits + t * n * n; /* through softmax(row) + eps: p (g - sum_o g p) */                           \
      for (int64_t i = 0; i < n; i++) {                                                                           \
        T s = 0;                                                                                                  \
        for (int64_t o = 0; o < n; o++) s += g[i * n + o] * p[i * n + o];                                         \
        for (int64_t o = 0; o < n; o++) gl[i * n + o] = p[i * n + o] * (g[i * n + o] - s);                        \
      }                                                                                                           \
    }                                                                                                             \
    return 0;                                                                                                     \
  }

SINKHORN(float, expf)
SINKHORN(double, exp)
