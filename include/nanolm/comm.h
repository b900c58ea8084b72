/*
 * nanolm comm: collectives over MPI, each in two implementations.
 *
 *   NL_COMM_OURS    our algorithms on MPI point-to-point: ring reduce-scatter, ring all-gather,
 *                   all-reduce = reduce-scatter + all-gather, pipelined chain broadcast and
 *                   reduce, pairwise-exchange all-to-all.
 *   NL_COMM_NATIVE  the MPI library's own collective (MPI_Allreduce, ...).
 *
 * Buffers are fp32 or bf16; bf16 is reduced in fp32 (each addition is done in fp32 and the
 * result rounded to bf16 once, before it travels on).
 *
 * A communicator (nl_comm) is the world or a group split from it (the data-, tensor- and
 * pipeline-parallel groups of a layout). Every communicator counts, per collective, the calls,
 * the bytes this rank sent and received, and the seconds spent; the counts are part of the API.
 * For NL_COMM_OURS the bytes are exactly what our code handed to MPI point-to-point. For
 * NL_COMM_NATIVE the MPI library's internal traffic is not observable, so the counters record
 * the volume our algorithm moves for the same call (the bandwidth-optimal ring volume for
 * reduce-scatter, all-gather, all-reduce; the chain volume for broadcast and reduce).
 *
 * Sizes that do not divide by the rank count: an array of n elements is cut into p chunks,
 * chunk i has nl_comm_chunk_count(n, p, i) elements starting at nl_comm_chunk_offset(n, p, i)
 * (the first n % p chunks are one element longer). Reduce-scatter leaves chunk `rank` on each
 * rank; all-gather assembles the chunks.
 *
 * Only src/parallel/ includes <mpi.h>. Without mpirun the same binary runs as one rank.
 */
#ifndef NANOLM_COMM_H
#define NANOLM_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/base.h"
#include "nanolm/coll.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nl_comm_dtype { NL_COMM_F32 = 0, NL_COMM_BF16 = 1 } nl_comm_dtype;
typedef enum nl_comm_impl { NL_COMM_OURS = 0, NL_COMM_NATIVE = 1 } nl_comm_impl;

/* nl_comm_op, the list of collective operations, is in nanolm/coll.h (shared with the planner). */

typedef struct nl_comm_counter {
    uint64_t calls;
    uint64_t sent_bytes;
    uint64_t recv_bytes;
    double time_s;
} nl_comm_counter;

typedef struct nl_comm_stats {
    nl_comm_counter coll[NL_COMM_OP_COUNT];
} nl_comm_stats;

typedef struct nl_comm nl_comm;

/* Size in bytes of one element of `dt` (4 or 2). */
size_t nl_comm_dtype_bytes(nl_comm_dtype dt);
/* Names: "f32"/"bf16", "ours"/"native", "all-reduce"/... */
const char *nl_comm_dtype_name(nl_comm_dtype dt);
const char *nl_comm_impl_name(nl_comm_impl impl);

/* ---- lifecycle ---------------------------------------------------------------------------- */

/* Initializes MPI (once; later calls do nothing) with errors returned rather than fatal, and
 * creates the world communicator. Without mpirun this is a world of one rank.
 * Returns NL_ERR_COMM if MPI cannot start. */
nl_status nl_comm_init(int *argc, char ***argv);
/* Frees the world and finalizes MPI (if nl_comm_init started it). Safe to call twice. */
void nl_comm_finalize(void);
/* The collective watchdog: a blocking wait (a collective, a pipeline receive) longer than
 * `seconds` makes this rank ask every other rank for its heartbeat (over a communicator of the
 * watchdog's own); the ranks that do not answer within the grace time (`seconds` clamped to
 * [2, 10]) are named: "nanolm: rank R of P: <what> waited S s for rank Q, which did not arrive
 * ..." and the process ends (exit 75), upon which mpirun ends the job. When all answer, the
 * report names the ranks not waiting, or says that all wait. Default 600 s; <= 0 turns it off.
 * The watchdog thread runs from nl_comm_init when the world has more than one rank. */
void nl_comm_set_timeout(double seconds);
/* The world communicator, or NULL before nl_comm_init. */
nl_comm *nl_comm_world(void);
/* Splits `parent` into groups: ranks with the same `color` form one group, ordered by `key`.
 * `name` (e.g. "dp") labels errors. Collective over `parent`. On failure *out is NULL and
 * NL_ERR_COMM or NL_ERR_NOMEM is returned. */
nl_status nl_comm_split(nl_comm *parent, int color, int key, const char *name, nl_comm **out);
/* Frees a communicator made by nl_comm_split (the world is freed by nl_comm_finalize). */
void nl_comm_free(nl_comm *c);
int nl_comm_rank(const nl_comm *c);
int nl_comm_size(const nl_comm *c);
/* Rank in the world of this process (0 before init). */
int nl_comm_world_rank(void);

/* ---- layouts ------------------------------------------------------------------------------
 * A layout of world = dp * tp * pp ranks. World rank = (pp_rank * dp + dp_rank) * tp + tp_rank
 * (tensor-parallel groups are consecutive ranks, as in Megatron). */
typedef struct nl_layout {
    int dp, tp, pp;
    int dp_rank, tp_rank, pp_rank;
    nl_comm *dp_comm; /* ranks with the same tp_rank and pp_rank */
    nl_comm *tp_comm; /* ranks with the same dp_rank and pp_rank */
    nl_comm *pp_comm; /* ranks with the same dp_rank and tp_rank, ordered by stage */
} nl_layout;
/* Builds the three groups. Fails (NL_ERR_INVALID, naming the sizes) if dp*tp*pp != world size. */
nl_status nl_layout_init(nl_comm *world, int dp, int tp, int pp, nl_layout *out);
void nl_layout_free(nl_layout *l);

