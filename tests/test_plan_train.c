/* plan/ training: the course's napkin problems (FSDP, HSDP, 70B, MoE all-to-all, TP bound,
 * all-reduce factor, pipeline bubble), the layout search and its errors. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/layer_study.h"
#include "nanolm/plan.h"
#include "nanolm/plan_assume.h"
#include "nanolm/train_layout.h"

#define ROUNDS_TO(x, v, unit) assert_true(fabs((double)(x) - (double)(v)) <= 0.5 * (unit) + 1e-9 * fabs((double)(v)))

/* The course's napkin: NVLink 450 GB/s, network 50 GB/s, no latency, full link rate, MFU 40%. */
static void napkin_req(nl_train_req *q, const char *model, double params) {
    memset(q, 0, sizeof *q);
    nl_catalog cat;
    nl_catalog_init(&cat);
    assert_int_equal(nl_catalog_find_model(&cat, model, &q->arch), NL_OK);
    assert_int_equal(nl_catalog_find_hw(&cat, "h100", &q->hw), NL_OK);
    assert_int_equal(nl_plan_recipe("bf16", &q->recipe), NL_OK);
    nl_eff_default(&q->eff);
    q->eff.fixed_mfu = 0.4;
    q->hw.intra_eff = q->hw.inter_eff = 1;
    q->hw.latency_s = 0;
    q->hw.nvls_eff = 0;      /* the course prices ring algorithms */
    q->hw.nics_per_node = 0; /* and one network link per GPU */
    q->params_override = params;
    q->tokens = 1e12;
}

static const nl_layer_coll *find(const nl_layer_plan *lp, const char *what) {
    for (int i = 0; i < lp->n; i++)
        if (strstr(lp->c[i].what, what)) return &lp->c[i];
    return NULL;
}

static void test_course_fsdp_one_node(void **state) {
    (void)state;
    /* 7B under FSDP in one node of 8 H100, 16,384 tokens per GPU per step: three collectives of
     * 7/8 x 14 GB = 12.3 GB, 27 ms each, ~80 ms in all, against ~1.7 s of compute (~5%). */
    nl_train_req q;
    napkin_req(&q, "llama-2-7b", 7e9);
    q.gpus = 8;
    q.seq = 4096;
    q.global_batch = 8 * 4;
    nl_layout L = {8, 1, 1, 1, 1, NL_ZERO_3, 4, 1, 1, NL_RECOMPUTE_NONE, 0};
    nl_layer_plan lp;
    assert_int_equal(nl_plan_layer(&q, &L, 16384, &lp), NL_OK);
    assert_int_equal(lp.n, 3);
    const nl_layer_coll *ag = find(&lp, "all-gather (forward"), *ag2 = find(&lp, "all-gather (backward"),
                        *rs = find(&lp, "reduce-scatter");
    assert_non_null(ag);
    assert_non_null(ag2);
    assert_non_null(rs);
    ROUNDS_TO(ag->bytes / 1e9, 14, 1);
    for (int i = 0; i < 3; i++) {
        ROUNDS_TO(lp.c[i].wire_bytes / 1e9, 12.3, 0.1);
        ROUNDS_TO(lp.c[i].time_s * 1e3, 27, 1);
    }
    ROUNDS_TO(lp.per_step_s * 1e3, 80, 10);
    ROUNDS_TO(lp.compute_step_s, 1.7, 0.1);
    ROUNDS_TO(100 * lp.per_step_s / lp.compute_step_s, 5, 1);
    /* ZeRO-3 moves 1.5x what DDP's all-reduce moves. */
    ROUNDS_TO(lp.per_step_s / lp.ddp_step_s, 1.5, 0.01);
    /* ZeRO-1 adds nothing to DDP: reduce-scatter + all-gather = all-reduce. */
    L.zero = NL_ZERO_1;
    assert_int_equal(nl_plan_layer(&q, &L, 16384, &lp), NL_OK);
    assert_int_equal(lp.n, 2);
    assert_true(fabs(lp.per_step_s / lp.ddp_step_s - 1) < 1e-12);
}

/* plan layer's figures around the collectives: the request a layout by its degrees completes,
 * the data-parallel traffic, the FSDP gather and the width at which TP turns compute-bound. */
static void test_layer_study(void **state) {
    (void)state;
    nl_train_req q;
    napkin_req(&q, "llama-2-7b", 7e9);
    nl_layer_study_req a = {8, 1, 1, 1, 1, NL_ZERO_3, 0, 16384, 7e9};
    nl_layer_study x;
    assert_int_equal(nl_plan_layer_study(&q, &a, &x), NL_OK);
    assert_int_equal(q.gpus, 8);
    assert_int_equal(q.seq, 4096); /* 16,384 tokens are 4 whole sequences */
    assert_int_equal(q.global_batch, 8 * 4);
    assert_true(x.N == 7e9 && x.T == 16384);
    /* pure data parallelism: every collective is a per-step one, ~82 ms (the course's ~80) */
    ROUNDS_TO(x.dp_traffic * 1e3, 82, 1);
    assert_true(fabs(x.dp_traffic - x.lp.per_step_s) < 1e-12);
    ROUNDS_TO(x.fsdp_gather / 1e9, 14, 1); /* bf16 weights, 437.5 MB per layer */
    /* D > 2(p-1) P / W with p = 2: 2 x 989 TFLOP/s / 450 GB/s */
    ROUNDS_TO(x.tp_bound, 4396, 1);
    a.zero = NL_ZERO_1;
    a.tokens = 1000; /* not a whole number of sequences: one sequence of 1,000 */
    assert_int_equal(nl_plan_layer_study(&q, &a, &x), NL_OK);
    assert_int_equal(q.seq, 1000);
    assert_true(x.fsdp_gather == 0);
}

