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
   logits, computed and thrown away.

   At n = 4 (the streams' usual count) a block's 16 entries are 16 vector variables, which the compiler keeps in
   registers across all the steps (REGISTER_STEPS): a step is then the chain of its adds, n divisions and
   multiplies, not loads and stores through the workspace, about 3x faster at DeepSeek's 20 iterations. The same
   operations in the same order: the forward's values bit for bit, the backward's too built without fused
   multiply-adds; as built (-ffp-contract=fast) the compiler fuses the two backward loops' products differently,
   within an ulp of each other.

   mHC's weights (mhc_weights_forward / _backward: the fused boundaries' taped path,
   ManifoldHyperConnection.taped_weights) run the same blocks on u = z s + b of its logits' res part, with post's
   sigmoids and, backward, each part's share of the bias's and scales' gradients in the same call: what autograd
   took a dozen small tensor operations for. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "native_rows.h"

#define LANES 16

/* a block's workspace, aligned for its entries as vectors (every entry starts at a multiple of LANES values) */
static inline void *workspace(size_t bytes) {
  size_t align = LANES * sizeof(double);
  return aligned_alloc(align, (bytes + align - 1) / align * align);
}

/* lg[e][l] = src[(t0 + l) stride + e] s + b[e], entry e of token t0 + l (zero past the last token; b NULL: 0):
   the logits u = z s + b of mHC's res part, or plain logits (s = 1, b = 0: exactly them) */
#define LOAD_AFFINE(src, stride, s, b, dst, t0, M, nn)                                                            \
  for (int64_t e = 0; e < (nn); e++)                                                                              \
    for (int64_t l = 0; l < LANES; l++)                                                                           \
      (dst)[e * LANES + l] = (t0) + l < (M) ? (src)[((t0) + l) * (stride) + e] * (s) + ((b) ? (b)[e] : 0) : 0;

/* g[i n + o][l] = grad[t0 + l, o, i] (zero past the last token): a gradient of Sinkhorn's output (M, n_out, n_in)
   in the logits' layout */
#define LOAD_TRANSPOSED(grad, g, t0, M, n)                                                                        \
  for (int64_t i = 0; i < (n); i++)                                                                               \
    for (int64_t o = 0; o < (n); o++)                                                                             \
      for (int64_t l = 0; l < LANES; l++)                                                                         \
        (g)[(i * (n) + o) * LANES + l] = (t0) + l < (M) ? (grad)[((t0) + l) * (n) * (n) + o * (n) + i] : 0;

