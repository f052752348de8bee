/* arrivals.c: the load generator's random distributions (on td_rng.h's generator) and the
 * open-loop arrival schedule (vLLM's get_request). */
#include "bench.h"
#include "td_error.h"

#include <math.h>

int64_t td_bench_rng_range(td_rng_t *r, int64_t lo, int64_t hi)
{
    if (hi <= lo)
        return lo;
    uint64_t span = (uint64_t)(hi - lo) + 1;
    return lo + (int64_t)(td_rng_next(r) % span);
}

double td_bench_rng_normal(td_rng_t *r)
{
    double u1 = td_rng_uniform(r), u2 = td_rng_uniform(r);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

double td_bench_rng_gamma(td_rng_t *r, double shape, double scale)
{
    if (shape < 1.0) {
        /* Gamma(a) = Gamma(a + 1) x U^(1/a) */
        double u = td_rng_uniform(r);
        return td_bench_rng_gamma(r, shape + 1.0, scale) * pow(u > 0 ? u : 1e-300, 1.0 / shape);
    }
    double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x, v;
        do {
            x = td_bench_rng_normal(r);
            v = 1.0 + c * x;
        } while (v <= 0.0);
        v = v * v * v;
        double u = td_rng_uniform(r);
        if (u < 1.0 - 0.0331 * x * x * x * x)
            return d * v * scale;
        if (log(u > 0 ? u : 1e-300) < 0.5 * x * x + d * (1.0 - v + log(v)))
            return d * v * scale;
    }
}

int td_bench_arrivals(size_t n, double rate, double burstiness, uint64_t seed, double *out)
{
    if (n < 1)
        return td_err_set(TD_EINVAL, "arrivals: need at least one request");
    if (!(rate > 0))
        return td_err_set(TD_EINVAL, "--request-rate must be > 0 (or inf)");
    if (!(burstiness > 0))
        return td_err_set(TD_EINVAL, "--burstiness must be > 0 (or inf)");
    if (isinf(rate)) {
        for (size_t i = 0; i < n; i++)
            out[i] = 0;
        return 0;
    }
    td_rng_t rng;
    td_rng_seed(&rng, seed);
    double acc = 0;
    for (size_t i = 0; i < n; i++) {
        /* burstiness -> infinity: Gamma(k, 1/(rate k)) concentrates on its mean 1/rate */
        double gap = isinf(burstiness)
                         ? 1.0 / rate
                         : td_bench_rng_gamma(&rng, burstiness, 1.0 / (rate * burstiness));
        acc += gap;
        out[i] = acc;
    }
    /* vLLM: rescale so that the last request goes out at n / rate, which removes the 1-2% run to
     * run spread of the sum of the gaps and keeps throughput comparable across seeds. */
    if (out[n - 1] > 0) {
        double f = ((double)n / rate) / out[n - 1];
        for (size_t i = 0; i < n; i++)
            out[i] *= f;
    }
    return 0;
}