static void test_course_fsdp_64_nodes(void **state) {
    (void)state;
    /* The same FSDP over 64 nodes: every collective crosses the network: 14/50 = 0.28 s each,
     * 0.84 s for the three, half the compute. HSDP keeps the shards in a node and all-reduces an
     * eighth of the gradients across nodes: 2 x 1.75 / 50 = 0.07 s. */
    nl_train_req q;
    napkin_req(&q, "llama-2-7b", 7e9);
    q.gpus = 512;
    q.seq = 4096;
    q.global_batch = 512 * 4;
    nl_layout L = {512, 1, 1, 1, 1, NL_ZERO_3, 4, 1, 1, NL_RECOMPUTE_NONE, 0};
    nl_layer_plan lp;
    assert_int_equal(nl_plan_layer(&q, &L, 16384, &lp), NL_OK);
    for (int i = 0; i < lp.n; i++) ROUNDS_TO(lp.c[i].time_s, 0.28, 0.01);
    ROUNDS_TO(lp.per_step_s, 0.84, 0.01);
    ROUNDS_TO(lp.per_step_s / lp.compute_step_s, 0.5, 0.1);
    L.zero = NL_ZERO_HSDP;
    assert_int_equal(nl_plan_layer(&q, &L, 16384, &lp), NL_OK);
    const nl_layer_coll *x = find(&lp, "across nodes");
    assert_non_null(x);
    assert_int_equal(x->p, 64);
    ROUNDS_TO(x->bytes / 1e9, 1.75, 0.01);
    ROUNDS_TO(x->time_s, 0.07, 0.01);
    /* In-node collectives are back to 27 ms. */
    ROUNDS_TO(find(&lp, "in node (forward)")->time_s * 1e3, 27, 1);
}

static void test_course_moe_all_to_all(void **state) {
    (void)state;
    /* The course MoE, 8,192 tokens per GPU, EP = 8: dispatch 8192 x 6 x 2048 x 2 = 201 MB, the
     * same back; 7/8 of both (~350 MB) leave the GPU: ~0.8 ms in a node, ~7 ms across nodes,
     * against ~2.2 ms of the layer's forward compute at 50% MFU. */
    nl_train_req q;
    napkin_req(&q, "course-moe", 0);
    q.eff.fixed_mfu = 0.5;
    q.gpus = 8;
    q.seq = 4096;
    q.global_batch = 16;
    nl_layout L = {8, 1, 1, 1, 8, NL_ZERO_0, 2, 1, 1, NL_RECOMPUTE_NONE, 0};
    nl_layer_plan lp;
    assert_int_equal(nl_plan_layer(&q, &L, 8192, &lp), NL_OK);
    const nl_layer_coll *d = find(&lp, "dispatch"), *c = find(&lp, "combine expert");
    assert_non_null(d);
    assert_non_null(c);
    ROUNDS_TO(d->bytes / 1e6, 201, 1);
    ROUNDS_TO((d->wire_bytes + c->wire_bytes) / 1e6, 350, 10);
    ROUNDS_TO(lp.per_layer_fwd_s * 1e3, 0.8, 0.1);
    q.hw.gpus_per_node = 1; /* every EP peer on another node */
    assert_int_equal(nl_plan_layer(&q, &L, 8192, &lp), NL_OK);
    ROUNDS_TO(lp.per_layer_fwd_s * 1e3, 7, 1);
    /* Forward compute of one layer: 2 x active parameters per layer x tokens / (P x 0.5). */
    nl_arch_params p;
    nl_arch_count_params(&q.arch, &p);
    double active_layer = (double)(p.active - p.embedding - p.classifier) / 24;
    ROUNDS_TO(2 * active_layer * 8192 / (989e12 * 0.5) * 1e3, 2.2, 0.1);
}

static void test_course_small_facts(void **state) {
    (void)state;
    nl_catalog cat;
    nl_catalog_init(&cat);
    nl_hw hw;
    nl_catalog_find_hw(&cat, "h100", &hw);
    /* All-reduce moves 2(p-1)/p of the array: 1.75x at p = 8; the others (p-1)/p. */
    assert_true(nl_plan_coll_bytes(NL_ALL_REDUCE, 8, 1.0) == 1.75);
    assert_true(nl_plan_coll_bytes(NL_REDUCE_SCATTER, 8, 1.0) + nl_plan_coll_bytes(NL_ALL_GATHER, 8, 1.0) == 1.75);
    assert_true(nl_plan_coll_bytes(NL_ALL_REDUCE, 1000, 1.0) > 1.99);
    /* The 4-GPU example: each sends 3 numbers in reduce-scatter and 3 in all-gather of 4. */
    assert_true(nl_plan_coll_bytes(NL_ALL_REDUCE, 4, 4.0) == 6.0);
    /* TP of (B x D)(D x F) over 2 GPUs is compute-bound only for D > 2 P / W ~ 4,400 on NVLink. */
    ROUNDS_TO(2 * hw.flops_bf16 / hw.intra_bw, 4400, 100);
    /* Pipeline: 4 stages, 8 microbatches: bubble 3/11 ~ 27%, from the evaluator's own times. */
    nl_train_req q;
    napkin_req(&q, "llama-2-7b", 0);
    q.eff.fixed_mfu = 0;
    q.hw = hw;
    q.gpus = 4;
    q.seq = 4096;
    q.global_batch = 8;
    nl_layout L = {1, 1, 4, 1, 1, NL_ZERO_0, 1, 8, 1, NL_RECOMPUTE_NONE, 0};
    nl_train_eval e;
    assert_int_equal(nl_plan_train_eval(&q, &L, &e), NL_OK);
    ROUNDS_TO(100 * e.t_bubble / (e.t_compute + e.t_bubble), 27, 1);
    assert_true(fabs(e.t_bubble / (e.t_compute + e.t_bubble) - 3.0 / 11) < 1e-12);
    /* Interleaving v = 2 halves it. */
    L.vpp = 2;
    nl_train_eval e2;
    assert_int_equal(nl_plan_train_eval(&q, &L, &e2), NL_OK);
    assert_true(fabs(e2.t_bubble - e.t_bubble / 2) < 1e-12);
}

static void base_req(nl_train_req *q, const char *model, int64_t gpus) {
    memset(q, 0, sizeof *q);
    nl_catalog cat;
    nl_catalog_init(&cat);
    assert_int_equal(nl_catalog_find_model(&cat, model, &q->arch), NL_OK);
    assert_int_equal(nl_catalog_find_hw(&cat, "h100", &q->hw), NL_OK);
    nl_plan_recipe("bf16", &q->recipe);
    nl_eff_default(&q->eff);
    q->gpus = gpus;
    q->seq = q->arch.seq_len;
    q->global_batch = 1024;
    q->tokens = 20 * 6.74e9;
}

