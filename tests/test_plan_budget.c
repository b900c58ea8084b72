/* plan/ memory: bytes per parameter by ZeRO stage, activations (the course's 384 GiB), MoE. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/plan.h"

#define ROUNDS_TO(x, v, unit) assert_true(fabs((double)(x) - (double)(v)) <= 0.5 * (unit) + 1e-9 * fabs((double)(v)))

static double state_gb(double n, nl_zero z, int64_t dp) {
    nl_recipe r;
    assert_int_equal(nl_plan_recipe("bf16", &r), NL_OK);
    nl_state_bytes s;
    nl_plan_state_bytes(&r, z, dp, 0, &s);
    return n * s.total / 1e9;
}

static void test_course_zero(void **state) {
    (void)state;
    nl_recipe r;
    nl_plan_recipe("bf16", &r);
    nl_state_bytes s;
    /* 16 bytes/param under DDP: 7B -> 112 GB per GPU. */
    nl_plan_state_bytes(&r, NL_ZERO_0, 4, 0, &s);
    assert_true(s.total == 16);
    ROUNDS_TO(state_gb(7e9, NL_ZERO_0, 4), 112, 1);
    /* 4 GPUs: ZeRO-1 7 bytes/param = 49 GB, ZeRO-2 5.5 = 38.5 GB, ZeRO-3 4 = 28 GB. */
    nl_plan_state_bytes(&r, NL_ZERO_1, 4, 0, &s);
    assert_true(s.total == 7);
    ROUNDS_TO(state_gb(7e9, NL_ZERO_1, 4), 49, 1);
    nl_plan_state_bytes(&r, NL_ZERO_2, 4, 0, &s);
    assert_true(s.total == 5.5);
    ROUNDS_TO(state_gb(7e9, NL_ZERO_2, 4), 38.5, 0.1);
    nl_plan_state_bytes(&r, NL_ZERO_3, 4, 0, &s);
    assert_true(s.total == 4);
    ROUNDS_TO(state_gb(7e9, NL_ZERO_3, 4), 28, 1);
    /* 8 GPUs, ZeRO-3: 2 bytes/param = 14 GB. */
    nl_plan_state_bytes(&r, NL_ZERO_3, 8, 0, &s);
    assert_true(s.total == 2);
    ROUNDS_TO(state_gb(7e9, NL_ZERO_3, 8), 14, 1);
    /* 70B: 1.12 TB of state; 140 GB per GPU on 8 (does not fit 80 GB); 17.5 GB on 64. */
    ROUNDS_TO(70e9 * 16 / 1e12, 1.12, 0.01);
    ROUNDS_TO(state_gb(70e9, NL_ZERO_3, 8), 140, 1);
    assert_true(state_gb(70e9, NL_ZERO_3, 8) > 80);
    ROUNDS_TO(state_gb(70e9, NL_ZERO_3, 64), 17.5, 0.1);
    /* TP = 8 in a node + ZeRO-1 across 8 nodes: 8.75e9 x (2 + 2 + 12/8) ~ 48 GB. */
    ROUNDS_TO(state_gb(70e9 / 8, NL_ZERO_1, 8), 48, 1);
    /* HSDP shards inside the group only. */
    nl_plan_state_bytes(&r, NL_ZERO_HSDP, 512, 8, &s);
    assert_true(s.total == 2);
    assert_int_equal(nl_plan_recipe("bf17", &r), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "fp8"));
}

