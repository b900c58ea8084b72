/* Data-parallel training under mpirun against the one-process run with the same global batch:
 * DDP (buckets overlapped with backward, after it, native collectives), ZeRO-1, ZeRO-2, ZeRO-3
 * on 2 and 4 ranks, 20 steps each. Checks, per run:
 *   - losses equal the one-process losses within 1e-5 relative (and says which are bit-exact);
 *   - the bytes every rank sent per step equal the formula of the layout computed here from the
 *     model's layout (exactly), and the planner's per-collective formula up to padding;
 *   - --report-memory: the bytes of parameters, gradients and optimizer state every rank holds
 *     equal the padded-shard formula exactly and the planner's ZeRO formula up to padding;
 *   - TP/PP layouts: each rank's parameter, gradient and optimizer bytes equal its part (stage
 *     layers with the matrices split T ways, embedding on the first stage, tail on the last)
 *     times the planner's fp32 bytes per parameter, and its activation bytes the formula, exactly. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "nanolm/plan.h"
#include "testutil.h"

#define STEPS        20
#define GLOBAL_BATCH 8
static const char *SHAPE = "--dim 32 --layers 2 --heads 4 --kv-heads 2 --hidden 64 --seq 16";

static const char *data_file(void) { return tu_committed_data("tinyshakespeare/input.txt"); }

static int run(int np, const char *args, char **out) {
    const tu_run_opts o = {.np = np, .timeout_s = 300, .one_thread = 1};
    return tu_run_cli_ex(&o, args, out, NULL);
}

/* The model's units as the trainer cuts them: embedding, each layer, tail; sizes from the
 * Llama shapes (model.h's layout), computed here independently of the model code. */
static size_t unit_len[64], n_params;
static int n_units;
/* one layer's parts: the two norms (replicated under TP) and the q, k, v, o, w1, w3, w2 matrices
 * (split in T parts under TP, Megatron) */
static size_t layer_norms, layer_mats, vocab;

static int setup(void **state) {
    (void)state;
    nl_arch a;
    if (nl_arch_preset("shakespeare-char", &a)) return -1;
    a.dim = 32, a.n_layers = 2, a.n_heads = 4, a.n_kv_heads = 2, a.hidden_dim = 64;
    if (a.seq_len < 16) a.seq_len = 16;
    size_t C = (size_t)a.dim, V = (size_t)a.vocab_size, H = (size_t)a.hidden_dim, hd = C / (size_t)a.n_heads;
    size_t q = (size_t)a.n_heads * hd, kv = (size_t)a.n_kv_heads * hd;
    n_units = (int)a.n_layers + 2;
    unit_len[0] = V * C;                 /* embedding */
    for (int l = 0; l < a.n_layers; l++) /* norm, q, k, v, o, norm, w1, w3, w2 */
        unit_len[1 + l] = C + (q + 2 * kv) * C + C * q + C + 2 * H * C + C * H;
    layer_norms = 2 * C;
    vocab = V;
    layer_mats = (q + 2 * kv) * C + C * q + 2 * H * C + C * H;
    unit_len[n_units - 1] = C + (a.tied_embeddings ? 0 : V * C); /* final norm (+ classifier) */
    n_params = 0;
    for (int u = 0; u < n_units; u++) n_params += unit_len[u];
    return 0;
}
static int teardown(void **state) {
    (void)state;
    return 0;
}

static size_t chunk(size_t n, int p, int i) { return n / (size_t)p + ((size_t)i < n % (size_t)p); }
static size_t shard(size_t n, int p) { return (n + (size_t)p - 1) / (size_t)p; }

/* Bytes rank r sends per step, from the algorithm: DDP all-reduces each unit (ring: every chunk
 * but its own, then every chunk but the next rank's); ZeRO reduce-scatters each padded unit and
 * all-gathers it back (ZeRO-1/2 after the update, ZeRO-3 before forward and, for layers, again
 * before backward). */
