/*
 * The collective operations: one list for the runtime that runs and counts them
 * (nanolm/comm.h, src/parallel/) and the planner that prices them (nanolm/plan.h, src/plan/).
 * It lives in base/ because the planner may not include the parallel code.
 */
#ifndef NANOLM_COLL_H
#define NANOLM_COLL_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nl_comm_op {
    NL_COMM_OP_BROADCAST = 0,
    NL_COMM_OP_REDUCE,
    NL_COMM_OP_ALL_REDUCE,
    NL_COMM_OP_ALL_GATHER,
    NL_COMM_OP_REDUCE_SCATTER,
    NL_COMM_OP_ALL_TO_ALL,
    NL_COMM_OP_SEND_RECV, /* point-to-point (pipeline stages) */
    NL_COMM_OP_COUNT
} nl_comm_op;

/* "broadcast", "reduce", "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv";
 * "?" outside the list. */
const char *nl_comm_op_name(nl_comm_op c);

#ifdef __cplusplus
}
#endif
#endif