static void test_course_384gib(void **state) {
    (void)state;
    nl_catalog cat;
    nl_catalog_init(&cat);
    nl_arch a;
    assert_int_equal(nl_catalog_find_model(&cat, "llama-3-8b", &a), NL_OK);
    /* Llama-3-8B, batch 8 x 8192 tokens, bf16, flash attention, no recomputation, counted as
     * Korthikanti et al. count a layer (fused SwiGLU keeps gate and up, recomputes SiLU): 34
     * bytes per hidden unit per token per layer = 272 GiB (plus 0.07% of softmax statistics).
     * The course's 48 (384 GiB) also kept sigmoid(gate) and SiLU(gate) and a second copy of the
     * norm inputs. */
    nl_act_opts o = {.tp = 1, .sp = 0, .flash = 1, .recompute = NL_RECOMPUTE_NONE, .seq = 8192, .bytes_per_elem = 2};
    nl_act_layer L;
    nl_plan_act_layer(&a, &o, &L);
    double gib = (double)(1u << 30), tokens = 8.0 * 8192;
    double stats = 4.0 * 32; /* fp32 log-sum-exp per head */
    /* 4 D-sized (norm inputs and outputs), Q and wo input (q = D), K and V (kv = D/4), gate, up
     * and SwiGLU output (F = 3.5 D): 2 x (4 + 2 + 0.5 + 10.5) D = 34 D bytes. */
    assert_true(L.bytes_per_token - stats == 34.0 * 4096);
    ROUNDS_TO(L.bytes_per_token * tokens * 32 / gib, 272, 1);
    double sum = 0;
    for (int i = 0; i < L.n; i++) sum += L.terms[i].bytes;
    assert_true(sum == L.bytes_per_token);
    /* Korthikanti et al. 2022 as published: 34 sbh with flash/selective = 272 GiB here; full
     * recomputation keeps the layer input only: 2 sbh = 16 GiB. */
    ROUNDS_TO(nl_plan_act_korthikanti(&a, 8192, NL_RECOMPUTE_NONE, 1, 1, 0) * tokens * 32 / gib, 272, 1);
    ROUNDS_TO(nl_plan_act_korthikanti(&a, 8192, NL_RECOMPUTE_FULL, 1, 1, 0) * tokens * 32 / gib, 16, 1);
    /* Without flash: the a*s*b*s score terms dominate (34 + 5 a s / h). */
    assert_true(nl_plan_act_korthikanti(&a, 8192, NL_RECOMPUTE_NONE, 0, 1, 0) ==
                4096.0 * (34 + 5.0 * 32 * 8192 / 4096));
    /* Selective keeps no more (with flash attention there are no scores to drop), full least. */
    o.recompute = NL_RECOMPUTE_SELECTIVE;
    nl_act_layer S;
    nl_plan_act_layer(&a, &o, &S);
    o.recompute = NL_RECOMPUTE_FULL;
    nl_act_layer F;
    nl_plan_act_layer(&a, &o, &F);
    assert_true(S.bytes_per_token <= L.bytes_per_token && F.bytes_per_token < S.bytes_per_token);
    assert_true(F.bytes_per_token == 2.0 * 4096);
    /* Tensor parallel without SP leaves the 4 norm tensors replicated; SP shards them too. */
    o.recompute = NL_RECOMPUTE_NONE;
    o.tp = 8;
    nl_act_layer T8, T8s;
    nl_plan_act_layer(&a, &o, &T8);
    o.sp = 1;
    nl_plan_act_layer(&a, &o, &T8s);
    assert_true(fabs(T8s.bytes_per_token - L.bytes_per_token / 8) < 1e-6);
    assert_true(fabs(T8.bytes_per_token - (T8s.bytes_per_token + 4 * 2 * 4096 * 7.0 / 8)) < 1e-6);
}

