/* Sequence parallelism (Korthikanti et al.) on top of tensor parallelism, under mpirun with 2,
 * 3 and 4 ranks (TP = world size): 20 training steps of NanoLM with SP against the same run in
 * one process (same seed and batch) within 1e-5 relative, and against plain TP. The collective
 * bytes: SP's reduce-scatters + all-gathers move exactly what TP's all-reduces move (a ring
 * all-reduce is a reduce-scatter plus an all-gather), plus the small all-reduce of the norm
 * weights' and embedding's partial gradients. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/comm.h"
#include "nanolm/pipeline.h"
#include "nanolm/tokenizer.h"
#include "testutil.h"

#define STEPS 20

static void run(nl_comm *tp, nl_comm *self, int sp, const nl_data *d, float *loss, nl_comm_stats *st) {
    nl_arch a;
    assert_int_equal(nl_arch_preset("shakespeare-char", &a), NL_OK);
    a.dim = 48, a.n_layers = 2, a.n_heads = 12, a.n_kv_heads = 12, a.hidden_dim = 96, a.seq_len = 12;
    nl_dist_opts o;
    nl_dist_opts_default(&o);
    o.batch = 4, o.seq = 12, o.sp = sp;
    nl_pipe p;
    assert_int_equal(nl_pipe_init(&p, &a, &o, 1, NL_PIPE_GPIPE, self, self, tp), NL_OK);
    nl_comm_reset_stats(tp);
    for (int s = 0; s < STEPS; s++) assert_int_equal(nl_pipe_step(&p, d, s, o.lr, &loss[s], NULL), NL_OK);
    nl_comm_get_stats(tp, st);
    nl_pipe_free(&p);
}

static void test_sp(void **state) {
    (void)state;
    nl_comm *w = nl_comm_world(), *self, *self2;
    int r = nl_comm_rank(w), P = nl_comm_size(w);
    assert_int_equal(nl_comm_split(w, r, 0, "self", &self), NL_OK);
    assert_int_equal(nl_comm_split(w, r, 0, "self2", &self2), NL_OK);
    const char *path = tu_data_path("tinyshakespeare/input.txt");
    nl_tokenizer tok;
    nl_data d;
    assert_int_equal(nl_tokenizer_init_byte(&tok), NL_OK);
    assert_int_equal(nl_data_open(&d, path ? path : "/usr/share/games/fortunes/fortunes", &tok), NL_OK);
    float ref[STEPS], tp[STEPS], sp[STEPS];
    nl_comm_stats s_ref, s_tp, s_sp;
    run(self2, self, 0, &d, ref, &s_ref); /* one process: a tensor-parallel group of one */
    run(w, self, 0, &d, tp, &s_tp);
    run(w, self, 1, &d, sp, &s_sp);
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
                      "norm/embedding all-reduce %llu\n",
                      P, STEPS, e_sp, e_tp, sp[STEPS - 1], (unsigned long long)ar_tp, (unsigned long long)rs,
                      (unsigned long long)ag, (unsigned long long)ar_sp);
    assert_true(e_sp <= 1e-5);
    /* per layer: 2 reduce-scatters in forward + 2 in backward replace the 4 all-reduces, the
     * all-gathers likewise; on top, SP gathers the final norm's rows once per step (TP computes
     * that norm on every rank). Sizes divide by 2, 3 and 4, so the ring volumes are exact. */
    const uint64_t BTC = 4 * 12 * 48, per = (uint64_t)(P - 1) * BTC / (uint64_t)P * 4;
    assert_true(rs + ag - (uint64_t)STEPS * per == ar_tp);
    assert_true(ag == rs + (uint64_t)STEPS * per);
    /* partial gradients summed: the 5 norm weights (48) and the embedding (256 x 48), per step */
    uint64_t nb = 5 * 48 + 256 * 48;
    assert_true(ar_sp == (uint64_t)STEPS * 2 * (uint64_t)(P - 1) * nb / (uint64_t)P * 4);
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
