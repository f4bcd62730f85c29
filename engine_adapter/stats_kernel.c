/* One-pass statistics of a host tensor: max, min, sum, sum of squares, NaN and Inf counts.
 *
 * Compiled once per machine by engine_adapter/torch_stats.py (cc -O3 -march=native) and loaded
 * with ctypes. Reading is memory-bound: a training step's tensors have mostly left this core's
 * caches by the time a hook reads them. (A second reading thread was tried: on a machine whose
 * cores torch's own threads share, waking it made every step slower, not faster.)
 */
#include <math.h>
#include <stdint.h>

#define LANES 16
#define BLOCK 2048

/* max, min, sum, sum of squares over blocks of float lanes (vectorised) summed into doubles;
   NaN/Inf are counted in a second pass only when the sum is not finite, and when every value
   is finite the sums are taken again in double (a float lane overflowed). */
#define MAIN(T)                                                                         \
    T mx[LANES], mn[LANES];                                                             \
    double S = 0, Q = 0;                                                                \
    for (int k = 0; k < LANES; k++) { mx[k] = -INFINITY; mn[k] = INFINITY; }           \
    int64_t i = 0;                                                                      \
    while (i + LANES <= n) {                                                            \
        T s[LANES] = {0}, q[LANES] = {0};                                               \
        int64_t end = i + BLOCK; if (end > n) end = n;                                  \
        for (; i + LANES <= end; i += LANES) {                                          \
            for (int k = 0; k < LANES; k++) {                                           \
                T v = x[i + k];                                                         \
                mx[k] = v > mx[k] ? v : mx[k];                                          \
                mn[k] = v < mn[k] ? v : mn[k];                                          \
                s[k] += v; q[k] += v * v;                                               \
            }                                                                           \
        }                                                                               \
        for (int k = 0; k < LANES; k++) { S += s[k]; Q += q[k]; }                       \
    }                                                                                   \
    for (; i < n; i++) {                                                                \
        T v = x[i];                                                                     \
        mx[0] = v > mx[0] ? v : mx[0]; mn[0] = v < mn[0] ? v : mn[0];                   \
        S += v; Q += (double)v * v;                                                     \
    }                                                                                   \
    double MX = -INFINITY, MN = INFINITY;                                               \
    for (int k = 0; k < LANES; k++) {                                                   \
        if (mx[k] > MX) MX = mx[k];                                                     \
        if (mn[k] < MN) MN = mn[k];                                                     \
    }

/* NaN/Inf counts and the double re-sum of an overflowed float lane, after MAIN */
#define FINISH(T)                                                                       \
    double NN = 0, NI = 0;                                                              \
    if (!isfinite(S) || !isfinite(Q)) {                                                 \
        for (int64_t j = 0; j < n; j++) {                                               \
            NN += isnan(x[j]) ? 1 : 0; NI += isinf(x[j]) ? 1 : 0;                       \
        }                                                                               \
        if (NN) { MX = NAN; MN = NAN; }                                                 \
        else if (!NI) {          /* all finite: a lane's float sum overflowed (|x| > ~1.8e19 \
                                    squared); sum again in double */                    \
            S = 0; Q = 0;                                                               \
            for (int64_t j = 0; j < n; j++) { double v = x[j]; S += v; Q += v * v; }    \
        }                                                                               \
    }                                                                                   \
    out[0] = MX; out[1] = MN; out[2] = S; out[3] = Q; out[4] = NN; out[5] = NI;

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include <immintrin.h>
/* MAIN(float) with AVX-512 and four independent chains per statistic: the compiler's version
   of MAIN runs one 16-lane chain, bound by the latency of its adds (~52 GB/s on a tensor in
   L2 on the reference machine; this one ~65 GB/s). Same blocks of BLOCK floats, each block's
   float sums added into doubles. */