static double expected_sent(int zero, int p, int r) {
    double b = 0;
    for (int u = 0; u < n_units; u++) {
        size_t n = unit_len[u], s = shard(n, p);
        int is_layer = u > 0 && u < n_units - 1;
        if (zero == 0)
            b += 4.0 * (double)(2 * n - chunk(n, p, r) - chunk(n, p, (r + 1) % p));
        else if (zero <= 2)
            b += 4.0 * 2 * (double)((size_t)(p - 1) * s);
        else
            b += 4.0 * (2 + is_layer) * (double)((size_t)(p - 1) * s);
    }
    return b;
}

static cJSON *ref_doc;

static double *losses_of(cJSON *d, int *n) {
    cJSON *ls = cJSON_GetObjectItem(d, "losses");
    *n = cJSON_GetArraySize(ls);
    double *v = calloc((size_t)*n, sizeof(double));
    for (int i = 0; i < *n; i++) v[i] = cJSON_GetArrayItem(ls, i)->valuedouble;
    return v;
}

static void test_one_process_reference(void **state) {
    (void)state;
    char args[1024], *out;
    snprintf(args, sizeof args, "parallel train --data %s %s --steps %d --batch %d --json", data_file(), SHAPE, STEPS,
             GLOBAL_BATCH);
    int rc = run(0, args, &out);
    if (rc) print_message("%s\n", out);
    assert_int_equal(rc, 0);
    ref_doc = cJSON_Parse(out);
    assert_non_null(ref_doc);
    int n;
    double *l = losses_of(ref_doc, &n);
    assert_int_equal(n, STEPS);
    assert_true(l[STEPS - 1] < l[0]); /* it learns */
    assert_int_equal((int)cJSON_GetObjectItem(ref_doc, "n_params")->valuedouble, (int)n_params);
    free(l);
    free(out);
}

/* Parameters rank r of a (dp, tp, pp) layout holds (rank = (stage * dp + dp_rank) * tp + tp_rank):
 * its stage's layers with T-th of each matrix and the whole norms, the embedding on the first
 * stage, the final norm and classifier on the last. */
static size_t part_params(int np, int dp, int tp, int r) {
    int P = np / (dp * tp), s = r / (tp * dp), L = n_units - 2;
    size_t n = 0;
    for (int l = s * L / P; l < (s + 1) * L / P; l++) n += layer_norms + layer_mats / (size_t)tp;
    if (s == 0) n += unit_len[0];
    if (s == P - 1) n += unit_len[n_units - 1];
    return n;
}

/* Activation floats rank r allocates (SHAPE: C 32, 4 heads, 2 KV heads of 8, hidden 64, T 16),
 * with b = GLOBAL_BATCH / dp / M windows per micro-batch, n of its stage's layers and the heads
 * and width divided by tp. Per micro-batch in flight: the residual stream entering each layer and
 * leaving the last, per layer the two norm outputs and the residual after attention (b T C each),
 * two norm rstd (b T), q k v (b T QKV), attention probabilities (b NH T T), attention output
 * (b T NH hd), gate and up (2 b T H), SwiGLU output (b T H); the gradient sent back (b T C); the
 * last stage adds the final norm (b T C + b T) and the logits (b T V). One backward scratch:
 * 2 b T C + b T QKV + b T NH hd + b NH T + 3 b T H. Micro-batches in flight: M (GPipe),
 * min(M, P - s) (1F1B). */
static double expected_act_floats(int np, int dp, int tp, int M, int onef1b, int r) {
    int P = np / (dp * tp), s = r / (tp * dp), L = n_units - 2;
    double n = (double)((s + 1) * L / P - s * L / P), b = (double)(GLOBAL_BATCH / dp / M), T = 16, C = 32;
    double NH = 4.0 / tp, KVH = 2.0 / tp, hd = 8, H = 64.0 / tp, QKV = (NH + 2 * KVH) * hd, bT = b * T;
    double mb =
        (n + 1) * bT * C + n * (3 * bT * C + 2 * bT + bT * QKV + b * NH * T * T + bT * NH * hd + 3 * bT * H) + bT * C;
    if (s == P - 1) mb += bT * C + bT + bT * (double)vocab;
    double inflight = onef1b && P - s < M ? P - s : M;
    return inflight * mb + 2 * bT * C + bT * QKV + bT * NH * hd + b * NH * T + 3 * bT * H;
}