static void test_course_moe(void **state) {
    (void)state;
    nl_catalog cat;
    nl_catalog_init(&cat);
    nl_arch a;
    assert_int_equal(nl_catalog_find_model(&cat, "course-moe", &a), NL_OK);
    nl_arch_params p;
    nl_arch_count_params(&a, &p);
    double expert = 3.0 * 2048 * 1024, attn = 4.0 * 2048 * 2048;
    ROUNDS_TO(expert / 1e6, 6.3, 0.1);
    ROUNDS_TO(attn / 1e6, 16.8, 0.1);
    ROUNDS_TO(((double)p.attention + (double)p.mlp_experts + (double)p.mlp_shared) / 24 / 1e6, 432, 1);
    /* Embeddings not counted: ~10.4B in all, ~1.6B active per token. */
    ROUNDS_TO((double)p.non_embedding / 1e9, 10.4, 0.1);
    double active_ne = (double)(p.active - p.embedding - p.classifier);
    ROUNDS_TO(active_ne / 24 / 1e6, 67, 1);
    ROUNDS_TO(active_ne / 1e9, 1.6, 0.1);
    /* EP = 8: 8 routed experts of each layer + the shared ones + attention: ~80M per layer,
     * 1.9B parameters, 3.8 GB in bf16. */
    double per_gpu = (double)p.non_embedding - (double)p.mlp_experts + (double)p.mlp_experts / 8;
    ROUNDS_TO(per_gpu / 24 / 1e6, 80, 1);
    ROUNDS_TO(per_gpu / 1e9, 1.9, 0.1);
    ROUNDS_TO(per_gpu * 2 / 1e9, 3.8, 0.1);
    /* The same through the command. */
    char *out = NULL;
    assert_int_equal(tu_run_cli("budget --model course-moe --gpus 8 --ep 8 --json", &out), 0);
    char *q = strstr(out, "\"params_per_gpu_non_embedding\":");
    assert_non_null(q);
    ROUNDS_TO(strtod(q + strlen("\"params_per_gpu_non_embedding\":"), NULL) / 1e9, 1.9, 0.1);
    free(out);
}

/* ZeRO stages and recomputation by name, each name back to its stage; anything else -1. */
static void test_stage_names(void **state) {
    (void)state;
    const char *zeros[] = {"0", "DDP", "1", "zero1", "2", "zero2", "3", "zero3", "FSDP", "hsdp"};
    const int want[] = {NL_ZERO_0, NL_ZERO_0, NL_ZERO_1, NL_ZERO_1, NL_ZERO_2,
                        NL_ZERO_2, NL_ZERO_3, NL_ZERO_3, NL_ZERO_3, NL_ZERO_HSDP};
    for (int i = 0; i < 10; i++) assert_int_equal(nl_zero_parse(zeros[i]), want[i]);
    for (int z = NL_ZERO_0; z <= NL_ZERO_HSDP; z++) assert_int_equal(nl_zero_parse(nl_zero_name((nl_zero)z)), z);
    assert_int_equal(nl_zero_parse("4"), -1);
    assert_int_equal(nl_zero_parse(""), -1);
    for (int r = NL_RECOMPUTE_NONE; r <= NL_RECOMPUTE_FULL; r++)
        assert_int_equal(nl_recompute_parse(nl_recompute_name((nl_recompute)r)), r);
    assert_int_equal(nl_recompute_parse("Selective"), NL_RECOMPUTE_SELECTIVE);
    assert_int_equal(nl_recompute_parse("partial"), -1);
}

static void test_cli(void **state) {
    (void)state;
    char *out = NULL;
    assert_int_equal(tu_run_cli("budget --params 7B --gpus 4", &out), 0);
    assert_non_null(strstr(out, "zero1  4   2        2      3          7            49.00"));
    assert_non_null(strstr(out, "38.50"));
    free(out);
    assert_int_equal(tu_run_cli("budget --model llama-3-8b --batch 8 --seq 8192 --json", &out), 0);
    char *q = strstr(out, "\"bytes_per_hidden_unit\":");
    assert_non_null(q);
    ROUNDS_TO(strtod(q + strlen("\"bytes_per_hidden_unit\":"), NULL), 34, 1);
    free(out);
    char *dir = tu_tmpdir();
    char args[512];
    snprintf(args, sizeof args, "budget --model llama-3-8b --batch 1 --svg %s/mem.svg", dir);
    assert_int_equal(tu_run_cli(args, &out), 0);
    free(out);
    snprintf(args, sizeof args, "%s/mem.svg", dir);
    char *svg = tu_read_file(args, NULL);
    assert_non_null(svg);
    assert_non_null(strstr(svg, "zero3"));
    free(svg);
    tu_rmdir(dir);
    free(dir);
    assert_int_equal(tu_run_cli("budget --model llama-9", &out), 2);
    assert_non_null(strstr(out, "llama-3-8b")); /* lists the known models */
    free(out);
    assert_int_equal(tu_run_cli("budget --params 7B --zero 5", &out), 2);
    assert_non_null(strstr(out, "--zero"));
    free(out);
    assert_int_equal(tu_run_cli("budget --params 7B --gpus 6 --tp 4", &out), 2);
    free(out);
}

