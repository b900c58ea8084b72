/* plan/ on inputs the planner used to misprice or misreport (issue 33): each test failed before
 * its fix. fp32 at the TF32 rate; FP8 refused on GPUs without FP8 units; the family a field of
 * the model file, never its name; DualPipe's overlap bounded and its constraints checked; errors
 * that name the real constraint; Llama 3 405B's uneven pipeline reachable from plan train; plan
 * serve's explanation made of the terms of its numbers; H800's NVLink SHARP. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "nanolm/plan.h"

static nl_catalog cat;

static void req(nl_train_req *q, const char *model, const char *gpu, const char *recipe) {
    memset(q, 0, sizeof *q);
    assert_int_equal(nl_catalog_find_model(&cat, model, &q->arch), NL_OK);
    nl_catalog_family(&cat, model, &q->fam);
    assert_int_equal(nl_catalog_find_hw(&cat, gpu, &q->hw), NL_OK);
    assert_int_equal(nl_plan_recipe(recipe, &q->recipe), NL_OK);
    nl_eff_default(&q->eff);
    q->tokens = 1e12;
}

/* --recipe fp32 runs its GEMMs on the TF32 units (A100: 156 against 312 TFLOP/s bf16), with
 * 4-byte activations: the same layout's compute takes well over 1.5x bf16's (the GEMMs alone
 * 2x). Before: priced at the bf16 rate, fp32 came out as fast as bf16. */
static void test_fp32_at_tf32_rate(void **state) {
    (void)state;
    nl_train_req q;
    nl_layout L = {8, 1, 1, 1, 1, NL_ZERO_1, 1, 16, 1, NL_RECOMPUTE_FULL, 0};
    nl_train_eval b, f;
    req(&q, "llama-2-7b", "a100", "bf16");
    q.gpus = 8, q.seq = 4096, q.global_batch = 128;
    assert_int_equal(nl_plan_train_eval(&q, &L, &b), NL_OK);
    assert_int_equal(nl_plan_recipe("fp32", &q.recipe), NL_OK);
    assert_int_equal(nl_plan_train_eval(&q, &L, &f), NL_OK);
    assert_true(q.hw.flops_tf32 > 0 && q.hw.flops_tf32 < q.hw.flops_bf16);
    assert_true(f.t_compute > 1.5 * b.t_compute);
    assert_true(f.t_step > b.t_step);
}

/* FP8 on an A100 (no FP8 tensor cores): refused in training and serving, the message naming the
 * GPU. Before: training priced at the 312 TFLOP/s "fp8 peak", serving decode 1.65x faster. */
static void test_fp8_refused_without_fp8_units(void **state) {
    (void)state;
    nl_train_req q;
    req(&q, "llama-2-7b", "a100", "fp8");
    q.gpus = 8, q.seq = 4096, q.global_batch = 128;
    nl_train_result r;
    assert_int_equal(nl_plan_train_search(&q, &r), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "a100"));
    assert_non_null(strstr(nl_last_error(), "FP8"));
    nl_layout L = {8, 1, 1, 1, 1, NL_ZERO_1, 1, 16, 1, NL_RECOMPUTE_FULL, 0};
    nl_train_eval e;
    assert_int_equal(nl_plan_train_eval(&q, &L, &e), NL_ERR_INVALID);
    nl_serve_req s;
    nl_serve_req_default(&s);
    s.arch = q.arch;
    s.hw = q.hw;
    s.fp8 = 1;
    s.weight_bytes = s.kv_bytes = 1;
    nl_serve_plan p;
    assert_int_equal(nl_plan_serve(&s, &p), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "a100"));
    /* the same request on an H100 runs */
    assert_int_equal(nl_catalog_find_hw(&cat, "h100", &s.hw), NL_OK);
    assert_int_equal(nl_plan_serve(&s, &p), NL_OK);
    char *out = NULL;
    assert_int_not_equal(tu_run_cli("plan serve --model llama-2-7b --gpu a100 --precision fp8", &out), 0);
    assert_non_null(strstr(out, "a100"));
    free(out);
    out = NULL;
    assert_int_not_equal(tu_run_cli("plan train --model llama-2-7b --gpu a100 --gpus 8 --recipe fp8", &out), 0);
    assert_non_null(strstr(out, "a100"));
    free(out);
}

