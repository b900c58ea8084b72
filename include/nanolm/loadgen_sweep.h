/* A rate sweep of the load generator: the arrival rates from a "1,2,4.5" list, one run of
 * nl_loadgen_run per rate, and the latency-vs-throughput plot of the runs. */
#ifndef NANOLM_LOADGEN_SWEEP_H
#define NANOLM_LOADGEN_SWEEP_H

#include "nanolm/http_loadgen.h"

#define NL_LOADGEN_MAX_SWEEP 32

/* Parses "1,2,4.5" into rates (each > 0 and finite, at most NL_LOADGEN_MAX_SWEEP). Returns the
 * count, or -1 with the last error set to a phrase that follows the option's name ("is empty",
 * "wants up to 32 rates > 0 separated by commas, got 'x'"). */
int nl_loadgen_parse_rates(const char *s, double *rates);

/* Called after each rate's run of a sweep, with its index, rate and result. */
typedef void (*nl_loadgen_sweep_fn)(void *ctx, int i, double rate, const nl_loadgen_result *r);

/* Runs *o once per rate (o->rate_rps set to rates[i]; left at the last one) into res[0..n),
 * calling each (if not NULL) after every run. Stops at the first run that fails and returns
 * its status; failed requests are counted in the results, not fatal. */
nl_status nl_loadgen_sweep(nl_loadgen_opts *o, const double *rates, int n, nl_loadgen_result *res,
                           nl_loadgen_sweep_fn each, void *ctx);

/* How many of res[0..n) had a failed request. */
int nl_loadgen_sweep_failed(const nl_loadgen_result *res, int n);

/* The SVG of a sweep at path: TTFT and TPOT p50/p99 (ms) against output tokens/s, a point per
 * run (n <= NL_LOADGEN_MAX_SWEEP). */
nl_status nl_loadgen_sweep_svg(const char *path, const nl_loadgen_result *res, int n);

#endif
