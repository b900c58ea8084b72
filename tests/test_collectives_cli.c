/* `nanolm collectives`: the course demo as one rank (no mpirun) and under mpirun -np 4, the
 * bench's JSON, bad options, and the bad day: a rank that exits or crashes in the middle of a
 * collective must end the whole job (non-zero status, a message naming the rank), not hang; and
 * the library under the command (nanolm/coll_bench.h) on one rank. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "nanolm/base.h"
#include "nanolm/coll_bench.h"
#include "testutil.h"

/* Runs `mpirun -np np nanolm <args>` under `timeout` (a hang shows as status 124); returns the
 * exit status and the output (stdout + stderr). */
static int run_mpi(int np, const char *args, char **out, double *elapsed_s) {
    const tu_run_opts o = {.np = np, .timeout_s = 120};
    return tu_run_cli_ex(&o, args, out, elapsed_s);
}

static void test_demo_one_rank(void **state) {
    (void)state;
    char *out = NULL;
    int rc = tu_run_cli("collectives demo --json", &out);
    assert_int_equal(rc, 0);
    cJSON *d = cJSON_Parse(out);
    assert_non_null(d);
    assert_int_equal(cJSON_GetObjectItem(d, "ranks")->valueint, 1);
    cJSON *r0 = cJSON_GetArrayItem(cJSON_GetObjectItem(d, "per_rank"), 0);
    assert_int_equal(cJSON_GetObjectItem(r0, "after_reduce_scatter")->valueint, 1);
    assert_int_equal(cJSON_GetObjectItem(r0, "sent_numbers")->valueint, 0);
    cJSON_Delete(d);
    free(out);
}

/* The course example: (1,2,3,4), (5,6,7,8), (9,10,11,12), (13,14,15,16) -> 28, 32, 36, 40 on
 * ranks 0..3, everyone gets (28, 32, 36, 40), each rank sent 3 + 3 = 6 numbers. */
static void test_demo_course_example(void **state) {
    (void)state;
    const char *variants[] = {"--impl ours", "--impl native", "--impl ours --dtype bf16"};
    for (int v = 0; v < 3; v++) {
        char *out = NULL, args[128];
        snprintf(args, sizeof args, "collectives demo --json %s", variants[v]);
        int rc = run_mpi(4, args, &out, NULL);
        if (rc != 0) print_message("%s\n", out);
        assert_int_equal(rc, 0);
        cJSON *d = cJSON_Parse(out);
        assert_non_null(d);
        cJSON *ranks = cJSON_GetObjectItem(d, "per_rank");
        assert_int_equal(cJSON_GetArraySize(ranks), 4);
        const double sums[4] = {28, 32, 36, 40};
        for (int r = 0; r < 4; r++) {
            cJSON *o = cJSON_GetArrayItem(ranks, r);
            cJSON *holds = cJSON_GetObjectItem(o, "holds"), *all = cJSON_GetObjectItem(o, "after_all_gather");
            for (int i = 0; i < 4; i++) {
                assert_true(cJSON_GetArrayItem(holds, i)->valuedouble == 4 * r + i + 1);
                assert_true(cJSON_GetArrayItem(all, i)->valuedouble == sums[i]);
            }
            assert_true(cJSON_GetObjectItem(o, "after_reduce_scatter")->valuedouble == sums[r]);
            if (strstr(variants[v], "ours")) { /* counted bytes are real only for ours */
                assert_int_equal(cJSON_GetObjectItem(o, "sent_numbers_reduce_scatter")->valueint, 3);
                assert_int_equal(cJSON_GetObjectItem(o, "sent_numbers_all_gather")->valueint, 3);
                assert_int_equal(cJSON_GetObjectItem(o, "received_numbers")->valueint, 6);
                assert_true(cJSON_GetObjectItem(o, "sent_fraction")->valuedouble == 1.5); /* 2(p-1)/p */
            }
        }
        cJSON_Delete(d);
        free(out);
    }
    char *out = NULL;
    assert_int_equal(run_mpi(4, "collectives demo", &out, NULL), 0);
    assert_non_null(strstr(out, "28 32 36 40"));
    assert_non_null(strstr(out, "3 + 3 = 6"));
    free(out);
}