/* The "params" of a command's --json. */
static double json_params(const char *args) {
    char *out = NULL;
    int rc = tu_run_cli(args, &out);
    if (rc) fail_msg("%s -> %d: %s", args, rc, out ? out : "");
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "params");
    assert_true(cJSON_IsNumber(p));
    double v = p->valuedouble;
    cJSON_Delete(j);
    free(out);
    return v;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* The family is the model file's "family" field: budget, plan train and plan serve count the
 * same parameters for it, and a file reusing a catalog name without it is told to say it.
 * Before: "family" was an unknown field, and a file named like a catalog entry took that
 * entry's family in plan train but not in budget (22.07B against 29.31B). */
static void test_family_field(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), mpt[600], llama[600], named[600], args[900];
    assert_non_null(dir);
    snprintf(mpt, sizeof mpt, "%s/shape-mpt.json", dir);
    snprintf(llama, sizeof llama, "%s/shape.json", dir);
    snprintf(named, sizeof named, "%s/mpt-30b.json", dir);
    const char *shape = "\"vocab_size\": 50432, \"dim\": 6144, \"n_layers\": 48, \"n_heads\": 48, "
                        "\"hidden_dim\": 24576, \"seq_len\": 2048";
    char text[512];
    snprintf(text, sizeof text, "{\"name\": \"shape-22b\", \"family\": \"mpt\", %s}", shape);
    write_text(mpt, text);
    snprintf(text, sizeof text, "{\"name\": \"shape-22b\", %s}", shape);
    write_text(llama, text);
    snprintf(text, sizeof text, "{\"name\": \"mpt-30b\", %s}", shape);
    write_text(named, text);

    snprintf(args, sizeof args, "budget --model %s --json", mpt);
    double b_mpt = json_params(args);
    snprintf(args, sizeof args, "plan train --model %s --gpus 64 --json", mpt);
    double t_mpt = json_params(args);
    snprintf(args, sizeof args, "budget --model %s --json", llama);
    double b_llama = json_params(args);
    snprintf(args, sizeof args, "plan train --model %s --gpus 64 --json", llama);
    double t_llama = json_params(args);
    assert_true(b_mpt == t_mpt);
    assert_true(b_llama == t_llama);
    /* MPT's 2-matrix GeLU MLP against SwiGLU's 3 at the same width: fewer parameters */
    assert_true(b_mpt < 0.8 * b_llama);

    char *out = NULL;
    snprintf(args, sizeof args, "budget --model %s", named);
    assert_int_not_equal(tu_run_cli(args, &out), 0);
    assert_non_null(strstr(out, "family"));
    free(out);
    tu_rmdir(dir);
    free(dir);
}

/* DualPipe hides expert all-to-alls behind the other direction's compute, no more: with the
 * links at 1% of their rate the step is at least the all-to-all time. It needs an even pp and
 * an even number of microbatches >= 2 pp (deepseek-ai/DualPipe's asserts). Before: 338 s of
 * all-to-all gave a 27 s step, and pp 3 was accepted. */
static void test_dualpipe_bounded_and_checked(void **state) {
    (void)state;
    nl_train_req q;
    req(&q, "mixtral-8x7b", "h100", "bf16");
    q.schedule = NL_SCHED_DUALPIPE;
    q.gpus = 64, q.seq = 4096, q.global_batch = 256;
    q.hw.intra_eff = q.hw.inter_eff = 0.01;
    nl_layout L = {16, 1, 4, 1, 8, NL_ZERO_1, 1, 16, 1, NL_RECOMPUTE_FULL, 0};
    nl_train_eval e, f;
    assert_int_equal(nl_plan_train_eval(&q, &L, &e), NL_OK);
    assert_true(e.t_ep > e.t_compute); /* the case: more all-to-all than compute */
    assert_true(e.t_step >= e.t_ep);
    /* What DualPipe hides beyond 1F1B (which exposes the all-to-alls whole, ep_overlap 0) is the
     * all-to-all up to the compute, never all of it: every other exposed term is the same. */
    q.schedule = NL_SCHED_1F1B;
    assert_int_equal(nl_plan_train_eval(&q, &L, &f), NL_OK);
    q.schedule = NL_SCHED_DUALPIPE;
    double hidden = f.t_exposed - e.t_exposed;
    assert_true(hidden > 0);
    assert_true(hidden <= e.t_compute * (1 + 1e-9));
    assert_true(hidden < 0.9 * e.t_ep);
    nl_layout odd = {16, 1, 3, 1, 8, NL_ZERO_1, 1, 16, 1, NL_RECOMPUTE_FULL, 0};
    q.gpus = 48, q.global_batch = 256;
    assert_int_equal(nl_plan_train_eval(&q, &odd, &e), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "even"));
    q.gpus = 64, q.global_batch = 16 * 6;
    nl_layout few = {16, 1, 4, 1, 8, NL_ZERO_1, 1, 6, 1, NL_RECOMPUTE_FULL, 0};
    assert_int_equal(nl_plan_train_eval(&q, &few, &e), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "2 x pp"));
}

