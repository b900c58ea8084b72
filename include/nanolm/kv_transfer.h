/*
 * nanolm kv_transfer: prefill/decode disaggregation (DistServe, Splitwise). A prefill process
 * computes each prompt's KV cache and its first token; a decode process (the HTTP front end)
 * imports that KV into its own paged pool and decodes. The two talk over a local TCP socket
 * with a small framed binary protocol, all integers little-endian:
 *
 *   request, decode -> prefill: 64-byte header, then n_tokens int32 prompt tokens
 *     0 magic "NKVQ"  4 version (1)  8 shape: n_layers, n_heads, kv_heads, head_dim, vocab,
 *     seq_len (6 x u32)  32 KV format (0 fp32, 1 int8)  36 n_tokens  40 temperature (f32)
 *     44 top_p (f32)  48 top_k  52 request id (u32)  56 seed (u64)
 *   answer, prefill -> decode: 104-byte header, then either status == 0: n_tokens int32 prompt
 *   tokens and kv_bytes of K/V (nl_kvcache_gather's layout), or status != 0: text_len bytes of
 *   error message
 *     0 magic "NKVK"  4 version (1)  8 status (0 ok, else an nl_status)  12 shape (6 x u32)
 *     36 KV format  40 block_size  44 n_blocks (= ceil(n_tokens / block_size) of the sender)
 *     48 n_tokens  52 first_token  56 generator state (4 x u64)  88 kv_bytes (u64)
 *     96 text_len  100 request id (the request's, echoed)
 *
 * Every field is validated on receipt before anything is allocated: the magic, the version,
 * the model shape and KV format against the receiver's, n_tokens in [1, seq_len), tokens in
 * the vocabulary, n_blocks against n_tokens, and kv_bytes equal to exactly
 * 2 x n_layers x kv_heads x head_dim x bytes x n_tokens (+ the int8 format's fp16 scales,
 * 2 x n_layers x kv_heads x 2 x n_tokens). Bad input gets NL_ERR_FORMAT naming the field. The
 * decode side also checks that an answer is for its request: the request id and every prompt
 * token.
 */
#ifndef NANOLM_KV_TRANSFER_H
#define NANOLM_KV_TRANSFER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "nanolm/base.h"
#include "nanolm/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NL_KVX_VERSION          1
#define NL_KVX_REQ_HEADER_BYTES 64
#define NL_KVX_KV_HEADER_BYTES  104
#define NL_KVX_MAX_TEXT         1024
/* The prefill server: at most this many connections (one thread each; more get a BUSY error
 * answer at once), a request must arrive within NL_KVX_REQUEST_TIMEOUT_S of connecting (an idle
 * connection is closed), its answer be sent within NL_KVX_ANSWER_TIMEOUT_S, and stopping shuts
 * every connection down rather than waiting for its client. */
#define NL_KVX_MAX_CONNS         64
#define NL_KVX_REQUEST_TIMEOUT_S 10
#define NL_KVX_ANSWER_TIMEOUT_S  120

/* What both sides must agree on: the model's shape and the KV format. */
typedef struct nl_kvx_shape {
    int64_t n_layers, n_heads, kv_heads, head_dim, vocab, seq_len;
    nl_kv_dtype dtype;
} nl_kvx_shape;
/* The shape of an engine's model and its KV format. */
void nl_kvx_shape_of(const nl_engine *e, nl_kvx_shape *sh);

/* A parsed request: the prompt and what the prefill side samples the first token with. */
typedef struct nl_kvx_request {
    int32_t *tokens; /* (n_tokens) nl_free */
    int64_t n_tokens;
    nl_sampling s; /* temperature, top_p, top_k, seed; the rest default */
    uint32_t id;   /* the request id, which the answer echoes */
} nl_kvx_request;

/* Encodes a request with its id (which the answer must echo; buf: nl_free): every header field
 * written, so that parsing and encoding again gives the same bytes. NL_ERR_INVALID for n outside
 * [1, seq_len]. */
nl_status nl_kvx_encode_request(const nl_kvx_shape *sh, const int32_t *prompt, int64_t n, const nl_sampling *s,
                                uint32_t id, uint8_t **buf, size_t *len);
