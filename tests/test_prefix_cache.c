/* Prefix caching (nanolm/block_pool.h, engine.h's prefix_cache): the block pool's reference
 * counts, chained hashes and LRU eviction; and on small random models, the same tokens with
 * caching on and off (greedy and seeded sampling, fp32 and int8 KV, batched and one at a time,
 * through preemption and eviction), hits counted, every block back in the pool at the end. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "nanolm/block_pool.h"
#include "nanolm/engine.h"
#include "nanolm/model.h"

static void test_pool_refcounts_lru(void **state) {
    (void)state;
    nl_block_pool p;
    assert_int_equal(nl_block_pool_init(&p, 1, 1, 4, NL_KV_FP32, 2, 4, 1), NL_OK);
    const int32_t toks[6] = {1, 2, 3, 4, 5, 6};
    nl_block_table a = {0}, b = {0};
    assert_true(nl_block_table_reserve(&p, &a, 5)); /* 3 blocks */
    assert_int_equal(a.n, 3);
    assert_int_equal(p.n_free, 1);
    /* the first two blocks are full: hashed, chained */
    uint64_t h0 = nl_block_pool_register(&p, a.ids[0], 0, toks);
    uint64_t h1 = nl_block_pool_register(&p, a.ids[1], h0, toks + 2);
    assert_true(h0 != 0 && h1 != 0 && h0 != h1);
    assert_int_equal(h1, nl_block_hash(h0, toks + 2, 2));
    assert_int_equal(nl_block_pool_register(&p, a.ids[2], h0, toks + 2), 0); /* that prefix is held */
    assert_int_equal(p.n_cached, 2);
    assert_int_equal(nl_block_pool_find(&p, h1, h0, toks + 2), a.ids[1]);
    assert_int_equal(nl_block_pool_find(&p, h1, 0, toks + 2), -1); /* another parent */
    int64_t nf = -1;
    assert_int_equal(nl_block_pool_match(&p, toks, 6, 3, &nf), 2);
    assert_int_equal(nf, 0);
    assert_int_equal(nl_block_pool_match(&p, toks, 3, 3, &nf), 1); /* only full blocks */
    /* a second sequence shares the two blocks: reference counts 2 */
    assert_int_equal(nl_block_table_take_cached(&p, &b, toks, 2), 2);
    assert_int_equal(p.ref[a.ids[0]], 2);
    assert_int_equal(p.ref[a.ids[1]], 2);
    nl_block_table_clear(&p, &a);
    assert_int_equal(p.ref[b.ids[0]], 1);
    assert_int_equal(p.n_free, 2); /* a's unhashed last block and the spare */
    nl_block_table_clear(&p, &b);
    for (int64_t i = 0; i < p.n_blocks; i++) assert_int_equal(p.ref[i], 0);
    assert_int_equal(p.n_free, 4);
    assert_int_equal(nl_block_pool_match(&p, toks, 6, 3, &nf), 2);
    assert_int_equal(nf, 2); /* found, but free */
    /* the two unhashed blocks go first, then the least recently used cached one: b released its
     * second block before its first, so the second is evicted, and the prefix keeps one block */
    int32_t x = nl_block_pool_alloc(&p), y = nl_block_pool_alloc(&p);
    assert_true(!p.hashed[x] && !p.hashed[y] && x >= 0 && y >= 0);
    assert_int_equal(nl_block_pool_match(&p, toks, 6, 3, NULL), 2);
    int32_t z = nl_block_pool_alloc(&p);
    assert_int_equal(p.evictions, 1);
    assert_int_equal(nl_block_pool_match(&p, toks, 6, 3, NULL), 1);
    assert_int_equal(nl_block_pool_alloc(&p) >= 0, 1);
    assert_int_equal(nl_block_pool_alloc(&p), -1);
    assert_int_equal(p.n_cached, 0);
    (void)z;
    nl_block_table_free(&a);
    nl_block_table_free(&b);
    nl_block_pool_free(&p);
    /* caching off: nothing is hashed */
    assert_int_equal(nl_block_pool_init(&p, 1, 1, 4, NL_KV_FP32, 2, 4, 0), NL_OK);
    int32_t id = nl_block_pool_alloc(&p);
    assert_int_equal(nl_block_pool_register(&p, id, 0, toks), 0);
    assert_int_equal(nl_block_pool_match(&p, toks, 6, 3, NULL), 0);
    nl_block_pool_free(&p);
}

/* A byte-vocabulary model whose weights are scaled up, so that logits are far apart. */
static void make_model(nl_model *m, int64_t seq_len) {
    nl_arch a;
    memset(&a, 0, sizeof a);
    snprintf(a.name, sizeof a.name, "prefix-test");
    a.vocab_size = 256;
    a.dim = 64;
    a.n_layers = 2;
    a.n_heads = 4;
    a.n_kv_heads = 2;
    a.hidden_dim = 96;
    a.seq_len = seq_len;
    a.rope_theta = 10000;
    a.norm_eps = 1e-5;
    a.tied_embeddings = 1;
    assert_int_equal(nl_model_init(m, &a), NL_OK);
    nl_model_init_random(m, 7);
    for (size_t i = 0; i < m->n_params; i++) m->params[i] *= 25.0f;
    for (int64_t l = 0; l < m->L; l++)
        for (int64_t i = 0; i < m->C; i++) m->w.layers[l].rms_att[i] = m->w.layers[l].rms_ffn[i] = 1.0f;
    for (int64_t i = 0; i < m->C; i++) m->w.rms_final[i] = 1.0f;
}