static void test_search(void **state) {
    (void)state;
    nl_train_req q;
    base_req(&q, "llama-2-7b", 8);
    nl_train_result r;
    assert_int_equal(nl_plan_train_search(&q, &r), NL_OK);
    assert_true(r.n_fit > 0 && r.n > r.n_fit);
    /* Plain DDP cannot hold 7B's 16 bytes/param in 80 GB: every ddp layout without model
     * parallelism is rejected with a reason. */
    for (size_t i = 0; i < r.n; i++) {
        const nl_train_eval *e = &r.evals[i];
        if (e->L.zero == NL_ZERO_0 && e->L.tp == 1 && e->L.pp == 1) {
            assert_false(e->fits);
            assert_non_null(strstr(e->reason, "needs"));
        }
        if (e->fits) {
            assert_true(e->mem_total <= e->mem_usable);
            /* The step is the sum of its parts, tokens/s and MFU follow from it. */
            assert_true(fabs(e->t_step - (e->t_compute + e->t_bubble + e->t_exposed + e->t_overlap_hbm + e->t_optim)) <
                        1e-9 * e->t_step);
            assert_true(e->t_optim > 0);
            assert_true(fabs(e->tokens_per_s * e->t_step - 1024.0 * 4096) < 1e-6 * 1024 * 4096);
            assert_true(e->mfu > 0 && e->mfu < (q.eff.gemm > 0 ? q.eff.gemm : q.hw.gemm_eff));
        }
    }
    /* Ranked by step time. */
    for (size_t i = 1; i < r.n_fit; i++) assert_true(r.evals[i - 1].t_step <= r.evals[i].t_step * (1 + 1e-9));
    char buf[4096];
    nl_plan_train_explain(&q, &r, buf, sizeof buf);
    assert_non_null(strstr(buf, "Memory first"));
    assert_non_null(strstr(buf, "sharded"));
    /* plan train --svg: the best layouts that fit and the first rejected ones, by name */
    char *dir = tu_tmpdir(), path[1100], lab[160];
    snprintf(path, sizeof path, "%s/mem.svg", dir);
    assert_int_equal(nl_plan_svg_search(path, &r, q.hw.mem_bytes), NL_OK);
    char *svg = tu_read_file(path, NULL);
    assert_non_null(svg);
    assert_non_null(strstr(svg, "Memory per GPU by layout"));
    assert_non_null(strstr(svg, nl_layout_str(&r.evals[0].L, lab, sizeof lab)));
    assert_non_null(strstr(svg, nl_layout_str(&r.evals[r.n_fit].L, lab, sizeof lab)));
    free(svg);
    tu_rmdir(dir);
    free(dir);
    nl_plan_train_free(&r);
    /* 512 GPUs: the search covers every layout (it prints its own time; no assertion on it). */
    base_req(&q, "llama-2-7b", 512);
    assert_int_equal(nl_plan_train_search(&q, &r), NL_OK);
    assert_true(r.n > 1000);
    assert_true(r.evals[0].L.dp * r.evals[0].L.tp * r.evals[0].L.pp * r.evals[0].L.cp == 512);
    nl_plan_train_free(&r);
}

/* A layout's options fill the request: defaults from the model (sequence, ~4M-token batch), the
 * fixed degrees and stack, and the two errors (uneven ends alone or without pp >= 2, a kernel). */
static void test_layout_request(void **state) {
    (void)state;
    nl_train_req q;
    base_req(&q, "llama-2-7b", 1);
    nl_train_layout l;
    memset(&l, 0, sizeof l);
    l.gpus = 64;
    assert_int_equal(nl_train_layout_request(&l, &q), NL_OK);
    assert_int_equal(q.gpus, 64);
    assert_int_equal(q.seq, 4096);
    assert_int_equal(q.global_batch, 1024); /* 4194304 / 4096 */
    assert_int_equal(q.fix.tp + q.fix.sp_plus1 + q.attn_triton + q.attn_materialized, 0);
    int64_t fix[6] = {2, 4, 8, 1, 1, 2};
    memcpy(l.fix, fix, sizeof fix);
    l.seq = 3000;
    l.first_layers = l.last_layers = 3;
    l.attention = "flash-v1";
    l.sp_given = 1;
    l.sp = 1; /* off */
    l.zero_plus1 = NL_ZERO_1 + 1;
    l.schedule = NL_SCHED_ZB_H1;
    l.z3_calls = 4;
    assert_int_equal(nl_train_layout_request(&l, &q), NL_OK);
    assert_int_equal(q.global_batch, 1398); /* round(4194304 / 3000) */
    assert_true(q.fix.dp == 2 && q.fix.tp == 4 && q.fix.pp == 8 && q.fix.micro_batch == 2);
    assert_true(q.fix.first_layers == 3 && q.fix.last_layers == 3 && q.fix.sp_plus1 == 1);
    assert_true(q.attn_triton == 1 && q.fix.zero_plus1 == NL_ZERO_1 + 1 && q.schedule == NL_SCHED_ZB_H1);
    assert_int_equal(q.zero3_calls_per_layer, 4);
    l.attention = "materialized";
    l.sp = 0;
    assert_int_equal(nl_train_layout_request(&l, &q), NL_OK);
    assert_true(q.attn_materialized == 1 && q.fix.sp_plus1 == 2);
    l.attention = "paged";
    assert_int_equal(nl_train_layout_request(&l, &q), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "unknown --attention 'paged'"));
    l.attention = NULL;
    l.last_layers = 0;
    assert_int_equal(nl_train_layout_request(&l, &q), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "--first-stage-layers and --last-stage-layers"));
    l.last_layers = 3;
    l.fix[2] = 1;
    assert_int_equal(nl_train_layout_request(&l, &q), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "--pp >= 2"));
}

/* The assumptions a user overrides: nothing changes the GPU and the planner's efficiencies; the
 * napkin sets the course's figures, which an explicit --link-eff or --mfu overrides; serving takes
 * --gemm-eff and the napkin's roofline. */
