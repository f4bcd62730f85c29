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
   NaN/Inf are counted in a second pass only when the sum is not finite. */
#define BODY(T)                                                                         \
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
    }                                                                                   \
    double NN = 0, NI = 0;                                                              \
    if (!isfinite(S) || !isfinite(Q)) {                                                 \
        for (int64_t j = 0; j < n; j++) {                                               \
            NN += isnan(x[j]) ? 1 : 0; NI += isinf(x[j]) ? 1 : 0;                       \
        }                                                                               \
        if (NN) { MX = NAN; MN = NAN; }                                                 \
    }                                                                                   \
    out[0] = MX; out[1] = MN; out[2] = S; out[3] = Q; out[4] = NN; out[5] = NI;

void probe_stats_f32(const float *x, int64_t n, double *out) { BODY(float) }
void probe_stats_f64(const double *x, int64_t n, double *out) { BODY(double) }
