/* plan/ against published runs: the validation set in tests/validation/published.json, priced
 * with the default assumptions. The published figures come from the sources named in each
 * entry, never from the planner. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/plan_opts.h"
#include "nanolm/plan.h"

static nl_catalog cat;

static const nl_valid_group *group(const nl_valid_result *r, const char *name) {
    for (int i = 0; i < 4; i++)
        if (!strcmp(r->groups[i].group, name)) return &r->groups[i];
    fail_msg("no group %s", name);
    return NULL;
}

/* At least 40 published figures, each with a source and a positive figure; the groups of the
 * issue are present. */
/* The published set found without --file: in the working directory, else under $NANOLM_SRC. */
static void test_default_file(void **state) {
    (void)state;
    char cwd[2048], buf[4096], root[4096], *saved = getenv("NANOLM_SRC") ? strdup(getenv("NANOLM_SRC")) : NULL;
    assert_non_null(getcwd(cwd, sizeof cwd));
    snprintf(root, sizeof root, "%s", tu_src_path("."));
    char *dir = tu_tmpdir();
    assert_int_equal(chdir(dir), 0);
    setenv("NANOLM_SRC", "/some/tree", 1);
    assert_string_equal(nl_plan_validate_default_file(buf, sizeof buf), "/some/tree/tests/validation/published.json");
    unsetenv("NANOLM_SRC");
    assert_null(nl_plan_validate_default_file(buf, sizeof buf));
    assert_int_equal(chdir(root), 0);
    assert_string_equal(nl_plan_validate_default_file(buf, sizeof buf), "tests/validation/published.json");
    assert_int_equal(chdir(cwd), 0);
    if (saved) setenv("NANOLM_SRC", saved, 1);
    free(saved);
    tu_rmdir(dir);
    free(dir);
}

static void test_set_shape(void **state) {
    (void)state;
    nl_valid_result r;
    assert_int_equal(
        nl_plan_validate(&cat, tu_src_path("tests/validation/published.json"), nl_cli_validate_run, NULL, 0, &r),
        NL_OK);
    assert_true(r.n >= 40);
    for (size_t i = 0; i < r.n; i++) {
        assert_true(r.cases[i].published > 0);
        assert_true(strlen(r.cases[i].source) > 10);
        assert_true(isfinite(r.cases[i].predicted) && r.cases[i].predicted > 0);
    }
    assert_true(group(&r, "train")->n >= 20);
    assert_true(group(&r, "memory")->n >= 10);
    assert_true(group(&r, "serve")->n >= 10);
    assert_true(group(&r, "collective")->n >= 4);
    nl_plan_validate_free(&r);
}

/* The figures on the whole set, one set of defaults for every case (in sample: the constants
 * are the catalog's). Training median 8.7% (guard 9%); four cases over 30%: FlashAttention-2's
 * baseline without FlashAttention for GPT3-1.3B at 8k (+53.9%) and LLaMA-1 65B (+30.1%), whose
 * layouts plan train chooses, NeMo's Llama 2 70B SFT on 16 H100 (-43.2%) and Llama 2 13B's
 * GPU-hours (-34.8%); memory cases whose accounting the source spells out within 3%, serving
 * median <= 10% (8.5% on 49 cases) and worst 47.2% (OCI's MI300X at batch 256; it was +104%,
 * TensorRT-LLM 0.6.1's Llama-2-70B at 2,048 outputs, before its per-query-head decode kernel was
 * priced), every published layout fitting (docs/validation.md gives the figures). */
static void test_targets(void **state) {
    (void)state;
    nl_valid_result r;
    assert_int_equal(
        nl_plan_validate(&cat, tu_src_path("tests/validation/published.json"), nl_cli_validate_run, NULL, 0, &r),
        NL_OK);
    const nl_valid_group *m = group(&r, "memory"), *t = group(&r, "train"), *s = group(&r, "serve"),
                         *c = group(&r, "collective");
    assert_true(m->n_formula >= 20);
    assert_true(m->worst_formula_abs <= 0.03);
    assert_true(t->median_abs <= 0.09); /* reached 8.7% */
    int over = 0;
    for (size_t i = 0; i < r.n; i++)
        if (!strcmp(r.cases[i].group, "train") && fabs(r.cases[i].err) > 0.30) over++;
    assert_true(over <= 4);            /* the four named above */
    assert_true(t->worst_abs <= 0.60); /* reached 53.9% */
    assert_true(s->median_abs <= 0.10);
    assert_true(s->worst_abs <= 0.50); /* reached 47.2% */
    assert_true(r.n_nofit == 0);
    /* nccl-tests bus bandwidth, NVLink SHARP included (the H100 NVLS all-reduce was -25% as a
     * ring). */
    assert_true(c->worst_abs <= 0.05);
    nl_plan_validate_free(&r);
}

