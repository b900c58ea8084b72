/* Collectives priced with the alpha-beta model (Hockney 1994; Thakur et al. 2005 for the ring
 * algorithms): time = alpha + wire bytes / bandwidth. */
#include "nanolm/plan.h"

#include <math.h>


/* Ring reduce-scatter and all-gather move (p-1)/p of the array through each GPU; all-reduce is
 * reduce-scatter + all-gather, 2(p-1)/p (Patarasuk & Yuan 2009); an all-to-all keeps 1/p at
 * home and sends the rest. */
double nl_plan_coll_bytes(nl_coll c, int64_t p, double bytes) {
    if (c == NL_P2P) return bytes;
    if (p <= 1) return 0.0;
    double f = (double)(p - 1) / (double)p;
    return (c == NL_ALL_REDUCE ? 2.0 : 1.0) * f * bytes;
}

/* Inside an NVSwitch node with NVLink SHARP (hw->nvls_eff > 0), an all-reduce may instead
 * reduce in the switch: each GPU sends and receives the whole array once, at nvls_eff of the
 * link (catalog.c gives the measurements). NCCL picks the faster of the two algorithms per
 * call; so does this (the ring wins at p = 2, NVLS from p = 4 on an H100). */
/* Across nodes (spans_nodes = k >= 1 members of the group in each node) a ring crosses each
 * node boundary once per channel; NCCL gives each channel its own NIC and, with PXN, routes a
 * member's traffic to the NIC of the GPU next to it over NVLink, so a reduce-scatter, all-gather
 * or all-reduce ring moves its wire bytes over k NICs' share of the node's network, k x inter_bw,
 * and never faster than NVLink. nccl-tests on 4 nodes of 8 H100 with 8 x 400 Gb/s NICs measure
 * ~320 GB/s busbw (NCCL issue #1221), 8 x 50 x 0.8. A node whose NICs are not described
 * (nics_per_node 0) keeps one GPU's share; point-to-point sends and all-to-alls leave through
 * the GPU's own link. */
double nl_plan_coll_time(const nl_hw *hw, nl_coll c, int64_t p, double bytes, int spans_nodes) {
    if (c != NL_P2P && p <= 1) return 0.0;
    double bw = spans_nodes ? hw->inter_bw * hw->inter_eff : hw->intra_bw * hw->intra_eff;
    if (spans_nodes > 1 && hw->nics_per_node > 0 && c != NL_P2P && c != NL_ALL_TO_ALL)
        bw = fmin(bw * spans_nodes, hw->intra_bw * hw->intra_eff);
    double t = nl_plan_coll_bytes(c, p, bytes) / bw;
    if (c == NL_ALL_REDUCE && !spans_nodes && hw->nvls_eff > 0) {
        double t_nvls = bytes / (hw->intra_bw * hw->nvls_eff);
        if (t_nvls < t) t = t_nvls;
    }
    return hw->latency_s + t;
}
