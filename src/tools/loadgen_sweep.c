/* A rate sweep of the load generator: the rate list, the runs and their plot. See
 * include/nanolm/loadgen_sweep.h. */
#include "nanolm/loadgen_sweep.h"

#include <math.h>
#include <stdlib.h>

#include "nanolm/svg.h"

int nl_loadgen_parse_rates(const char *s, double *rates) {
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        double v = strtod(p, &end);
        if (end == p || !(v > 0) || !isfinite(v) || n == NL_LOADGEN_MAX_SWEEP || (*end && *end != ',')) {
            nl_fail(NL_ERR_INVALID, "wants up to %d rates > 0 separated by commas, got '%s'", NL_LOADGEN_MAX_SWEEP, s);
            return -1;
        }
        rates[n++] = v;
        p = *end ? end + 1 : end;
    }
    if (n == 0) {
        nl_fail(NL_ERR_INVALID, "is empty");
        return -1;
    }
    return n;
}

nl_status nl_loadgen_sweep(nl_loadgen_opts *o, const double *rates, int n, nl_loadgen_result *res,
                           nl_loadgen_sweep_fn each, void *ctx) {
    for (int i = 0; i < n; i++) {
        o->rate_rps = rates[i];
        nl_status st = nl_loadgen_run(o, &res[i]);
        if (st) return st;
        if (each) each(ctx, i, rates[i], &res[i]);
    }
    return NL_OK;
}

int nl_loadgen_sweep_failed(const nl_loadgen_result *res, int n) {
    int failed = 0;
    for (int i = 0; i < n; i++) failed += res[i].failed > 0;
    return failed;
}

nl_status nl_loadgen_sweep_svg(const char *path, const nl_loadgen_result *res, int n) {
    if (n < 1 || n > NL_LOADGEN_MAX_SWEEP)
        return nl_fail(NL_ERR_INVALID, "a sweep plot wants 1..%d runs, got %d", NL_LOADGEN_MAX_SWEEP, n);
    double x[NL_LOADGEN_MAX_SWEEP], y[4][NL_LOADGEN_MAX_SWEEP];
    for (int i = 0; i < n; i++) {
        x[i] = res[i].output_tokens_per_s;
        y[0][i] = res[i].ttft.p50 * 1e3;
        y[1][i] = res[i].ttft.p99 * 1e3;
        y[2][i] = res[i].tpot.p50 * 1e3;
        y[3][i] = res[i].tpot.p99 * 1e3;
    }
    nl_svg_series ser[4] = {{"TTFT p50", x, y[0], (size_t)n, NULL, 1},
                            {"TTFT p99", x, y[1], (size_t)n, NULL, 1},
                            {"TPOT p50", x, y[2], (size_t)n, NULL, 1},
                            {"TPOT p99", x, y[3], (size_t)n, NULL, 1}};
    nl_svg_plot_opts po = {
        "latency vs throughput (one point per arrival rate)", "output tokens/s", "latency (ms)", 0, 1, 0, 0};
    return nl_svg_plot(path, &po, ser, 4);
}