/* llm-foundry's long-sequence rows outside the set (not in the targets; docs/planning.md says
 * why): the H100 FP8 table with its BF16 twins and every 8k and 32k BF16 row of the H100 80GB,
 * A100 80GB and A100 40GB tables on 8 GPUs. Every run fits, and the errors are guarded at the
 * level the attention core priced from published kernel rates reached (FP8 table: median 4.6%,
 * worst 11.5%; BF16 rows: median 5.7%, worst 27.9%, MPT-30B at 8k on A100; with the flat 0.4
 * they were 24.1% / 70.7% and 6.8% / 56.9%), so that a change that prices long sequences worse
 * fails. */
static void test_long_sequence_tables(void **state) {
    (void)state;
    static const struct {
        const char *path;
        double median, worst;
    } t[] = {{"tests/validation/foundry-h100-fp8-table.json", 0.05, 0.12},
             {"tests/validation/foundry-long-seq-bf16.json", 0.06, 0.28}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        nl_valid_result r;
        assert_int_equal(nl_plan_validate(&cat, tu_src_path(t[i].path), nl_cli_validate_run, NULL, 0, &r), NL_OK);
        const nl_valid_group *g = group(&r, "train");
        assert_true(g->n >= 16);
        assert_true(r.n_nofit == 0);
        assert_true(g->median_abs <= t[i].median);
        assert_true(g->worst_abs <= t[i].worst);
        nl_plan_validate_free(&r);
    }
}

/* DeepSeek-V3's selective recipe as its report describes it (sec. 3.3.2-3.3.3), per token and
 * layer at tp 1: the two RMSNorm inputs in bf16 (2 x 2 x 7168), the q and kv latents in FP8
 * (1536 + 512 + 64), the attention output in E5M6 (1.5 x 128 heads x 128), the fp32 log-sum-exp
 * (4 x 128), the inputs of the 8 routed + 1 shared experts in FP8 (58 of 61 layers; the 3 dense
 * layers keep one 7168 input), the SwiGLU inputs in FP8 (2 x 9 x 2048 on MoE layers, 2 x 18432
 * on dense ones) and the fp32 router logits (4 x 256 on MoE layers). */
static void test_ds3_activations(void **state) {
    (void)state;
    nl_arch a;
    assert_int_equal(nl_catalog_find_model(&cat, "deepseek-v3", &a), NL_OK);
    nl_act_opts o = {.tp = 1,
                     .flash = 1,
                     .recompute = NL_RECOMPUTE_SELECTIVE,
                     .seq = 4096,
                     .bytes_per_elem = 2,
                     .fp8_cache = NL_FP8_CACHE_DS3};
    nl_act_layer l;
    nl_plan_act_layer(&a, &o, &l);
    double moe = 58.0 / 61.0, dense = 3.0 / 61.0;
    double want = 2 * 2 * 7168.0 + (1536 + 512 + 64) + 1.5 * 128 * 128 + 4 * 128 + (moe * 9 + dense) * 7168 +
                  moe * 2 * 9 * 2048 + dense * 2 * 18432 + moe * 4 * 256;
    assert_true(fabs(l.bytes_per_token - want) < 1e-6 * want);
    /* Without the recipe the same layer keeps the bf16 walk: more than twice as much. */
    o.fp8_cache = NL_FP8_CACHE_NONE;
    nl_act_layer b;
    nl_plan_act_layer(&a, &o, &b);
    assert_true(b.bytes_per_token > 2 * l.bytes_per_token);
}

