/* plan/ serving: the course's inference numbers for Llama-3-8B on H100. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/plan.h"

#define ROUNDS_TO(x, v, unit) assert_true(fabs((double)(x) - (double)(v)) <= 0.5 * (unit) + 1e-9 * fabs((double)(v)))

static void req(nl_serve_req *q, int64_t tp, double context) {
    nl_serve_req_default(q);
    nl_catalog cat;
    nl_catalog_init(&cat);
    assert_int_equal(nl_catalog_find_model(&cat, "llama-3-8b", &q->arch), NL_OK);
    assert_int_equal(nl_catalog_find_hw(&cat, "h100", &q->hw), NL_OK);
    q->tp = tp;
    q->context = context;
    /* The course's napkin: 50% MFU in prefill, no launch cost. */
    q->prefill_mfu = 0.5;
    q->kernel_s = 0;
    q->hbm_eff = 1;
}

static void test_course_prefill_decode(void **state) {
    (void)state;
    nl_serve_req q;
    nl_serve_plan p;
    req(&q, 1, 0);
    assert_int_equal(nl_plan_serve(&q, &p), NL_OK);
    /* A 2,000-token prompt: ~3.1e13 FLOPs, ~63 ms at 50% MFU. */
    ROUNDS_TO(p.prefill_flops / 1e13, 3.1, 0.1);
    ROUNDS_TO(p.prefill_s * 1e3, 63, 1);
    /* Decode at B = 32, context ~2,250: ~7.6 ms a step; one prefill stalls 32 users 8+ steps. */
    ROUNDS_TO(2000 + 500 / 2, 2250, 1);
    ROUNDS_TO(p.decode_step_total_s * 1e3, 7.6, 0.1);
    assert_true(p.stall_steps > 8 && p.stall_steps < 9);
    /* KV cache of the prompt: ~262 MB (128 KiB per token with GQA 8 x 128). */
    assert_true(p.kv_bytes_per_token == 2.0 * 32 * 8 * 128 * 2);
    ROUNDS_TO(p.prompt_kv_bytes / 1e6, 262, 1);
    /* Chunked prefill: 256 prompt + 32 decode tokens ~4.4 ms of compute vs 4.79 ms of weights. */
    ROUNDS_TO(p.chunk_compute_s * 1e3, 4.4, 0.1);
    ROUNDS_TO(p.weight_read_s * 1e3, 4.79, 0.01);
    assert_true(p.chunk_compute_s < p.weight_read_s);
    /* Disaggregation: prefill GPU ~16 requests/s, decode GPU ~8.4 requests/s: ~2 decode GPUs
     * per prefill GPU. */
    ROUNDS_TO(p.prefill_rps, 16, 1);
    ROUNDS_TO(p.decode_rps, 8.4, 0.1);
    ROUNDS_TO(p.decode_per_prefill, 2, 1);
    assert_true(p.fits);
}

static void test_course_tp_decode(void **state) {
    (void)state;
    nl_serve_req q;
    nl_serve_plan p1, p2, p8;
    /* B = 32 at 8k: one GPU 15.1 ms a step, TP 2 7.5 ms, with 64 all-reduces of B x D x 2 =
     * 256 KiB costing ~0.6 ms of launch latency; TP 8: 1.9 ms, communication adds a third. */
    req(&q, 1, 8192);
    assert_int_equal(nl_plan_serve(&q, &p1), NL_OK);
    ROUNDS_TO(p1.decode_step_s * 1e3, 15.1, 0.1);
    req(&q, 2, 8192);
    assert_int_equal(nl_plan_serve(&q, &p2), NL_OK);
    ROUNDS_TO(p2.decode_step_s * 1e3, 7.5, 0.1);
    assert_true(p2.tp_allreduces == 64);
    assert_true(p2.tp_allreduce_bytes == 256 * 1024);
    ROUNDS_TO(p2.tp_comm_latency_s * 1e3, 0.6, 0.1);
    /* By bandwidth each all-reduce is a fraction of a microsecond. */
    assert_true(p2.tp_comm_s - p2.tp_comm_latency_s < 64 * 1e-6);
    req(&q, 8, 8192);
    assert_int_equal(nl_plan_serve(&q, &p8), NL_OK);
    ROUNDS_TO(p8.decode_step_s * 1e3, 1.9, 0.1);
    ROUNDS_TO(p8.tp_comm_latency_s / p8.decode_step_s, 1.0 / 3, 0.1);
    assert_true(p8.tp_comm_s / p8.decode_step_s < 0.4);
    /* Bad input. */
    req(&q, 3, 8192);
    assert_int_equal(nl_plan_serve(&q, &p8), NL_ERR_INVALID);
}