/* Pipeline: rank r = stage * dp + dp_rank sends M activations (b, T, C) forward unless it is
 * the last stage, M gradients back unless it is the first, and all-reduces the parameters it
 * holds (part_params) over the data-parallel group. */
static double expected_sent_pp(int np, int dp, int tp, int M, int r) {
    int P = np / (dp * tp), t = r % tp, d = (r / tp) % dp, s = r / (tp * dp), L = n_units - 2;
    size_t n_act = (size_t)(GLOBAL_BATCH / dp / M) * 16 * 32; /* b x T x C floats */
    double act = 4.0 * M * (double)n_act;
    double b = (s < P - 1 ? act : 0) + (s > 0 ? act : 0);
    /* tensor parallel: per layer of the stage and micro-batch, 2 all-reduces of (b, T, C) in
     * forward and 2 in backward */
    if (tp > 1)
        b += 4.0 * M * (double)((s + 1) * L / P - s * L / P) * 4 *
             (double)(2 * n_act - chunk(n_act, tp, t) - chunk(n_act, tp, (t + 1) % tp));
    if (dp > 1) {
        size_t n = part_params(np, dp, tp, r);
        b += 4.0 * (double)(2 * n - chunk(n, dp, d) - chunk(n, dp, (d + 1) % dp));
    }
    return b;
}

