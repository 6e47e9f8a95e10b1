/* What probe's C row kernels share (probe/kernels/native.py builds each kernel file with this header beside it).

   Each kernel file defines its functions for float and double through one macro taking the element type T and the
   names below. Rows are independent: the row loop is split across OpenMP threads (torch's own libgomp, whose soname
   the kernels' link shares, so one thread pool serves both), each row (at most a few thousand keys) stays in L1/L2
   while its passes run, so a rule's forward or backward reads and writes each T x T tensor once.

   exp is glibc's vector exp (libmvec) where the build links it (PROBE_LIBMVEC): gcc calls it for 8 or 16 lanes at a
   time once expf/exp are declared SIMD-callable and errno is off (-fno-math-errno). Its fast path ends at the
   underflow and overflow bounds, and one lane out of range sends the whole vector to the scalar path, tens of times
   slower; so every argument is first clamped into [EXP_LO, EXP_HI] in a loop of its own (a clamp inside exp's
   argument is if-converted by gcc into exp of the unclamped value). exp(EXP_LO) is the smallest normal float's
   order (1.6e-38; 3e-308 for double), exp(EXP_HI) its inverse: a result the clamp changes moves by less than
   1e-37 (6e-307) in a sigmoid or a shifted exp, and each kernel sends the
   keys a row cannot see (-inf) to their exact values by a select. */
#include <math.h>
#include <stdint.h>

#ifdef PROBE_LIBMVEC
#pragma omp declare simd notinbranch
extern float expf(float);
#pragma omp declare simd notinbranch
extern double exp(double);
#endif

#define EXP_LO_float (-87.0f)
#define EXP_HI_float (87.0f)
#define EXP_LO_double (-708.0)
#define EXP_HI_double (708.0)

/* x clamped into exp's fast range, in its own loop (see above) */
#define CLAMP_ROW(T, dst, src, n)                                   \
  _Pragma("omp simd") for (int64_t j = 0; j < (n); j++) {           \
    T x_ = (src)[j];                                                \
    x_ = x_ < EXP_LO_##T ? EXP_LO_##T : x_;                         \
    (dst)[j] = x_ > EXP_HI_##T ? EXP_HI_##T : x_;                   \
  }

/* dst[j] = exp(dst[j]) in place: SIMD where libmvec is linked */
#define EXP_ROW(T, EXP, dst, n) _Pragma("omp simd") for (int64_t j = 0; j < (n); j++)(dst)[j] = EXP((dst)[j]);
