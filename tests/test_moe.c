/* NanoLM-MoE: the parameter layout against the planner's counts, and the whole model's backward
 * (router with top-k and renormalised gates, shared and routed experts, capacity dropping, the
 * auxiliary loss) against central finite differences of its forward. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/moe.h"

static nl_arch tiny_arch(void) {
    nl_arch a = tu_arch("moe-test", 16, 16, 2, 2, 1, 24, 8);
    a.n_experts = 4, a.n_shared_experts = 1, a.top_k = 2, a.expert_hidden_dim = 8, a.first_moe_layer = 1;
    return a;
}

static void test_counts_match_planner(void **state) {
    (void)state;
    nl_arch a;
    assert_int_equal(nl_moe_preset("moe-course-tiny", &a), NL_OK);
    nl_arch_params p;
    nl_arch_count_params(&a, &p);
    for (int ep = 1; ep <= 8; ep *= 2) {
        for (int r = 0; r < ep; r++) {
            nl_model m;
            assert_int_equal(nl_model_init_ep(&m, &a, ep, r), NL_OK);
            /* per rank: everything but the routed experts, plus 1/ep of them */
            assert_int_equal((int64_t)m.n_params, p.total - p.mlp_experts + p.mlp_experts / ep);
            size_t experts = 0, b, e;
            for (int64_t l = 0; l < m.L; l++) {
                nl_moe_expert_range(&m, l, &b, &e);
                experts += e - b;
            }
            assert_int_equal((int64_t)experts, p.mlp_experts / ep);
            if (ep == 1 && r == 0) {
                /* active parameters: all but the routed experts, plus top_k of them per layer */
                int64_t one = 3 * a.dim * a.expert_hidden_dim;
                assert_int_equal((int64_t)m.n_params - (int64_t)experts + a.n_layers * a.top_k * one, p.active);
                const nl_param_info *t = nl_model_find_param(&m, "model.layers.1.mlp.experts.63.down_proj.weight");
                assert_non_null(t);
                assert_int_equal(t->expert, 63);
                print_message("moe-course-tiny: total %lld, active %lld, per rank at ep 4 %lld\n", (long long)p.total,
                              (long long)p.active, (long long)(p.total - p.mlp_experts + p.mlp_experts / 4));
            }
            nl_model_free(&m);
        }
    }
    nl_model m;
    assert_int_equal(nl_model_init_ep(&m, &a, 3, 0), NL_ERR_INVALID); /* 3 does not divide 64 */
    assert_non_null(
        strstr(nl_last_error(), "expert-parallel degree 3 does not divide")); /* the library names no CLI flag */
}

static double objective(nl_model *m, const int32_t *x, const int32_t *y, int64_t B, int64_t T) {
    float loss;
    assert_int_equal(nl_model_forward(m, x, y, B, T, &loss), NL_OK);
    return (double)loss + m->moe->aux_loss;
}