static void test_assumptions(void **state) {
    (void)state;
    nl_catalog cat;
    nl_catalog_init(&cat);
    nl_hw h100, hw;
    assert_int_equal(nl_catalog_find_hw(&cat, "h100", &h100), NL_OK);
    nl_plan_assume a;
    nl_plan_assume_default(&a);
    nl_eff eff, def;
    nl_eff_default(&def);
    hw = h100;
    nl_plan_assume_train(&a, &hw, &eff);
    assert_memory_equal(&hw, &h100, sizeof hw);
    assert_memory_equal(&eff, &def, sizeof eff);
    a.kernel_us = 0, a.reserved_gb = 0, a.price = 1.5, a.gpus_per_node = 4, a.latency_us = 20;
    nl_plan_assume_train(&a, &hw, &eff);
    assert_true(eff.kernel_s == 0 && eff.reserved_bytes == 0);
    assert_true(hw.price_per_hour == 1.5 && hw.gpus_per_node == 4 && fabs(hw.latency_s - 20e-6) < 1e-12);
    nl_plan_assume_default(&a);
    a.napkin = 1;
    hw = h100;
    nl_plan_assume_train(&a, &hw, &eff);
    assert_true(hw.intra_eff == 1 && hw.inter_eff == 1 && hw.latency_s == 0 && hw.nvls_eff == 0);
    assert_int_equal(hw.nics_per_node, 0);
    assert_true(eff.fixed_mfu == 0.4);
    a.link_eff = 0.5, a.mfu = 0.3;
    nl_plan_assume_train(&a, &hw, &eff);
    assert_true(hw.intra_eff == 0.5 && hw.inter_eff == 0.5 && eff.fixed_mfu == 0.3);
    nl_serve_req sq;
    nl_serve_req_default(&sq);
    sq.hw = h100;
    nl_plan_assume_default(&a);
    nl_plan_assume_serve(&a, &sq);
    assert_true(sq.hw.gemm_eff == h100.gemm_eff && sq.hbm_eff < 1 && sq.kernel_s > 0);
    a.eff.gemm = 0.7, a.napkin = 1;
    nl_plan_assume_serve(&a, &sq);
    assert_true(sq.hw.gemm_eff == 0.7 && sq.prefill_mfu == 0.5 && sq.hbm_eff == 1 && sq.kernel_s == 0);
    sq.prefill_mfu = 0.6; /* given: kept */
    nl_plan_assume_serve(&a, &sq);
    assert_true(sq.prefill_mfu == 0.6);
}

static void test_search_errors(void **state) {
    (void)state;
    nl_train_req q;
    /* 7 GPUs: 7 does not divide the heads (no tp 7) and no dp divides a batch of 1024. */
    base_req(&q, "llama-2-7b", 7);
    nl_train_result r;
    assert_int_equal(nl_plan_train_search(&q, &r), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "no layout can use 7 GPUs"));
    /* 405B on 8 GPUs fits nowhere: the message names the smallest need and its layout. */
    base_req(&q, "llama-3-405b", 8);
    assert_int_equal(nl_plan_train_search(&q, &r), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "fits on no layout"));
    assert_non_null(strstr(nl_last_error(), "smallest need"));
    assert_non_null(strstr(nl_last_error(), "tp8")); /* 405B x 16 B / 8 = 812 GB even at tp 8 */
    /* Invalid decompositions are refused by the evaluator. */
    base_req(&q, "llama-2-7b", 8);
    nl_layout L = {3, 1, 1, 1, 1, NL_ZERO_0, 1, 1, 1, NL_RECOMPUTE_NONE, 0};
    nl_train_eval e;
    assert_int_equal(nl_plan_train_eval(&q, &L, &e), NL_ERR_INVALID);
}

static void test_cli(void **state) {
    (void)state;
    char *out = NULL;
    assert_int_equal(tu_run_cli("plan train --model llama-2-7b --gpus 8", &out), 0);
    assert_non_null(strstr(out, "Searched"));
    assert_non_null(strstr(out, "Why #1: Memory first"));
    assert_non_null(strstr(out, "Rejected"));
    free(out);
    assert_int_equal(tu_run_cli("plan layer --model llama-3-8b --tp 8 --sp --json", &out), 0);
    /* TP = 8 with SP: 4 all-gathers and 4 reduce-scatters per layer (forward and backward). */
    int ag = 0, rs = 0;
    for (char *p = out; (p = strstr(p, "\"all-gather\"")); p++) ag++;
    for (char *p = out; (p = strstr(p, "\"reduce-scatter\"")); p++) rs++;
    assert_int_equal(ag, 4);
    assert_int_equal(rs, 4);
    free(out);
    assert_int_equal(tu_run_cli("plan layer --model llama-3-8b --tp 8", &out), 0);
    assert_non_null(strstr(out, "after attention"));
    assert_non_null(strstr(out, "after MLP"));
    free(out);
    assert_int_equal(tu_run_cli("plan train --model gpt-5 --gpus 8", &out), 2);
    assert_non_null(strstr(out, "llama-2-7b"));
    free(out);
    assert_int_equal(tu_run_cli("plan train --model llama-2-7b --gpus 8 --gpu tpu", &out), 2);
    assert_non_null(strstr(out, "h100"));
    free(out);
    assert_int_equal(tu_run_cli("plan train --model llama-3-405b --gpus 8", &out), 1);
    assert_non_null(strstr(out, "smallest need"));
    free(out);
    assert_int_equal(tu_run_cli("plan train --model llama-2-7b --gpus 8 --frobnicate", &out), 2);
    assert_non_null(strstr(out, "--frobnicate"));
    free(out);
    char *dir = tu_tmpdir();
    char args[512], path[300];
    snprintf(args, sizeof args, "plan pipeline --stages 4 --micro 8 --svg %s/pp.svg", dir);
    assert_int_equal(tu_run_cli(args, &out), 0);
    assert_non_null(strstr(out, "3/11"));
    free(out);
    snprintf(path, sizeof path, "%s/pp.svg", dir);
    char *svg = tu_read_file(path, NULL);
    assert_non_null(svg);
    /* Both schedules, simulated op by op, leave the same 3/11 idle. */
    assert_non_null(strstr(svg, "GPipe: 4 stages, 8 microbatches: simulated idle 27%"));
    assert_non_null(strstr(svg, "1F1B: 4 stages, 8 microbatches: simulated idle 27%"));
    free(svg);
    tu_rmdir(dir);
    free(dir);
}