/* Validates a request header (NL_KVX_REQ_HEADER_BYTES) against expect; *body_bytes receives the
 * bytes that follow. NL_ERR_FORMAT naming the field. */
nl_status nl_kvx_request_header(const uint8_t *hdr, const nl_kvx_shape *expect, size_t *body_bytes);
/* Parses a whole request message of len bytes (header + body, nothing more).
 * NL_ERR_FORMAT naming the field, NL_ERR_NOMEM. out: nl_free(out->tokens). */
nl_status nl_kvx_parse_request(const uint8_t *msg, size_t len, const nl_kvx_shape *expect, nl_kvx_request *out);

/* Encodes an answer with the KV of kv (block_size: the sender's, for n_blocks) to the request
 * `id`, or, with status != 0, an error carrying message (at most NL_KVX_MAX_TEXT bytes of it).
 * buf: nl_free. */
nl_status nl_kvx_encode_kv(const nl_kvx_shape *sh, const nl_engine_kv *kv, int64_t block_size, uint32_t id,
                           uint8_t **buf, size_t *len);
nl_status nl_kvx_encode_error(const nl_kvx_shape *sh, nl_status status, const char *message, uint8_t **buf,
                              size_t *len);
/* Validates an answer header (NL_KVX_KV_HEADER_BYTES) against expect; *body_bytes receives
 * the bytes that follow (the error text for an error answer). NL_ERR_FORMAT naming the field. */
nl_status nl_kvx_kv_header(const uint8_t *hdr, const nl_kvx_shape *expect, size_t *body_bytes);
/* Parses a whole answer of len bytes into out (nl_engine_kv_free). An error answer returns its
 * status with "prefill server: MESSAGE"; NL_ERR_FORMAT naming the field for bad bytes. */
nl_status nl_kvx_parse_kv(const uint8_t *msg, size_t len, const nl_kvx_shape *expect, nl_engine_kv *out);

/* The decode side: sends prompt (n tokens) with s's sampling fields to the prefill server at
 * addr ("HOST:PORT", IPv4), waits for its answer and parses it into out (nl_engine_kv_free).
 * *bytes_moved (may be NULL) receives the bytes of the answer (header, tokens and K/V).
 * Errors: NL_ERR_IO naming addr (cannot connect, connection closed, timeout), the remote
 * side's status and message, NL_ERR_FORMAT for a bad answer or one for another request (its id
 * or its prompt tokens differ). */
nl_status nl_kvx_remote_prefill(const char *addr, const nl_kvx_shape *sh, const int32_t *prompt, int64_t n,
                                const nl_sampling *s, nl_engine_kv *out, size_t *bytes_moved);
/* As nl_kvx_remote_prefill, giving up (NL_ERR_IO, "cancelled") within 100 ms of *cancel becoming
 * nonzero (NULL: never), and after NL_KVX_ANSWER_TIMEOUT_S without the whole answer. */
nl_status nl_kvx_remote_prefill_cancel(const char *addr, const nl_kvx_shape *sh, const int32_t *prompt, int64_t n,
                                       const nl_sampling *s, const atomic_int *cancel, nl_engine_kv *out,
                                       size_t *bytes_moved);

/* The prefill side: a server on host:port (port 0: ephemeral) that answers each connection's
 * request by running it through e as a prefill-only request (batched with the others by a
 * driver thread it starts) and sending back its KV. The engine must outlive the server. */
typedef struct nl_kvx_server nl_kvx_server;
typedef struct nl_kvx_stats {
    int64_t requests_ok, requests_failed;
    int64_t kv_bytes_sent; /* K/V bytes of the answers (not headers or tokens) */
} nl_kvx_stats;
/* NL_ERR_INVALID for a bad host, NL_ERR_IO naming host:port when it cannot listen. */
nl_status nl_kvx_server_start(nl_kvx_server **s, nl_engine *e, const char *host, int port);
int nl_kvx_server_port(const nl_kvx_server *s);
void nl_kvx_server_stats(nl_kvx_server *s, nl_kvx_stats *st);
/* Stops accepting, cancels what runs, waits for the connection threads and the driver, frees. */
void nl_kvx_server_stop(nl_kvx_server *s);

#ifdef __cplusplus
}
#endif
#endif
