/*
 * nanolm coll_bench: the measurements behind `nanolm collectives`: the course's reduce-scatter +
 * all-gather example with what every rank sent, and a benchmark of every collective (ours and
 * MPI's native) with nccl-tests' algbw / busbw and an alpha-beta fit per collective.
 *
 * Size S is the nccl-tests size: the array of all-reduce / broadcast / reduce, the full array of
 * all-gather and reduce-scatter, the whole send buffer of all-to-all. time is the median over
 * repetitions of the slowest rank; algbw = S / time; busbw = algbw x factor (2(p-1)/p all-reduce,
 * (p-1)/p reduce-scatter, all-gather, all-to-all; 1 broadcast, reduce).
 */
#ifndef NANOLM_COLL_BENCH_H
#define NANOLM_COLL_BENCH_H

#include "nanolm/comm.h"
#include "nanolm/linfit.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the course example -------------------------------------------------------------------------- */

/* Rank r holds (r*P+1, ..., r*P+P); reduce-scatter leaves the sum of column r on rank r, the
 * all-gather gives everyone the sums. rows: (P, NL_COLL_DEMO_NF + 2P) on every rank: per rank the
 * value after reduce-scatter, numbers sent by reduce-scatter and by all-gather, numbers received,
 * bytes sent, then the P numbers held and the P after the all-gather. */
enum { NL_COLL_DEMO_NF = 5 };
typedef struct nl_coll_demo {
    int p;
    size_t row_len; /* NL_COLL_DEMO_NF + 2P */
    double *rows;
} nl_coll_demo;

/* between(user) runs between the two steps (NULL: nothing). Collective over w. Free the rows
 * with nl_coll_demo_free. */
nl_status nl_coll_demo_run(nl_comm *w, nl_comm_impl impl, nl_comm_dtype dt, void (*between)(void *), void *user,
                           nl_coll_demo *out);
void nl_coll_demo_free(nl_coll_demo *d);

/* ---- the benchmark --------------------------------------------------------------------------------- */

enum { NL_COLL_BENCH_OPS = 6, NL_COLL_BENCH_SIZES = 64 };
/* The collectives benchmarked, in the order of the tables. */
extern const nl_comm_op nl_coll_bench_ops[NL_COLL_BENCH_OPS];

typedef struct nl_coll_bench_opts {
    int impl_mask; /* 1 ours, 2 native, 3 both */
    int nops, nsizes;
    nl_comm_op ops[NL_COLL_BENCH_OPS];
    size_t sizes[NL_COLL_BENCH_SIZES]; /* bytes */
    int reps;                          /* 0: 3..20, about 0.3 s per row */
    nl_comm_dtype dt;
    void (*before_rep)(void *user); /* called before every timed repetition (NULL: nothing) */
    void *user;
} nl_coll_bench_opts;

/* Adds the collectives of a ','-separated list of names (all-reduce, reduce-scatter, all-gather,
 * broadcast, reduce, all-to-all) to o->ops. NL_ERR_INVALID naming an unknown entry, or too many. */
nl_status nl_coll_bench_parse_ops(const char *list, nl_coll_bench_opts *o);
/* What o leaves to the defaults: no ops, every collective; no sizes, min_bytes, min_bytes x step,
 * ... up to max_bytes (at most NL_COLL_BENCH_SIZES). */
void nl_coll_bench_defaults(nl_coll_bench_opts *o, size_t min_bytes, size_t max_bytes, size_t step);

typedef struct nl_coll_bench_row {
    nl_comm_op op;
    nl_comm_impl impl;
    size_t bytes;
    double time_s, algbw, busbw;
    int reps;
} nl_coll_bench_row;

/* Times every (op, size, impl) of o (op, then size, then ours before native). Collective over w;
 * every rank gets the same rows (malloc'd, free with nl_free). */
nl_status nl_coll_bench_run(nl_comm *w, const nl_coll_bench_opts *o, nl_coll_bench_row **rows, int *nrows);

/* busbw of row k (ours) over native at the same op and size, or NaN (no such pair). */
double nl_coll_bench_ratio(const nl_coll_bench_row *rows, int nrows, int k);

/* The alpha-beta fit of one (op, impl): t = alpha + beta x, x = busbw factor x S, weights 1/t^2,
 * alpha >= 0 and beta >= 0 (nl_linfit_nonneg). With one size, alpha is that time, beta 0. */
typedef struct nl_coll_fit {
    nl_comm_op op;
    nl_comm_impl impl;
    nl_linfit f;
} nl_coll_fit;

/* One fit per (op of o, impl) that has rows, ours before native, into fits (room for 2 x nops).
 * Returns the count; *link: the index of all-reduce's fit (native first), or -1. */
int nl_coll_bench_fits(const nl_coll_bench_opts *o, const nl_coll_bench_row *rows, int nrows, int p, nl_coll_fit *fits,
                       int *link);

#ifdef __cplusplus
}
#endif

#endif