/* Bad input: a missing file, a non-array, an entry without a source, an unknown metric. */
static void test_bad_files(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char path[4096];
    nl_valid_result r;
    snprintf(path, sizeof path, "%s/none.json", dir);
    assert_int_not_equal(nl_plan_validate(&cat, path, nl_cli_validate_run, NULL, 0, &r), NL_OK);
    static const char *bad[] = {
        "{\"id\": \"x\"}",
        "[{\"id\": \"x\", \"group\": \"memory\", \"metric\": \"state_gb\", \"published\": 1, "
        "\"command\": \"budget --params 1e9 --zero 0\"}]",
        "[{\"id\": \"x\", \"group\": \"memory\", \"source\": \"a paper, Table 1\", \"metric\": \"nonsense\", "
        "\"published\": 1, \"command\": \"budget --params 1e9 --zero 0\"}]",
        "[{\"id\": \"x\", \"group\": \"train\", \"source\": \"a paper, Table 1\", "
        "\"command\": \"plan train --model no-such-model --gpus 8\", \"metric\": \"mfu\", \"published\": 40}]",
        "[{\"id\": \"x\", \"group\": \"collective\", \"source\": \"a paper, Table 1\", \"model\": \"-\", "
        "\"gpu\": \"h100\", \"gpus\": 8, \"collective\": \"all-reduce\", \"algo\": \"tree\", \"bytes\": 1e9, "
        "\"metric\": \"busbw_gbs\", \"published\": 400}]",
        "[{\"id\": \"x\", \"group\": \"train\", \"source\": \"a paper, Table 1\", \"command\": \"plan train "
        "--model llama-2-7b --gpus 8 --dp 8 --global-batch 8 --seq 4096 --attention sdpa\", \"metric\": \"mfu\", "
        "\"published\": 40}]",
        "[{\"id\": \"x\", \"group\": \"train\", \"source\": \"a paper, Table 1\", \"command\": \"plan train "
        "--model llama-2-7b --gpus 8 --dp 8 --global-batch 8 --seq 4096\", \"flops\": \"palm\", \"metric\": \"mfu\", "
        "\"published\": 40}]",
        "[{\"id\": \"x\", \"group\": \"train\", \"source\": \"a paper, Table 1\", \"metric\": \"mfu\", "
        "\"published\": 40}]",
    };
    static const char *want[] = {"JSON array",   "source",      "unknown memory metric", "unknown model",
                                 "algo must be", "--attention", "flops must be",         "\"command\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(path, sizeof path, "%s/bad%zu.json", dir, i);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(bad[i], f);
        fclose(f);
        assert_int_not_equal(nl_plan_validate(&cat, path, nl_cli_validate_run, NULL, 0, &r), NL_OK);
        assert_non_null(strstr(nl_last_error(), want[i]));
        assert_non_null(strstr(nl_last_error(), path));
    }
    tu_rmdir(dir);
    free(dir);
}

/* A throughput figure is priced with the FLOP count its source divides by. The same OPT-175B
 * run under Korthikanti et al.'s model FLOPs, 72 B s l h^2 (1 + s/6h + V/12lh), and under the
 * Chinchilla paper's appendix F: with a 4h two-matrix MLP and heads x head dim = h the two
 * differ only by what Chinchilla adds, the input embedding as a matmul (3 x 2 s V h per
 * sequence) and 3 FLOPs per attention score for the softmax (3 x 3 H s^2 per layer). */
static void test_flops_conventions(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/opt.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    const char *conv[] = {"megatron-model", "chinchilla"};
    fputs("[", f);
    for (int i = 0; i < 2; i++)
        fprintf(f,
                "%s{\"id\": \"opt-%s\", \"group\": \"train\", \"source\": \"a paper, sec. 2\", "
                "\"command\": \"plan train --model opt-175b --gpu a100 --gpus 992 --dp 124 --tp 8 --pp 1 "
                "--micro-batch 8 --zero 2 --recompute full --sp off --distribute-saved --global-batch 992 --seq 2048 "
                "--attention materialized\", \"flops\": \"%s\", \"metric\": \"tflops_per_gpu\", \"published\": 147}",
                i ? ", " : "", conv[i], conv[i]);
    fputs("]", f);
    fclose(f);
    nl_valid_result r;
    assert_int_equal(nl_plan_validate(&cat, path, nl_cli_validate_run, NULL, 0, &r), NL_OK);
    assert_int_equal(r.n, (size_t)2);
    double s = 2048, l = 96, h = 12288, V = 50272, H = 96;
    double megatron = 72 * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
    double extra = 9 * H * s * s * l + 6 * s * V * h;
    double ratio = r.cases[1].predicted / r.cases[0].predicted;
    assert_true(fabs(ratio / (1 + extra / megatron) - 1) < 1e-9);
    assert_true(ratio > 1.002 && ratio < 1.006); /* 0.36% more: small at this shape */
    nl_plan_validate_free(&r);
    tu_rmdir(dir);
    free(dir);
}