enum { N_REQ = 12, SHARED = 37, GEN = 12 };

/* Request i: SHARED tokens common to all (two prefixes: even and odd i), then its own tail. */
static int64_t prompt_of(int i, int32_t *p) {
    int64_t n = SHARED + 3 + (i * 5) % 17;
    for (int64_t j = 0; j < n; j++)
        p[j] = j < SHARED ? (int32_t)((13 * j + 7 * (i % 2) + 1) % 256) : (int32_t)((31 * i + 11 * j) % 256);
    return n;
}

typedef struct run_cfg {
    int caching, kv, one_at_a_time, max_batch;
    int64_t kv_blocks;
} run_cfg;

/* Runs the N_REQ requests (request 3 and 8 sampled with a seed, the others greedy); out (N_REQ,
 * GEN) tokens. Checks that every block is back in the pool at the end. */
static void run(const nl_model *m, const run_cfg *c, int32_t out[N_REQ][GEN], nl_engine_stats *st) {
    nl_engine_opts o;
    nl_engine_opts_default(&o);
    o.prefix_cache = c->caching;
    o.kv = c->kv ? NL_KV_INT8 : NL_KV_FP32;
    o.block_size = 8;
    o.chunk = 16;
    o.max_batch = c->max_batch;
    o.kv_blocks = c->kv_blocks;
    o.threads = 1;
    nl_engine *e;
    assert_int_equal(nl_engine_open_model(&e, m, NULL, &o), NL_OK);
    uint64_t ids[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        int32_t p[96];
        int64_t n = prompt_of(i, p);
        nl_sampling s;
        nl_sampling_default(&s);
        s.temperature = (i == 3 || i == 8) ? 0.8f : 0.0f;
        s.seed = 100 + (uint64_t)i;
        s.max_tokens = GEN;
        s.ignore_eos = 1;
        assert_int_equal(nl_engine_submit(e, p, n, &s, &ids[i]), NL_OK);
        if (c->one_at_a_time)
            while (nl_engine_busy(e)) assert_int_equal(nl_engine_step(e, NULL), NL_OK);
    }
    int guard = 0;
    while (nl_engine_busy(e)) {
        assert_int_equal(nl_engine_step(e, NULL), NL_OK);
        assert_true(++guard < 100000);
    }
    for (int i = 0; i < N_REQ; i++) {
        nl_engine_output r;
        assert_int_equal(nl_engine_read(e, ids[i], 1, &r), NL_OK);
        assert_int_equal(r.n_tokens, GEN);
        memcpy(out[i], r.tokens, sizeof(int32_t) * GEN);
        nl_engine_output_free(&r);
        nl_engine_release(e, ids[i]);
    }
    nl_engine_stats_get(e, st);
    assert_int_equal(st->kv_blocks_used, 0); /* every reference count back to 0 */
    assert_int_equal(st->kv_blocks_free, st->kv_blocks_total);
    nl_engine_close(e);
}

static void test_same_tokens_on_and_off(void **state) {
    (void)state;
    nl_model m;
    make_model(&m, 96);
    const run_cfg cfgs[] = {
        {0, 0, 0, 4, 0},  {0, 1, 0, 4, 0},                    /* references: fp32 and int8 KV */
        {1, 0, 0, 4, 0},  {1, 0, 1, 4, 0},  {1, 0, 0, 32, 0}, /* batched, one at a time, all at once */
        {1, 1, 0, 4, 0},  {1, 1, 1, 4, 0},                    /* int8 KV */
        {1, 0, 0, 4, 24}, {1, 0, 1, 2, 14},                   /* small pools: preemption, eviction */
    };
    int32_t ref[2][N_REQ][GEN], got[N_REQ][GEN];
    int64_t evictions = 0;
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
        nl_engine_stats st;
        run(&m, &cfgs[k], k < 2 ? ref[k] : got, &st);
        if (k < 2) {
            assert_int_equal(st.prefix_cache_hits, 0);
            continue;
        }
        print_message("caching, kv %d, one at a time %d, batch %d, blocks %lld: %lld of %lld prompt tokens cached, "
                      "%lld evictions, %lld preemptions\n",
                      cfgs[k].kv, cfgs[k].one_at_a_time, cfgs[k].max_batch, (long long)cfgs[k].kv_blocks,
                      (long long)st.prefix_cache_hits, (long long)st.prefix_cache_queries,
                      (long long)st.prefix_cache_evictions, (long long)st.preemptions);
        assert_memory_equal(got, ref[cfgs[k].kv], sizeof got);
        /* a shared prefix is 4 full blocks (32 tokens): one at a time, every request after the first
         * of its prefix finds them; four at a time, the first four (two of each prefix) run
         * before any is registered */
        if (!cfgs[k].kv_blocks && cfgs[k].one_at_a_time) assert_int_equal(st.prefix_cache_hits, 32 * (N_REQ - 2));
        if (!cfgs[k].kv_blocks && !cfgs[k].one_at_a_time && cfgs[k].max_batch == 4)
            assert_int_equal(st.prefix_cache_hits, 32 * (N_REQ - 4));
        evictions += st.prefix_cache_evictions;
    }
    assert_true(evictions > 0);
    nl_model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_refcounts_lru),
        cmocka_unit_test(test_same_tokens_on_and_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
