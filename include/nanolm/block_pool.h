/*
 * nanolm block_pool: the bookkeeping of the serving engine's paged KV cache (vLLM v1's
 * KVCacheManager / BlockPool): which block is free, which sequence holds which blocks (block
 * tables), how many sequences share a block (reference counts), and which full blocks hold which
 * tokens (prefix hashes, for automatic prefix caching). The K/V themselves are in `kv`
 * (nanolm/kvcache.h).
 *
 * Free blocks wait in one queue: alloc takes from its head. A block released without a hash goes
 * to the head (taken again first, the stack order of a pool without caching); a block released
 * with a hash (a full block whose tokens are known) goes to the tail, so the free cached blocks
 * are evicted least recently used first, and its hash stays findable until it is taken.
 *
 * Prefix caching: a full block's hash is that of its tokens and of the hash of the block before
 * it (chained, so a hash names the whole prefix up to the block's end); a lookup compares the
 * tokens and the parent's hash too, so that two prefixes never share a block by a hash collision.
 * Only full blocks are shared, and a sequence writes only at positions past its shared blocks, so
 * a shared block is never written again while it is held.
 * Not thread-safe: the engine's driver thread owns the pool (under the engine's mutex).
 */
#ifndef NANOLM_BLOCK_POOL_H
#define NANOLM_BLOCK_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/base.h"
#include "nanolm/kvcache.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nl_block_pool {
    nl_kvcache kv; /* the storage */
    int64_t n_blocks, block_size;
    int caching;                 /* 1: full blocks are hashed and shared */
    int32_t *ref;                /* (n_blocks) sequences holding each block */
    int32_t *prev, *next;        /* (n_blocks) the free queue, doubly linked (-1 ends) */
    int32_t head, tail;          /* of the free queue (-1 when empty) */
    int64_t n_free;              /* blocks in the free queue (cached ones included) */
    uint64_t *hash, *parent;     /* (n_blocks) a hashed block's hash and its parent's (0: first) */
    uint8_t *hashed;             /* (n_blocks) 1 when the block is in the hash table */
    int32_t *toks;               /* (n_blocks, block_size) a hashed block's tokens */
    int32_t *bucket, *chain;     /* hash table: (n_buckets) first block, (n_blocks) next block */
    int64_t n_buckets, n_cached; /* buckets (a power of 2); blocks in the hash table */
    int64_t evictions;           /* hashed blocks taken for other tokens */
} nl_block_pool;

/* A sequence's blocks in position order: position p is in ids[p / block_size]. */
typedef struct nl_block_table {
    int32_t *ids;
    int64_t n, cap;
} nl_block_table;

/* Allocates the storage (nl_kvcache_init) and the bookkeeping of n_blocks blocks, all free.
 * caching: 1 to hash and share full blocks. Errors as nl_kvcache_init, NL_ERR_NOMEM. */
nl_status nl_block_pool_init(nl_block_pool *p, int64_t L, int64_t KVH, int64_t hd, nl_kv_dtype dt, int64_t block_size,
                             int64_t n_blocks, int caching);
/* Frees everything; safe on a zeroed struct. */
void nl_block_pool_free(nl_block_pool *p);
/* Takes a free block (reference count 1; a free cached block is evicted: its hash forgotten):
 * its id, or -1 when none is free. */
int32_t nl_block_pool_alloc(nl_block_pool *p);
/* Blocks held by sequences (n_blocks - n_free). */
static inline int64_t nl_block_pool_used(const nl_block_pool *p) { return p->n_blocks - p->n_free; }

/* The chained hash of a full block: its block_size tokens after the hash of the block before it
 * (0 for the first block). Never 0. */
uint64_t nl_block_hash(uint64_t parent, const int32_t *toks, int64_t block_size);
/* The cached block with these tokens after this parent hash (hash h = nl_block_hash(parent,
 * toks)), or -1. */
int32_t nl_block_pool_find(const nl_block_pool *p, uint64_t h, uint64_t parent, const int32_t *toks);
/* Records full block id as holding toks (block_size tokens) after parent; returns its hash, or
 * 0 when caching is off or another block already holds that prefix (id then stays unhashed). */
uint64_t nl_block_pool_register(nl_block_pool *p, int32_t id, uint64_t parent, const int32_t *toks);

/* How many leading full blocks of toks (n tokens, at most max_blocks blocks) are cached, and of
 * those how many sit in the free queue (*n_free_hit; may be NULL). Takes nothing. */
int64_t nl_block_pool_match(const nl_block_pool *p, const int32_t *toks, int64_t n, int64_t max_blocks,
                            int64_t *n_free_hit);

/* Grows t so that it holds positions [0, upto) from free blocks. Returns 0 when the pool ran out
 * (t keeps what it got) or the table cannot grow. */
int nl_block_table_reserve(nl_block_pool *p, nl_block_table *t, int64_t upto);
/* Appends the first n_blocks cached blocks that nl_block_pool_match found for toks to the empty
 * table t, holding each. Returns the blocks taken (fewer only when t cannot grow). */
int64_t nl_block_table_take_cached(nl_block_pool *p, nl_block_table *t, const int32_t *toks, int64_t n_blocks);
/* Releases every block of t, last first (a sequence's later blocks are evicted before its
 * prefix), and empties it (its array is kept). */
void nl_block_table_clear(nl_block_pool *p, nl_block_table *t);
/* Frees the array (the blocks must be released). */
void nl_block_table_free(nl_block_table *t);

#ifdef __cplusplus
}
#endif
#endif
