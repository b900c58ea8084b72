/* The KV cache's bookkeeping: free queue, reference counts, block tables and prefix hashes
 * (block_pool.h). */
#include <string.h>

#include "nanolm/block_pool.h"

nl_status nl_block_pool_init(nl_block_pool *p, int64_t L, int64_t KVH, int64_t hd, nl_kv_dtype dt, int64_t block_size,
                             int64_t n_blocks, int caching) {
    memset(p, 0, sizeof *p);
    NL_TRY(nl_kvcache_init(&p->kv, L, KVH, hd, dt, block_size, n_blocks));
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    p->caching = caching != 0;
    p->n_buckets = 16;
    while (p->n_buckets < 2 * n_blocks) p->n_buckets *= 2;
    const size_t nb = (size_t)n_blocks;
    p->ref = nl_calloc(nb, sizeof(int32_t), "KV block reference counts");
    p->prev = nl_malloc(nb * sizeof(int32_t), "KV free queue");
    p->next = nl_malloc(nb * sizeof(int32_t), "KV free queue");
    p->hash = nl_calloc(nb, sizeof(uint64_t), "KV block hashes");
    p->parent = nl_calloc(nb, sizeof(uint64_t), "KV block parent hashes");
    p->hashed = nl_calloc(nb, 1, "KV block hash flags");
    p->chain = nl_malloc(nb * sizeof(int32_t), "KV block hash chains");
    p->bucket = nl_malloc((size_t)p->n_buckets * sizeof(int32_t), "KV block hash table");
    if (p->caching) p->toks = nl_malloc(nb * (size_t)block_size * sizeof(int32_t), "KV block tokens");
    if (!p->ref || !p->prev || !p->next || !p->hash || !p->parent || !p->hashed || !p->chain || !p->bucket ||
        (p->caching && !p->toks)) {
        nl_block_pool_free(p);
        return NL_ERR_NOMEM;
    }
    for (int64_t b = 0; b < p->n_buckets; b++) p->bucket[b] = -1;
    /* the queue hands out block 0 first */
    for (int64_t i = 0; i < n_blocks; i++) {
        p->prev[i] = (int32_t)(i - 1);
        p->next[i] = i + 1 < n_blocks ? (int32_t)(i + 1) : -1;
        p->chain[i] = -1;
    }
    p->head = 0;
    p->tail = (int32_t)(n_blocks - 1);
    p->n_free = n_blocks;
    return NL_OK;
}

void nl_block_pool_free(nl_block_pool *p) {
    if (!p) return;
    nl_kvcache_free(&p->kv);
    nl_free(p->ref);
    nl_free(p->prev);
    nl_free(p->next);
    nl_free(p->hash);
    nl_free(p->parent);
    nl_free(p->hashed);
    nl_free(p->chain);
    nl_free(p->bucket);
    nl_free(p->toks);
    memset(p, 0, sizeof *p);
}

/* ---- the free queue ---------------------------------------------------------------------------- */

static void queue_unlink(nl_block_pool *p, int32_t id) {
    if (p->prev[id] >= 0)
        p->next[p->prev[id]] = p->next[id];
    else
        p->head = p->next[id];
    if (p->next[id] >= 0)
        p->prev[p->next[id]] = p->prev[id];
    else
        p->tail = p->prev[id];
    p->prev[id] = p->next[id] = -1;
    p->n_free--;
}

static void queue_push(nl_block_pool *p, int32_t id, int at_tail) {
    if (at_tail) {
        p->prev[id] = p->tail;
        p->next[id] = -1;
        if (p->tail >= 0)
            p->next[p->tail] = id;
        else
            p->head = id;
        p->tail = id;
    } else {
        p->next[id] = p->head;
        p->prev[id] = -1;
        if (p->head >= 0)
            p->prev[p->head] = id;
        else
            p->tail = id;
        p->head = id;
    }
    p->n_free++;
}

/* ---- hashes ------------------------------------------------------------------------------------ */

static inline uint64_t mix64(uint64_t x) { /* splitmix64's finalizer */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

uint64_t nl_block_hash(uint64_t parent, const int32_t *toks, int64_t block_size) {
    uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ULL);
    for (int64_t i = 0; i < block_size; i++) h = mix64(h ^ ((uint64_t)(uint32_t)toks[i] + 0x632be59bd9b4e019ULL));
    return h ? h : 1;
}

static void hash_remove(nl_block_pool *p, int32_t id) {
    if (!p->hashed[id]) return;
    int32_t *at = &p->bucket[p->hash[id] & (uint64_t)(p->n_buckets - 1)];
    while (*at >= 0 && *at != id) at = &p->chain[*at];
    if (*at == id) *at = p->chain[id];
    p->chain[id] = -1;
    p->hashed[id] = 0;
    p->hash[id] = p->parent[id] = 0;
    p->n_cached--;
}

