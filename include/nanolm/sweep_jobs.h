/*
 * nanolm sweep_jobs: a scaling sweep (nanolm/sweep.h) trained by several worker processes of one
 * thread each sharing DIR (`nanolm scaling sweep --jobs J`): on 2 cores two single-threaded
 * workers train more than one two-threaded process.
 */
#ifndef NANOLM_SWEEP_JOBS_H
#define NANOLM_SWEEP_JOBS_H

#include "nanolm/sweep.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Trains g's unfinished runs: jobs = 1 in this process (nl_sweep_run), else in `jobs` (<= 16)
 * forked workers (nl_sweep_run_worker, largest budget first), forked before this process runs
 * any parallel region. on_error(user, w, message) reports a worker's failure (w = -1: a fork
 * that failed); NULL: nothing. NL_ERR_IO when a worker failed (the finished runs are in
 * DIR/sweep.csv: run again to resume), nl_sweep_run's errors with jobs = 1. */
nl_status nl_sweep_run_jobs(const nl_sweep_grid *g, const char *data_path, const char *dir, const nl_sweep_progress *p,
                            int jobs, void (*on_error)(void *user, int worker, const char *message), void *user);

#ifdef __cplusplus
}
#endif

#endif