static void main_f32(const float *x, int64_t n, double *SQ, double *MXMN, int64_t *done) {
    __m512 mx0 = _mm512_set1_ps(-INFINITY), mx1 = mx0, mx2 = mx0, mx3 = mx0;
    __m512 mn0 = _mm512_set1_ps(INFINITY), mn1 = mn0, mn2 = mn0, mn3 = mn0;
    double S = 0, Q = 0;
    int64_t i = 0;
    while (i + 64 <= n) {
        __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, q0 = s0, q1 = s0, q2 = s0, q3 = s0;
        int64_t end = i + BLOCK; if (end > n) end = n;
        for (; i + 64 <= end; i += 64) {
            __m512 v0 = _mm512_loadu_ps(x + i), v1 = _mm512_loadu_ps(x + i + 16),
                   v2 = _mm512_loadu_ps(x + i + 32), v3 = _mm512_loadu_ps(x + i + 48);
            /* max(v, m): m when v is NaN, as MAIN's v > m ? v : m */
            mx0 = _mm512_max_ps(v0, mx0); mx1 = _mm512_max_ps(v1, mx1);
            mx2 = _mm512_max_ps(v2, mx2); mx3 = _mm512_max_ps(v3, mx3);
            mn0 = _mm512_min_ps(v0, mn0); mn1 = _mm512_min_ps(v1, mn1);
            mn2 = _mm512_min_ps(v2, mn2); mn3 = _mm512_min_ps(v3, mn3);
            s0 = _mm512_add_ps(s0, v0); s1 = _mm512_add_ps(s1, v1);
            s2 = _mm512_add_ps(s2, v2); s3 = _mm512_add_ps(s3, v3);
            q0 = _mm512_fmadd_ps(v0, v0, q0); q1 = _mm512_fmadd_ps(v1, v1, q1);
            q2 = _mm512_fmadd_ps(v2, v2, q2); q3 = _mm512_fmadd_ps(v3, v3, q3);
        }
        __m512 sb = _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3));
        __m512 qb = _mm512_add_ps(_mm512_add_ps(q0, q1), _mm512_add_ps(q2, q3));
        S += _mm512_reduce_add_pd(_mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(sb)),
                                                _mm512_cvtps_pd(_mm512_extractf32x8_ps(sb, 1))));
        Q += _mm512_reduce_add_pd(_mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(qb)),
                                                _mm512_cvtps_pd(_mm512_extractf32x8_ps(qb, 1))));
    }
    float a[16], b[16];
    _mm512_storeu_ps(a, _mm512_max_ps(_mm512_max_ps(mx0, mx1), _mm512_max_ps(mx2, mx3)));
    _mm512_storeu_ps(b, _mm512_min_ps(_mm512_min_ps(mn0, mn1), _mm512_min_ps(mn2, mn3)));
    double MX = -INFINITY, MN = INFINITY;
    for (int k = 0; k < 16; k++) { if (a[k] > MX) MX = a[k]; if (b[k] < MN) MN = b[k]; }
    SQ[0] = S; SQ[1] = Q; MXMN[0] = MX; MXMN[1] = MN; *done = i;
}

static void stats_f32(const float *x, int64_t n, double *out) {
    double SQ[2], MM[2];
    int64_t i;
    main_f32(x, n, SQ, MM, &i);
    double S = SQ[0], Q = SQ[1], MX = MM[0], MN = MM[1];
    for (; i < n; i++) {
        float v = x[i];
        MX = v > MX ? v : MX; MN = v < MN ? v : MN;
        S += v; Q += (double)v * v;
    }
    FINISH(float)
}
#else
static void stats_f32(const float *x, int64_t n, double *out) { MAIN(float) FINISH(float) }
#endif
static void stats_f64(const double *x, int64_t n, double *out) { MAIN(double) FINISH(double) }

#ifdef _OPENMP
#include <omp.h>
/* A tensor of at least this many elements is read by the OpenMP threads torch itself runs
   (the same runtime: torch's libgomp is already loaded when this library is): each thread
   reads the contiguous share that an element-wise op of torch's wrote from that thread, so it
   is still in that core's cache, and the threads are spinning right after that op. */
#define PARALLEL_MIN 32768

static void merge(double *acc, const double *part) {
    if (part[4] || acc[4]) { acc[0] = NAN; acc[1] = NAN; }
    else {
        if (part[0] > acc[0]) acc[0] = part[0];
        if (part[1] < acc[1]) acc[1] = part[1];
    }
    acc[2] += part[2]; acc[3] += part[3]; acc[4] += part[4]; acc[5] += part[5];
}

/* Split [0, n) over the OpenMP threads: SERIAL when the tensor is small (or no thread is
   free), else PART on [lo, hi) per thread into parts[t], folded into out by MERGE. */
#define PARALLEL_SPLIT(SERIAL, PART, MERGE)                                             \
    int threads = omp_get_max_threads();                                                \
    if (n < PARALLEL_MIN || threads < 2 || omp_in_parallel()) { SERIAL; return; }       \
    if (threads > 64) threads = 64;                                                     \
    double parts[64][6];                                                                \
    int used = 1;                                                                       \
    _Pragma("omp parallel num_threads(threads)")                                        \
    {                                                                                   \
        int t = omp_get_thread_num(), k = omp_get_num_threads();                        \
        int64_t lo = n * t / k, hi = n * (t + 1) / k;                                   \
        PART;                                                                           \
        if (t == 0) used = k;                                                           \
    }                                                                                   \
    for (int k = 0; k < 6; k++) out[k] = parts[0][k];                                   \
    for (int t = 1; t < used; t++) MERGE;

#define PARALLEL(FN, T) \
    PARALLEL_SPLIT(FN(x, n, out), FN(x + lo, hi - lo, parts[t]), merge(out, parts[t]))

