/* Hyper-connections' stream products in C, one pass over each token's (n, d) streams (probe/models/hyper.py's
   _ReadStreams and _Write, the same products; probe/kernels/native.py builds this file). N tokens, n streams, d
   features, row-major and contiguous; the token loop is split across OpenMP threads (torch's libgomp), and each
   token's streams (n x d) stay in L1 while its products run, where torch's batched (n x n)(n x d) products are a
   loop of tiny matrix products and each backward term another pass over memory.

     read    h_t = sum_j w_tj X_tj                        backward: gw_tj = X_tj . g_t, gX_tj = w_tj g_t
     write   Y_ti = sum_j res_tij X_tj + post_ti f_t      backward: gX_tj = sum_i res_tij G_ti,
                                                                    gf_t = sum_i post_ti G_ti,
                                                                    gpost_ti = G_ti . f_t, gres_tij = G_ti . X_tj */
#include <stdint.h>

#define STREAMS(T)                                                                                                \
  void read_forward_##T(const T *w, const T *x, T *h, int64_t N, int64_t n, int64_t d, int threads) {             \
    _Pragma("omp parallel for num_threads(threads) schedule(static)") for (int64_t t = 0; t < N; t++) {           \
      const T *wt = w + t * n, *xt = x + t * n * d;                                                               \
      T *ht = h + t * d;                                                                                          \
      _Pragma("omp simd") for (int64_t k = 0; k < d; k++) ht[k] = wt[0] * xt[k];                                  \
      for (int64_t j = 1; j < n; j++) {                                                                           \
        _Pragma("omp simd") for (int64_t k = 0; k < d; k++) ht[k] += wt[j] * xt[j * d + k];                       \
      }                                                                                                           \
    }                                                                                                             \
  }                                                                                                               \
                                                                                                                  \
  /* gw or gx may be NULL: that gradient is not asked for */                                                      \
  void read_backward_##T(const T *w, const T *x, const T *g, T *gw, T *gx, int64_t N, int64_t n, int64_t d,       \
                         int threads) {                                                                           \
    _Pragma("omp parallel for num_threads(threads) schedule(static)") for (int64_t t = 0; t < N; t++) {           \
      const T *wt = w + t * n, *xt = x + t * n * d, *gt = g + t * d;                                              \
      for (int64_t j = 0; j < n; j++) {                                                                           \
        if (gw) {                                                                                                 \
          T dot = 0;                                                                                              \
          _Pragma("omp simd reduction(+ : dot)") for (int64_t k = 0; k < d; k++) dot += xt[j * d + k] * gt[k];    \
          gw[t * n + j] = dot;                                                                                    \
        }                                                                                                         \
        if (gx) {                                                                                                 \
          T *gxt = gx + (t * n + j) * d;                                                                          \
          _Pragma("omp simd") for (int64_t k = 0; k < d; k++) gxt[k] = wt[j] * gt[k];                             \
        }                                                                                                         \
      }                                                                                                           \
    }                                                                                                             \
  }                                                                                                               \
                                                                                                                  \
  void write_forward_##T(const T *x, const T *f, const T *post, const T *res, T *y, int64_t N, int64_t n,          \
                         int64_t d, int threads) {                                                                \
    _Pragma("omp parallel for num_threads(threads) schedule(static)") for (int64_t t = 0; t < N; t++) {           \
      const T *xt = x + t * n * d, *ft = f + t * d, *rt = res + t * n * n;                                        \
      for (int64_t i = 0; i < n; i++) {                                                                           \
        T *yti = y + (t * n + i) * d;                                                                             \
        _Pragma("omp simd") for (int64_t k = 0; k < d; k++) yti[k] = rt[i * n] * xt[k];                           \
        for (int64_t j = 1; j < n; j++) {                                                                         \
          _Pragma("omp simd") for (int64_t k = 0; k < d; k++) yti[k] += rt[i * n + j] * xt[j * d + k];            \
        }                                                                                                         \
        T p = post[t * n + i];                                                                                    \
        _Pragma("omp simd") for (int64_t k = 0; k < d; k++) yti[k] += p * ft[k];                                  \
      }                                                                                                           \
    }                                                                                                             \
  }                                                                                                               \
                                                                                                                  \
  /* any of gx, gf, gpost, gres may be NULL: that gradient is not asked for */                                    \
  void write_backward_##T(const T *g, const T *x, const T *f, const T *post, const T *res, T *gx, T *gf, T *gpost, \
                          T *gres, int64_t N, int64_t n, int64_t d, int threads) {                                \
    _Pragma("omp parallel for num_threads(threads) schedule(static)") for (int64_t t = 0; t < N; t++) {           \
      const T *gt = g + t * n * d, *xt = x + t * n * d, *ft = f + t * d, *rt = res + t * n * n;                   \
      if (gx) {                                                                                                   \
        for (int64_t j = 0; j < n; j++) {                                                                         \
          T *gxj = gx + (t * n + j) * d;                                                                          \
          _Pragma("omp simd") for (int64_t k = 0; k < d; k++) gxj[k] = rt[j] * gt[k];                             \
          for (int64_t i = 1; i < n; i++) {                                                                       \
            _Pragma("omp simd") for (int64_t k = 0; k < d; k++) gxj[k] += rt[i * n + j] * gt[i * d + k];          \
          }                                                                                                       \
        }                                                                                                         \
      }                                                                                                           \
      if (gf) {                                                                                                   \
        T *gft = gf + t * d;                                                                                      \
        _Pragma("omp simd") for (int64_t k = 0; k < d; k++) gft[k] = post[t * n] * gt[k];                         \
        for (int64_t i = 1; i < n; i++) {                                                                         \
          T p = post[t * n + i];                                                                                  \
          _Pragma("omp simd") for (int64_t k = 0; k < d; k++) gft[k] += p * gt[i * d + k];                        \
        }                                                                                                         \
      }                                                                                                           \
      for (int64_t i = 0; i < n; i++) {                                                                           \
        const T *gi = gt + i * d;                                                                                 \
        if (gpost) {                                                                                              \
          T dot = 0;                                                                                              \
          _Pragma("omp simd reduction(+ : dot)") for (int64_t k = 0; k < d; k++) dot += gi[k] * ft[k];            \
          gpost[t * n + i] = dot;                                                                                 \
        }                                                                                                         \
        if (gres) {                                                                                               \
          for (int64_t j = 0; j < n; j++) {                                                                       \
            T dot = 0;                                                                                            \
            _Pragma("omp simd reduction(+ : dot)") for (int64_t k = 0; k < d; k++) dot += gi[k] * xt[j * d + k];  \
            gres[(t * n + i) * n + j] = dot;                                                                      \
          }                                                                                                       \
        }                                                                                                         \
      }                                                                                                           \
    }                                                                                                             \
  }

STREAMS(float)
STREAMS(double)