/* The course: decoding with FSDP/ZeRO-3 weights is several times slower than reading them from
 * HBM. Llama-3-8B on 8 H100: each step gathers 7/8 of 16.06 GB over NVLink (450 GB/s x 0.8)
 * instead of reading 16.06 GB at 3.35 TB/s: (7/8) x 3350 / 360 = 8.1x (less the per-layer
 * call latency). Memory holds 1/8 of the weights plus two gathered layers. */
static void test_fsdp_decode(void **state) {
    (void)state;
    nl_serve_req q;
    nl_serve_plan p0, p8;
    req(&q, 1, 0);
    assert_int_equal(nl_plan_serve(&q, &p0), NL_OK);
    assert_true(p0.fsdp_gather_s == 0);
    q.fsdp = 8;
    assert_int_equal(nl_plan_serve(&q, &p8), NL_OK);
    double want = 7.0 / 8.0 * p8.params * 2 / (450e9 * 0.8) + 32 * 10e-6;
    assert_true(fabs(p8.fsdp_gather_s / want - 1) < 1e-9);
    assert_true(p8.fsdp_gather_s > 5 * p8.weight_read_s);
    assert_true(p8.decode_step_s >= p8.fsdp_gather_s && p8.decode_step_s > 4 * p0.decode_step_s);
    assert_true(fabs(p8.mem_weights - (p0.mem_weights / 8 + 2 * p0.mem_weights / 32)) < 1);
    q.fsdp = -1;
    assert_int_equal(nl_plan_serve(&q, &p8), NL_ERR_INVALID);
}

/* A decode kernel with one thread block per query head (TensorRT-LLM's masked MHA before XQA)
 * streams each KV head's cache once per query head of its group: Llama-2-70B (64 query heads, 8
 * KV heads) at batch 480 and context 1152 on 4 H100 with an FP8 cache reads 480 x 1152 x 160 KiB
 * x 8 / 4 = 181 GB per GPU per step instead of 22.6 GB, 67.6 ms at 0.8 x 3.35 TB/s instead of
 * 8.45 ms. A model without GQA (Llama-2-7B) reads the same either way. */
static void test_decode_attn_per_head(void **state) {
    (void)state;
    nl_catalog cat;
    nl_catalog_init(&cat);
    nl_serve_req q;
    nl_serve_plan g, h;
    nl_serve_req_default(&q);
    assert_int_equal(nl_catalog_find_model(&cat, "llama-2-70b", &q.arch), NL_OK);
    assert_int_equal(nl_catalog_find_hw(&cat, "h100", &q.hw), NL_OK);
    q.tp = 4;
    q.batch = 480;
    q.prompt = 128;
    q.output = 2048;
    q.weight_bytes = q.kv_bytes = 1;
    q.fp8 = 1;
    assert_int_equal(nl_plan_serve(&q, &g), NL_OK);
    assert_true(g.kv_reads_per_head == 1);
    ROUNDS_TO(g.kv_read_s * 1e3, 8.45, 0.01);
    q.decode_attn = NL_DECODE_ATTN_PER_HEAD;
    assert_int_equal(nl_plan_serve(&q, &h), NL_OK);
    assert_true(h.kv_reads_per_head == 8);
    double want = 480.0 * 1152 * (2.0 * 80 * 8 * 128) * 8 / 4 / (3.35e12 * 0.8);
    assert_true(fabs(h.kv_read_s / want - 1) < 1e-12);
    ROUNDS_TO(h.kv_read_s * 1e3, 67.6, 0.1);
    assert_true(fabs(h.decode_step_total_s - g.decode_step_total_s - (h.kv_read_s - g.kv_read_s)) < 1e-12);
    assert_true(h.weight_read_s == g.weight_read_s && h.prefill_s == g.prefill_s && h.mem_kv == g.mem_kv);
    /* Llama-2-7B has as many KV heads as query heads: nothing changes. */
    assert_int_equal(nl_catalog_find_model(&cat, "llama-2-7b", &q.arch), NL_OK);
    q.tp = 1;
    q.decode_attn = NL_DECODE_ATTN_GROUPED;
    assert_int_equal(nl_plan_serve(&q, &g), NL_OK);
    q.decode_attn = NL_DECODE_ATTN_PER_HEAD;
    assert_int_equal(nl_plan_serve(&q, &h), NL_OK);
    assert_true(h.kv_reads_per_head == 1 && h.kv_read_s == g.kv_read_s);
    q.decode_attn = 7;
    assert_int_equal(nl_plan_serve(&q, &h), NL_ERR_INVALID);
}