/* Issue 16's budget bugs: the Korthikanti rows honour --tp and --sp; --params -7B names the
 * problem. */
static void test_budget_bugs(void **state) {
    (void)state;
    nl_catalog cat;
    nl_catalog_init(&cat);
    nl_arch a;
    assert_int_equal(nl_catalog_find_model(&cat, "llama-3-8b", &a), NL_OK);
    double h = 4096, as_h = 5.0 * 32 * 8192 / 4096;
    assert_true(nl_plan_act_korthikanti(&a, 8192, NL_RECOMPUTE_NONE, 0, 8, 0) == h * (10 + 24.0 / 8 + as_h / 8));
    assert_true(nl_plan_act_korthikanti(&a, 8192, NL_RECOMPUTE_NONE, 0, 8, 1) == h / 8 * (34 + as_h));
    assert_true(nl_plan_act_korthikanti(&a, 8192, NL_RECOMPUTE_SELECTIVE, 0, 8, 1) == h / 8 * 34);
    char *out = NULL;
    assert_int_equal(tu_run_cli("budget --model llama-3-8b --batch 1 --seq 8192 --gpus 8 --tp 8 --sp --json", &out), 0);
    char *q = strstr(out, "\"korthikanti_flash_bytes\":");
    assert_non_null(q);
    double got = strtod(q + strlen("\"korthikanti_flash_bytes\":"), NULL);
    assert_true(fabs(got - h / 8 * 34 * 8192 * 32) < 1e-6 * got);
    free(out);
    assert_int_equal(tu_run_cli("budget --params -7B", &out), 2);
    assert_non_null(strstr(out, "--params must be a positive"));
    assert_null(strstr(out, "give --model"));
    free(out);
}

/* The text of the option group titled `title` in the --help of `cmd`: from its heading to the
 * blank line after it (malloc'd). */
static char *help_group(const char *cmd, const char *title) {
    char args[128], head[96], *out = NULL;
    snprintf(args, sizeof args, "%s --help", cmd);
    assert_int_equal(tu_run_cli(args, &out), 0);
    snprintf(head, sizeof head, "\n%s:\n", title);
    const char *p = strstr(out, head);
    if (!p) {
        fail_msg("nanolm %s has no group '%s'", args, title);
        return NULL;
    }
    const char *end = strstr(p + 1, "\n\n");
    size_t n = end ? (size_t)(end - p) : strlen(p);
    char *g = malloc(n + 1);
    assert_non_null(g);
    memcpy(g, p, n);
    g[n] = 0;
    free(out);
    return g;
}

/* The planner's option groups are declared once (src/cli/plan_opts.c): every command that takes
 * them shows the same lines, so one spelling and one meaning per option. */
static void test_planner_option_groups(void **state) {
    (void)state;
    static const char *model_cmds[] = {"plan train", "plan layer", "plan serve"};
    char *model = help_group("budget", "model"), *hw = help_group("budget", "hardware");
    char *assume = help_group("plan train", "assumptions (docs/planning.md)");
    assert_non_null(strstr(model, "--model-file"));
    assert_non_null(strstr(hw, "--recipe"));
    assert_non_null(strstr(assume, "--gemm-eff"));
    assert_non_null(strstr(assume, "--napkin"));
    for (int i = 0; i < 3; i++) {
        char *m = help_group(model_cmds[i], "model"), *h = help_group(model_cmds[i], "hardware");
        char *a = help_group(model_cmds[i], "assumptions (docs/planning.md)");
        assert_string_equal(m, model);
        assert_string_equal(h, hw);
        assert_string_equal(a, assume);
        free(m);
        free(h);
        free(a);
    }
    free(model);
    free(hw);
    free(assume);
}

/* The number of microbatches is --microbatches everywhere; --micro, the old spelling that the
 * README uses, gives the same result. */