static void check_run_layout(int np, int dp, int zero, const char *extra) {
    assert_non_null(ref_doc);
    char args[1024], *out;
    int tp = 1, M = 1;
    const char *mp = strstr(extra, "--microbatches "), *tpp = strstr(extra, "--tp ");
    if (mp) M = atoi(mp + 15);
    if (tpp) tp = atoi(tpp + 5);
    int pp = np / (dp * tp);
    snprintf(args, sizeof args, "parallel train --data %s %s --steps %d --batch %d --dp %d --pp %d --zero %d %s --json",
             data_file(), SHAPE, STEPS, GLOBAL_BATCH / dp, dp, pp, zero, extra);
    int rc = run(np, args, &out);
    if (rc) print_message("%s\n", out);
    assert_int_equal(rc, 0);
    cJSON *d = cJSON_Parse(out);
    assert_non_null(d);
    int n, nr;
    double *l = losses_of(d, &n), *lr = losses_of(ref_doc, &nr);
    assert_int_equal(n, nr);
    double worst = 0;
    int exact = 0;
    for (int i = 0; i < n; i++) {
        double e = fabs(l[i] - lr[i]) / fabs(lr[i]);
        worst = e > worst ? e : worst;
        exact += l[i] == lr[i];
    }
    print_message("np %d dp %d tp %d pp %d zero %d %s: max relative loss difference %.3g over %d steps, %d bit-exact\n",
                  np, dp, tp, pp, zero, extra, worst, n, exact);
    (void)np;
    assert_true(worst <= 1e-5);

    nl_recipe fp32;
    assert_int_equal(nl_plan_recipe("fp32", &fp32), NL_OK);
    nl_state_bytes sb;
    nl_plan_state_bytes(&fp32, (nl_zero)zero, np, np, &sb);
    double N = (double)n_params, S = 0;
    for (int u = 0; u < n_units; u++) S += (double)shard(unit_len[u], np);
    double pad_bound = 4.0 * 2 * n_units; /* a few floats per unit of padding, times 8 bytes/param at most */
    cJSON *ranks = cJSON_GetObjectItem(d, "per_rank");
    assert_int_equal(cJSON_GetArraySize(ranks), np);
    if (pp > 1 || tp > 1) { /* bytes of the pipeline / tensor parallelism; memory of this rank's part */
        for (int r = 0; r < np; r++) {
            cJSON *e = cJSON_GetArrayItem(ranks, r);
            /* --report-memory: exactly the part's parameters at the planner's fp32 bytes per
             * parameter (4 weights, 4 gradients, 8 AdamW) */
            double part = (double)part_params(np, dp, tp, r);
            double pb = cJSON_GetObjectItem(e, "params_bytes")->valuedouble,
                   gb = cJSON_GetObjectItem(e, "grads_bytes")->valuedouble;
            double ob = cJSON_GetObjectItem(e, "optimizer_bytes")->valuedouble;
            if (r == 0 || r == np - 1)
                print_message("  rank %d holds %.0f B params, %.0f B grads, %.0f B optimizer = %.4f of the model's; "
                              "activations %.0f B\n",
                              r, pb, gb, ob, part / (double)n_params,
                              cJSON_GetObjectItem(e, "workspace_bytes")->valuedouble);
            assert_true(pb == sb.weights * part);
            assert_true(gb == sb.grads * part);
            assert_true(ob == sb.optim * part);
            assert_true(part < (double)n_params);
            double ws = cJSON_GetObjectItem(e, "workspace_bytes")->valuedouble;
            double wa = 4 * expected_act_floats(np, dp, tp, M, strstr(extra, "1f1b") != NULL, r);
            if (ws != wa) print_message("rank %d activations %.0f B, formula %.0f B\n", r, ws, wa);
            assert_true(ws == wa);
            double sent = cJSON_GetObjectItem(e, "sent_bytes_per_step")->valuedouble,
                   want = expected_sent_pp(np, dp, tp, M, r);
            if (sent != want) print_message("rank %d sent %.0f bytes per step, formula %.0f\n", r, sent, want);
            assert_true(sent == want);
            if (pp > 1) {
                cJSON *stage = cJSON_GetArrayItem(cJSON_GetObjectItem(d, "stages"), r);
                assert_int_equal(cJSON_GetObjectItem(stage, "rank")->valueint, r);
                double bub = cJSON_GetObjectItem(stage, "bubble")->valuedouble;
                assert_true(bub >= 0 && bub <= 1);
            }
        }
        if (pp > 1)
            print_message(
                "  measured bubble rank 0 %.3f, formula %.3f\n",
                cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(d, "stages"), 0), "bubble")->valuedouble,
                cJSON_GetObjectItem(d, "bubble_formula")->valuedouble);
        free(l);
        free(lr);
        cJSON_Delete(d);
        free(out);
        return;
    }
    for (int r = 0; r < np; r++) {
        cJSON *e = cJSON_GetArrayItem(ranks, r);
        double sent = cJSON_GetObjectItem(e, "sent_bytes_per_step")->valuedouble;
        double want = expected_sent(zero, np, r);
        if (sent != want) print_message("rank %d sent %.0f bytes per step, formula %.0f\n", r, sent, want);
        assert_true(sent == want);
        /* the planner's per-collective bytes on the whole parameter array */
        double plan;
        if (zero == 0)
            plan = nl_plan_coll_bytes(NL_ALL_REDUCE, np, 4 * N);
        else if (zero <= 2)
            plan = nl_plan_coll_bytes(NL_REDUCE_SCATTER, np, 4 * N) + nl_plan_coll_bytes(NL_ALL_GATHER, np, 4 * N);
        else
            plan = 3 * nl_plan_coll_bytes(NL_ALL_GATHER, np, 4 * N);
        if (r == 0)
            print_message("  rank 0 sends %.0f B/step = %.4f x the parameter bytes (planner %.4f)\n", sent,
                          sent / (4 * N), plan / (4 * N));
        if (zero < 3)
            assert_true(fabs(sent - plan) <= 4.0 * (np - 1) * 2 * n_units);
        else
            assert_true(sent <= plan && sent >= 2.0 / 3.0 * plan); /* root units gathered once, not twice */

        double pb = cJSON_GetObjectItem(e, "params_bytes")->valuedouble,
               gb = cJSON_GetObjectItem(e, "grads_bytes")->valuedouble;
        double ob = cJSON_GetObjectItem(e, "optimizer_bytes")->valuedouble;
        /* exact, with shards padded to a multiple of the group size */
        assert_true(pb == 4 * (zero == 3 ? S : N));
        assert_true(gb == 4 * (zero >= 2 ? S : N));
        assert_true(ob == 8 * (zero >= 1 ? S : N));
        /* the planner's bytes per parameter, up to the padding */
        assert_true(fabs(pb - sb.weights * N) <= pad_bound);
        assert_true(fabs(gb - sb.grads * N) <= pad_bound);
        assert_true(fabs(ob - sb.optim * N) <= 2 * pad_bound);
    }
    free(l);
    free(lr);
    cJSON_Delete(d);
    free(out);
}