/* A static batch's prompts are prefilled in one forward: each layer's two all-reduces carry all
 * B x prompt tokens, so the per-call latency is paid 2 x layers times for the batch, not once per
 * prompt. Llama-3-8B on 8 H100, 64 prompts of 128 tokens: 64 all-reduces of 64 x 128 x 4096 x 2 =
 * 64 MiB (0.64 ms of call latency), where pricing each prompt's own all-reduces paid 41 ms of it. */
static void test_batch_prefill_comm(void **state) {
    (void)state;
    nl_serve_req q;
    nl_serve_plan p;
    req(&q, 8, 0);
    q.batch = 64;
    q.prompt = 128;
    q.output = 128;
    q.hw.latency_s = 10e-6;
    assert_int_equal(nl_plan_serve(&q, &p), NL_OK);
    double want = 64 * nl_plan_coll_time(&q.hw, NL_ALL_REDUCE, 8, 64.0 * 128 * 4096 * 2, 0);
    assert_true(fabs(p.batch_prefill_comm_s / want - 1) < 1e-12);
    /* the same bytes, 64 x fewer calls: 63 x 64 x 10 us less latency than one prefill per prompt */
    assert_true(fabs(64 * p.prefill_comm_s - p.batch_prefill_comm_s - 63 * 64 * 10e-6) < 1e-9);
    /* The batch's prefill time pays the call latency 64 times: with 10 us per call it is 0.64 ms
     * longer than with none. */
    nl_serve_plan p0;
    q.hw.latency_s = 0;
    assert_int_equal(nl_plan_serve(&q, &p0), NL_OK);
    assert_true(fabs(p.batch_prefill_s - p0.batch_prefill_s - 64 * 10e-6) < 1e-12);
    /* one GPU: no all-reduce */
    req(&q, 1, 0);
    q.batch = 64;
    assert_int_equal(nl_plan_serve(&q, &p), NL_OK);
    assert_true(p.batch_prefill_comm_s == 0);
}

static void test_cli(void **state) {
    (void)state;
    char *out = NULL;
    assert_int_equal(tu_run_cli("plan serve --model llama-3-8b --prefill-mfu 0.5", &out), 0);
    /* The course's 62.8 ms at 50% MFU plus 32 layers x 20 kernels x 5 us of launches. */
    assert_non_null(strstr(out, "66.0 ms"));
    assert_non_null(strstr(out, "262 MB"));
    free(out);
    assert_int_equal(tu_run_cli("plan serve --model llama-3-8b --tp 2 --context 8192 --json", &out), 0);
    assert_non_null(strstr(out, "\"tp_allreduces\":\t64"));
    free(out);
    assert_int_equal(tu_run_cli("plan serve --model llama-3-8b --prefill-mfu 2", &out), 2);
    free(out);
    assert_int_equal(tu_run_cli("plan serve --model llama-2-70b --tp 4 --batch 480 --prompt 128 --output 2048 "
                                "--precision fp8 --decode-attn per-head",
                                &out),
                     0);
    assert_non_null(strstr(out, "67.61 ms"));
    assert_non_null(strstr(out, "x 8 query heads per KV head / 4 GPUs' HBM (per-head kernel)"));
    free(out);
    assert_int_equal(tu_run_cli("plan serve --model llama-2-70b --decode-attn per-kv", &out), 2);
    assert_non_null(strstr(out, "grouped|per-head"));
    free(out);
    assert_int_equal(tu_run_cli("plan serve --model nope", &out), 2);
    assert_non_null(strstr(out, "known:"));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_course_prefill_decode), cmocka_unit_test(test_course_tp_decode),
        cmocka_unit_test(test_fsdp_decode),           cmocka_unit_test(test_decode_attn_per_head),
        cmocka_unit_test(test_batch_prefill_comm),    cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
