/* softpick's rows in C (fused.py's forward and backward, the same math; probe/kernels/native.py builds this file).
   s (rows, n) scores, hidden keys -inf; per row the forward keeps den, m and top for the backward:
     top = max_j s_j   m = max(0, top)   e_j = exp(s_j - m) - exp(-m) (0 on hidden keys)
     den = sum_j |e_j| + eps             a_j = max(e_j, 0) / den  (0 where s_j <= 0: e_j has the sign of s_j, also
                                                                where exp's clamp moved e_j by its 1e-38)
   backward, with g = dL/da and c = sum_j g_j a_j:
     ds_j = ((s_j > 0 ? g_j : 0) - c sign(s_j)) / den * exp(s_j - m)  (0 on hidden keys)
            + [s_j = top] (-eps c / den) / #{j: s_j = top}             (where top > 0: the gradient through m) */
#include "native_rows.h"

#define SOFTPICK_ROWS(T, EXP, ABS)                                                                                  \
  void softpick_forward_##T(const T *s, T *a, T *den, T *m_out, T *top_out, int64_t rows, int64_t n, double eps,   \
                            int threads) {                                                                        \
    _Pragma("omp parallel for num_threads(threads) schedule(static)") for (int64_t r = 0; r < rows; r++) {        \
      const T *sr = s + r * n;                                                                                    \
      T *ar = a + r * n;                                                                                          \
      T top = -INFINITY;                                                                                          \
      _Pragma("omp simd reduction(max : top)") for (int64_t j = 0; j < n; j++) top = sr[j] > top ? sr[j] : top;  \
      T m = top > 0 ? top : 0, em = EXP(-m), sum = 0;                                                              \
      _Pragma("omp simd") for (int64_t j = 0; j < n; j++) ar[j] = sr[j] - m;                                     \
      CLAMP_ROW(T, ar, ar, n)                                                                                     \
      EXP_ROW(T, EXP, ar, n)                                                                                      \
      _Pragma("omp simd reduction(+ : sum)") for (int64_t j = 0; j < n; j++) {                                    \
        T e = sr[j] == -INFINITY ? 0 : ar[j] - em;                                                                \
        ar[j] = e;                                                                                                \
        sum += ABS(e);                                                                                            \
      }                                                                                                           \
      T d = sum + (T)eps;                                                                                         \
      _Pragma("omp simd") for (int64_t j = 0; j < n; j++) ar[j] = (sr[j] > 0 && ar[j] > 0 ? ar[j] : 0) / d;     \
      den[r] = d, m_out[r] = m, top_out[r] = top;                                                                 \
    }                                                                                                             \
  }                                                                                                               \
                                                                                                                  \
  void softpick_backward_##T(const T *g, const T *s, const T *a, const T *den, const T *m, const T *top, T *ds,    \
                             int64_t rows, int64_t n, double eps, int threads) {                                  \
    _Pragma("omp parallel for num_threads(threads) schedule(static)") for (int64_t r = 0; r < rows; r++) {        \
      const T *gr = g + r * n, *sr = s + r * n, *ar = a + r * n;                                                  \
      T *dr = ds + r * n;                                                                                         \
      T c = 0, d = den[r], tp = top[r], at_top = 0;                                                               \
      _Pragma("omp simd reduction(+ : c)") for (int64_t j = 0; j < n; j++) c += gr[j] * ar[j];                    \
      if (tp > 0) { /* the keys at the max share m's gradient, as autograd shares an amax's */                   \
        int64_t count = 0;                                                                                        \
        _Pragma("omp simd reduction(+ : count)") for (int64_t j = 0; j < n; j++) count += sr[j] == tp;            \
        at_top = -(T)eps * c / d / (T)count;                                                                      \
      }                                                                                                           \
      _Pragma("omp simd") for (int64_t j = 0; j < n; j++) dr[j] = sr[j] - m[r];                                  \
      CLAMP_ROW(T, dr, dr, n)                                                                                     \
      EXP_ROW(T, EXP, dr, n)                                                                                      \
      _Pragma("omp simd") for (int64_t j = 0; j < n; j++) {                                                       \
        T sj = sr[j], sign = sj > 0 ? 1 : (sj < 0 ? -1 : 0);                                                      \
        T grad = ((sj > 0 ? gr[j] : 0) - c * sign) / d * dr[j];                                                   \
        dr[j] = (sj == -INFINITY ? grad * 0 : grad) + (sj == tp ? at_top : 0); /* 0, or NaN as torch's */        \
      }                                                                                                           \
    }                                                                                                             \
  }

SOFTPICK_ROWS(float, expf, fabsf)
SOFTPICK_ROWS(double, exp, fabs)