/* The error names the constraint that failed, not a micro-batch that divides the batch. */
static void test_errors_name_the_constraint(void **state) {
    (void)state;
    char *out = NULL;
    /* 80 layers do not split into 8 stages x 8 chunks */
    assert_int_not_equal(tu_run_cli("plan train --model llama-2-70b --gpus 64 --tp 8 --pp 8 --interleave 8 "
                                    "--micro-batch 1 --global-batch 64",
                                    &out),
                         0);
    assert_null(strstr(out, "does not divide the global batch"));
    assert_non_null(strstr(out, "interleave"));
    free(out);
    /* 4 microbatches for 8 stages */
    out = NULL;
    assert_int_not_equal(
        tu_run_cli("plan train --model llama-2-70b --gpus 64 --tp 8 --pp 8 --micro-batch 1 --global-batch 4", &out), 0);
    assert_null(strstr(out, "does not divide the global batch"));
    assert_non_null(strstr(out, "microbatches"));
    free(out);
}

/* Llama 3 405B's published layout (Dubey et al. 2024 Table 4 and sec. 3.3.2: 16,384 H100, tp 8,
 * pp 16, dp 128, interleave 8, 126 layers with one removed from the first and the last stage,
 * batch 2,048 x 8,192) is reachable from plan train's options, and it fits. Before: refused. */
static void test_llama3_layout_reachable(void **state) {
    (void)state;
    char *out = NULL;
    int rc = tu_run_cli("plan train --model llama-3-405b --gpu h100 --gpus 16384 --tp 8 --pp 16 --cp 1 --dp 128 "
                        "--interleave 8 --first-stage-layers 7 --last-stage-layers 7 --micro-batch 1 "
                        "--global-batch 2048 --seq 8192 --json",
                        &out);
    if (rc) fail_msg("%s", out);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    cJSON *ranked = cJSON_GetObjectItemCaseSensitive(j, "ranked");
    assert_true(cJSON_GetArraySize(ranked) >= 1);
    cJSON *best = cJSON_GetArrayItem(ranked, 0);
    assert_int_equal((int)cJSON_GetObjectItemCaseSensitive(best, "vpp")->valuedouble, 8);
    assert_int_equal((int)cJSON_GetObjectItemCaseSensitive(best, "pp")->valuedouble, 16);
    cJSON_Delete(j);
    free(out);
    /* the ends must leave even middle stages */
    out = NULL;
    assert_int_not_equal(tu_run_cli("plan train --model llama-3-405b --gpus 16384 --tp 8 --pp 16 --cp 1 "
                                    "--first-stage-layers 6 --last-stage-layers 7 --global-batch 2048 --seq 8192",
                                    &out),
                         0);
    assert_non_null(strstr(out, "middle stages"));
    free(out);
}

/* A "plan serve" number and its explanation: the text's terms are the JSON's. */
static double jnum(cJSON *j, const char *k) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    if (!cJSON_IsNumber(v)) fail_msg("no number %s", k);
    return v->valuedouble;
}

