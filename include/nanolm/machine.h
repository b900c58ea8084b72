/*
 * nanolm machine: measures this CPU (cpu_rates.h) for the serving engine's cost model in plan/:
 * streaming read bandwidth (1 and N threads), the engine's linear kernel (nl_mv_forward) in
 * fp32, bf16 and int8 at M = 1, 8, 32, 128, 256, 512 rows over a model's linear shapes, the
 * paged attention rate, the per-row elementwise work of a layer, and the engine's per-step
 * and per-layer overheads. `nanolm bench machine` prints the result as a --hw JSON entry.
 */
#ifndef NANOLM_MACHINE_H
#define NANOLM_MACHINE_H

#include <stddef.h>

#include "nanolm/arch.h"
#include "nanolm/base.h"
#include "nanolm/cpu_rates.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nl_machine_opts {
    int threads;         /* OpenMP threads (<= 0: the OpenMP default) */
    size_t bw_bytes;     /* buffer of the bandwidth probe (default 256 MiB) */
    double min_time_s;   /* each timed measurement runs at least this long (default 0.05) */
    int repeats;         /* medians over this many timings (default 5) */
    int formats;         /* bit f set: measure weight format f (0 fp32, 1 bf16, 2 int8; default all) */
    int kv_formats;      /* bit k set: measure the decode rows with KV format k (0 fp32, 1 int8; default both) */
    int thread_cpu_time; /* 1 (threads must be 1): time with this thread's CPU clock instead of the
                                wall clock, so that other processes sharing the cores do not count */
    /* The cost model's time of one batch-1 decode step at context ctx of a model of shape a on
     * rates r with no step or layer overhead (plan_engine.h: nl_plan_engine_probe_step_s). The
     * engine's measured step minus this is its overhead; NULL leaves the overheads at 0. The
     * caller passes it in, so that this layer does not call the planner above it. */
    double (*predict_step_s)(const nl_arch *a, const nl_cpu_rates *r, double ctx);
} nl_machine_opts;

void nl_machine_opts_default(nl_machine_opts *o);
/* Seconds on the clock o chooses (the wall clock, or this thread's CPU clock). */
double nl_machine_clock_s(const nl_machine_opts *o);
/* Measures the machine at the linear shapes of arch (every layer's weights distinct, as the
 * engine reads them). out->name is set to "cpu-<threads>t". Errors: NL_ERR_NOMEM naming the
 * buffer, NL_ERR_INVALID for a bad shape, the engine's errors. */
nl_status nl_machine_measure(const nl_arch *arch, const nl_machine_opts *o, nl_cpu_rates *out);

#ifdef __cplusplus
}
#endif
#endif
