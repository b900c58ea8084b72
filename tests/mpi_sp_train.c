/* Sequence parallelism (Korthikanti et al.) on top of tensor parallelism, under mpirun with 2,
 * 3 and 4 ranks (TP = world size): 20 training steps of NanoLM with SP against the same run in
 * one process (same seed and batch) within 1e-5 relative, and against plain TP. The collective
 * bytes: SP's reduce-scatters + all-gathers move exactly what TP's all-reduces move (a ring
 * all-reduce is a reduce-scatter plus an all-gather), plus the small all-reduce of the norm
 * weights' and embedding's partial gradients, and the all-gathers that SP repeats in backward
 * because it keeps only the shard of each norm output. The activation bytes per rank
 * (nl_pipe_memory_report's workspace, what --report-memory prints) against a formula written
 * here: SP keeps the residual stream, the norm outputs and their rstd at b*T/TP rows, so it
 * holds less than plain TP. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/comm.h"
#include "nanolm/pipeline.h"
#include "nanolm/tokenizer.h"
#include "testutil.h"

#define STEPS 20

static void run(nl_comm *tp, nl_comm *self, int sp, const nl_data *d, float *loss, nl_comm_stats *st, size_t *ws) {
    nl_arch a;
    assert_int_equal(nl_arch_preset("shakespeare-char", &a), NL_OK);
    a.dim = 48, a.n_layers = 2, a.n_heads = 12, a.n_kv_heads = 12, a.hidden_dim = 96, a.seq_len = 12;
    nl_dist_opts o;
    nl_dist_opts_default(&o);
    o.train.batch = 4, o.train.seq = 12, o.sp = sp;
    nl_pipe p;
    assert_int_equal(nl_pipe_init(&p, &a, &o, 1, NL_PIPE_GPIPE, self, self, tp), NL_OK);
    nl_comm_reset_stats(tp);
    for (int s = 0; s < STEPS; s++) assert_int_equal(nl_pipe_step(&p, d, s, o.train.lr, &loss[s], NULL), NL_OK);
    nl_comm_get_stats(tp, st);
    nl_dist_memory dm;
    nl_pipe_memory_report(&p, &dm);
    *ws = dm.workspace;
    nl_pipe_free(&p);
}

static void test_sp(void **state) {
    (void)state;
    nl_comm *w = nl_comm_world(), *self, *self2;
    int r = nl_comm_rank(w), P = nl_comm_size(w);
    assert_int_equal(nl_comm_split(w, r, 0, "self", &self), NL_OK);
    assert_int_equal(nl_comm_split(w, r, 0, "self2", &self2), NL_OK);
    const char *path = tu_committed_data("tinyshakespeare/input.txt");
    nl_tokenizer tok;
    nl_data d;
    assert_int_equal(nl_tokenizer_init_byte(&tok), NL_OK);
    assert_int_equal(nl_data_open(&d, path, &tok), NL_OK);
    float ref[STEPS], tp[STEPS], sp[STEPS];
    nl_comm_stats s_ref, s_tp, s_sp;
    size_t w_ref, w_tp, w_sp;
    run(self2, self, 0, &d, ref, &s_ref, &w_ref); /* one process: a tensor-parallel group of one */
    run(w, self, 0, &d, tp, &s_tp, &w_tp);
    run(w, self, 1, &d, sp, &s_sp, &w_sp);
    double e_sp = 0, e_tp = 0;
    for (int s = 0; s < STEPS; s++) {
        e_sp = fmax(e_sp, fabs(sp[s] - ref[s]) / fabs(ref[s]));
        e_tp = fmax(e_tp, fabs(tp[s] - ref[s]) / fabs(ref[s]));
    }
    uint64_t ar_tp = s_tp.coll[NL_COMM_OP_ALL_REDUCE].sent_bytes;
    uint64_t rs = s_sp.coll[NL_COMM_OP_REDUCE_SCATTER].sent_bytes, ag = s_sp.coll[NL_COMM_OP_ALL_GATHER].sent_bytes;
    uint64_t ar_sp = s_sp.coll[NL_COMM_OP_ALL_REDUCE].sent_bytes;
    if (r == 0)
        print_message("TP = SP degree %d: loss rel diff vs one process over %d steps: SP %.2e, TP %.2e (final %.5f); "
                      "bytes sent per rank in 20 steps: TP all-reduce %llu, SP reduce-scatter %llu + all-gather %llu + "
                      "norm/embedding all-reduce %llu; activation bytes per rank: one process %zu, TP %zu, SP %zu\n",
                      P, STEPS, e_sp, e_tp, sp[STEPS - 1], (unsigned long long)ar_tp, (unsigned long long)rs,
                      (unsigned long long)ag, (unsigned long long)ar_sp, w_ref, w_tp, w_sp);
    assert_true(e_sp <= 1e-5);
    /* per layer: 2 reduce-scatters in forward + 2 in backward replace the 4 all-reduces, the
     * all-gathers likewise; on top, SP gathers the final norm's rows in forward (TP computes that
     * norm on every rank), and re-gathers in backward the 2 norm outputs of each of the 2 layers
     * and the final norm's (it stores only its shard): 2 + 2 * 2 extra all-gathers per step.
     * Sizes divide by 2, 3 and 4, so the ring volumes are exact. */
    const uint64_t BTC = 4 * 12 * 48, per = (uint64_t)(P - 1) * BTC / (uint64_t)P * 4, extra = 2 + 2 * 2;
    assert_true(rs + ag - (uint64_t)STEPS * extra * per == ar_tp);
    assert_true(ag == rs + (uint64_t)STEPS * extra * per);
    /* partial gradients summed: the 5 norm weights (48) and the embedding (256 x 48), per step */
    uint64_t nb = 5 * 48 + 256 * 48;
    assert_true(ar_sp == (uint64_t)STEPS * 2 * (uint64_t)(P - 1) * nb / (uint64_t)P * 4);
    /* activation floats per rank, one micro-batch of b = 4 windows of T = 12, L = 2 layers,
     * C = 48, V = 256, head_dim 4, this rank's NH = KVH = 12/tp heads and H = 96/tp width; r rows
     * of the sequence-sharded tensors (b*T, or b*T/tp under SP). Kept for backward: the residual
     * stream entering each layer and leaving the last (L+1) r C; per layer the two norm outputs
     * and the residual after attention 3 r C, two norm rstd 2 r, q k v bT QKV, attention
     * probabilities b NH T T, attention output bT NH hd, gate, up and SwiGLU output 3 bT H; the
     * gradient buffer for a previous stage bT C; final norm r C + r; logits bT V. Backward
     * scratch: 2 bT C + bT QKV + bT NH hd + b NH T + 3 bT H, and under SP one bT C buffer for the
     * all-gathered input of a column-parallel matmul. */
    const double b = 4, T = 12, bT = b * T, C = 48, V = 256, hd = 4, L = 2;
    double expect[3];
    for (int c = 0; c < 3; c++) {
        double tpn = c == 0 ? 1 : P, r = c == 2 ? bT / tpn : bT, NH = 12 / tpn, H = 96 / tpn, QKV = 3 * NH * hd;
        double mb = (L + 1) * r * C + L * (3 * r * C + 2 * r + bT * QKV + b * NH * T * T + bT * NH * hd + 3 * bT * H) +
                    bT * C + r * C + r + bT * V;
        double scratch = 2 * bT * C + bT * QKV + bT * NH * hd + b * NH * T + 3 * bT * H + (c == 2 ? bT * C : 0);
        expect[c] = 4 * (mb + scratch);
    }
    assert_true((double)w_ref == expect[0]);
    assert_true((double)w_tp == expect[1]);
    assert_true((double)w_sp == expect[2]);
    assert_true(w_sp < w_tp);
    nl_data_free(&d);
    nl_tokenizer_free(&tok);
    nl_comm_free(self);
    nl_comm_free(self2);
}

int main(int argc, char **argv) {
    nl_set_threads(1); /* several ranks share the cores: OpenMP spinning threads would starve them */
    if (nl_comm_init(&argc, &argv)) {
        fprintf(stderr, "nl_comm_init: %s\n", nl_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sp)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    nl_comm_finalize();
    return rc;
}