/* Issue 16's bugs, each failing before its fix. */
static void test_bugs(void **state) {
    (void)state;
    nl_train_req q;
    nl_train_result r;
    /* A fixed --pp keeps the interleaved chunks even: 80 layers on pp 8 allow v 2 (10 per
     * stage = 2 x 5), never v 4 or 8. */
    base_req(&q, "llama-3-70b", 64);
    q.fix.pp = 8;
    q.seq = 4096;
    assert_int_equal(nl_plan_train_search(&q, &r), NL_OK);
    for (size_t i = 0; i < r.n; i++) assert_true(q.arch.n_layers % (r.evals[i].L.pp * r.evals[i].L.vpp) == 0);
    nl_plan_train_free(&r);
    nl_train_eval ev;
    /* Tensor-parallel degrees that are not powers of two: 24 heads on 6 GPUs at tp 6. */
    base_req(&q, "llama-2-7b", 6);
    q.arch.dim = 3072;
    q.arch.n_heads = q.arch.n_kv_heads = 24;
    q.fix.tp = 6;
    q.global_batch = 1020;
    assert_int_equal(nl_plan_train_search(&q, &r), NL_OK);
    assert_true(r.n_fit > 0 && r.evals[0].L.tp == 6);
    nl_plan_train_free(&r);
    /* Any micro-batch size: 5 with 1000 sequences on 8 GPUs (125 per rank). */
    base_req(&q, "llama-2-7b", 8);
    q.global_batch = 1000;
    q.fix.micro_batch = 5;
    assert_int_equal(nl_plan_train_search(&q, &r), NL_OK);
    assert_true(r.n > 0 && r.evals[0].L.micro_batch == 5);
    nl_plan_train_free(&r);
    /* A micro-batch that divides nothing says so (not a pipeline message). */
    q.fix.micro_batch = 7;
    assert_int_not_equal(nl_plan_train_search(&q, &r), NL_OK);
    assert_non_null(strstr(nl_last_error(), "micro-batch 7"));
    /* ZeRO with dp = 1 names ZeRO, not pipelines (issue 18). */
    base_req(&q, "llama-2-7b", 2);
    q.fix.tp = 2;
    q.fix.zero_plus1 = NL_ZERO_1 + 1;
    assert_int_not_equal(nl_plan_train_search(&q, &r), NL_OK);
    assert_non_null(strstr(nl_last_error(), "ZeRO"));
    assert_null(strstr(nl_last_error(), "pipeline"));
    /* PP > 1: the first stage holds the in-flight activations and not the logits (those are
     * on the last stage). */
    base_req(&q, "llama-3-8b", 8);
    q.seq = 8192;
    q.global_batch = 64;
    nl_layout P = {2, 1, 4, 1, 1, NL_ZERO_1, 1, 32, 1, NL_RECOMPUTE_NONE, 0};
    assert_int_equal(nl_plan_train_eval(&q, &P, &ev), NL_OK);
    assert_true(ev.mem_act > 0);
    assert_true(ev.mem_logits == 0);
}

/* ZB-H1 (Qi et al. 2024): the same layout and memory as 1F1B, the bubble cut to (p-1) forward
 * chunks: with the backward twice the forward, a third of 1F1B's (p-1)(F + B), less the
 * classifier's backward. */
static void test_zero_bubble(void **state) {
    (void)state;
    nl_train_req q;
    base_req(&q, "llama-3-70b", 64);
    q.seq = 4096;
    q.global_batch = 32;
    nl_layout L = {.dp = 2,
                   .tp = 8,
                   .pp = 4,
                   .cp = 1,
                   .ep = 1,
                   .zero = NL_ZERO_1,
                   .micro_batch = 1,
                   .n_micro = 16,
                   .vpp = 1,
                   .recompute = NL_RECOMPUTE_NONE,
                   .sp = 1};
    nl_train_eval a, z;
    assert_int_equal(nl_plan_train_eval(&q, &L, &a), NL_OK);
    q.schedule = NL_SCHED_ZB_H1;
    assert_int_equal(nl_plan_train_eval(&q, &L, &z), NL_OK);
    assert_true(z.mem_total == a.mem_total && z.t_compute == a.t_compute);
    assert_true(z.t_bubble > 0.25 * a.t_bubble && z.t_bubble < 0.4 * a.t_bubble);
    assert_true(z.t_step < a.t_step);
    assert_int_equal(nl_plan_schedule("zb-h1"), NL_SCHED_ZB_H1);
    assert_int_equal(nl_plan_schedule("gpipe"), -1);
    char *out = NULL;
    assert_int_equal(
        tu_run_cli("plan train --model llama-3-70b --gpus 64 --seq 4096 --tp 8 --pp 4 --schedule zb-h1 --top 1", &out),
        0);
    free(out);
    assert_int_equal(tu_run_cli("plan train --model llama-3-70b --gpus 64 --schedule gpipe", &out), 2);
    assert_non_null(strstr(out, "unknown --schedule 'gpipe'"));
    free(out);
}

static void test_cli_bugs(void **state) {
    (void)state;
    char *out = NULL;
    /* Layout options: the interleave degree and sequence parallelism on or off. */
    assert_int_equal(
        tu_run_cli("plan train --model llama-3-70b --gpus 64 --seq 4096 --tp 8 --pp 4 --interleave 5 --sp off --json",
                   &out),
        0);
    assert_non_null(strstr(out, "\"vpp\":\t5"));
    assert_null(strstr(out, "tp8+sp"));
    free(out);
    assert_int_equal(tu_run_cli("plan train --model llama-3-70b --gpus 64 --sp maybe", &out), 2);
    free(out);
    /* The headline's token count is the batch's, not the parameter count. */
    assert_int_equal(tu_run_cli("plan train --model llama-2-7b --gpus 8 --top 1", &out), 0);
    assert_non_null(strstr(out, "global batch 1024 x 4096 = 4.19M tokens"));
    free(out);
    /* --params 0 or negative is refused (issue 18), not ignored. */
    assert_int_equal(tu_run_cli("plan train --model llama-2-7b --gpus 8 --params 0", &out), 2);
    assert_non_null(strstr(out, "--params must be a positive"));
    free(out);
    assert_int_equal(tu_run_cli("plan train --model llama-2-7b --gpus 8 --params -1", &out), 2);
    free(out);
}

/* Collective topology. NVLink SHARP: an all-reduce inside an H100 node reduces in the switch, S each way at 0.603 of
 * 450 GB/s (catalog.c: from the 8 x H200 nccl-tests figure, 475 GB/s busbw). nccl-tests' busbw
 * of an 8 GiB all-reduce on 8 H100 is then 2 x 7/8 x 450 x 0.603 = 474.9 GB/s (the NCCL
 * maintainers' figure for H100, nccl-tests issue #212: ~480); the ring gives 2 x 7/8 x 360 / 1.75
 * = 360. On 2 GPUs the ring is faster and is kept; across nodes and on A100 there is no NVLS. */