static void grad_check(float capacity, float aux) {
    nl_arch a = tiny_arch();
    nl_model m;
    assert_int_equal(nl_model_init(&m, &a), NL_OK);
    nl_model_init_random(&m, 7);
    m.moe->capacity_factor = capacity;
    m.moe->aux_coef = aux;
    /* spread the router so that top-k has clear margins, and grow the weights so every part of
     * the gradient is well above float noise */
    for (int64_t i = 0; i < (int64_t)m.n_params; i++) m.params[i] *= 10.0f;
    for (int i = 0; i < m.n_tensors; i++)
        if (m.table[i].ndim == 1)
            for (size_t j = 0; j < m.table[i].numel; j++) m.params[m.table[i].offset + j] = 1.0f;
    const nl_param_info *rt = nl_model_find_param(&m, "model.layers.1.mlp.gate.weight");
    for (size_t j = 0; j < rt->numel; j++) m.params[rt->offset + j] *= 10.0f;
    enum { B = 2, T = 6 };
    int32_t x[B * T], y[B * T];
    nl_rng rng;
    nl_rng_seed(&rng, 3);
    for (int i = 0; i < B * T; i++) x[i] = (int32_t)nl_rng_below(&rng, 16), y[i] = (int32_t)nl_rng_below(&rng, 16);
    assert_int_equal(nl_model_alloc_grads(&m), NL_OK);
    assert_int_equal(nl_model_alloc_acts(&m, B, T), NL_OK);
    objective(&m, x, y, B, T);
    if (capacity > 0) assert_true(m.moe->dropped > 0);
    int64_t dropped = m.moe->dropped;
    int32_t sel0[B * T * 2];
    memcpy(sel0, m.moe->layers[0].sel, sizeof sel0);
    nl_model_zero_grad(&m);
    assert_int_equal(nl_model_backward(&m), NL_OK);
    const char *names[] = {"model.layers.1.mlp.gate.weight",
                           "model.layers.1.mlp.shared_experts.gate_proj.weight",
                           "model.layers.1.mlp.shared_experts.down_proj.weight",
                           "model.layers.1.mlp.experts.0.gate_proj.weight",
                           "model.layers.1.mlp.experts.2.up_proj.weight",
                           "model.layers.1.mlp.experts.3.down_proj.weight",
                           "model.layers.1.self_attn.q_proj.weight",
                           "model.layers.0.mlp.gate_proj.weight",
                           "model.embed_tokens.weight"};
    const float h = 1e-3f;
    for (size_t n = 0; n < sizeof names / sizeof names[0]; n++) {
        const nl_param_info *p = nl_model_find_param(&m, names[n]);
        assert_non_null(p);
        double md = 0, mg = 0;
        int checked = 0;
        for (size_t j = 0; j < p->numel; j += p->numel / 24 + 1) {
            float *w = m.params + p->offset + j, w0 = *w;
            *w = w0 + h;
            double fp = objective(&m, x, y, B, T);
            int same = !memcmp(sel0, m.moe->layers[0].sel, sizeof sel0) && m.moe->dropped == dropped;
            *w = w0 - h;
            double fm = objective(&m, x, y, B, T);
            same = same && !memcmp(sel0, m.moe->layers[0].sel, sizeof sel0) && m.moe->dropped == dropped;
            *w = w0;
            if (!same) continue; /* the perturbation changed the routing: not differentiable there */
            double num = (fp - fm) / (2.0 * h), an = m.train->grads[p->offset + j];
            if (fabs(an - num) > md) md = fabs(an - num);
            if (fabs(num) > mg) mg = fabs(num);
            checked++;
        }
        print_message("cap %.1f aux %.2f %-52s checked %2d max|err| %.2e max|grad| %.2e\n", capacity, aux, names[n],
                      checked, md, mg);
        assert_true(checked >= 10);
        assert_true(mg > 1e-4);
        if (md > 2e-2 * mg) fail_msg("%s: gradient error %.3g vs %.3g", names[n], md, mg);
    }
    nl_model_free(&m);
}

static void test_grad_plain(void **state) {
    (void)state;
    grad_check(0.0f, 0.0f);
}
static void test_grad_aux(void **state) {
    (void)state;
    grad_check(0.0f, 0.5f);
}
static void test_grad_capacity(void **state) {
    (void)state;
    grad_check(1.0f, 0.1f);
}

static void test_stats(void **state) {
    (void)state;
    nl_arch a = tiny_arch();
    nl_model m;
    assert_int_equal(nl_model_init(&m, &a), NL_OK);
    nl_model_init_random(&m, 1);
    assert_int_equal(nl_model_alloc_acts(&m, 2, 8), NL_OK);
    int32_t x[16];
    for (int i = 0; i < 16; i++) x[i] = i;
    m.moe->capacity_factor = 0.5f; /* ceil(0.5 * 8 * 2 / 4) = 2 slots per expert and sequence */
    assert_int_equal(nl_model_forward(&m, x, x, 2, 8, NULL), NL_OK);
    int64_t sum = 0;
    for (int e = 0; e < 4; e++) sum += m.moe->tokens[e];
    assert_int_equal(sum, 2 * 8 * 2);
    assert_int_equal(m.moe->slots, 32);
    /* at most 2 kept per expert and sequence: at least 32 - 2*4*2 = 16 dropped */
    assert_true(m.moe->dropped >= 16);
    assert_int_equal(m.moe->layers[0].n_send, 32 - m.moe->dropped);
    /* aux >= alpha (its minimum, reached only by perfectly uniform routing) */
    assert_true(m.moe->aux_loss >= 0.01 * (1 - 1e-6));
    nl_model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_match_planner), cmocka_unit_test(test_grad_plain), cmocka_unit_test(test_grad_aux),
        cmocka_unit_test(test_grad_capacity),        cmocka_unit_test(test_stats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
