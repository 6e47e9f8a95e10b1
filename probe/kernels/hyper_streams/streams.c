/* Hyper-connections' stream products in C, one pass over each token's (n, d) streams (probe/models/hyper.py's
   _ReadStreams and _Write, the same products; probe/kernels/native.py builds this file). N tokens, n streams, d
   features, row-major and contiguous; the token loop is split across OpenMP threads (torch's libgomp), and each
   token's streams (n x d) stay in L1 while its products run, where torch's batched (n x n)(n x d) products are a
   loop of tiny matrix products and each backward term another pass over memory.

     read    h_t = sum_j w_tj X_tj                        backward: gw_tj = X_tj . g_t, gX_tj = w_tj g_t
     write   Y_ti = sum_j res_tij X_tj + post_ti f_t      backward: gX_tj = sum_i res_tij G_ti,
                                                                    gf_t = sum_i post_ti G_ti,
                                                                    gpost_ti = G_ti . f_t, gres_tij = G_ti . X_tj
     boundary  one sub-layer's write and the next read's projections of its output (probe/models/hyper_boundary.py),
               forward and backward, in one pass over each token's streams

   The many short dot products (a token's n x n + n weight gradients, the projections) run eight at a time
   (``dots``): one dot is a chain of dependent vector adds ended by a horizontal sum, and that chain, not memory,
   was what the backward waited on. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define AHEAD 2 /* tokens: how far ahead of its products a token's rows are asked for (fetch) */

#define OFFSET(p, off) ((p) ? (p) + (off) : 0) /* a row of an optional output, NULL where it is not asked for */