static void test_nvls(void **state) {
    (void)state;
    nl_catalog cat;
    nl_catalog_init(&cat);
    nl_hw h100, a100;
    assert_int_equal(nl_catalog_find_hw(&cat, "h100", &h100), NL_OK);
    assert_int_equal(nl_catalog_find_hw(&cat, "a100", &a100), NL_OK);
    double S = 8.0 * 1024 * 1024 * 1024;
    double t = nl_plan_coll_time(&h100, NL_ALL_REDUCE, 8, S, 0);
    ROUNDS_TO(nl_plan_coll_bytes(NL_ALL_REDUCE, 8, S) / t / 1e9, 474.7, 0.2); /* with the 10 us latency */
    nl_hw ring = h100;
    ring.nvls_eff = 0;
    double tr = nl_plan_coll_time(&ring, NL_ALL_REDUCE, 8, S, 0);
    ROUNDS_TO(nl_plan_coll_bytes(NL_ALL_REDUCE, 8, S) / tr / 1e9, 359.9, 0.2);
    /* p = 2: the ring moves S/2 each way at 360 GB/s, NVLS S at 271: the ring. */
    assert_true(nl_plan_coll_time(&h100, NL_ALL_REDUCE, 2, S, 0) == nl_plan_coll_time(&ring, NL_ALL_REDUCE, 2, S, 0));
    /* Across nodes, and for gathers, nothing changes. */
    assert_true(nl_plan_coll_time(&h100, NL_ALL_REDUCE, 16, S, 1) == nl_plan_coll_time(&ring, NL_ALL_REDUCE, 16, S, 1));
    assert_true(nl_plan_coll_time(&h100, NL_ALL_GATHER, 8, S, 0) == nl_plan_coll_time(&ring, NL_ALL_GATHER, 8, S, 0));
    assert_true(a100.nvls_eff == 0);
    /* Across nodes a ring spreads over the NICs of its members in each node: 32 consecutive
     * H100 (8 per node, 8 x 400 Gb/s NICs) reach 8 x 50 x 0.8 = 320 GB/s busbw (NCCL issue
     * #1221 measures ~320); a data-parallel group next to tp 8 has one member per node and gets
     * one NIC, 40 GB/s; with 2 members, 80. */
    double wire = nl_plan_coll_bytes(NL_ALL_REDUCE, 32, S);
    ROUNDS_TO(wire / nl_plan_coll_time(&h100, NL_ALL_REDUCE, 32, S, 8) / 1e9, 320, 1);
    ROUNDS_TO(wire / nl_plan_coll_time(&h100, NL_ALL_REDUCE, 32, S, 1) / 1e9, 40, 1);
    ROUNDS_TO(wire / nl_plan_coll_time(&h100, NL_ALL_REDUCE, 32, S, 2) / 1e9, 80, 1);
    /* All-to-alls and point-to-point sends keep the GPU's own link; a node without described
     * NICs keeps one GPU's share. */
    assert_true(nl_plan_coll_time(&h100, NL_ALL_TO_ALL, 32, S, 8) == nl_plan_coll_time(&h100, NL_ALL_TO_ALL, 32, S, 1));
    nl_hw bare = h100;
    bare.nics_per_node = 0;
    assert_true(nl_plan_coll_time(&bare, NL_ALL_REDUCE, 32, S, 8) == nl_plan_coll_time(&h100, NL_ALL_REDUCE, 32, S, 1));
    /* A GPU file may give it (and is held to <= 1). */
    char *dir = tu_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/hw.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"name\": \"x100\", \"base\": \"a100\", \"nvls_eff\": 0.5}", f);
    fclose(f);
    assert_int_equal(nl_catalog_load_hw(&cat, path), NL_OK);
    nl_hw x;
    assert_int_equal(nl_catalog_find_hw(&cat, "x100", &x), NL_OK);
    assert_true(x.nvls_eff == 0.5);
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"name\": \"y100\", \"nvls_eff\": 1.5}", f);
    fclose(f);
    assert_int_not_equal(nl_catalog_load_hw(&cat, path), NL_OK);
    tu_rmdir(dir);
    free(dir);
}

/* The attention core's rate against the published kernel figures it is taken from (each point
 * is a figure of the paper; between the points the curve is interpolated in log(seq)):
 *  - A100, causal, head dim 64, forward + backward (FlashAttention-2 paper, Fig. 4(c)):
 *    140 TFLOP/s at 2k and 171 at 16k, the backward counted as 2.5x the forward's FLOPs;
 *  - H100 head dim 128, causal forward (FlashAttention-3 paper, Fig. 5, FlashAttention-3):
 *    521 TFLOP/s at 2k and 616 at 16k; FlashAttention-2 there (the Triton kernel's base):
 *    298 and 335;
 *  - the Triton kernel at FlashAttention's (v1) rate: 140 / 77 slower at 2k (Fig. 4(c));
 *  - a GPU without a table: the fallback share for both passes.
 * The flat 0.4 of peak this replaced gives 125 TFLOP/s on A100 and 396 on H100 at every
 * length: 11% and 27% off the A100 points, 24% and 36% off the H100 ones. */
static void attn_fb(const nl_hw *hw, double seq, double hd, int triton, double *fwd_tflops, double *fb_tflops) {
    double f, b;
    nl_plan_attn_eff(hw, seq, hd, triton, &f, &b);
    double peak = hw->flops_bf16 / 1e12;
    *fwd_tflops = f * peak;
    *fb_tflops = 3.5 / (1 / (f * peak) + 2.5 / (b * peak));
}

static void test_attn_rates(void **state) {
    (void)state;
    nl_catalog cat;
    nl_catalog_init(&cat);
    nl_hw a100, h100, h800, mi300x;
    assert_int_equal(nl_catalog_find_hw(&cat, "a100", &a100), NL_OK);
    assert_int_equal(nl_catalog_find_hw(&cat, "h100", &h100), NL_OK);
    assert_int_equal(nl_catalog_find_hw(&cat, "h800", &h800), NL_OK);
    assert_int_equal(nl_catalog_find_hw(&cat, "mi300x", &mi300x), NL_OK);
    double f, fb, f2, b2;
    attn_fb(&a100, 2048, 64, 0, &f, &fb);
    assert_true(fabs(fb / 140 - 1) < 0.02);
    attn_fb(&a100, 16384, 64, 0, &f, &fb);
    assert_true(fabs(fb / 171 - 1) < 0.02);
    attn_fb(&h100, 2048, 128, 0, &f, &fb);
    assert_true(fabs(f / 521 - 1) < 0.02);
    attn_fb(&h100, 16384, 128, 0, &f, &fb);
    assert_true(fabs(f / 616 - 1) < 0.02);
    /* The Triton kernel on H100: FlashAttention-2's forward over FlashAttention-2/FlashAttention. */
    attn_fb(&h100, 2048, 128, 1, &f, &fb);
    assert_true(fabs(f / (298.0 * 77 / 140) - 1) < 0.02);
    assert_true(fabs(nl_plan_attn_triton_slowdown(2048) / (140.0 / 77) - 1) < 0.01);
    /* Beyond 16k the curve stays at its 16k value; between points it lies between them. */
    attn_fb(&h100, 131072, 128, 0, &f2, &b2);
    attn_fb(&h100, 16384, 128, 0, &f, &fb);
    assert_true(fabs(f2 / f - 1) < 1e-9);
    attn_fb(&a100, 2896, 64, 0, &f, &fb);
    assert_true(fb > 140 && fb < 156);
    /* Longer sequences and larger heads run faster; the backward slower than the forward. */
    nl_plan_attn_eff(&a100, 1024, 128, 0, &f, &fb);
    nl_plan_attn_eff(&a100, 8192, 128, 0, &f2, &b2);
    assert_true(f2 > f && b2 > fb && fb < f && b2 < f2);
    nl_plan_attn_eff(&a100, 8192, 64, 0, &f, &fb);
    assert_true(f < f2);
    /* H800 shares H100's table; MI300X has none. */
    assert_int_equal(nl_plan_attn_eff(&h800, 4096, 128, 0, &f, &fb), 2);
    assert_int_equal(nl_plan_attn_eff(&mi300x, 4096, 128, 0, &f, &fb), 0);
    assert_true(f == NL_ATTN_EFF_FALLBACK && fb == NL_ATTN_EFF_FALLBACK);
}