static void test_microbatches_spelling(void **state) {
    (void)state;
    static const struct {
        const char *args, *value, *expect; /* `args --microbatches value` */
    } c[] = {{"budget --model llama-3-8b --gpus 16 --pp 4", "6", "Pipeline of 4 stages, 6 microbatches"},
             {"plan layer --model llama-2-7b --dp 4 --pp 2", "4", "4 microbatch(es) per step"},
             {"plan pipeline --stages 4", "8", "4 stages, 8 microbatches"}};
    for (int i = 0; i < 3; i++) {
        char a1[160], a2[160], *o1 = NULL, *o2 = NULL;
        snprintf(a1, sizeof a1, "%s --microbatches %s", c[i].args, c[i].value);
        snprintf(a2, sizeof a2, "%s --micro %s", c[i].args, c[i].value);
        assert_int_equal(tu_run_cli(a1, &o1), 0);
        assert_int_equal(tu_run_cli(a2, &o2), 0);
        if (!strstr(o1, c[i].expect)) fail_msg("nanolm %s: no '%s' in:\n%s", a1, c[i].expect, o1);
        assert_string_equal(o1, o2);
        free(o1);
        free(o2);
    }
}

/* The assumptions group reaches the cost model: inside one node --napkin is --mfu 0.4 --link-eff 1
 * --latency-us 0 (plan layer prints no timing of its own, so the two outputs must match byte for
 * byte); across nodes it is also the course's one link per GPU (FSDP at dp 512: 0.28 s per
 * collective); and --hw may be given more than once, each file adding its GPU. */
static void test_planner_options_take_effect(void **state) {
    (void)state;
    char *o1 = NULL, *o2 = NULL, *o3 = NULL;
    assert_int_equal(tu_run_cli("plan layer --model llama-2-7b --dp 8 --zero 3 --napkin", &o1), 0);
    assert_int_equal(
        tu_run_cli("plan layer --model llama-2-7b --dp 8 --zero 3 --mfu 0.4 --link-eff 1 --latency-us 0", &o2), 0);
    assert_int_equal(tu_run_cli("plan layer --model llama-2-7b --dp 8 --zero 3", &o3), 0);
    assert_string_equal(o1, o2);
    assert_string_not_equal(o1, o3);
    assert_non_null(strstr(o1, "latency 0 us"));
    free(o1);
    free(o2);
    free(o3);
    assert_int_equal(
        tu_run_cli("plan layer --model llama-2-7b --params 7B --dp 512 --zero 3 --tokens-per-gpu 16384 --napkin", &o1),
        0);
    if (!strstr(o1, "279 ms  x1")) fail_msg("the course's 0.28 s per FSDP collective at dp 512: %s", o1);
    free(o1);
    char *dir = tu_tmpdir(), a[300], b[300], args[700], *out = NULL;
    snprintf(a, sizeof a, "%s/a.json", dir);
    snprintf(b, sizeof b, "%s/b.json", dir);
    const char *body[] = {"{\"name\": \"gpu-a\", \"base\": \"h100\"}", "{\"name\": \"gpu-b\", \"base\": \"a100\"}"};
    const char *path[] = {a, b};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(path[i], "w");
        assert_non_null(f);
        fputs(body[i], f);
        fclose(f);
    }
    snprintf(args, sizeof args, "plan catalog --hw %s --hw %s", a, b);
    assert_int_equal(tu_run_cli(args, &out), 0);
    assert_non_null(strstr(out, "gpu-a"));
    assert_non_null(strstr(out, "gpu-b"));
    free(out);
    snprintf(args, sizeof args, "budget --params 7B --hw %s --hw %s --gpu gpu-b", a, b);
    assert_int_equal(tu_run_cli(args, &out), 0);
    assert_non_null(strstr(out, "against gpu-b's"));
    free(out);
    assert_int_equal(tu_run_cli("plan train --model llama-2-7b --gpus 8 --gemm-eff 2", &out), 2);
    assert_non_null(strstr(out, "--gemm-eff"));
    free(out);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_course_zero),
        cmocka_unit_test(test_course_384gib),
        cmocka_unit_test(test_course_moe),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_stage_names),
        cmocka_unit_test(test_budget_bugs),
        cmocka_unit_test(test_planner_option_groups),
        cmocka_unit_test(test_microbatches_spelling),
        cmocka_unit_test(test_planner_options_take_effect),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