static void test_bench_json(void **state) {
    (void)state;
    char *out = NULL;
    int rc = run_mpi(2, "collectives bench --json --min-bytes 4K --max-bytes 64K --reps 2", &out, NULL);
    if (rc) print_message("%s\n", out);
    assert_int_equal(rc, 0);
    cJSON *d = cJSON_Parse(out);
    assert_non_null(d);
    cJSON *res = cJSON_GetObjectItem(d, "results");
    /* 6 collectives x 3 sizes (4K, 16K, 64K) x 2 implementations */
    assert_int_equal(cJSON_GetArraySize(res), 36);
    cJSON *o;
    cJSON_ArrayForEach(o, res) {
        double t = cJSON_GetObjectItem(o, "time_s")->valuedouble, S = cJSON_GetObjectItem(o, "bytes")->valuedouble;
        double alg = cJSON_GetObjectItem(o, "algbw_bytes_per_s")->valuedouble;
        double bus = cJSON_GetObjectItem(o, "busbw_bytes_per_s")->valuedouble;
        const char *op = cJSON_GetObjectItem(o, "op")->valuestring;
        assert_true(t > 0);
        assert_true(fabs(alg - S / t) <= 1e-9 * alg);
        double f = !strcmp(op, "all-reduce") ? 1.0 : (!strcmp(op, "broadcast") || !strcmp(op, "reduce")) ? 1.0 : 0.5;
        assert_true(fabs(bus - alg * f) <= 1e-9 * bus); /* p = 2: 2(p-1)/p = 1, (p-1)/p = 0.5 */
    }
    /* every alpha-beta fit is a latency and a time per byte that cannot be negative (the free fit
     * once printed alpha = -2419.6 us); a constrained one says which parameter it pinned */
    cJSON *fits = cJSON_GetObjectItem(d, "fits");
    assert_int_equal(cJSON_GetArraySize(fits), 12);
    cJSON_ArrayForEach(o, fits) {
        assert_true(cJSON_GetObjectItem(o, "alpha_s")->valuedouble >= 0);
        assert_true(cJSON_GetObjectItem(o, "beta_s_per_byte")->valuedouble >= 0);
        assert_true(cJSON_GetObjectItem(o, "r2")->valuedouble <= 1);
        const char *cl = cJSON_GetObjectItem(o, "clamped")->valuestring;
        assert_true(!strcmp(cl, "-") || !strcmp(cl, "alpha = 0") || !strcmp(cl, "beta = 0"));
    }
    cJSON *link = cJSON_GetObjectItem(d, "link");
    assert_non_null(link);
    assert_non_null(cJSON_GetObjectItem(link, "alpha_s"));
    assert_non_null(cJSON_GetObjectItem(link, "bandwidth_bytes_per_s"));
    cJSON_Delete(d);
    free(out);
}

static void test_bad_options(void **state) {
    (void)state;
    char *out = NULL;
    assert_int_equal(tu_run_cli("collectives demo --impl fast", &out), 2);
    assert_non_null(strstr(out, "fast"));
    free(out);
    assert_int_equal(tu_run_cli("collectives bench --ops all-sum", &out), 2);
    assert_non_null(strstr(out, "all-sum"));
    free(out);
    assert_int_equal(tu_run_cli("collectives bench --sizes 12Q", &out), 2);
    assert_non_null(strstr(out, "12Q"));
    free(out);
    assert_int_equal(tu_run_cli("collectives spin", &out), 2);
    assert_non_null(strstr(out, "spin"));
    free(out);
    assert_int_equal(tu_run_cli("collectives demo --bogus", &out), 2);
    assert_non_null(strstr(out, "--bogus"));
    free(out);
}

/* Rank 1 leaves while the others are in (or entering) an all-reduce: the job must end with a
 * non-zero status and a message that names rank 1. A hang would end in timeout's status 124. */
static void test_rank_dies_mid_collective(void **state) {
    (void)state;
    const char *how[] = {"exit", "_exit", "segv", "kill"};
    for (int k = 0; k < 4; k++) {
        char args[256], *out = NULL;
        double t;
        snprintf(args, sizeof args, "collectives bench --ops all-reduce --sizes 1M --reps 50 --inject-fault 1:%s",
                 how[k]);
        int rc = run_mpi(3, args, &out, &t);
        print_message("fault %s: status %d after %.1f s\n", how[k], rc, t);
        assert_int_not_equal(rc, 0);
        assert_int_not_equal(rc, 124); /* not a hang killed by timeout */
        /* our own line (exit, segv), or mpirun's ("process rank 1", "[[job,1],1]") */
        int named = strstr(out, "rank 1 of 3") || strstr(out, "process rank 1 ") || strstr(out, ",1],1]");
        if (!named) print_message("%s\n", out);
        assert_true(named);
        if (!strcmp(how[k], "exit") || !strcmp(how[k], "segv")) assert_non_null(strstr(out, "nanolm: rank 1 of 3"));
        free(out);
    }
}