int32_t nl_block_pool_find(const nl_block_pool *p, uint64_t h, uint64_t parent, const int32_t *toks) {
    if (!p->caching) return -1;
    for (int32_t id = p->bucket[h & (uint64_t)(p->n_buckets - 1)]; id >= 0; id = p->chain[id])
        if (p->hash[id] == h && p->parent[id] == parent &&
            !memcmp(p->toks + (int64_t)id * p->block_size, toks, (size_t)p->block_size * sizeof(int32_t)))
            return id;
    return -1;
}

uint64_t nl_block_pool_register(nl_block_pool *p, int32_t id, uint64_t parent, const int32_t *toks) {
    if (!p->caching || p->hashed[id]) return 0;
    uint64_t h = nl_block_hash(parent, toks, p->block_size);
    if (nl_block_pool_find(p, h, parent, toks) >= 0) return 0;
    int32_t *b = &p->bucket[h & (uint64_t)(p->n_buckets - 1)];
    p->chain[id] = *b;
    *b = id;
    p->hash[id] = h;
    p->parent[id] = parent;
    p->hashed[id] = 1;
    memcpy(p->toks + (int64_t)id * p->block_size, toks, (size_t)p->block_size * sizeof(int32_t));
    p->n_cached++;
    return h;
}

/* ---- blocks ------------------------------------------------------------------------------------ */

int32_t nl_block_pool_alloc(nl_block_pool *p) {
    int32_t id = p->head;
    if (id < 0) return -1;
    queue_unlink(p, id);
    if (p->hashed[id]) {
        hash_remove(p, id);
        p->evictions++;
    }
    p->ref[id] = 1;
    return id;
}

/* One more holder of block id (taken out of the free queue when it was free). */
static void pool_retain(nl_block_pool *p, int32_t id) {
    if (p->ref[id]++ == 0) queue_unlink(p, id);
}

/* One holder less; at 0 the block joins the free queue (tail when hashed, head otherwise). */
static void pool_release(nl_block_pool *p, int32_t id) {
    if (id < 0 || id >= p->n_blocks || p->ref[id] <= 0) return;
    if (--p->ref[id] == 0) queue_push(p, id, p->hashed[id]);
}

int64_t nl_block_pool_match(const nl_block_pool *p, const int32_t *toks, int64_t n, int64_t max_blocks,
                            int64_t *n_free_hit) {
    const int64_t bs = p->block_size;
    int64_t k = 0, nf = 0;
    uint64_t parent = 0;
    if (p->caching)
        for (; k < max_blocks && (k + 1) * bs <= n; k++) {
            uint64_t h = nl_block_hash(parent, toks + k * bs, bs);
            int32_t id = nl_block_pool_find(p, h, parent, toks + k * bs);
            if (id < 0) break;
            nf += p->ref[id] == 0;
            parent = h;
        }
    if (n_free_hit) *n_free_hit = nf;
    return k;
}

/* ---- block tables ------------------------------------------------------------------------------ */

static int table_grow(nl_block_table *t, int64_t need) {
    if (need <= t->cap) return 1;
    int64_t nc = t->cap ? t->cap : 8;
    while (nc < need) nc *= 2;
    int32_t *q = nl_malloc((size_t)nc * sizeof(int32_t), "block table");
    if (!q) return 0;
    if (t->n) memcpy(q, t->ids, (size_t)t->n * sizeof(int32_t));
    nl_free(t->ids);
    t->ids = q;
    t->cap = nc;
    return 1;
}

int nl_block_table_reserve(nl_block_pool *p, nl_block_table *t, int64_t upto) {
    int64_t need = (upto + p->block_size - 1) / p->block_size;
    if (!table_grow(t, need)) return 0;
    while (t->n < need) {
        int32_t b = nl_block_pool_alloc(p);
        if (b < 0) return 0;
        t->ids[t->n++] = b;
    }
    return 1;
}

int64_t nl_block_table_take_cached(nl_block_pool *p, nl_block_table *t, const int32_t *toks, int64_t n_blocks) {
    const int64_t bs = p->block_size;
    if (!table_grow(t, t->n + n_blocks)) return 0;
    uint64_t parent = 0;
    int64_t k = 0;
    for (; k < n_blocks; k++) {
        uint64_t h = nl_block_hash(parent, toks + k * bs, bs);
        int32_t id = nl_block_pool_find(p, h, parent, toks + k * bs);
        if (id < 0) break;
        pool_retain(p, id);
        t->ids[t->n++] = id;
        parent = h;
    }
    return k;
}

void nl_block_table_clear(nl_block_pool *p, nl_block_table *t) {
    for (int64_t i = t->n - 1; i >= 0; i--) pool_release(p, t->ids[i]);
    t->n = 0;
}

void nl_block_table_free(nl_block_table *t) {
    nl_free(t->ids);
    memset(t, 0, sizeof *t);
}