#define HELPERS(T)                                                                                                \
  /* out[r] = v . rows[r] for r < cnt (len values each), eight rows per pass over v; four where four or fewer are \
     left (a token's n read-weight dots) */                                                                       \
  static inline void dots_##T(const T *v, const T *const *rows, int64_t cnt, int64_t len, T *out) {               \
    int64_t r0 = 0;                                                                                               \
    for (; cnt - r0 > 4; r0 += 8) {                                                                               \
      const T *p[8];                                                                                              \
      for (int r = 0; r < 8; r++) p[r] = rows[r0 + r < cnt ? r0 + r : cnt - 1]; /* past cnt: dropped */           \
      const T *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3], *p4 = p[4], *p5 = p[5], *p6 = p[6], *p7 = p[7];     \
      T a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;                                           \
      _Pragma("omp simd reduction(+ : a0, a1, a2, a3, a4, a5, a6, a7)") for (int64_t e = 0; e < len; e++) {       \
        T x_ = v[e];                                                                                              \
        a0 += x_ * p0[e], a1 += x_ * p1[e], a2 += x_ * p2[e], a3 += x_ * p3[e];                                   \
        a4 += x_ * p4[e], a5 += x_ * p5[e], a6 += x_ * p6[e], a7 += x_ * p7[e];                                   \
      }                                                                                                           \
      T a[8] = {a0, a1, a2, a3, a4, a5, a6, a7};                                                                  \
      for (int r = 0; r < 8 && r0 + r < cnt; r++) out[r0 + r] = a[r];                                             \
    }                                                                                                             \
    if (r0 < cnt) {                                                                                               \
      const T *p0 = rows[r0], *p1 = rows[r0 + 1 < cnt ? r0 + 1 : r0], *p2 = rows[r0 + 2 < cnt ? r0 + 2 : r0];     \
      const T *p3 = rows[r0 + 3 < cnt ? r0 + 3 : r0]; /* past cnt: dropped */                                     \
      T a0 = 0, a1 = 0, a2 = 0, a3 = 0;                                                                           \
      _Pragma("omp simd reduction(+ : a0, a1, a2, a3)") for (int64_t e = 0; e < len; e++) {                       \
        T x_ = v[e];                                                                                              \
        a0 += x_ * p0[e], a1 += x_ * p1[e], a2 += x_ * p2[e], a3 += x_ * p3[e];                                   \
      }                                                                                                           \
      T a[4] = {a0, a1, a2, a3};                                                                                  \
      for (int r = 0; r < 4 && r0 + r < cnt; r++) out[r0 + r] = a[r];                                             \
    }                                                                                                             \
  }                                                                                                               \
                                                                                                                  \
  /* b += sum_r s[r] rows[r] (r < cnt, len values each), one pass over b per eight rows */                        \
  static inline void spread_##T(T *b, const T *s, const T *const *rows, int64_t cnt, int64_t len) {               \
    for (int64_t r0 = 0; r0 < cnt; r0 += 8) {                                                                     \
      const T *p[8];                                                                                              \
      T w[8];                                                                                                     \
      for (int r = 0; r < 8; r++) {                                                                               \
        p[r] = rows[r0 + r < cnt ? r0 + r : cnt - 1];                                                             \
        w[r] = r0 + r < cnt ? s[r0 + r] : 0; /* past cnt: weighs 0 */                                             \
      }                                                                                                           \
      const T *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3], *p4 = p[4], *p5 = p[5], *p6 = p[6], *p7 = p[7];     \
      T w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3], w4 = w[4], w5 = w[5], w6 = w[6], w7 = w[7];                   \
      _Pragma("omp simd") for (int64_t e = 0; e < len; e++) b[e] +=                                               \
          w0 * p0[e] + w1 * p1[e] + w2 * p2[e] + w3 * p3[e] + w4 * p4[e] + w5 * p5[e] + w6 * p6[e] + w7 * p7[e];  \
    }                                                                                                             \
  }                                                                                                               \
                                                                                                                  \
  /* out[q][r] = v[q] . rows[r] for four vectors q and r < cnt: four rows by four vectors per pass, so each value  \
     loaded serves four products (the projections of a block of tokens share their weight rows); a last one or two \
     rows by four vectors alone, not padded to four (a token's n + 1 write-gradient rows, dynamic HC's 2 + n) */   \
  static inline void dots4_##T(const T *const *v, const T *const *rows, int64_t cnt, int64_t len, T *const *out) { \
    const T *v0 = v[0], *v1 = v[1], *v2 = v[2], *v3 = v[3];                                                        \
    int64_t r0 = 0;                                                                                                \
    for (; cnt - r0 >= 3; r0 += 4) {                                                                               \
      const T *p0 = rows[r0], *p1 = rows[r0 + 1], *p2 = rows[r0 + 2];                                              \
      const T *p3 = rows[r0 + 3 < cnt ? r0 + 3 : r0]; /* three left: the fourth dropped */                         \
      T a00 = 0, a01 = 0, a02 = 0, a03 = 0, a10 = 0, a11 = 0, a12 = 0, a13 = 0;                                    \
      T a20 = 0, a21 = 0, a22 = 0, a23 = 0, a30 = 0, a31 = 0, a32 = 0, a33 = 0;                                    \
      _Pragma("omp simd reduction(+ : a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32,   \
                                       a33)") for (int64_t e = 0; e < len; e++) {                                  \
        T q0 = p0[e], q1 = p1[e], q2 = p2[e], q3 = p3[e], x_;                                                      \
        x_ = v0[e], a00 += x_ * q0, a01 += x_ * q1, a02 += x_ * q2, a03 += x_ * q3;                                \
        x_ = v1[e], a10 += x_ * q0, a11 += x_ * q1, a12 += x_ * q2, a13 += x_ * q3;                                \
        x_ = v2[e], a20 += x_ * q0, a21 += x_ * q1, a22 += x_ * q2, a23 += x_ * q3;                                \
        x_ = v3[e], a30 += x_ * q0, a31 += x_ * q1, a32 += x_ * q2, a33 += x_ * q3;                                \
      }                                                                                                            \
      T a[4][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23}, {a30, a31, a32, a33}};        \
      for (int q = 0; q < 4; q++)                                                                                  \
        for (int r = 0; r < 4 && r0 + r < cnt; r++) out[q][r0 + r] = a[q][r];                                      \
    }                                                                                                              \
    if (cnt - r0 == 2) {                                                                                           \
      const T *p0 = rows[r0], *p1 = rows[r0 + 1];                                                                  \
      T a00 = 0, a01 = 0, a10 = 0, a11 = 0, a20 = 0, a21 = 0, a30 = 0, a31 = 0;                                    \
      _Pragma("omp simd reduction(+ : a00, a01, a10, a11, a20, a21, a30, a31)")                                   \
      for (int64_t e = 0; e < len; e++) {                                                                         \
        T q0 = p0[e], q1 = p1[e];                                                                                  \
        a00 += v0[e] * q0, a01 += v0[e] * q1, a10 += v1[e] * q0, a11 += v1[e] * q1;                                \
        a20 += v2[e] * q0, a21 += v2[e] * q1, a30 += v3[e] * q0, a31 += v3[e] * q1;                                \
      }                                                                                                            \
      out[0][r0] = a00, out[0][r0 + 1] = a01, out[1][r0] = a10, out[1][r0 + 1] = a11;                              \
      out[2][r0] = a20, out[2][r0 + 1] = a21, out[3][r0] = a30, out[3][r0 + 1] = a31;                              \
    } else if (cnt - r0 == 1) {                                                                                    \
      const T *p0 = rows[r0];                                                                                      \
      T a0 = 0, a1 = 0, a2 = 0, a3 = 0;                                                                            \
      _Pragma("omp simd reduction(+ : a0, a1, a2, a3)") for (int64_t e = 0; e < len; e++) {                        \
        T q0 = p0[e];                                                                                              \
        a0 += v0[e] * q0, a1 += v1[e] * q0, a2 += v2[e] * q0, a3 += v3[e] * q0;                                    \
      }                                                                                                            \
      out[0][r0] = a0, out[1][r0] = a1, out[2][r0] = a2, out[3][r0] = a3;                                          \
    }                                                                                                              \
  }                                                                                                                \
                                                                                                                   \
  /* b[q] += sum_r s[q][r] rows[r] for four buffers q (r < cnt, len values each), four rows per pass; a last      \
     one or two rows alone, not padded to four */                                                                 \
  static inline void spread4_##T(T *const *b, const T *const *s, const T *const *rows, int64_t cnt, int64_t len) { \
    T *b0 = b[0], *b1 = b[1], *b2 = b[2], *b3 = b[3];                                                             \
    int64_t r0 = 0;                                                                                               \
    for (; cnt - r0 >= 3; r0 += 4) {                                                                              \
      const T *p[4];                                                                                              \
      T w[4][4];                                                                                                  \
      for (int r = 0; r < 4; r++) {                                                                               \
        p[r] = rows[r0 + r < cnt ? r0 + r : r0];                                                                  \
        for (int q = 0; q < 4; q++) /* three left: the fourth weighs 0 */                                         \
          w[q][r] = r0 + r < cnt ? s[q][r0 + r] : 0;                                                              \
      }                                                                                                           \
      const T *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3];                                                     \
      _Pragma("omp simd") for (int64_t e = 0; e < len; e++) {                                                     \
        T q0 = p0[e], q1 = p1[e], q2 = p2[e], q3 = p3[e];                                                         \
        b0[e] += w[0][0] * q0 + w[0][1] * q1 + w[0][2] * q2 + w[0][3] * q3;                                       \
        b1[e] += w[1][0] * q0 + w[1][1] * q1 + w[1][2] * q2 + w[1][3] * q3;                                       \
        b2[e] += w[2][0] * q0 + w[2][1] * q1 + w[2][2] * q2 + w[2][3] * q3;                                       \
        b3[e] += w[3][0] * q0 + w[3][1] * q1 + w[3][2] * q2 + w[3][3] * q3;                                       \
      }                                                                                                           \
    }                                                                                                             \
    if (cnt - r0 == 2) {                                                                                          \
      const T *p0 = rows[r0], *p1 = rows[r0 + 1];                                                                 \
      T w00 = s[0][r0], w01 = s[0][r0 + 1], w10 = s[1][r0], w11 = s[1][r0 + 1];                                   \
      T w20 = s[2][r0], w21 = s[2][r0 + 1], w30 = s[3][r0], w31 = s[3][r0 + 1];                                   \
      _Pragma("omp simd") for (int64_t e = 0; e < len; e++) {                                                     \
        T q0 = p0[e], q1 = p1[e];                                                                                 \
        b0[e] += w00 * q0 + w01 * q1, b1[e] += w10 * q0 + w11 * q1;                                               \
        b2[e] += w20 * q0 + w21 * q1, b3[e] += w30 * q0 + w31 * q1;                                               \
      }                                                                                                           \
    } else if (cnt - r0 == 1) {                                                                                   \
      const T *p0 = rows[r0];                                                                                     \
      T w0 = s[0][r0], w1 = s[1][r0], w2 = s[2][r0], w3 = s[3][r0];                                               \
      _Pragma("omp simd") for (int64_t e = 0; e < len; e++) {                                                     \
        T q0 = p0[e];                                                                                             \
        b0[e] += w0 * q0, b1[e] += w1 * q0, b2[e] += w2 * q0, b3[e] += w3 * q0;                                   \
      }                                                                                                           \
    }                                                                                                             \
  }                                                                                                               \
                                                                                                                  \
  /* a block of nb <= 4 tokens: dots4 / spread4 for a full block, dots / spread token by token for the last */     \
  static inline void dots_block_##T(const T *const *v, const T *const *rows, int64_t cnt, int64_t len,             \
                                    T *const *out, int64_t nb) {                                                   \
    if (nb == 4)                                                                                                   \
      dots4_##T(v, rows, cnt, len, out);                                                                           \
    else                                                                                                           \
      for (int64_t q = 0; q < nb; q++) dots_##T(v[q], rows, cnt, len, out[q]);                                     \
  }                                                                                                                \
                                                                                                                   \
  static inline void spread_block_##T(T *const *b, const T *const *s, const T *const *rows, int64_t cnt,           \
                                      int64_t len, int64_t nb) {                                                   \
    if (nb == 4)                                                                                                   \
      spread4_##T(b, s, rows, cnt, len);                                                                           \
    else                                                                                                           \
      for (int64_t q = 0; q < nb; q++) spread_##T(b[q], s[q], rows, cnt, len);                                     \
  }                                                                                                                \
                                                                                                                   \
  /* ask for the cache lines of len values at p before they are read (a later token's rows, while this token's    \
     products run: the memory's latency hidden behind them) */                                                    \
  static inline void fetch_##T(const T *p, int64_t len) {                                                         \
    for (int64_t e = 0; e < len; e += 64 / (int64_t)sizeof(T)) __builtin_prefetch(p + e);                         \
  }                                                                                                               \
                                                                                                                  \
  /* y = sum_j w_j x_j (n rows of d) */                                                                           \
  static inline void mix_##T(T *y, const T *w, const T *x, int64_t n, int64_t d) {                                \
    _Pragma("omp simd") for (int64_t e = 0; e < d; e++) y[e] = w[0] * x[e];                                       \
    for (int64_t j = 1; j < n; j++) {                                                                             \
      _Pragma("omp simd") for (int64_t e = 0; e < d; e++) y[e] += w[j] * x[j * d + e];                            \
    }                                                                                                             \
  }                                                                                                               \
                                                                                                                  \
  /* token t's write: Y_i = sum_j res_ij X_j + post_i f (x: n x d, f: d, post: n, res: n x n, y: n x d) */        \
  static inline void write_token_##T(const T *x, const T *f, const T *post, const T *res, T *y, int64_t n,        \
                                     int64_t d) {                                                                 \
    for (int64_t i = 0; i < n; i++) {                                                                             \
      T *yi = y + i * d, p_ = post[i];                                                                            \
      mix_##T(yi, res + i * n, x, n, d);                                                                          \
      _Pragma("omp simd") for (int64_t e = 0; e < d; e++) yi[e] += p_ * f[e];                                     \
    }                                                                                                             \
  }                                                                                                               \
                                                                                                                  \
  /* token t's write backward from G (g: n x d); gx, gf, gpost, gres may be NULL (not asked for) */               \
  static inline void write_backward_token_##T(const T *g, const T *x, const T *f, const T *post, const T *res,    \
                                              T *gx, T *gf, T *gpost, T *gres, int64_t n, int64_t d) {            \
    if (gx) {                                                                                                     \
      for (int64_t j = 0; j < n; j++) {                                                                           \
        T *gxj = gx + j * d;                                                                                      \
        _Pragma("omp simd") for (int64_t e = 0; e < d; e++) gxj[e] = res[j] * g[e];                               \
        for (int64_t i = 1; i < n; i++) {                                                                         \
          T r_ = res[i * n + j];                                                                                  \
          _Pragma("omp simd") for (int64_t e = 0; e < d; e++) gxj[e] += r_ * g[i * d + e];                        \
        }                                                                                                         \
      }                                                                                                           \
    }                                                                                                             \
    if (gf) mix_##T(gf, post, g, n, d);                                                                           \
    if (gpost || gres) { /* G_i . X_j (j < n) and G_i . f, n + 1 dots per output stream */                       \
      const T *rows[n + 1];                                                                                       \
      for (int64_t j = 0; j < n; j++) rows[j] = x + j * d;                                                        \
      rows[n] = f;                                                                                                \
      for (int64_t i0 = 0; i0 < n; i0 += 4) { /* four output streams per pass over the rows */                 \
        int64_t nb = n - i0 < 4 ? n - i0 : 4;                                                                     \
        const T *v[4];                                                                                            \
        T outs[4][n + 1], *o[4];                                                                                  \
        for (int64_t q = 0; q < nb; q++) v[q] = g + (i0 + q) * d, o[q] = outs[q];                                 \
        dots_block_##T(v, rows, n + 1, d, o, nb);                                                                 \
        for (int64_t q = 0; q < nb; q++) {                                                                        \
          if (gres)                                                                                               \
            for (int64_t j = 0; j < n; j++) gres[(i0 + q) * n + j] = outs[q][j];                                  \
          if (gpost) gpost[i0 + q] = outs[q][n];                                                                  \
        }                                                                                                         \
      }                                                                                                           \
    }                                                                                                             \
  }