static void test_serve_text_from_its_terms(void **state) {
    (void)state;
    static const char *runs[] = {"--model llama-2-70b --tp 4", "--model llama-2-70b --tp 1 --fsdp 8",
                                 "--model llama-2-7b --precision fp8 --prompt 128", "--model llama-2-7b --prompt 8000"};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        char args[256], *text = NULL, *js = NULL;
        snprintf(args, sizeof args, "plan serve %s", runs[i]);
        assert_int_equal(tu_run_cli(args, &text), 0);
        snprintf(args, sizeof args, "plan serve %s --json", runs[i]);
        assert_int_equal(tu_run_cli(args, &js), 0);
        cJSON *j = cJSON_Parse(js);
        assert_non_null(j);
        /* prefill = max(compute, weight stream) + TP + launches */
        double pre = jnum(j, "prefill_s"), c = jnum(j, "prefill_compute_s"), w = jnum(j, "prefill_weight_s");
        double sum = fmax(c, w) + jnum(j, "prefill_comm_s") + jnum(j, "launch_s");
        assert_true(fabs(sum - pre) <= 1e-9 * pre);
        /* the rate the text quotes is the rate of the compute term */
        char want[128];
        snprintf(want, sizeof want, "compute %.1f ms at %.0f%% of %.0f TFLOP/s", c * 1e3, 100 * jnum(j, "prefill_eff"),
                 jnum(j, "prefill_peak") / 1e12);
        if (!strstr(text, want)) fail_msg("'%s' not in:\n%s", want, text);
        double kvb = jnum(j, "kv_bytes_per_token");
        snprintf(want, sizeof want, "x %g bytes", strstr(runs[i], "fp8") ? 1.0 : 2.0);
        assert_non_null(strstr(text, want));
        assert_true(kvb > 0);
        if (strstr(runs[i], "--fsdp")) {
            assert_true(jnum(j, "fsdp_gather_s") > jnum(j, "weight_read_s"));
            assert_non_null(strstr(text, "(FSDP all-gathers)"));
        }
        cJSON_Delete(j);
        free(text);
        free(js);
    }
}

/* HGX H800 has the third-generation NVSwitch: an 8-GPU all-reduce may use NVLink SHARP, which
 * beats the ring at 8 GPUs as on H100. Before: H800 priced the ring only. */
static void test_h800_nvls(void **state) {
    (void)state;
    nl_hw h, ring;
    assert_int_equal(nl_catalog_find_hw(&cat, "h800", &h), NL_OK);
    ring = h;
    ring.nvls_eff = 0;
    double b = 1e9;
    assert_true(nl_plan_coll_time(&h, NL_ALL_REDUCE, 8, b, 0) < nl_plan_coll_time(&ring, NL_ALL_REDUCE, 8, b, 0));
}

/* Cross-node ZeRO-3 (175B, GPT as Narayanan et al. 2021 Table 2 ran it with DeepSpeed, on 384 and
 * 1,536 A100s, one microbatch per step): each GPU's parameter traffic (2 gathers of the weights
 * and a reduce-scatter of the gradients, (p-1)/p of them) goes through its own NIC, the rings'
 * latency grows with their ranks, and a prefetch shorter than a layer hides less. Before: the
 * rings spread over all 8 NICs of a node and the collectives hid behind compute, 1.5-4.4x
 * faster than published. */
static void zero3_req(nl_train_req *q, int64_t gpus) {
    memset(q, 0, sizeof *q);
    q->arch = (nl_arch){.name = "gpt-175b",
                        .vocab_size = 51200,
                        .dim = 12288,
                        .n_layers = 96,
                        .n_heads = 96,
                        .n_kv_heads = 96,
                        .hidden_dim = 49152,
                        .seq_len = 2048,
                        .rope_theta = 1e4,
                        .norm_eps = 1e-5,
                        .tied_embeddings = 1};
    assert_int_equal(nl_plan_family("gpt", &q->fam), NL_OK);
    assert_int_equal(nl_catalog_find_hw(&cat, "a100", &q->hw), NL_OK);
    assert_int_equal(nl_plan_recipe("bf16", &q->recipe), NL_OK);
    nl_eff_default(&q->eff);
    q->tokens = 1e12, q->gpus = gpus, q->seq = 2048, q->global_batch = 1536;
}