/* A run with the Triton FlashAttention kernel pays nl_plan_attn_triton_slowdown on its attention
 * core only: slower than flash, by less than the factor on the whole step. */
static void test_attn_triton(void **state) {
    (void)state;
    nl_catalog cat;
    nl_catalog_init(&cat);
    nl_train_req q;
    memset(&q, 0, sizeof q);
    assert_int_equal(nl_catalog_find_model(&cat, "llama-2-7b", &q.arch), NL_OK);
    assert_int_equal(nl_catalog_find_hw(&cat, "h100", &q.hw), NL_OK);
    assert_int_equal(nl_plan_recipe("bf16", &q.recipe), NL_OK);
    nl_eff_default(&q.eff);
    q.gpus = 8;
    q.seq = 8192;
    q.global_batch = 64;
    q.tokens = 1e12;
    nl_layout L = {8, 1, 1, 1, 1, NL_ZERO_3, 1, 8, 1, NL_RECOMPUTE_FULL, 0};
    nl_train_eval a, b;
    assert_int_equal(nl_plan_train_eval(&q, &L, &a), NL_OK);
    q.attn_triton = 1;
    assert_int_equal(nl_plan_train_eval(&q, &L, &b), NL_OK);
    assert_true(b.t_compute > a.t_compute * 1.02);
    assert_true(b.t_compute < a.t_compute * nl_plan_attn_triton_slowdown((double)q.seq));
    assert_true(b.mem_total == a.mem_total);
}

/* A hidden collective still takes HBM time from the compute it overlaps: 3 bytes per byte
 * received (NL_COLL_HBM_PER_BYTE, NCCL's maintainer in NVIDIA/nccl issue #1428). FSDP on 8 GPUs:
 * per microbatch each GPU receives 7/8 of the bf16 weights twice (forward and backward gathers)
 * and 7/8 of the bf16 gradients (reduce-scatter). With none of it exposed, the charge is
 * 3 x m x 7/8 x (2 + 2 + 2) bytes x params / HBM bandwidth; without data parallelism, or in
 * the napkin, nothing. */
static void test_overlap_hbm(void **state) {
    (void)state;
    nl_train_req q;
    base_req(&q, "llama-2-7b", 8);
    q.global_batch = 64;
    nl_layout L = {8, 1, 1, 1, 1, NL_ZERO_3, 1, 8, 1, NL_RECOMPUTE_FULL, 0};
    nl_train_eval e;
    assert_int_equal(nl_plan_train_eval(&q, &L, &e), NL_OK);
    assert_true(e.t_exposed == 0); /* all of FSDP's traffic hidden behind compute */
    nl_arch_params c;
    nl_plan_count_params(&q.arch, &q.fam, &c);
    double want = 3.0 * 8 * 7.0 / 8 * (2 + 2 + 2) * (double)c.total / q.hw.hbm_bw;
    assert_true(fabs(e.t_overlap_hbm - want) < 1e-9 * want);
    assert_true(fabs(e.t_step - (e.t_compute + e.t_bubble + e.t_overlap_hbm + e.t_optim)) < 1e-9 * e.t_step);
    q.eff.fixed_mfu = 0.4;
    assert_int_equal(nl_plan_train_eval(&q, &L, &e), NL_OK);
    assert_true(e.t_overlap_hbm == 0);
}

/* The casts of an FP8 recipe, from the tensor shapes. Transformer Engine's te.Linear casts its
 * input to fp8 with a transposed copy in the forward (read bf16 2 bytes, write 1 + 1) and its
 * output gradient the same way in the backward. MPT-7B (GeLU MLP, D 4096, F 16384) per token:
 * forward inputs of Wqkv, out_proj, up and down are D, D, D, F; backward output gradients
 * 3D, D, F, D. Llama-2-7B (SwiGLU, F 11008): w1 and w3 share their input and have one output
 * gradient each (3D + F forward, 5D + 2F backward). Tensor parallelism with sequence
 * parallelism splits all of them. DeepSeek-V3's block scaling: the cast (2 + 1 + 4/128) and a
 * transposed copy re-made from the fp8 one (1 + 1 + 4/128). */
static void test_fp8_casts(void **state) {
    (void)state;
    /* The cast-transpose kernel's share of H100's 3.35 TB/s: TE pull request #101 times a
     * 4096 x 4096 fp16 -> fp8 cast with its transpose (4 bytes per element) at 51.53 us. */
    double measured = 4096.0 * 4096 * 4 / 51.53e-6 / 3.35e12;
    assert_true(fabs(NL_FP8_CAST_TRANSPOSE_BW_SHARE - measured) < 0.005);
    nl_catalog cat;
    nl_catalog_init(&cat);
    nl_arch a;
    nl_family fam;
    assert_int_equal(nl_catalog_find_model(&cat, "mpt-7b", &a), NL_OK);
    nl_catalog_family(&cat, "mpt-7b", &fam);
    double D = 4096, F = 16384, T = 1000, f, b;
    nl_plan_fp8_cast_bytes(&a, &fam, 1, 0, NL_FP8_PER_TENSOR, T, 0, &f, &b);
    assert_true(fabs(f - 4 * T * (3 * D + F)) < 1e-9 * f);
    assert_true(fabs(b - 4 * T * (5 * D + F)) < 1e-9 * b);
    double f2, b2;
    nl_plan_fp8_cast_bytes(&a, &fam, 2, 1, NL_FP8_PER_TENSOR, T, 0, &f2, &b2);
    assert_true(fabs(f2 - f / 2) < 1e-9 * f && fabs(b2 - b / 2) < 1e-9 * b);
    nl_plan_fp8_cast_bytes(&a, &fam, 1, 0, NL_FP8_BLOCK, T, 0, &f2, &b2);
    assert_true(fabs(f2 - (5 + 8.0 / 128) / 4 * f) < 1e-9 * f);
    assert_true(fabs(b2 - (5 + 8.0 / 128) / 4 * b) < 1e-9 * b);
    assert_int_equal(nl_catalog_find_model(&cat, "llama-2-7b", &a), NL_OK);
    nl_catalog_family(&cat, "llama-2-7b", &fam);
    F = 11008;
    nl_plan_fp8_cast_bytes(&a, &fam, 1, 0, NL_FP8_PER_TENSOR, T, 0, &f, &b);
    assert_true(fabs(f - 4 * T * (3 * D + F)) < 1e-9 * f);
    assert_true(fabs(b - 4 * T * (5 * D + 2 * F)) < 1e-9 * b);
}