#define STREAMS(T)                                                                                                \
  HELPERS(T)                                                                                                      \
                                                                                                                  \
  void read_forward_##T(const T *w, const T *x, T *h, int64_t N, int64_t n, int64_t d, int threads) {             \
    _Pragma("omp parallel for num_threads(threads) schedule(static)") for (int64_t t = 0; t < N; t++) {           \
      if (t + AHEAD < N) fetch_##T(x + (t + AHEAD) * n * d, n * d);                                               \
      mix_##T(h + t * d, w + t * n, x + t * n * d, n, d);                                                         \
    }                                                                                                             \
  }                                                                                                               \
                                                                                                                  \
  /* gw or gx may be NULL: that gradient is not asked for */                                                      \
  void read_backward_##T(const T *w, const T *x, const T *g, T *gw, T *gx, int64_t N, int64_t n, int64_t d,       \
                         int threads) {                                                                           \
    _Pragma("omp parallel for num_threads(threads) schedule(static)") for (int64_t t = 0; t < N; t++) {           \
      if (t + AHEAD < N) fetch_##T(x + (t + AHEAD) * n * d, n * d), fetch_##T(g + (t + AHEAD) * d, d);            \
      const T *wt = w + t * n, *xt = x + t * n * d, *gt = g + t * d;                                              \
      if (gw) {                                                                                                   \
        const T *rows[n];                                                                                         \
        for (int64_t j = 0; j < n; j++) rows[j] = xt + j * d;                                                     \
        dots_##T(gt, rows, n, d, gw + t * n);                                                                     \
      }                                                                                                           \
      for (int64_t j = 0; j < n && gx; j++) {                                                                     \
        T *gxt = gx + (t * n + j) * d;                                                                            \
        _Pragma("omp simd") for (int64_t e = 0; e < d; e++) gxt[e] = wt[j] * gt[e];                               \
      }                                                                                                           \
    }                                                                                                             \
  }                                                                                                               \
                                                                                                                  \
  void write_forward_##T(const T *x, const T *f, const T *post, const T *res, T *y, int64_t N, int64_t n,          \
                         int64_t d, int threads) {                                                                \
    _Pragma("omp parallel for num_threads(threads) schedule(static)") for (int64_t t = 0; t < N; t++) {           \
      if (t + AHEAD < N) fetch_##T(x + (t + AHEAD) * n * d, n * d), fetch_##T(f + (t + AHEAD) * d, d);            \
      write_token_##T(x + t * n * d, f + t * d, post + t * n, res + t * n * n, y + t * n * d, n, d);              \
    }                                                                                                             \
  }                                                                                                               \
                                                                                                                  \
  /* any of gx, gf, gpost, gres may be NULL: that gradient is not asked for */                                    \
  void write_backward_##T(const T *g, const T *x, const T *f, const T *post, const T *res, T *gx, T *gf, T *gpost, \
                          T *gres, int64_t N, int64_t n, int64_t d, int threads) {                                \
    _Pragma("omp parallel for num_threads(threads) schedule(static)") for (int64_t t = 0; t < N; t++) {           \
      if (t + AHEAD < N) {                                                                                        \
        int64_t u = t + AHEAD;                                                                                    \
        fetch_##T(g + u * n * d, n * d), fetch_##T(x + u * n * d, n * d), fetch_##T(f + u * d, d);                \
      }                                                                                                           \
      write_backward_token_##T(g + t * n * d, x + t * n * d, f + t * d, post + t * n, res + t * n * n,            \
                               OFFSET(gx, t * n * d), OFFSET(gf, t * d), OFFSET(gpost, t * n),                    \
                               OFFSET(gres, t * n * n), n, d);                                                    \
    }                                                                                                             \
  }                                                                                                               \
                                                                                                                  \
  /* A boundary: the write Y = res X + post f, and, for k > 0, each of its G groups' (L = n d / G values) inverse  \
     rms and k projections y_g . proj[kk] (proj: k x L); then the read sum_j pre_j Y_j, all while the tokens' Y    \
     sit in L1. Tokens go in blocks of four, whose projections share each load of proj's rows (dots4). The read's  \
     weights pre (n per token) are given (rule 0: they do not depend on Y) or follow from logit                    \
     z_j = dots[j step] inv_rms (the j step-th of the token's G x k projections, group (j step) / k): rule 1,      \
     pre_j = sigmoid(a z_j + b_j) + pre_eps (mHC); rule 2, pre_j = b_j + a tanh(z_j) (dynamic HC); each written to \
     pre_out with its slope d pre_j / d z_j for the backward */                                                    \
  void boundary_forward_##T(const T *x, const T *f, const T *post, const T *res, const T *proj, const T *pre,      \
                            const T *b, T *y, T *dots, T *inv_rms, T *read, T *pre_out, T *slope, int64_t N,       \
                            int64_t n, int64_t d, int64_t G, int64_t k, int64_t rule, int64_t step, double eps,    \
                            double a, double pre_eps, int threads) {                                               \
    int64_t L = n * d / G;                                                                                         \
    const T *rows[k > 0 ? k : 1];                                                                                  \
    for (int64_t kk = 0; kk < k; kk++) rows[kk] = proj + kk * L;                                                   \
    _Pragma("omp parallel for num_threads(threads) schedule(static)") for (int64_t t0 = 0; t0 < N; t0 += 4) {      \
      int64_t nb = N - t0 < 4 ? N - t0 : 4;                                                                        \
      for (int64_t t = t0; t < t0 + nb; t++) {                                                                     \
        if (t + AHEAD < N) fetch_##T(x + (t + AHEAD) * n * d, n * d), fetch_##T(f + (t + AHEAD) * d, d);          \
        T *yt = y + t * n * d;                                                                                     \
        write_token_##T(x + t * n * d, f + t * d, post + t * n, res + t * n * n, yt, n, d);                        \
        for (int64_t g = 0; g < G && k > 0; g++) {                                                                 \
          const T *yg = yt + g * L;                                                                                \
          T ss = 0;                                                                                                \
          _Pragma("omp simd reduction(+ : ss)") for (int64_t e = 0; e < L; e++) ss += yg[e] * yg[e];               \
          inv_rms[t * G + g] = (T)1 / sqrt(ss / (T)L + (T)eps);                                                    \
        }                                                                                                          \
      }                                                                                                            \
      for (int64_t g = 0; g < G && k > 0; g++) { /* the block's projections, group by group */                     \
        const T *v[4];                                                                                             \
        T *o[4];                                                                                                   \
        for (int64_t q = 0; q < nb; q++)                                                                           \
          v[q] = y + (t0 + q) * n * d + g * L, o[q] = dots + ((t0 + q) * G + g) * k;                               \
        dots_block_##T(v, rows, k, L, o, nb);                                                                      \
      }                                                                                                            \
      for (int64_t t = t0; t < t0 + nb; t++) {                                                                     \
        const T *pt = pre ? pre + t * n : pre_out + t * n;                                                         \
        for (int64_t j = 0; j < n && rule > 0; j++) {                                                              \
          int64_t at = j * step;                                                                                   \
          T z = dots[t * G * k + at] * inv_rms[t * G + at / k], v;                                                 \
          if (rule == 1) {                                                                                         \
            T s = (T)1 / ((T)1 + exp(-(z * (T)a + b[j])));                                                         \
            v = s + (T)pre_eps, slope[t * n + j] = s * ((T)1 - s) * (T)a;                                          \
          } else {                                                                                                 \
            T h = tanh(z);                                                                                         \
            v = b[j] + (T)a * h, slope[t * n + j] = (T)a * ((T)1 - h * h);                                         \
          }                                                                                                        \
          pre_out[t * n + j] = v;                                                                                  \
        }                                                                                                          \
        mix_##T(read + t * d, pt, y + t * n * d, n, d);                                                            \
      }                                                                                                            \
    }                                                                                                              \
  }                                                                                                                \
                                                                                                                   \
  /* Its backward: per token, Y's whole gradient gY = G (NULL: none) + pre (x) gread + for each group              \
     gdots[g] proj + coeff[g] y_g, kept in a buffer, then the write's backward from gY; tokens in blocks of four,  \
     whose buffers take the projection's share together (spread4). The projection's share comes from the logits'   \
     gradient glogits (z = dots r, r = 1 / rms(y_g): gdots = gl r, written out for the caller's gradient of proj,  \
     and coeff = -r^3 / L gl . dots). gpre, the read's weights' gradient Y_j . gread, comes from X and f where the \
     weights do not depend on Y (k = 0: sum_i res_ji X_i . gread + post_j f . gread, so Y is neither read nor      \
     recomputed), else from Y; where they do (slope given, rules 1 and 2), its share of the logits' gradient is    \
     added to glogits, in place, first. Returns 1 where the buffers could not be allocated. */                     \
  int boundary_backward_##T(const T *gy, const T *gread, const T *pre, const T *y, const T *x, const T *f,         \
                            const T *post, const T *res, const T *proj, const T *dots, const T *inv_rms,           \
                            const T *slope, T *glogits, T *gdots, T *gx, T *gf, T *gpost, T *gres, T *gpre,        \
                            int64_t N, int64_t n, int64_t d, int64_t G, int64_t k, int64_t step, int threads) {    \
    int64_t L = n * d / G;                                                                                         \
    const T *rows[k > 0 ? k : 1];                                                                                  \
    for (int64_t kk = 0; kk < k; kk++) rows[kk] = proj + kk * L;                                                   \
    int failed = 0;                                                                                                \
    _Pragma("omp parallel num_threads(threads)") {                                                                 \
      T *buf = malloc(sizeof(T) * 4 * n * d);                                                                      \
      if (!buf) {                                                                                                  \
        _Pragma("omp atomic write") failed = 1;                                                                    \
      } else {                                                                                                     \
        const T *streams[n + 1];                                                                                   \
        T coeff[G]; /* a token's groups' share of gY along y_g: d (1 / rms(y_g)) / dy_g */                         \
        _Pragma("omp for schedule(static)") for (int64_t t0 = 0; t0 < N; t0 += 4) {                                \
          int64_t nb = N - t0 < 4 ? N - t0 : 4;                                                                    \
          for (int64_t t = t0; t < t0 + nb; t++) {                                                                 \
            if (t + AHEAD < N) {                                                                                   \
              int64_t u = t + AHEAD;                                                                               \
              fetch_##T(x + u * n * d, n * d), fetch_##T(f + u * d, d), fetch_##T(gread + u * d, d);               \
              if (gy) fetch_##T(gy + u * n * d, n * d);                                                            \
              if (k > 0) fetch_##T(y + u * n * d, n * d);                                                          \
            }                                                                                                      \
            const T *yt = y + t * n * d, *gr = gread + t * d;                                                      \
            T *bt = buf + (t - t0) * n * d;                                                                        \
            if (gpre && k == 0) { /* Y_j . gread = sum_i res_ji (X_i . gread) + post_j (f . gread): no Y read */  \
              T a[n + 1];                                                                                          \
              for (int64_t j = 0; j < n; j++) streams[j] = x + t * n * d + j * d;                                  \
              streams[n] = f + t * d;                                                                              \
              dots_##T(gr, streams, n + 1, d, a);                                                                  \
              for (int64_t j = 0; j < n; j++) {                                                                    \
                T s_ = post[t * n + j] * a[n];                                                                     \
                for (int64_t i = 0; i < n; i++) s_ += res[(t * n + j) * n + i] * a[i];                             \
                gpre[t * n + j] = s_;                                                                              \
              }                                                                                                    \
            } else if (gpre) {                                                                                     \
              for (int64_t j = 0; j < n; j++) streams[j] = yt + j * d;                                             \
              dots_##T(gr, streams, n, d, gpre + t * n);                                                           \
            }                                                                                                      \
            for (int64_t j = 0; j < n && slope && gpre; j++) /* pre's share of the logits' gradient */             \
              glogits[t * G * k + j * step] += gpre[t * n + j] * slope[t * n + j];                                 \
            for (int64_t g = 0; g < G && k > 0; g++) { /* z = dots r, r = 1 / rms(y_g): gl r, -r^3 / L gl.dots */  \
              const T *gl = glogits + (t * G + g) * k, *dt = dots + (t * G + g) * k, r = inv_rms[t * G + g];       \
              T *gd = gdots + (t * G + g) * k, c_ = 0;                                                             \
              for (int64_t kk = 0; kk < k; kk++) gd[kk] = gl[kk] * r, c_ += gl[kk] * dt[kk];                       \
              coeff[g] = -c_ * r * r * r / (T)L;                                                                   \
            }                                                                                                      \
            for (int64_t i = 0; i < n; i++) {                                                                      \
              T p_ = pre[t * n + i], *bi = bt + i * d;                                                             \
              const T *gi = gy ? gy + (t * n + i) * d : 0;                                                         \
              if (gi) {                                                                                            \
                _Pragma("omp simd") for (int64_t e = 0; e < d; e++) bi[e] = gi[e] + p_ * gr[e];                    \
              } else {                                                                                             \
                _Pragma("omp simd") for (int64_t e = 0; e < d; e++) bi[e] = p_ * gr[e];                            \
              }                                                                                                    \
            }                                                                                                      \
            for (int64_t g = 0; g < G && k > 0; g++) {                                                             \
              T *bg = bt + g * L, c_ = coeff[g];                                                                   \
              const T *yg = yt + g * L;                                                                            \
              _Pragma("omp simd") for (int64_t e = 0; e < L; e++) bg[e] += c_ * yg[e];                             \
            }                                                                                                      \
          }                                                                                                        \
          for (int64_t g = 0; g < G && k > 0; g++) { /* the projection's share, group by group */                  \
            T *bq[4];                                                                                              \
            const T *sq[4];                                                                                        \
            for (int64_t q = 0; q < nb; q++)                                                                       \
              bq[q] = buf + q * n * d + g * L, sq[q] = gdots + ((t0 + q) * G + g) * k;                             \
            spread_block_##T(bq, sq, rows, k, L, nb);                                                              \
          }                                                                                                        \
          for (int64_t t = t0; t < t0 + nb; t++)                                                                   \
            write_backward_token_##T(buf + (t - t0) * n * d, x + t * n * d, f + t * d, post + t * n,               \
                                     res + t * n * n, OFFSET(gx, t * n * d), OFFSET(gf, t * d),                    \
                                     OFFSET(gpost, t * n), OFFSET(gres, t * n * n), n, d);                         \
        }                                                                                                          \
        free(buf);                                                                                                 \
      }                                                                                                            \
    }                                                                                                              \
    return failed;                                                                                                 \
  }

STREAMS(float)
STREAMS(double)