/* The command prints the table, the summary per group, and the same data with --json. */
/* The FP8 reduction-loop term against the sweep it was fitted to (tilelang's H800 SXM matmul
 * benchmarks, M = N = 8192): at each K the FP8 rate over its K = 16384 rate, divided by the same
 * ratio for FP16, is what nl_plan_gemm_fp8_k_eff(K) / nl_plan_gemm_fp8_k_eff(16384) must give.
 * The measured TFLOP/s are the benchmark READMEs' tables. */
static void test_fp8_k_term(void **state) {
    (void)state;
    static const double k[] = {256, 512, 1024, 2048, 4096, 8192, 16384};
    static const double fp16_tflops[] = {386, 520, 628, 705, 736, 758, 766};
    static const double fp8_tflops[] = {569, 858, 1129, 1343, 1467, 1507, 1541};
    for (int i = 0; i < 7; i++) {
        double measured = (fp8_tflops[i] / fp8_tflops[6]) / (fp16_tflops[i] / fp16_tflops[6]);
        double model = nl_plan_gemm_fp8_k_eff(k[i]) / nl_plan_gemm_fp8_k_eff(k[6]);
        if (fabs(model / measured - 1) > 0.03) fail_msg("K %g: model %.3f, measured %.3f", k[i], model, measured);
    }
    assert_true(nl_plan_gemm_fp8_k_eff(1e9) > 0.999); /* long reductions cost nothing extra */
}

static void test_cli(void **state) {
    (void)state;
    char *out = NULL;
    assert_int_equal(tu_run_cli("plan validate", &out), 0);
    assert_non_null(strstr(out, "In sample"));
    assert_non_null(strstr(out, "megatron21-1.7b"));
    free(out);
    assert_int_equal(tu_run_cli("plan validate --json", &out), 0);
    assert_non_null(strstr(out, "\"median_abs_error\""));
    free(out);
}

/* Leave-one-source-out: the GEMM efficiency of each GPU generation refit on every source but the
 * case's own, through the commands' --gemm-eff. Issue 33's targets: training median <= 8% (met:
 * 7.6% on 89 cases), memory <= 5% (met: 1.3%), no published layout rejected (met: 0). Missed, and
 * guarded at the level reached, nothing tuned: every training case <= 30% (five over, worst
 * +59.1%, FlashAttention-2's GPT3-1.3B at 8k without FlashAttention; Llama 2 7B's GPU-hours went
 * from -29.7% to -31.8% when the A100 refit took in TensorRT-LLM 0.9.0's rows) and serving median
 * <= 12% (12.9% on 49 cases: OCI's MI300X batches >= 16 and TensorRT-LLM's H100/H200 rows priced
 * with the Hopper constant fit on training runs; the worst, 47.2%, was 129% before TensorRT-LLM
 * 0.6.1's per-query-head decode kernel was priced). */
static void test_holdout_targets(void **state) {
    (void)state;
    nl_valid_result r;
    assert_int_equal(
        nl_plan_validate(&cat, tu_src_path("tests/validation/published.json"), nl_cli_validate_run, NULL, 1, &r),
        NL_OK);
    assert_true(r.has_holdout);
    const nl_valid_group *t = &r.holdout[0], *m = &r.holdout[1], *s = &r.holdout[2];
    assert_string_equal(t->group, "train");
    assert_true(t->n >= 40);
    assert_true(t->median_abs <= 0.08);
    int over = 0;
    for (size_t i = 0; i < r.n; i++)
        if (!strcmp(r.cases[i].group, "train") && fabs(r.cases[i].err_holdout) > 0.30) over++;
    assert_true(over <= 5);
    assert_true(t->worst_abs <= 0.60);
    assert_true(m->worst_abs <= 0.05);
    assert_true(s->median_abs <= 0.13); /* target 0.12, missed: 0.129 */
    assert_true(s->worst_abs <= 0.50);  /* reached 47.2% */
    assert_true(r.n_nofit == 0);
    /* every calibrated case was priced with a constant fit without its source, inside the grid */
    for (size_t i = 0; i < r.n; i++)
        if (r.cases[i].gemm_eff_holdout > 0) assert_true(r.cases[i].gemm_eff_holdout >= 0.4);
    for (int k = 0; k < NL_VALID_CONSTS; k++) assert_true(r.consts[k].n_cases > 0 && r.consts[k].fit_all > 0);
    nl_plan_validate_free(&r);
}