/* An FP8 recipe casts the layers' weights with their transposed copy (4 bytes per parameter, at
 * the cast-transpose kernel's measured share of HBM bandwidth):
 * once per step when the weights stay on the GPU (ZeRO-2, the fp8 copy is kept), once per
 * microbatch under ZeRO-3, which gathers the bf16 weights again for each. With 8 microbatches
 * the two layouts differ by 7 casts of the layers' parameters and nothing else; in bf16 they
 * do not differ. Its data-parallel collectives move what bf16's move. */
static void test_fp8_weight_casts(void **state) {
    (void)state;
    nl_train_req q;
    base_req(&q, "llama-2-7b", 8);
    q.global_batch = 64;
    nl_layout L3 = {8, 1, 1, 1, 1, NL_ZERO_3, 1, 8, 1, NL_RECOMPUTE_FULL, 0}, L2 = L3;
    L2.zero = NL_ZERO_2;
    nl_train_eval e3, e2;
    assert_int_equal(nl_plan_train_eval(&q, &L3, &e3), NL_OK);
    assert_int_equal(nl_plan_train_eval(&q, &L2, &e2), NL_OK);
    assert_true(e3.t_compute == e2.t_compute);
    assert_int_equal(nl_plan_recipe("fp8", &q.recipe), NL_OK);
    assert_int_equal(nl_plan_train_eval(&q, &L3, &e3), NL_OK);
    assert_int_equal(nl_plan_train_eval(&q, &L2, &e2), NL_OK);
    nl_arch_params c;
    nl_plan_count_params(&q.arch, &q.fam, &c);
    double layers = (double)(c.attention + c.mlp_dense + c.norms);
    double want = 7 * 4 * layers / (q.hw.hbm_bw * NL_FP8_CAST_TRANSPOSE_BW_SHARE);
    assert_true(fabs(e3.t_compute - e2.t_compute - want) < 1e-6 * want);
    /* The collectives move the bf16 weights and gradients, as in bf16: the fp8 copy is made on
     * each GPU from what it gathered. */
    nl_train_eval b3;
    assert_int_equal(nl_plan_recipe("bf16", &q.recipe), NL_OK);
    assert_int_equal(nl_plan_train_eval(&q, &L3, &b3), NL_OK);
    assert_true(e3.t_dp == b3.t_dp);
}

/* Checkpoints distributed over the tp ranks (Megatron-LM's --distribute-saved-activations,
 * metaseq's --distribute-checkpointed-activations, as OPT-175B ran): with full recomputation each
 * rank keeps 1/tp of the layer input (2D bytes per token in bf16), and the backward all-gathers
 * it over the tp ranks once per layer and microbatch before recomputing. Without full
 * recomputation, or with sequence parallelism (which already splits it), nothing changes. */
static void test_distributed_checkpoints(void **state) {
    (void)state;
    nl_catalog cat;
    nl_catalog_init(&cat);
    nl_arch a;
    assert_int_equal(nl_catalog_find_model(&cat, "llama-2-7b", &a), NL_OK);
    nl_act_opts o = {.tp = 4, .flash = 1, .recompute = NL_RECOMPUTE_FULL, .seq = 4096, .bytes_per_elem = 2};
    nl_act_layer l;
    nl_plan_act_layer(&a, &o, &l);
    assert_true(fabs(l.bytes_per_token - 2.0 * 4096) < 1e-9);
    o.distribute_saved = 1;
    nl_plan_act_layer(&a, &o, &l);
    assert_true(fabs(l.bytes_per_token - 2.0 * 4096 / 4) < 1e-9);

    nl_train_req q;
    base_req(&q, "llama-2-7b", 8);
    q.global_batch = 8;
    nl_layout L = {2, 4, 1, 1, 1, NL_ZERO_1, 1, 4, 1, NL_RECOMPUTE_FULL, 0};
    nl_train_eval e0, e1;
    assert_int_equal(nl_plan_train_eval(&q, &L, &e0), NL_OK);
    q.distribute_saved = 1;
    assert_int_equal(nl_plan_train_eval(&q, &L, &e1), NL_OK);
    double T = 4096, gather = nl_plan_coll_time(&q.hw, NL_ALL_GATHER, 4, T * 4096 * 2, 0);
    double want = 4 * 32 * gather; /* 4 microbatches x 32 layers */
    assert_true(fabs(e1.t_tp - e0.t_tp - want) < 1e-9 * want);
    assert_true(e1.mem_act < e0.mem_act);
    assert_true(e1.t_compute == e0.t_compute);
    L.sp = 1;
    assert_int_equal(nl_plan_train_eval(&q, &L, &e1), NL_OK);
    q.distribute_saved = 0;
    assert_int_equal(nl_plan_train_eval(&q, &L, &e0), NL_OK);
    assert_true(e1.t_tp == e0.t_tp && e1.mem_act == e0.mem_act);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_casts),
        cmocka_unit_test(test_distributed_checkpoints),
        cmocka_unit_test(test_fp8_weight_casts),
        cmocka_unit_test(test_overlap_hbm),
        cmocka_unit_test(test_attn_triton),
        cmocka_unit_test(test_attn_rates),
        cmocka_unit_test(test_nvls),
        cmocka_unit_test(test_course_fsdp_one_node),
        cmocka_unit_test(test_layer_study),
        cmocka_unit_test(test_course_fsdp_64_nodes),
        cmocka_unit_test(test_course_moe_all_to_all),
        cmocka_unit_test(test_course_small_facts),
        cmocka_unit_test(test_search),
        cmocka_unit_test(test_layout_request),
        cmocka_unit_test(test_assumptions),
        cmocka_unit_test(test_search_errors),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_bugs),
        cmocka_unit_test(test_cli_bugs),
        cmocka_unit_test(test_zero_bubble),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