/* p = softmax over each input's row of lg (n_in x n_out entries, LANES wide), c = p + eps; top and sum: LANES */
#define SOFTMAX_PLUS_EPS(T, EXP, lg, p, c, top, sum, n, eps)                                                      \
  for (int64_t i = 0; i < (n); i++) {                                                                             \
    T *row = (lg) + i * (n) * LANES, *pr = (p) + i * (n) * LANES, *cr = (c) + i * (n) * LANES;                    \
    _Pragma("omp simd") for (int64_t l = 0; l < LANES; l++) top[l] = row[l], sum[l] = 0;                          \
    for (int64_t o = 1; o < (n); o++)                                                                             \
      _Pragma("omp simd") for (int64_t l = 0; l < LANES; l++) top[l] =                                            \
          row[o * LANES + l] > top[l] ? row[o * LANES + l] : top[l];                                              \
    for (int64_t o = 0; o < (n); o++) {                                                                           \
      /* p holds the shifted logit (<= 0), clamped into exp's fast range, then its exp */                         \
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

/* A block's steps with its N x N entries held as vector variables x[e] (LANES values each: registers, for a
   constant N small enough): k = 0 .. steps - 1, columns first, y = x * (1 / (sum + eps)) as DIVIDE computes it.
   Where ys is given, each step's output is stored at ys[(k + 1) N N + e] and its inverses at divs[k N + a]
   (the backward's). */
#define REGISTER_STEPS(T, N)                                                                                      \
  static inline void steps##N##_##T(vec_##T *x, int64_t steps, T eps, vec_##T *ys, vec_##T *divs) {               \
    for (int64_t k = 0; k < steps; k++) {                                                                         \
      vec_##T r[N];                                                                                               \
      for (int a = 0; a < N; a++) { /* dim 0 (k even): column a's sum over the inputs; dim 1: row a's */          \
        vec_##T s = k % 2 == 0 ? x[a] : x[a * N];                                                                 \
        for (int b = 1; b < N; b++) s += k % 2 == 0 ? x[b * N + a] : x[a * N + b];                                \
        r[a] = (T)1 / (s + eps);                                                                                  \
      }                                                                                                           \
      for (int i = 0; i < N; i++)                                                                                 \
        for (int o = 0; o < N; o++) x[i * N + o] *= r[k % 2 == 0 ? o : i];                                        \
      if (ys) {                                                                                                   \
        memcpy(ys + (k + 1) * N * N, x, sizeof(vec_##T) * N * N);                                                 \
        memcpy(divs + k * N, r, sizeof(vec_##T) * N);                                                             \
      }                                                                                                           \
    }                                                                                                             \
  }                                                                                                               \
                                                                                                                  \
  /* the steps' gradient in reverse, g held as vector variables: g = (g - sum g y) * inverse along each step's    \
     dim, y the step's output (ys[k + 1]), as the generic loop computes it */                                     \
  static inline void steps##N##_backward_##T(vec_##T *g, int64_t steps, const vec_##T *ys, const vec_##T *divs) { \
    for (int64_t k = steps - 1; k >= 0; k--) {                                                                    \
      const vec_##T *yk = ys + (k + 1) * N * N, *dk = divs + k * N;                                               \
      vec_##T dot[N];                                                                                             \
      for (int a = 0; a < N; a++) {                                                                               \
        int e0 = k % 2 == 0 ? a : a * N;                                                                          \
        dot[a] = g[e0] * yk[e0];                                                                                  \
        for (int b = 1; b < N; b++) {                                                                             \
          int e = k % 2 == 0 ? b * N + a : a * N + b;                                                             \
          dot[a] += g[e] * yk[e];                                                                                 \
        }                                                                                                         \
      }                                                                                                           \
      for (int i = 0; i < N; i++)                                                                                 \
        for (int o = 0; o < N; o++) {                                                                             \
          int a = k % 2 == 0 ? o : i;                                                                             \
          g[i * N + o] = (g[i * N + o] - dot[a]) * dk[a];                                                         \
        }                                                                                                         \
    }                                                                                                             \
  }

#define SINKHORN(T, EXP)                                                                                          \
  typedef T vec_##T __attribute__((vector_size(LANES * sizeof(T)))); /* one entry of a block: LANES tokens */     \
  REGISTER_STEPS(T, 4)                                                                                            \
                                                                                                                  \
  /* A block's forward, its logits loaded in work (lg, n x n entries); returns its output's entries (c after the  \
     steps, in lg's layout), in work. Work: lg, x[2]; div, top, sum */                                            \
  static size_t forward_work_##T(int64_t n) { return sizeof(T) * LANES * (3 * n * n + 3 * n); }                   \
  static inline T *block_forward_##T(T *work, int64_t n, int64_t iters, double eps) {                             \
    int64_t nn = n * n;                                                                                           \
    T *lg = work, *x[2] = {work + LANES * nn, work + 2 * LANES * nn}, *div = work + 3 * LANES * nn;               \
    T *top = div + LANES * n, *sum = top + LANES * n;                                                             \
    SOFTMAX_PLUS_EPS(T, EXP, lg, x[1], x[0], top, sum, n, eps)                                                    \
    int cur = 0;                                                                                                  \
    if (n == 4) { /* on a copy in registers */                                                                    \
      vec_##T x4[16];                                                                                             \
      memcpy(x4, x[0], sizeof x4);                                                                                \
      steps4_##T(x4, 2 * iters - 1, (T)eps, 0, 0);                                                                \
      memcpy(x[0], x4, sizeof x4);                                                                                \
    } else {                                                                                                      \
      for (int64_t k = 0; k < 2 * iters - 1; k++, cur ^= 1) {                                                     \
        DIVIDE(T, x[cur], x[cur ^ 1], div, n, k % 2 == 0 ? 0 : 1, eps)                                            \
      }                                                                                                           \
    }                                                                                                             \
    return x[cur];                                                                                                \
  }                                                                                                               \
                                                                                                                  \
  /* A block's backward, its logits loaded in work (lg) and its output's gradient in g = work + 2 LANES n n (lg's \
     layout: entry i n + o, input i, output o); leaves the logits' gradient in g. Work: lg, p, g; y[steps + 1];   \
     div[steps], dot, top, sum */                                                                                 \
  static size_t backward_work_##T(int64_t n, int64_t iters) {                                                     \
    return sizeof(T) * LANES * ((2 * iters + 3) * n * n + (2 * iters + 2) * n);                                   \
  }                                                                                                               \
  static inline void block_backward_##T(T *work, int64_t n, int64_t iters, double eps) {                          \
    int64_t nn = n * n, steps = 2 * iters - 1;                                                                    \
    T *lg = work, *p = lg + LANES * nn, *g = p + LANES * nn, *y = g + LANES * nn;                                 \
    T *div = y + (steps + 1) * LANES * nn, *dot = div + steps * LANES * n, *top = dot + LANES * n;                \
    T *sum = top + LANES * n;                                                                                     \
    SOFTMAX_PLUS_EPS(T, EXP, lg, p, y, top, sum, n, eps)                                                          \
    if (n == 4) { /* the steps on a copy of y[0] in registers, each stored as the loop stores it, and back */     \
      vec_##T x4[16], g4[16];                                                                                     \
      memcpy(x4, y, sizeof x4);                                                                                   \
      steps4_##T(x4, steps, (T)eps, (vec_##T *)y, (vec_##T *)div);                                                \
      memcpy(g4, g, sizeof g4);                                                                                   \
      steps4_backward_##T(g4, steps, (const vec_##T *)y, (const vec_##T *)div);                                   \
      memcpy(g, g4, sizeof g4);                                                                                   \
    } else {                                                                                                      \
      for (int64_t k = 0; k < steps; k++) {                                                                       \
        DIVIDE(T, y + k * LANES * nn, y + (k + 1) * LANES * nn, div + k * LANES * n, n, k % 2 == 0 ? 0 : 1, eps)  \
      }                                                                                                           \
      for (int64_t k = steps - 1; k >= 0; k--) { /* y[k + 1] = y[k] * div[k] (an inverse) along dim */            \
        int dim = k % 2 == 0 ? 0 : 1;                                                                             \
        const T *yk = y + (k + 1) * LANES * nn, *dk = div + k * LANES * n;                                        \
        for (int64_t a = 0; a < n; a++) {                                                                         \
          T *da = dot + a * LANES;                                                                                \
          _Pragma("omp simd") for (int64_t l = 0; l < LANES; l++) da[l] = 0;                                      \
          for (int64_t b = 0; b < n; b++) {                                                                       \
            int64_t e = (dim == 0 ? b * n + a : a * n + b) * LANES;                                               \
            _Pragma("omp simd") for (int64_t l = 0; l < LANES; l++) da[l] += g[e + l] * yk[e + l];                \
          }                                                                                                       \
        }                                                                                                         \
        for (int64_t i = 0; i < n; i++)                                                                           \
          for (int64_t o = 0; o < n; o++) {                                                                       \
            int64_t a = (dim == 0 ? o : i) * LANES;                                                               \
            T *ge = g + (i * n + o) * LANES;                                                                      \
            _Pragma("omp simd") for (int64_t l = 0; l < LANES; l++) ge[l] = (ge[l] - dot[a + l]) * dk[a + l];     \
          }                                                                                                       \
      }                                                                                                           \
    }                                                                                                             \
    for (int64_t i = 0; i < n; i++) { /* through softmax(row) + eps: p (g - sum_o g p) */                         \
      T *gi = g + i * n * LANES, *pi = p + i * n * LANES;                                                         \
      _Pragma("omp simd") for (int64_t l = 0; l < LANES; l++) sum[l] = 0;                                         \
      for (int64_t o = 0; o < n; o++)                                                                             \
        _Pragma("omp simd") for (int64_t l = 0; l < LANES; l++) sum[l] += gi[o * LANES + l] * pi[o * LANES + l];  \
      for (int64_t o = 0; o < n; o++)                                                                             \
        _Pragma("omp simd") for (int64_t l = 0; l < LANES; l++) gi[o * LANES + l] =                               \
            pi[o * LANES + l] * (gi[o * LANES + l] - sum[l]);                                                     \
    }                                                                                                             \
  }                                                                                                               \
                                                                                                                  \
  /* Sinkhorn's forward on logits u = src[t stride + e] s + b[e] (b NULL: 0) of M tokens' n x n entries (stride   \
     values apart): out (M, n_out, n_in). The plain Sinkhorn is s = 1, b = 0: exactly its logits. */              \
  static int forward_blocks_##T(const T *src, int64_t stride, T s, const T *b, T *out, int64_t M, int64_t n,      \
                                int64_t iters, double eps, int threads) {                                         \
    int64_t blocks = (M + LANES - 1) / LANES;                                                                     \
    int failed = 0;                                                                                               \
    _Pragma("omp parallel num_threads(threads)") {                                                                \
      T *work = workspace(forward_work_##T(n));                                                                   \
      if (!work) {                                                                                                \
        _Pragma("omp atomic write") failed = 1;                                                                   \
      } else {                                                                                                    \
        _Pragma("omp for schedule(static)") for (int64_t blk = 0; blk < blocks; blk++) {                          \
          int64_t t0 = blk * LANES;                                                                               \
          LOAD_AFFINE(src, stride, s, b, work, t0, M, n * n)                                                      \
          T *c = block_forward_##T(work, n, iters, eps);                                                          \
          STORE_TRANSPOSED(c, out, t0, M, n)                                                                      \
        }                                                                                                         \
        free(work);                                                                                               \
      }                                                                                                           \
    }                                                                                                             \
    return failed;                                                                                                \
  }                                                                                                               \
                                                                                                                  \
  /* Its backward: grad (M, n_out, n_in) on the output -> gu (M, n_in, n_out), u's gradient */                    \
  static int backward_blocks_##T(const T *src, int64_t stride, T s, const T *b, const T *grad, T *gu, int64_t M,  \
                                 int64_t n, int64_t iters, double eps, int threads) {                             \
    int64_t nn = n * n, blocks = (M + LANES - 1) / LANES;                                                         \
    int failed = 0;                                                                                               \
    _Pragma("omp parallel num_threads(threads)") {                                                                \
      T *work = workspace(backward_work_##T(n, iters));                                                           \
      if (!work) {                                                                                                \
        _Pragma("omp atomic write") failed = 1;                                                                   \
      } else {                                                                                                    \
        T *g = work + 2 * LANES * nn;                                                                             \
        _Pragma("omp for schedule(static)") for (int64_t blk = 0; blk < blocks; blk++) {                          \
          int64_t t0 = blk * LANES;                                                                               \
          LOAD_AFFINE(src, stride, s, b, work, t0, M, nn)                                                         \
          LOAD_TRANSPOSED(grad, g, t0, M, n)                                                                      \
          block_backward_##T(work, n, iters, eps);                                                                \
          for (int64_t l = 0; l < LANES && t0 + l < M; l++)                                                       \
            for (int64_t e = 0; e < nn; e++) gu[(t0 + l) * nn + e] = g[e * LANES + l];                            \
        }                                                                                                         \
        free(work);                                                                                               \
      }                                                                                                           \
    }                                                                                                             \
    return failed;                                                                                                \
  }                                                                                                               \
                                                                                                                  \
  int sinkhorn_forward_##T(const T *logits, T *out, int64_t M, int64_t n, int64_t iters, double eps,              \
                           int threads) {                                                                         \
    return forward_blocks_##T(logits, n * n, 1, 0, out, M, n, iters, eps, threads);                               \
  }                                                                                                               \
                                                                                                                  \
  /* grad (M, n_out, n_in) on the output -> glogits (M, n_in, n_out) */                                           \
  int sinkhorn_backward_##T(const T *logits, const T *grad, T *glogits, int64_t M, int64_t n, int64_t iters,      \
                            double eps, int threads) {                                                            \
    return backward_blocks_##T(logits, n * n, 1, 0, grad, glogits, M, n, iters, eps, threads);                    \
  }                                                                                                               \
                                                                                                                  \
  /* mHC's weights from its logits z (M, K = (2 + n) n: pre's n, post's n, res's n x n), u = z s + b with one scale \
     per part (scale: 3, bias: K): post = 2 sigmoid(u_post) (M, n) and res = Sinkhorn of u_res (M, n_out, n_in),  \
     as probe/models/depth_mechanisms/hyper_connections.py's weights_from_logits (pre comes from the boundary) */ \
  int mhc_weights_forward_##T(const T *z, const T *bias, const T *scale, T *post, T *res, int64_t M, int64_t n,   \
                              int64_t iters, double eps, int threads) {                                           \
    int64_t K = 2 * n + n * n;                                                                                    \
    _Pragma("omp parallel for num_threads(threads) schedule(static)") for (int64_t t0 = 0; t0 < M; t0 += LANES) { \
      int64_t nb = M - t0 < LANES ? M - t0 : LANES; /* post[t, j]: vector exp across a block's tokens */          \
      for (int64_t j = 0; j < n; j++)                                                                             \
        _Pragma("omp simd") for (int64_t t = t0; t < t0 + nb; t++) post[t * n + j] =                              \
            (T)2 / ((T)1 + EXP(-(z[t * K + n + j] * scale[1] + bias[n + j])));                                    \
    }                                                                                                             \
    return forward_blocks_##T(z + 2 * n, K, scale[2], bias + 2 * n, res, M, n, iters, eps, threads);              \
  }                                                                                                               \
                                                                                                                  \
  /* Its backward, each part's from its weights' gradient where given (NULL: none): u's gradient gu, by pre's     \
     s (1 - s) (pre = sigmoid(u_pre) + eps), post's 2 s (1 - s) and Sinkhorn's backward; the logits' gradient gu s \
     into glogits (M, K) where given (pre's part 0: the boundary adds pre's share through the read, whose gradient \
     it takes itself), and added to gbias (K) and gscale (3): sum_t gu and sum_t gu z, summed per thread and then in \
     thread order (the same bits for the same thread count). Returns 1 where memory ran out. */                   \
  int mhc_weights_backward_##T(const T *z, const T *bias, const T *scale, const T *gpre, const T *gpost,          \
                               const T *gres, T *glogits, T *gbias, T *gscale, int64_t M, int64_t n, int64_t iters, \
                               double eps, int threads) {                                                         \
    int64_t nn = n * n, K = 2 * n + nn;                                                                           \
    int team = 1;                                                                                                 \
    T *partial = calloc((size_t)threads * (K + 3), sizeof(T)); /* each thread's sums: K bias, 3 scale */          \
    if (!partial) return 1;                                                                                       \
    T *gu_res = gres ? malloc(sizeof(T) * M * nn) : 0; /* Sinkhorn's backward: u_res's gradient */                \
    int failed = gres && !gu_res;                                                                                 \
    if (!failed && gres) failed = backward_blocks_##T(z + 2 * n, K, scale[2], bias + 2 * n, gres, gu_res, M, n,   \
                                                      iters, eps, threads);                                       \
    int64_t upto = failed ? 0 : M; /* no tokens where memory ran out */                                           \
    _Pragma("omp parallel num_threads(threads)") {                                                                \
      T *mine = partial + omp_get_thread_num() * (K + 3);                                                         \
      _Pragma("omp single") team = omp_get_num_threads();                                                         \
      _Pragma("omp for schedule(static)") for (int64_t t = 0; t < upto; t++) {                                    \
        const T *zt = z + t * K;                                                                                  \
        for (int64_t e = 0; e < K; e++) {                                                                         \
          int part = e < n ? 0 : e < 2 * n ? 1 : 2;                                                               \
          const T *given = part == 0 ? gpre : part == 1 ? gpost : gres;                                           \
          T gu = 0;                                                                                               \
          if (given && part < 2) { /* pre = sigmoid(u) + eps, post = 2 sigmoid(u) */                              \
            T s = (T)1 / ((T)1 + EXP(-(zt[e] * scale[part] + bias[e])));                                          \
            gu = given[t * n + e - part * n] * s * ((T)1 - s) * (part == 1 ? (T)2 : (T)1);                        \
          } else if (given) {                                                                                     \
            gu = gu_res[t * nn + e - 2 * n];                                                                      \
          }                                                                                                       \
          if (glogits) glogits[t * K + e] = part == 0 ? 0 : gu * scale[part];                                     \
          if (given) mine[e] += gu, mine[K + part] += gu * zt[e];                                                 \
        }                                                                                                         \
      }                                                                                                           \
    }                                                                                                             \
    for (int i = 0; i < team && !failed; i++) { /* the threads' sums in thread order */                           \
      for (int64_t e = 0; e < K; e++) gbias[e] += partial[i * (K + 3) + e];                                       \
      for (int q = 0; q < 3; q++) gscale[q] += partial[i * (K + 3) + K + q];                                      \
    }                                                                                                             \
    free(partial), free(gu_res);                                                                                  \
    return failed;                                                                                                \
  }

SINKHORN(float, expf)
SINKHORN(double, exp)