/* One program: a case's command run as a user runs it (the CLI binary, --json) gives the figure
 * validation read for it (checked on every fifth training case: TFLOP/s from the step time). */
static void test_commands_are_the_cases(void **state) {
    (void)state;
    nl_valid_result r;
    assert_int_equal(
        nl_plan_validate(&cat, tu_src_path("tests/validation/published.json"), nl_cli_validate_run, NULL, 0, &r),
        NL_OK);
    int checked = 0;
    for (size_t i = 0; i < r.n; i++) {
        const nl_valid_case *c = &r.cases[i];
        if (strcmp(c->group, "train") || strcmp(c->metric, "tokens_per_s_per_gpu") || i % 5) continue;
        char args[800], *out = NULL;
        snprintf(args, sizeof args, "%s --json", c->command + 0);
        assert_int_equal(tu_run_cli(args, &out), 0);
        const char *k = strstr(out, "\"tokens_per_s\":");
        const char *g = strstr(out, "\"gpus\":");
        assert_non_null(k);
        assert_non_null(g);
        double tps = strtod(k + strlen("\"tokens_per_s\":"), NULL), gpus = strtod(g + strlen("\"gpus\":"), NULL);
        assert_true(fabs(tps / gpus / c->predicted - 1) < 1e-9);
        free(out);
        checked++;
    }
    assert_true(checked >= 2);
    nl_plan_validate_free(&r);
}

/* TensorRT-LLM's Llama-2-70B throughput tables before and after its XQA kernel, on the same GPUs
 * and benchmark: 0.6.1 (generation attention one thread block per query head, cases priced with
 * --decode-attn per-head) and 0.9.0 (XQA enabled, the default grouped read). Every row is within
 * 30% in sample and H200 has cases; the 0.6.1 row with 2,048 outputs on 4 H100 priced with the
 * grouped read instead is over twice its published 1,486 tokens/s per GPU. */
static void test_trtllm_decode_kernels(void **state) {
    (void)state;
    nl_valid_result r;
    assert_int_equal(
        nl_plan_validate(&cat, tu_src_path("tests/validation/published.json"), nl_cli_validate_run, NULL, 0, &r),
        NL_OK);
    int old = 0, xqa = 0, h200 = 0;
    for (size_t i = 0; i < r.n; i++) {
        const nl_valid_case *c = &r.cases[i];
        if (!strncmp(c->id, "trtllm09-", 9) && !strcmp(c->gpu, "h200")) h200++;
        if (!strstr(c->id, "-tput-") || !strstr(c->id, "llama-2-70b")) continue;
        int per_head = strstr(c->command, "--decode-attn per-head") != NULL;
        assert_int_equal(per_head, strncmp(c->id, "trtllm09-", 9) != 0);
        per_head ? old++ : xqa++;
        assert_true(fabs(c->err) <= 0.30);
    }
    assert_true(old >= 7 && xqa >= 12 && h200 >= 12);
    nl_plan_validate_free(&r);
    char *out = NULL;
    assert_int_equal(tu_run_cli("plan serve --model llama-2-70b --gpu h100 --tp 4 --batch 480 --prompt 128 "
                                "--output 2048 --precision fp8 --json",
                                &out),
                     0);
    const char *k = strstr(out, "\"batch_prefill_s\":"), *t = strstr(out, "\"tpot_s\":");
    assert_non_null(k);
    assert_non_null(t);
    double secs = strtod(k + strlen("\"batch_prefill_s\":"), NULL) + 2048 * strtod(t + strlen("\"tpot_s\":"), NULL);
    assert_true(480 * 2048 / secs / 4 > 2 * 1486);
    free(out);
}

int main(void) {
    nl_catalog_init(&cat);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_set_shape),
        cmocka_unit_test(test_default_file),
        cmocka_unit_test(test_targets),
        cmocka_unit_test(test_ds3_activations),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_flops_conventions),
        cmocka_unit_test(test_fp8_k_term),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_holdout_targets),
        cmocka_unit_test(test_commands_are_the_cases),
        cmocka_unit_test(test_trtllm_decode_kernels),
        cmocka_unit_test(test_long_sequence_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
