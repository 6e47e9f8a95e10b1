/* stick-breaking's rows in C (fused.py's forward and backward, the same math; probe/kernels/native.py builds this
   file). s (rows, n) scores, hidden keys -inf; with t_j = exp(-s_j), beta_j = 1 / (1 + t_j) = sigmoid(s_j) and
   1 - beta_j = t_j / (1 + t_j) = sigmoid(-s_j) (one exp for both, no cancellation):
     A_j  = beta_j prod_{k > j} (1 - beta_k)          a reversed running product, the last key first
   backward, with u_j = g_j A_j:
     ds_j = u_j - beta_j sum_{k <= j} u_k              a running sum, the first key first
   The kernels keep no beta: the backward recomputes it from the scores, which the caller keeps anyway. A running
   product below the smallest normal is flushed to 0 (the weights it sets are below 1e-38 / 2e-308 either way):
   products of denormals are tens of times slower, and threads other than the caller's do not flush them. */
#include <float.h>
#include <omp.h>

#include "native_rows.h"

/* t_j = exp(-s_j) into t */
#define EXP_NEG(T, EXP, sr, t, n)                                                                                 \
  _Pragma("omp simd") for (int64_t j = 0; j < (n); j++)(t)[j] = -(sr)[j];                                         \
  CLAMP_ROW(T, t, t, n)                                                                                           \
  EXP_ROW(T, EXP, t, n)

/* beta_j = 1 / (1 + t_j), 0 on hidden keys */
#define BETA(sj, t) ((sj) == -INFINITY ? 0 : 1 / (1 + (t)))

/* The running product and sum are sequential in j: GROUP rows run side by side, so the core overlaps their chains
   (a multiply's or an add's latency each step) rather than waiting on one; the rows a thread's last group lacks run
   on its scratch rows (zeros) and are thrown away. */
#define GROUP 4

/* rows: the group's row pointers, each thread's scratch rows standing in for the missing ones */
#define GROUP_ROWS(T, ptrs, base, first, count, spare)                                                            \
  for (int i = 0; i < GROUP; i++) (ptrs)[i] = i < (count) ? (base) + ((first) + i) * n : (spare) + i * n;

#define STICKBREAKING_ROWS(T, EXP, TINY)                                                                          \
  /* scratch: (threads, 2 GROUP, n) zeros, each thread's 1 - beta rows and spare weight rows */                   \
  void stickbreaking_forward_##T(const T *s, T *weights, T *scratch, int64_t rows, int64_t n, int threads) {      \
    _Pragma("omp parallel num_threads(threads)") {                                                                \
      T *keep = scratch + omp_get_thread_num() * 2 * GROUP * n, *spare = keep + GROUP * n;                        \
      _Pragma("omp for schedule(static)") for (int64_t first = 0; first < rows; first += GROUP) {                 \
        int64_t count = rows - first < GROUP ? rows - first : GROUP;                                              \
        T *w[GROUP], kept[GROUP];                                                                                 \
        GROUP_ROWS(T, w, weights, first, count, spare)                                                            \
        for (int64_t i = 0; i < count; i++) {                                                                     \
          const T *sr = s + (first + i) * n;                                                                      \
          T *kr = keep + i * n;                                                                                   \
          EXP_NEG(T, EXP, sr, kr, n)                                                                              \
          _Pragma("omp simd") for (int64_t j = 0; j < n; j++) {                                                   \
            T t = kr[j];                                                                                          \
            w[i][j] = BETA(sr[j], t);                                                                             \
            kr[j] = sr[j] == INFINITY ? 0 : t / (1 + t); /* 1 - beta_j */                                         \
          }                                                                                                       \
        }                                                                                                         \
        for (int i = 0; i < GROUP; i++) kept[i] = 1;                                                              \
        for (int64_t j = n - 1; j >= 0; j--) {                                                                    \
          _Pragma("GCC unroll 4") for (int i = 0; i < GROUP; i++) {                                               \
            w[i][j] *= kept[i];                                                                                   \
            kept[i] *= keep[i * n + j];                                                                           \
            kept[i] = kept[i] < TINY ? 0 : kept[i];                                                               \
          }                                                                                                       \
        }                                                                                                         \
      }                                                                                                           \
    }                                                                                                             \
  }                                                                                                               \
                                                                                                                  \
  /* scratch: (threads, 2 GROUP, n) zeros, each thread's spare gradient-and-weight rows and spare ds rows */       \
  void stickbreaking_backward_##T(const T *g, const T *s, const T *weights, T *ds, T *scratch, int64_t rows,      \
                                  int64_t n, int threads) {                                                       \
    _Pragma("omp parallel num_threads(threads)") {                                                                \
      T *zeros = scratch + omp_get_thread_num() * 2 * GROUP * n, *spare = zeros + GROUP * n;                      \
      _Pragma("omp for schedule(static)") for (int64_t first = 0; first < rows; first += GROUP) {                 \
        int64_t count = rows - first < GROUP ? rows - first : GROUP;                                              \
        const T *gr[GROUP], *wr[GROUP];                                                                           \
        T *dr[GROUP], before[GROUP];                                                                              \
        GROUP_ROWS(T, gr, g, first, count, zeros)                                                                 \
        GROUP_ROWS(T, wr, weights, first, count, zeros)                                                           \
        GROUP_ROWS(T, dr, ds, first, count, spare)                                                                \
        for (int64_t i = 0; i < count; i++) {                                                                     \
          const T *sr = s + (first + i) * n;                                                                      \
          T *d = dr[i];                                                                                           \
          EXP_NEG(T, EXP, sr, d, n)                                                                               \
          _Pragma("omp simd") for (int64_t j = 0; j < n; j++) d[j] = BETA(sr[j], d[j]);                           \
        }                                                                                                         \
        for (int i = 0; i < GROUP; i++) before[i] = 0;                                                            \
        for (int64_t j = 0; j < n; j++) {                                                                         \
          _Pragma("GCC unroll 4") for (int i = 0; i < GROUP; i++) {                                               \
            T u = gr[i][j] * wr[i][j];                                                                            \
            before[i] += u;                                                                                       \
            dr[i][j] = u - dr[i][j] * before[i];                                                                  \
          }                                                                                                       \
        }                                                                                                         \
      }                                                                                                           \
    }                                                                                                             \
  }

STICKBREAKING_ROWS(float, expf, FLT_MIN)
STICKBREAKING_ROWS(double, exp, DBL_MIN)