static void check_run(int np, int zero, const char *extra) { check_run_layout(np, np, zero, extra); }
static void test_pp_2_gpipe(void **state) {
    (void)state;
    check_run_layout(2, 1, 0, "--microbatches 4 --schedule gpipe");
}
static void test_pp_2_1f1b(void **state) {
    (void)state;
    check_run_layout(2, 1, 0, "--microbatches 4 --schedule 1f1b");
}
static void test_dp2_pp2_1f1b(void **state) {
    (void)state;
    check_run_layout(4, 2, 0, "--microbatches 2 --schedule 1f1b");
}
static void test_tp_2(void **state) {
    (void)state;
    check_run_layout(2, 1, 0, "--tp 2");
}
static void test_dp2_tp2(void **state) {
    (void)state;
    check_run_layout(4, 2, 0, "--tp 2");
}
static void test_tp2_pp2_gpipe(void **state) {
    (void)state;
    check_run_layout(4, 1, 0, "--tp 2 --microbatches 2 --schedule gpipe");
}
static void test_ddp_2(void **state) {
    (void)state;
    check_run(2, 0, "");
}
static void test_ddp_2_no_overlap(void **state) {
    (void)state;
    check_run(2, 0, "--no-overlap");
}
static void test_ddp_2_native(void **state) {
    (void)state;
    check_run(2, 0, "--impl native");
}
static void test_zero1_2(void **state) {
    (void)state;
    check_run(2, 1, "");
}
static void test_zero2_2(void **state) {
    (void)state;
    check_run(2, 2, "");
}
static void test_zero3_2(void **state) {
    (void)state;
    check_run(2, 3, "");
}
static void test_ddp_4(void **state) {
    (void)state;
    check_run(4, 0, "");
}
static void test_zero1_4(void **state) {
    (void)state;
    check_run(4, 1, "");
}
static void test_zero3_4(void **state) {
    (void)state;
    check_run(4, 3, "--impl native");
}

static void test_bad_layouts(void **state) {
    (void)state;
    char args[1024], *out;
    snprintf(args, sizeof args, "parallel train --data %s %s --steps 1 --dp 3", data_file(), SHAPE);
    assert_int_not_equal(run(2, args, &out), 0);
    assert_non_null(strstr(out, "must equal the number of ranks"));
    free(out);
    assert_int_equal(run(0, "parallel train --data x --zero 4", &out), 2);
    assert_non_null(strstr(out, "--zero"));
    free(out);
    /* `nanolm train` with a layout option is this command */
    assert_int_equal(run(0, "train --data x --zero 4", &out), 2);
    assert_non_null(strstr(out, "--zero must be in [0, 3]")); /* train itself does not know --zero */
    free(out);
    assert_int_equal(run(0, "parallel train --data x --schedule zigzag", &out), 2);
    assert_non_null(strstr(out, "zigzag"));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_process_reference),
        cmocka_unit_test(test_ddp_2),
        cmocka_unit_test(test_ddp_2_no_overlap),
        cmocka_unit_test(test_ddp_2_native),
        cmocka_unit_test(test_zero1_2),
        cmocka_unit_test(test_zero2_2),
        cmocka_unit_test(test_zero3_2),
        cmocka_unit_test(test_ddp_4),
        cmocka_unit_test(test_zero1_4),
        cmocka_unit_test(test_zero3_4),
        cmocka_unit_test(test_pp_2_gpipe),
        cmocka_unit_test(test_pp_2_1f1b),
        cmocka_unit_test(test_dp2_pp2_1f1b),
        cmocka_unit_test(test_tp_2),
        cmocka_unit_test(test_dp2_tp2),
        cmocka_unit_test(test_tp2_pp2_gpipe),
        cmocka_unit_test(test_bad_layouts),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
