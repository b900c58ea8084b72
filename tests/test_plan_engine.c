/* The serving engine's cost model (plan_engine.h) against the engine itself, in one run: the
 * engine runs a prefill, decode steps at batch 1, 8 and 32, and 8 sequences served together,
 * on a random model of dim 256 with 1 thread, seven times; the machine is measured (machine.h,
 * as `nanolm bench machine` does) before and after each time, and each prediction is compared
 * with its measurement (ratios only, medians of the seven rounds): within 20%, the line,
 * and within 3x (the model is not off by a constant factor). A comparison that misses the 20%
 * line is made once more from the start before the test fails (see predicted_vs_measured).
 * Also: the measured rates round-trip through the --hw JSON, which the catalog accepts too, and
 * `nanolm plan serve --hw` reads them. */
#include "testutil.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/engine.h"
#include "nanolm/machine.h"
#include "nanolm/model.h"
#include "nanolm/plan.h"
#include "nanolm/plan_engine.h"

static nl_arch small_arch(void) {
    nl_arch a;
    memset(&a, 0, sizeof a);
    snprintf(a.name, sizeof a.name, "small-d256");
    a.vocab_size = 512;
    a.dim = 256;
    a.n_layers = 4;
    a.n_heads = 8;
    a.n_kv_heads = 4;
    a.hidden_dim = 688;
    a.seq_len = 1024;
    a.rope_theta = 10000;
    a.norm_eps = 1e-5;
    a.tied_embeddings = 1;
    return a;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The engine runs on this thread (1 OpenMP thread): its CPU clock does not count the other
 * processes that share the cores, so the comparison holds on a loaded machine. */
static nl_machine_opts g_mo;
static double clk(void) { return nl_machine_clock_s(&g_mo); }

static nl_sampling greedy(int64_t max_tokens) {
    nl_sampling s;
    nl_sampling_default(&s);
    s.temperature = 0;
    s.ignore_eos = 1;
    s.max_tokens = max_tokens;
    return s;
}

static void submit_n(nl_engine *e, int n, int64_t plen, int64_t out, uint64_t *ids) {
    int32_t p[1024];
    for (int i = 0; i < n; i++) {
        for (int64_t j = 0; j < plen; j++) p[j] = (int32_t)((31 * i + 7 * j) % 512);
        nl_sampling s = greedy(out);
        assert_int_equal(nl_engine_submit(e, p, plen, &s, &ids[i]), NL_OK);
    }
}

static void release_n(nl_engine *e, int n, const uint64_t *ids) {
    for (int i = 0; i < n; i++) nl_engine_release(e, ids[i]);
}

/* Seconds from submitting one prompt of plen tokens to its first token (median of 5). */
static double measure_prefill(nl_engine *e, int64_t plen) {
    double v[5];
    for (int k = 0; k < 5; k++) {
        uint64_t id;
        submit_n(e, 1, plen, 1, &id);
        double t0 = clk();
        while (nl_engine_busy(e)) assert_int_equal(nl_engine_step(e, NULL), NL_OK);
        v[k] = clk() - t0;
        release_n(e, 1, &id);
    }
    return median(v, 5);
}

/* Median seconds of a decode step of b sequences (prompts of plen, out tokens each). */
static double measure_decode(nl_engine *e, int b, int64_t plen, int64_t out) {
    uint64_t ids[64];
    submit_n(e, b, plen, out, ids);
    double v[256];
    int n = 0;
    int64_t rows = 0;
    while (nl_engine_busy(e)) {
        double t0 = clk();
        assert_int_equal(nl_engine_step(e, &rows), NL_OK);
        double dt = clk() - t0;
        if (rows == b && n < 256) v[n++] = dt; /* a step of b decodes (prefill steps have more rows) */
    }
    release_n(e, b, ids);
    assert_true(n > 8);
    return median(v, n);
}

/* Output tokens/s of b sequences submitted together and served to the end (median of 3). */
static double measure_throughput(nl_engine *e, int b, int64_t plen, int64_t out) {
    double v[3];
    for (int k = 0; k < 3; k++) {
        uint64_t ids[64];
        submit_n(e, b, plen, out, ids);
        double t0 = clk();
        while (nl_engine_busy(e)) assert_int_equal(nl_engine_step(e, NULL), NL_OK);
        v[k] = (double)b * (double)out / (clk() - t0);
        release_n(e, b, ids);
    }
    return median(v, 3);
}

enum { PROMPT = 256, DPROMPT = 64, DOUT = 64, ROUNDS = 7, ATTEMPTS = 2, NQ = 5 };
static const char *const QNAME[NQ] = {"prefill 256 tokens, ms", "decode step batch 1, ms", "decode step batch 8, ms",
                                      "decode step batch 32, ms", "throughput 8 streams, tok/s"};

/* Measures the machine (as `nanolm bench machine` does) and predicts the five quantities. */
static void predict(const nl_arch *a, double *pred) {
    nl_machine_opts mo = g_mo;
    nl_cpu_rates r;
    assert_int_equal(nl_machine_measure(a, &mo, &r), NL_OK);
    print_message("machine: read %.2f GB/s, fp32 kernel %.1f / %.1f / %.1f / %.1f GFLOP/s at M = 1 / 8 / 32 / 256, "
                  "decode attention %.2f / %.2f / %.2f us per token-head at 96 positions and D = 1 / 8 / 32, RoPE + "
                  "KV store %.2f / %.2f / %.2f us, chunk attention %.2f GFLOP/s, %.2f us per token-layer, "
                  "overheads %.1f us/step %.1f us/layer\n",
                  r.read_bw_nt / 1e9, r.gemm[0][0] / 1e9, r.gemm[0][1] / 1e9, r.gemm[0][2] / 1e9, r.gemm[0][4] / 1e9,
                  1e6 * (r.attn_row_s[0][0] + 96 * r.attn_pos_s[0][0]),
                  1e6 * (r.attn_row_s[0][1] + 96 * r.attn_pos_s[0][1]),
                  1e6 * (r.attn_row_s[0][2] + 96 * r.attn_pos_s[0][2]), r.rope_kv_s[0][0] * 1e6,
                  r.rope_kv_s[0][1] * 1e6, r.rope_kv_s[0][2] * 1e6, r.attn_flops_chunk / 1e9, r.row_layer_s * 1e6,
                  r.step_overhead_s * 1e6, r.layer_overhead_s * 1e6);
    nl_engine_plan_req q;
    nl_engine_plan_req_default(&q);
    q.arch = *a;
    q.prompt = PROMPT;
    q.output = 1;
    q.batch = 1;
    nl_engine_plan p;
    assert_int_equal(nl_plan_engine(&q, &r, &p), NL_OK);
    pred[0] = p.prefill_s * 1e3;
    q.prompt = DPROMPT;
    q.output = DOUT;
    q.batch = 8;
    assert_int_equal(nl_plan_engine(&q, &r, &p), NL_OK);
    for (int i = 0; i < 3; i++) pred[1 + i] = p.decode_step_s[i] * 1e3;
    pred[4] = p.throughput_tokens_per_s;
}

/* Measures the engine: the five quantities. */
static void measure(nl_engine *e, double *meas) {
    meas[0] = measure_prefill(e, PROMPT) * 1e3;
    static const int B[3] = {1, 8, 32};
    for (int i = 0; i < 3; i++) meas[1 + i] = measure_decode(e, B[i], DPROMPT, DOUT) * 1e3;
    meas[4] = measure_throughput(e, 8, DPROMPT, DOUT);
}

/* One comparison: the engine measured `rounds` times, the machine before and after each.
 * Returns 1 when every prediction is within 20% of its measurement (always asserting the right
 * order of magnitude). */
static int compare_once(nl_engine *e, const nl_arch *a, int rounds) {
    double pred[ROUNDS][NQ], meas[ROUNDS][NQ];
    /* The machine is measured before and after each measurement of the engine, and a round's
     * prediction is the mean of the two: on a shared machine whose speed drifts, the prediction
     * then sees the conditions of the measurement between them. */
    double bracket[ROUNDS + 1][NQ];
    predict(a, bracket[0]);
    for (int k = 0; k < rounds; k++) {
        measure(e, meas[k]);
        predict(a, bracket[k + 1]);
        for (int i = 0; i < NQ; i++) pred[k][i] = 0.5 * (bracket[k][i] + bracket[k + 1][i]);
        print_message("round %d: predicted/measured %.2f %.2f %.2f %.2f %.2f (machine before: %.2f %.2f %.2f %.2f "
                      "%.2f)\n",
                      k + 1, pred[k][0] / meas[k][0], pred[k][1] / meas[k][1], pred[k][2] / meas[k][2],
                      pred[k][3] / meas[k][3], pred[k][4] / meas[k][4], bracket[k][0] / meas[k][0],
                      bracket[k][1] / meas[k][1], bracket[k][2] / meas[k][2], bracket[k][3] / meas[k][3],
                      bracket[k][4] / meas[k][4]);
    }
    print_message("| %-28s | %10s | %10s | %5s |  (medians of %d round(s))\n", "quantity (1 thread, dim 256)",
                  "predicted", "measured", "ratio", rounds);
    int ok = 1;
    for (int i = 0; i < NQ; i++) {
        double pv[ROUNDS], mv[ROUNDS], rv[ROUNDS];
        for (int k = 0; k < rounds; k++) pv[k] = pred[k][i], mv[k] = meas[k][i], rv[k] = pred[k][i] / meas[k][i];
        double r = median(rv, rounds), pm = median(pv, rounds), mm = median(mv, rounds);
        int in = fabs(r - 1) <= 0.20;
        ok &= in;
        print_message("| %-28s | %10.3f | %10.3f | %5.2f |%s\n", QNAME[i], pm, mm, r, in ? "" : "  OUTSIDE 20%");
        /* always: the right order of magnitude (the model is not off by a constant factor) */
        assert_true(r > 1.0 / 3 && r < 3);
    }
    return ok;
}

static void predicted_vs_measured(void **state) {
    (void)state;
    nl_arch a = small_arch();
    nl_machine_opts_default(&g_mo);
    g_mo.predict_step_s = nl_plan_engine_probe_step_s;
    g_mo.threads = 1;
    g_mo.thread_cpu_time = 1;
    g_mo.bw_bytes = (size_t)64 << 20;
    g_mo.min_time_s = 0.01;
    g_mo.repeats = 3;
    g_mo.formats = 1;    /* fp32 weights */
    g_mo.kv_formats = 1; /* fp32 KV */
    nl_model m;
    assert_int_equal(nl_model_init(&m, &a), NL_OK);
    nl_model_init_random(&m, 11);
    nl_engine_opts eo;
    nl_engine_opts_default(&eo);
    eo.threads = 1;
    eo.prefix_cache = 0; /* the rounds repeat their prompts: the model prices computing them */
    eo.max_batch = 32;
    eo.max_step_tokens = 512;
    eo.chunk = 256;
    nl_engine *e = NULL;
    assert_int_equal(nl_engine_open_model(&e, &m, NULL, &eo), NL_OK);
    /* Under a sanitizer the code is instrumented and its speed is not the claim: one round runs
     * the whole path (and the order-of-magnitude check), the 20% line is left to the plain
     * build. Elsewhere a comparison that misses the line is made again from the start, machine
     * and engine measured anew: the model's residual errors are 5-15% on the VMs this ran on, and
     * there the speed of the engine's attention and of the probe's moves by 20-40% from one
     * second to the next (other tenants share the caches), so a median of seven rounds now and
     * then drifts past 20% while the next comparison holds. Every comparison is printed; a
     * model off by more than 20% fails both. */
    int ok = 0;
    if (getenv("NANOLM_SANITIZED")) {
        compare_once(e, &a, 1);
        print_message("sanitized build: the 20%% line is checked by the plain build\n");
        ok = 1;
    } else
        for (int attempt = 1; attempt <= ATTEMPTS && !ok; attempt++) {
            print_message("comparison %d of at most %d\n", attempt, ATTEMPTS);
            ok = compare_once(e, &a, ROUNDS);
        }
    nl_engine_stats st;
    nl_engine_stats_get(e, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    nl_engine_close(e);
    nl_model_free(&m);
    assert_true(ok); /* every prediction within 20% of its measurement */
}

static void rates_round_trip(void **state) {
    (void)state;
    nl_cpu_rates r;
    memset(&r, 0, sizeof r);
    snprintf(r.name, sizeof r.name, "cpu-test");
    r.threads = 2;
    r.read_bw_1t = 2e10;
    r.read_bw_nt = 3.5e10;
    for (int f = 0; f < 3; f++)
        for (int i = 0; i < NL_CPU_NM; i++) r.gemm[f][i] = 1e9 * (f + 1) * (i + 1);
    r.attn_flops_chunk = 4e9;
    for (int kv = 0; kv < 2; kv++)
        for (int i = 0; i < NL_CPU_NB; i++) { /* quotients: the doubles nearest the decimals cJSON prints */
            r.attn_row_s[kv][i] = (i + 1 + 10 * kv) / 1e7;
            r.attn_pos_s[kv][i] = (i + 2 + 10 * kv) / 1e9;
            r.rope_kv_s[kv][i] = (i + 3 + 10 * kv) / 1e6;
        }
    r.rope_kv_chunk_s = 1.5e-6;
    r.row_layer_s = 2e-6;
    r.step_overhead_s = 5e-5;
    r.layer_overhead_s = 1e-5;
    char *js = NULL;
    assert_int_equal(nl_cpu_rates_json(&r, 16e9, "test", &js), NL_OK);
    char *dir = tu_tmpdir(), path[512];
    snprintf(path, sizeof path, "%s/cpu.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(js, f);
    fclose(f);
    nl_free(js);
    nl_cpu_rates back;
    assert_int_equal(nl_cpu_rates_load(path, NULL, &back), NL_OK);
    assert_string_equal(back.name, "cpu-test");
    assert_int_equal(back.threads, 2);
    assert_true(back.read_bw_nt == r.read_bw_nt && back.attn_flops_chunk == r.attn_flops_chunk &&
                back.step_overhead_s == r.step_overhead_s && back.rope_kv_chunk_s == r.rope_kv_chunk_s);
    for (int kv = 0; kv < 2; kv++)
        for (int i = 0; i < NL_CPU_NB; i++)
            assert_true(back.attn_row_s[kv][i] == r.attn_row_s[kv][i] &&
                        back.attn_pos_s[kv][i] == r.attn_pos_s[kv][i] && back.rope_kv_s[kv][i] == r.rope_kv_s[kv][i]);
    for (int fm = 0; fm < 3; fm++)
        for (int i = 0; i < NL_CPU_NM; i++) assert_true(back.gemm[fm][i] == r.gemm[fm][i]);
    /* the catalog reads the same entry (its cpu_ fields are left to plan_engine) */
    nl_catalog cat;
    nl_catalog_init(&cat);
    assert_int_equal(nl_catalog_load_hw(&cat, path), NL_OK);
    nl_hw hw;
    assert_int_equal(nl_catalog_find_hw(&cat, "cpu-test", &hw), NL_OK);
    assert_true(hw.hbm_bw == 3.5e10);
    /* plan serve on it, from the CLI, with a model JSON */
    char args[2048], mp[600], *out = NULL;
    snprintf(mp, sizeof mp, "%s/model.json", dir);
    f = fopen(mp, "w");
    assert_non_null(f);
    fputs("{\"name\":\"small-d256\",\"vocab_size\":512,\"dim\":256,\"n_layers\":4,\"n_heads\":8,\"n_kv_heads\":4,"
          "\"hidden_dim\":688,\"seq_len\":1024}",
          f);
    fclose(f);
    snprintf(args, sizeof args, "plan serve --hw '%s' --model '%s' --prompt 128 --output 32 --batch 8 --json", path,
             mp);
    int rc = tu_run_cli(args, &out);
    if (rc) fail_msg("plan serve failed: %s", out);
    assert_non_null(strstr(out, "\"decode_step_s_b32\""));
    assert_non_null(strstr(out, "\"throughput_tokens_per_s\""));
    free(out);
    /* a file whose entry lacks a rate is refused, naming the field */
    f = fopen(path, "w");
    fputs("{\"name\":\"cpu-bad\",\"cpu_threads\":1,\"cpu_read_bw_nt\":1e10}", f);
    fclose(f);
    assert_int_equal(nl_cpu_rates_load(path, NULL, &back), NL_ERR_FORMAT);
    assert_non_null(strstr(nl_last_error(), "cpu_read_bw_1t"));
    tu_rmdir(dir);
    free(dir);
    /* a KV format whose decode rows were not measured is refused, naming it */
    nl_engine_plan_req q;
    nl_engine_plan_req_default(&q);
    q.arch = small_arch();
    nl_engine_plan p;
    assert_int_equal(nl_plan_engine(&q, &r, &p), NL_OK);
    for (int i = 0; i < NL_CPU_NB; i++) r.attn_pos_s[1][i] = 0;
    q.kv = 1;
    assert_int_equal(nl_plan_engine(&q, &r, &p), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "int8 KV"));
}

int main(void) {
    omp_set_num_threads(1); /* OMP_NUM_THREADS fixed at 1: every kernel of the engine on this thread */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rates_round_trip),
        cmocka_unit_test(predicted_vs_measured),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