void probe_stats_f32(const float *x, int64_t n, double *out) { PARALLEL(stats_f32, float) }
void probe_stats_f64(const double *x, int64_t n, double *out) { PARALLEL(stats_f64, double) }
#else
void probe_stats_f32(const float *x, int64_t n, double *out) { stats_f32(x, n, out); }
void probe_stats_f64(const double *x, int64_t n, double *out) { stats_f64(x, n, out); }
#endif

/* Adam's weight update, read from its state in one pass with the norms around it.
 *
 * For each element: the weight w (after the step), the first moment m and the second moment
 * (or AMSGrad's running maximum) v. c = [step_size, 1 / sqrt(bias_correction2), eps, decay,
 * scale]: the update is (decay * w + step_size * m / (sqrt(v) / sqrt(bc2) + eps)) * scale,
 * which for decoupled weight decay (AdamW: decay = lr * wd, scale = 1 / (1 - lr * wd)) is the
 * change the step made to w, and for Adam (decay 0, scale 1) exactly its update. out = [sum of
 * squares of w, of m, of v, of the update, NaN count of w, Inf count of w]: the weight, state
 * and update norms of a training step without a copy of the weights (see
 * engine_adapter/optimizer_update.py). */
#define ADAM_BODY(T, SQRT)                                                              \
    const T s = (T)c[0], r = (T)c[1], eps = (T)c[2], decay = (T)c[3], scale = (T)c[4];  \
    double P = 0, M = 0, V = 0, U = 0;                                                  \
    int64_t i = 0;                                                                      \
    while (i < n) {                                                                     \
        T pw[LANES] = {0}, pm[LANES] = {0}, pv[LANES] = {0}, pu[LANES] = {0};           \
        int64_t end = i + BLOCK; if (end > n) end = n;                                  \
        for (; i + LANES <= end; i += LANES) {                                          \
            for (int k = 0; k < LANES; k++) {                                           \
                T w = p[i + k], a = m[i + k], b = v[i + k];                             \
                T u = (decay * w + s * a / (SQRT(b) * r + eps)) * scale;                \
                pw[k] += w * w; pm[k] += a * a; pv[k] += b * b; pu[k] += u * u;         \
            }                                                                           \
        }                                                                               \
        for (; i < end; i++) {                                                          \
            T w = p[i], a = m[i], b = v[i];                                             \
            T u = (decay * w + s * a / (SQRT(b) * r + eps)) * scale;                    \
            pw[0] += w * w; pm[0] += a * a; pv[0] += b * b; pu[0] += u * u;             \
        }                                                                               \
        for (int k = 0; k < LANES; k++) { P += pw[k]; M += pm[k]; V += pv[k]; U += pu[k]; } \
    }                                                                                   \
    if (!isfinite(P) || !isfinite(M) || !isfinite(V) || !isfinite(U)) {                 \
        /* a lane's float sum overflowed, or the data is not finite: again in double */ \
        P = M = V = U = 0;                                                              \
        for (int64_t j = 0; j < n; j++) {                                               \
            double w = p[j], a = m[j], b = v[j];                                        \
            double u = (c[3] * w + c[0] * a / (sqrt(b) * c[1] + c[2])) * c[4];          \
            P += w * w; M += a * a; V += b * b; U += u * u;                             \
        }                                                                               \
    }                                                                                   \
    double NN = 0, NI = 0;                                                              \
    if (!isfinite(P)) {                                                                 \
        for (int64_t j = 0; j < n; j++) {                                               \
            NN += isnan(p[j]) ? 1 : 0; NI += isinf(p[j]) ? 1 : 0;                       \
        }                                                                               \
    }                                                                                   \
    out[0] = P; out[1] = M; out[2] = V; out[3] = U; out[4] = NN; out[5] = NI;

static void adam_f32(const float *p, const float *m, const float *v, int64_t n,
                     const double *c, double *out) { ADAM_BODY(float, sqrtf) }
static void adam_f64(const double *p, const double *m, const double *v, int64_t n,
                     const double *c, double *out) { ADAM_BODY(double, sqrt) }

#ifdef _OPENMP
static void add6(double *acc, const double *part) { for (int k = 0; k < 6; k++) acc[k] += part[k]; }

#define ADAM_PARALLEL(FN)                                                               \
    PARALLEL_SPLIT(FN(p, m, v, n, c, out), FN(p + lo, m + lo, v + lo, hi - lo, c, parts[t]), \
                   add6(out, parts[t]))

void probe_adam_f32(const float *p, const float *m, const float *v, int64_t n,
                    const double *c, double *out) { ADAM_PARALLEL(adam_f32) }
void probe_adam_f64(const double *p, const double *m, const double *v, int64_t n,
                    const double *c, double *out) { ADAM_PARALLEL(adam_f64) }
#else
void probe_adam_f32(const float *p, const float *m, const float *v, int64_t n,
                    const double *c, double *out) { adam_f32(p, m, v, n, c, out); }
void probe_adam_f64(const double *p, const double *m, const double *v, int64_t n,
                    const double *c, double *out) { adam_f64(p, m, v, n, c, out); }
#endif