static void test_zero3_across_nodes(void **state) {
    (void)state;
    nl_train_req q;
    nl_train_eval e, spread, deep;
    zero3_req(&q, 1536);
    nl_layout L = {1536, 1, 1, 1, 1, NL_ZERO_3, 1, 1, 1, NL_RECOMPUTE_FULL, 0};
    assert_int_equal(nl_plan_train_eval(&q, &L, &e), NL_OK);
    nl_arch_params ap;
    nl_plan_count_params(&q.arch, &q.fam, &ap);
    double p = 1536, traffic = 3 * (double)ap.total * 2 * (p - 1) / p; /* bytes through each GPU */
    double own_nic = q.hw.inter_bw * q.hw.inter_eff;
    assert_true(e.t_dp >= traffic / own_nic);
    assert_true(e.t_step >= e.t_dp); /* traffic beyond the compute shows */
    q.zero3_nic_spread = 1;
    assert_int_equal(nl_plan_train_eval(&q, &L, &spread), NL_OK);
    assert_true(spread.t_dp < 0.5 * e.t_dp);
    q.zero3_nic_spread = 0;
    /* DeepSpeed's defaults: a gather per parameter tensor, 5e7 parameters prefetched */
    q.zero3_calls_per_layer = 12;
    q.zero3_prefetch = 5e7;
    assert_int_equal(nl_plan_train_eval(&q, &L, &deep), NL_OK);
    assert_true(deep.t_dp > e.t_dp);           /* 12 rings' latency per layer */
    assert_true(deep.t_exposed > e.t_exposed); /* less hidden */
    /* the ring latency grows with the ranks: per byte, 1,536 GPUs take longer than 384 */
    nl_train_eval small;
    zero3_req(&q, 384);
    q.zero3_calls_per_layer = 12;
    nl_layout S = {384, 1, 1, 1, 1, NL_ZERO_3, 4, 1, 1, NL_RECOMPUTE_FULL, 0};
    assert_int_equal(nl_plan_train_eval(&q, &S, &small), NL_OK);
    assert_true(deep.t_dp / ((p - 1) / p) > small.t_dp / (383.0 / 384));
}

/* Selective recomputation recomputes the attention core (Korthikanti et al. 2022 sec. 5): with
 * the scores materialised that is one more forward of the core, not free. Before: priced as the
 * activation function only, so GPT3-1.3B at 8k without flash attention came out as fast with
 * selective recomputation as without recomputation while storing no scores. */
static void test_selective_recomputes_materialised_attention(void **state) {
    (void)state;
    nl_train_req q;
    zero3_req(&q, 8);
    q.arch.dim = 2048, q.arch.n_layers = 24, q.arch.n_heads = 16, q.arch.n_kv_heads = 16, q.arch.hidden_dim = 8192;
    q.seq = 8192, q.global_batch = 64;
    q.attn_materialized = 1;
    nl_layout none = {8, 1, 1, 1, 1, NL_ZERO_1, 1, 8, 1, NL_RECOMPUTE_NONE, 0}, sel = none;
    sel.recompute = NL_RECOMPUTE_SELECTIVE;
    nl_train_eval a, b;
    assert_int_equal(nl_plan_train_eval(&q, &none, &a), NL_OK);
    assert_int_equal(nl_plan_train_eval(&q, &sel, &b), NL_OK);
    assert_true(b.mem_act < a.mem_act);           /* no scores kept */
    assert_true(b.t_compute > 1.1 * a.t_compute); /* at 8k the core is a large share of the layer */
}

/* Context parallelism runs inside a fused attention kernel: Megatron-Core's unfused
 * DotProductAttention, which materialises the scores, refuses cp > 1. Before: the search split
 * GPT3-1.3B's 8k scores over cp 2 to 8 with materialised attention, a stack that cannot run,
 * and a fixed --cp 2 was accepted. */
