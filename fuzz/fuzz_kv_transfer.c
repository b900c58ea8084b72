/* libFuzzer target: the KV-transfer messages of prefill/decode disaggregation (kv_transfer.h)
 * through their parsers. The first byte picks the message (bit 0: 0 = request, 1 = answer) and
 * the receiver's KV format (bit 1: int8); the rest is the message, checked against a small
 * model shape. Invariants: an accepted message is within every range the header promises
 * (tokens in the vocabulary, n_tokens in [1, context), K/V bytes exactly those of n_tokens
 * positions of this shape) and encodes back to the same bytes; a refused one is NL_ERR_FORMAT
 * (or the status an error answer carries) with a message, and leaves nothing allocated. */
#include <stdlib.h>
#include <string.h>

#include "nanolm/kv_transfer.h"
#include "nanolm/kvcache.h"

#include "fuzz_targets.h"

int nl_fuzz_kv_transfer(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    nl_kvx_shape sh = {2, 4, 2, 8, 64, 32, (data[0] & 2) ? NL_KV_INT8 : NL_KV_FP32};
    const uint8_t *msg = data + 1;
    size_t len = size - 1;
    uint8_t *again = NULL;
    size_t again_len = 0;
    if (!(data[0] & 1)) {
        nl_kvx_request rq;
        nl_status rc = nl_kvx_parse_request(msg, len, &sh, &rq);
        if (rc) {
            if (rc != NL_ERR_FORMAT || !nl_last_error()[0] || rq.tokens) abort();
            return 0;
        }
        if (rq.n_tokens < 1 || rq.n_tokens >= sh.seq_len) abort();
        for (int64_t i = 0; i < rq.n_tokens; i++)
            if (rq.tokens[i] < 0 || rq.tokens[i] >= sh.vocab) abort();
        if (nl_kvx_encode_request(&sh, rq.tokens, rq.n_tokens, &rq.s, rq.id, &again, &again_len)) abort();
        if (again_len != len || memcmp(again, msg, len)) abort();
        nl_free(rq.tokens);
        nl_free(again);
        return 0;
    }
    nl_engine_kv kv;
    nl_status rc = nl_kvx_parse_kv(msg, len, &sh, &kv);
    if (rc) {
        if (!nl_last_error()[0] || kv.data || kv.tokens) abort();
        return 0;
    }
    if (kv.n_tokens < 1 || kv.n_tokens >= sh.seq_len || kv.first_token < 0 || kv.first_token >= sh.vocab) abort();
    if (kv.data_bytes != nl_kvcache_seq_bytes(sh.n_layers, sh.kv_heads, sh.head_dim, sh.dtype, kv.n_tokens)) abort();
    for (int64_t i = 0; i < kv.n_tokens; i++)
        if (kv.tokens[i] < 0 || kv.tokens[i] >= sh.vocab) abort();
    /* the sender's block size and the request id are not kept: re-encode with the message's */
    uint32_t bs = (uint32_t)msg[40] | (uint32_t)msg[41] << 8 | (uint32_t)msg[42] << 16 | (uint32_t)msg[43] << 24;
    uint32_t id = (uint32_t)msg[100] | (uint32_t)msg[101] << 8 | (uint32_t)msg[102] << 16 | (uint32_t)msg[103] << 24;
    if (nl_kvx_encode_kv(&sh, &kv, bs, id, &again, &again_len)) abort();
    if (again_len != len || memcmp(again, msg, len)) abort();
    nl_free(again);
    nl_engine_kv_free(&kv);
    return 0;
}

#ifndef NL_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return nl_fuzz_kv_transfer(data, size); }
#endif