/* ---- chunks of an array ------------------------------------------------------------------- */
size_t nl_comm_chunk_offset(size_t n, int p, int i);
size_t nl_comm_chunk_count(size_t n, int p, int i);

/* ---- collectives --------------------------------------------------------------------------
 * All are collective over `c` (every rank calls with the same n, dtype, root and impl) and
 * return NL_OK, NL_ERR_INVALID (bad root or size, naming it), NL_ERR_NOMEM or NL_ERR_COMM (an
 * MPI call failed; the message names the communicator, the collective and the rank). */

/* `buf` (n elements) of rank `root` is copied to every rank. */
nl_status nl_comm_broadcast(nl_comm *c, void *buf, size_t n, nl_comm_dtype dt, int root, nl_comm_impl impl);
/* recv (n, significant at root only) = sum over ranks of send (n). At the root send may equal
 * recv (in place). */
nl_status nl_comm_reduce(nl_comm *c, const void *send, void *recv, size_t n, nl_comm_dtype dt, int root,
                         nl_comm_impl impl);
/* buf (n) = sum over ranks of buf (n), in place. */
nl_status nl_comm_all_reduce(nl_comm *c, void *buf, size_t n, nl_comm_dtype dt, nl_comm_impl impl);
/* recv (chunk_count(n, p, rank)) = chunk `rank` of the sum over ranks of send (n).
 * recv may point at send's own chunk (send + offset(rank)). */
nl_status nl_comm_reduce_scatter(nl_comm *c, const void *send, void *recv, size_t n, nl_comm_dtype dt,
                                 nl_comm_impl impl);
/* recv (n) = the chunks of all ranks; send (chunk_count(n, p, rank)) is this rank's chunk.
 * send may equal recv + offset(rank) (in place). */
nl_status nl_comm_all_gather(nl_comm *c, const void *send, void *recv, size_t n, nl_comm_dtype dt, nl_comm_impl impl);
/* send (p, count) -> recv (p, count): block j of send goes to rank j, block i of recv came
 * from rank i. */
nl_status nl_comm_all_to_all(nl_comm *c, const void *send, void *recv, size_t count, nl_comm_dtype dt,
                             nl_comm_impl impl);
/* The same with per-rank element counts and offsets (arrays of p entries, in elements). */
nl_status nl_comm_all_to_allv(nl_comm *c, const void *send, const size_t *send_counts, const size_t *send_offsets,
                              void *recv, const size_t *recv_counts, const size_t *recv_offsets, nl_comm_dtype dt,
                              nl_comm_impl impl);
/* Point-to-point (counted as NL_COMM_OP_SEND_RECV). `tag` >= 0 separates message streams. */
nl_status nl_comm_send(nl_comm *c, const void *buf, size_t n, nl_comm_dtype dt, int dest, int tag);
nl_status nl_comm_recv(nl_comm *c, void *buf, size_t n, nl_comm_dtype dt, int src, int tag);
/* Waits until every rank of c arrives. */
nl_status nl_comm_barrier(nl_comm *c);
/* max (or sum) over ranks of a double, native, not counted: for timings and reports. */
nl_status nl_comm_max_double(nl_comm *c, double *v);
nl_status nl_comm_sum_double(nl_comm *c, double *v);
/* *v = max over ranks of *v, native, not counted: the ranks agree on a flag (a stop request). */
nl_status nl_comm_max_int(nl_comm *c, int *v);

/* ---- non-blocking all-reduce (gradient buckets) -------------------------------------------
 * Starts an in-place all-reduce of buf (n) and returns a request. The ring advances one step
 * each time nl_comm_progress is called and the step's messages have arrived, so a caller that
 * polls between its own work overlaps communication with computation. `buf` must stay valid
 * and untouched until nl_comm_wait returns. */
typedef struct nl_comm_request nl_comm_request;
nl_status nl_comm_all_reduce_start(nl_comm *c, void *buf, size_t n, nl_comm_dtype dt, nl_comm_impl impl,
                                   nl_comm_request **req);
/* Starts a point-to-point send of buf (n) to `dest` (counted as NL_COMM_OP_SEND_RECV); buf must
 * stay untouched until nl_comm_wait returns. */
nl_status nl_comm_send_start(nl_comm *c, const void *buf, size_t n, nl_comm_dtype dt, int dest, int tag,
                             nl_comm_request **req);
/* Advances the request without blocking; *done = 1 when finished (then call nl_comm_wait). */
nl_status nl_comm_progress(nl_comm_request *req, int *done);
/* Blocks until the request completes and frees it. */
nl_status nl_comm_wait(nl_comm_request *req);

/* ---- counters ------------------------------------------------------------------------------ */
/* Counters of one communicator, and of all communicators of this process together. */
void nl_comm_get_stats(const nl_comm *c, nl_comm_stats *out);
void nl_comm_get_total_stats(nl_comm_stats *out);
void nl_comm_reset_stats(nl_comm *c);
void nl_comm_reset_total_stats(void);
/* Sum of sent (recv) bytes over all collectives of a stats record. */
uint64_t nl_comm_stats_sent_bytes(const nl_comm_stats *s);
uint64_t nl_comm_stats_recv_bytes(const nl_comm_stats *s);

#ifdef __cplusplus
}
#endif
#endif