static void test_materialised_attention_runs_at_cp1(void **state) {
    (void)state;
    nl_train_req q;
    zero3_req(&q, 8);
    q.seq = 8192, q.global_batch = 64;
    q.attn_materialized = 1;
    nl_layout cp2 = {4, 1, 1, 2, 1, NL_ZERO_1, 1, 16, 1, NL_RECOMPUTE_NONE, 0};
    nl_train_eval e;
    assert_int_not_equal(nl_plan_train_eval(&q, &cp2, &e), NL_OK);
    assert_non_null(strstr(nl_last_error(), "context parallelism needs a fused attention kernel"));
    char *out = NULL;
    char base[512], args[600];
    snprintf(base, sizeof base,
             "plan train --model-file %s --model gpt3-1.3b-fa --gpu a100 --gpus 8 --seq 8192 --attention materialized",
             tu_src_path("tests/validation/models.json"));
    snprintf(args, sizeof args, "%s --cp 2", base);
    assert_int_not_equal(tu_run_cli(args, &out), 0);
    assert_non_null(strstr(out, "--attention flash"));
    free(out);
    snprintf(args, sizeof args, "%s --json", base); /* the search keeps to cp 1 */
    assert_int_equal(tu_run_cli(args, &out), 0);
    cJSON *j = cJSON_Parse(out);
    cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "ranked"), *x;
    assert_true(cJSON_GetArraySize(r) > 0);
    cJSON_ArrayForEach(x, r) assert_int_equal((int)cJSON_GetObjectItemCaseSensitive(x, "cp")->valuedouble, 1);
    cJSON_Delete(j);
    free(out);
}

/* Transformer Engine's FP8 linears keep the FP8 cast of their inputs for backward (linear.py:
 * "saved_inputmat = inputmat", the quantized tensor): per token and layer the qkv and fc1 inputs
 * take D bytes instead of 2D, the w2 input F/t instead of 2F/t, and the output projection's
 * 1-byte copy comes on top of the bf16 attention output the attention kernel keeps. Before: the
 * fp8 recipe kept bf16 activations, and Megatron-Bridge's Llama 3 70B layout on 64 H100 (tp 4,
 * pp 8, v 5, no recomputation, FP8) needed 81.3 GB: plan train fell back to full recomputation. */
static void test_fp8_linear_inputs_kept_in_fp8(void **state) {
    (void)state;
    nl_arch a;
    assert_int_equal(nl_catalog_find_model(&cat, "llama-3-70b", &a), NL_OK);
    nl_act_opts o = {.tp = 4, .sp = 1, .flash = 1, .recompute = NL_RECOMPUTE_NONE, .seq = 8192, .bytes_per_elem = 2};
    nl_act_layer b16, f8;
    nl_plan_act_layer(&a, &o, &b16);
    o.fp8_cache = NL_FP8_CACHE_TE;
    nl_plan_act_layer(&a, &o, &f8);
    double D = (double)a.dim, F = (double)a.hidden_dim, q = (double)a.n_heads * (double)nl_arch_head_dim(&a), t = 4;
    double saved = 2 * D / t + F / t - q / t; /* qkv and fc1 inputs (sp shards them), w2 input, wo copy */
    assert_true(fabs(b16.bytes_per_token - f8.bytes_per_token - saved) < 1e-9 * saved);
    char *out = NULL;
    assert_int_equal(tu_run_cli("plan train --model llama-3-70b --gpu h100 --gpus 64 --tp 4 --pp 8 --cp 1 --ep 1 "
                                "--micro-batch 1 --zero 1 --interleave 5 --global-batch 128 --seq 8192 --recipe fp8 "
                                "--recompute none --json",
                                &out),
                     0);
    cJSON *j = cJSON_Parse(out);
    cJSON *best = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "ranked"), 0);
    assert_non_null(best);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(best, "fits")));
    cJSON_Delete(j);
    free(out);
}

int main(void) {
    nl_catalog_init(&cat);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp32_at_tf32_rate),
        cmocka_unit_test(test_fp8_refused_without_fp8_units),
        cmocka_unit_test(test_family_field),
        cmocka_unit_test(test_dualpipe_bounded_and_checked),
        cmocka_unit_test(test_errors_name_the_constraint),
        cmocka_unit_test(test_llama3_layout_reachable),
        cmocka_unit_test(test_serve_text_from_its_terms),
        cmocka_unit_test(test_h800_nvls),
        cmocka_unit_test(test_zero3_across_nodes),
        cmocka_unit_test(test_selective_recomputes_materialised_attention),
        cmocka_unit_test(test_materialised_attention_runs_at_cp1),
        cmocka_unit_test(test_fp8_linear_inputs_kept_in_fp8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