/* One rank: the demo holds (1) and sends nothing; the benchmark times every row and fits. */
/* The library under the command. */
static void test_coll_one_rank(void **s) {
    (void)s;
    assert_int_equal(nl_comm_init(NULL, NULL), NL_OK);
    nl_comm *w = nl_comm_world();
    nl_coll_demo d;
    assert_int_equal(nl_coll_demo_run(w, NL_COMM_OURS, NL_COMM_F32, NULL, NULL, &d), NL_OK);
    assert_int_equal(d.p, 1);
    assert_true(d.rows[0] == 1.0 && d.rows[NL_COLL_DEMO_NF] == 1.0 && d.rows[NL_COLL_DEMO_NF + 1] == 1.0);
    nl_coll_demo_free(&d);
    nl_coll_bench_opts o = {.impl_mask = 3, .nops = 2, .nsizes = 2, .reps = 2, .dt = NL_COMM_F32};
    o.ops[0] = NL_COMM_OP_ALL_REDUCE, o.ops[1] = NL_COMM_OP_BROADCAST;
    o.sizes[0] = 4096, o.sizes[1] = 65536;
    nl_coll_bench_row *rows;
    int nrows;
    assert_int_equal(nl_coll_bench_run(w, &o, &rows, &nrows), NL_OK);
    assert_int_equal(nrows, 8); /* 2 ops x 2 sizes x 2 implementations */
    assert_int_equal(rows[0].impl, NL_COMM_OURS);
    assert_int_equal(rows[1].impl, NL_COMM_NATIVE);
    assert_true(rows[2].bytes == 65536 && rows[0].reps == 2);
    assert_true(isfinite(nl_coll_bench_ratio(rows, nrows, 4))); /* broadcast: busbw factor 1 */
    assert_true(isnan(nl_coll_bench_ratio(rows, nrows, 5)));    /* native has no pair */
    nl_coll_fit fits[4];
    int link;
    assert_int_equal(nl_coll_bench_fits(&o, rows, nrows, 1, fits, &link), 4);
    assert_int_equal(link, 1); /* all-reduce native */
    nl_free(rows);
    nl_comm_finalize();
}

/* The options of the benchmark: the collectives by name, and the defaults for what is not given. */
static void test_bench_opts(void **s) {
    (void)s;
    nl_coll_bench_opts o = {0};
    assert_int_equal(nl_coll_bench_parse_ops("broadcast,all-reduce", &o), NL_OK);
    assert_int_equal(o.nops, 2);
    assert_int_equal(o.ops[0], NL_COMM_OP_BROADCAST);
    assert_int_equal(o.ops[1], NL_COMM_OP_ALL_REDUCE);
    nl_coll_bench_defaults(&o, 1024, 16384, 4);
    assert_int_equal(o.nops, 2); /* given: kept */
    assert_int_equal(o.nsizes, 3);
    assert_true(o.sizes[0] == 1024 && o.sizes[1] == 4096 && o.sizes[2] == 16384);
    nl_coll_bench_opts d = {0};
    nl_coll_bench_defaults(&d, 1, 1 << 20, 2);
    assert_int_equal(d.nops, NL_COLL_BENCH_OPS);
    assert_int_equal(d.nsizes, 21);
    nl_coll_bench_opts bad = {0};
    assert_int_equal(nl_coll_bench_parse_ops("all-reduce,gather", &bad), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "'gather'"));
    assert_int_equal(nl_coll_bench_parse_ops("reduce,reduce,reduce,reduce,reduce,reduce,reduce", &bad), NL_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_demo_one_rank),
        cmocka_unit_test(test_demo_course_example),
        cmocka_unit_test(test_bench_json),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_rank_dies_mid_collective),
        cmocka_unit_test(test_coll_one_rank),
        cmocka_unit_test(test_bench_opts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
