/* Prefill/decode disaggregation: the KV-transfer protocol, its client and its server (kv_transfer.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "nanolm/driver.h"
#include "nanolm/kv_transfer.h"
#include "nanolm/kvcache.h"

static const uint8_t MAGIC_REQ[4] = {'N', 'K', 'V', 'Q'};
static const uint8_t MAGIC_KV[4] = {'N', 'K', 'V', 'K'};

/* ---- little-endian fields ---------------------------------------------------------------------- */

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}
static void putf(uint8_t *p, float f) {
    uint32_t v;
    memcpy(&v, &f, 4);
    put32(p, v);
}
static float getf(const uint8_t *p) {
    uint32_t v = get32(p);
    float f;
    memcpy(&f, &v, 4);
    return f;
}

void nl_kvx_shape_of(const nl_engine *e, nl_kvx_shape *sh) {
    const nl_arch *a = nl_engine_arch(e);
    sh->n_layers = a->n_layers;
    sh->n_heads = a->n_heads;
    sh->kv_heads = a->n_kv_heads;
    sh->head_dim = nl_arch_head_dim(a);
    sh->vocab = a->vocab_size;
    sh->seq_len = a->seq_len;
    sh->dtype = nl_engine_kv_dtype(e);
}

static void put_shape(uint8_t *p, const nl_kvx_shape *sh) {
    put32(p + 0, (uint32_t)sh->n_layers);
    put32(p + 4, (uint32_t)sh->n_heads);
    put32(p + 8, (uint32_t)sh->kv_heads);
    put32(p + 12, (uint32_t)sh->head_dim);
    put32(p + 16, (uint32_t)sh->vocab);
    put32(p + 20, (uint32_t)sh->seq_len);
    put32(p + 24, (uint32_t)sh->dtype);
}

static const char *dtype_name(uint32_t d) { return d == NL_KV_FP32 ? "fp32" : d == NL_KV_INT8 ? "int8" : "unknown"; }

/* Checks magic, version, shape and KV format of a header (shape at offset `at`). */
static nl_status check_common(const uint8_t *h, const uint8_t magic[4], const char *what, size_t at,
                              const nl_kvx_shape *x) {
    if (memcmp(h, magic, 4))
        return nl_fail(NL_ERR_FORMAT, "KV transfer %s: bad magic %02x %02x %02x %02x (expected \"%.4s\")", what, h[0],
                       h[1], h[2], h[3], (const char *)magic);
    if (get32(h + 4) != NL_KVX_VERSION)
        return nl_fail(NL_ERR_FORMAT, "KV transfer %s: version %u, this build speaks %d", what, get32(h + 4),
                       NL_KVX_VERSION);
    const uint8_t *s = h + at;
    const int64_t want[6] = {x->n_layers, x->n_heads, x->kv_heads, x->head_dim, x->vocab, x->seq_len};
    static const char *names[6] = {"n_layers", "n_heads", "kv_heads", "head_dim", "vocab", "seq_len"};
    for (int i = 0; i < 6; i++)
        if ((int64_t)get32(s + 4 * i) != want[i])
            return nl_fail(NL_ERR_FORMAT, "KV transfer %s: model shape differs: %s %u, this side's model has %lld",
                           what, names[i], get32(s + 4 * i), (long long)want[i]);
    uint32_t dt = get32(s + 24);
    if (dt != (uint32_t)x->dtype)
        return nl_fail(NL_ERR_FORMAT, "KV transfer %s: KV format %s (%u), this side's cache is %s", what,
                       dtype_name(dt), dt, dtype_name((uint32_t)x->dtype));
    return NL_OK;
}

/* ---- request ----------------------------------------------------------------------------------- */

nl_status nl_kvx_encode_request(const nl_kvx_shape *sh, const int32_t *prompt, int64_t n, const nl_sampling *s,
                                uint32_t id, uint8_t **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    if (n < 1 || n >= sh->seq_len)
        return nl_fail(NL_ERR_INVALID, "KV transfer: a prompt of %lld tokens (must be in [1, %lld))", (long long)n,
                       (long long)sh->seq_len);
    size_t bytes = NL_KVX_REQ_HEADER_BYTES + (size_t)n * 4;
    uint8_t *b = nl_calloc(1, bytes, "KV transfer request");
    if (!b) return NL_ERR_NOMEM;
    memcpy(b, MAGIC_REQ, 4);
    put32(b + 4, NL_KVX_VERSION);
    put_shape(b + 8, sh);
    put32(b + 36, (uint32_t)n);
    putf(b + 40, s->temperature);
    putf(b + 44, s->top_p);
    put32(b + 48, (uint32_t)s->top_k);
    put32(b + 52, id);
    put64(b + 56, s->seed);
    for (int64_t i = 0; i < n; i++) put32(b + NL_KVX_REQ_HEADER_BYTES + 4 * i, (uint32_t)prompt[i]);
    *buf = b;
    *len = bytes;
    return NL_OK;
}

nl_status nl_kvx_request_header(const uint8_t *h, const nl_kvx_shape *x, size_t *body_bytes) {
    *body_bytes = 0;
    NL_TRY(check_common(h, MAGIC_REQ, "request", 8, x));
    uint32_t n = get32(h + 36);
    if (n < 1 || (int64_t)n >= x->seq_len)
        return nl_fail(NL_ERR_FORMAT, "KV transfer request: n_tokens %u outside [1, %lld)", n, (long long)x->seq_len);
    *body_bytes = (size_t)n * 4;
    return NL_OK;
}

nl_status nl_kvx_parse_request(const uint8_t *msg, size_t len, const nl_kvx_shape *x, nl_kvx_request *out) {
    memset(out, 0, sizeof *out);
    if (len < NL_KVX_REQ_HEADER_BYTES)
        return nl_fail(NL_ERR_FORMAT, "KV transfer request: %zu bytes, shorter than its %d-byte header", len,
                       NL_KVX_REQ_HEADER_BYTES);
    size_t body = 0;
    NL_TRY(nl_kvx_request_header(msg, x, &body));
    if (len != NL_KVX_REQ_HEADER_BYTES + body)
        return nl_fail(NL_ERR_FORMAT, "KV transfer request: %zu bytes, its header says %zu", len,
                       (size_t)NL_KVX_REQ_HEADER_BYTES + body);
    nl_sampling_default(&out->s);
    out->s.temperature = getf(msg + 40);
    out->s.top_p = getf(msg + 44);
    out->s.top_k = (int)get32(msg + 48);
    out->s.seed = get64(msg + 56);
    out->id = get32(msg + 52);
    if (out->s.top_k < 0) return nl_fail(NL_ERR_FORMAT, "KV transfer request: top_k %d is negative", out->s.top_k);
    if (nl_sampling_check(&out->s)) return nl_fail(NL_ERR_FORMAT, "KV transfer request: %s", nl_last_error());
    int64_t n = (int64_t)(body / 4);
    const uint8_t *t = msg + NL_KVX_REQ_HEADER_BYTES;
    for (int64_t i = 0; i < n; i++) {
        uint32_t v = get32(t + 4 * i);
        if ((int64_t)v >= x->vocab)
            return nl_fail(NL_ERR_FORMAT,
                           "KV transfer request: token %u at index %lld is outside the vocabulary [0, %lld)", v,
                           (long long)i, (long long)x->vocab);
    }
    out->tokens = nl_malloc((size_t)n * sizeof(int32_t), "KV transfer prompt");
    if (!out->tokens) return NL_ERR_NOMEM;
    for (int64_t i = 0; i < n; i++) out->tokens[i] = (int32_t)get32(t + 4 * i);
    out->n_tokens = n;
    return NL_OK;
}

/* ---- answer ------------------------------------------------------------------------------------ */

static uint8_t *kv_header(const nl_kvx_shape *sh, size_t body, uint8_t **buf, size_t *len) {
    uint8_t *b = nl_calloc(1, NL_KVX_KV_HEADER_BYTES + body, "KV transfer answer");
    if (!b) return NULL;
    memcpy(b, MAGIC_KV, 4);
    put32(b + 4, NL_KVX_VERSION);
    put_shape(b + 12, sh);
    *buf = b;
    *len = NL_KVX_KV_HEADER_BYTES + body;
    return b;
}

nl_status nl_kvx_encode_kv(const nl_kvx_shape *sh, const nl_engine_kv *kv, int64_t block_size, uint32_t id,
                           uint8_t **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    if (block_size < 1) return nl_fail(NL_ERR_INVALID, "KV transfer: block size %lld", (long long)block_size);
    size_t body = (size_t)kv->n_tokens * 4 + kv->data_bytes;
    uint8_t *b = kv_header(sh, body, buf, len);
    if (!b) return NL_ERR_NOMEM;
    put32(b + 40, (uint32_t)block_size);
    put32(b + 44, (uint32_t)((kv->n_tokens + block_size - 1) / block_size));
    put32(b + 48, (uint32_t)kv->n_tokens);
    put32(b + 52, (uint32_t)kv->first_token);
    for (int i = 0; i < 4; i++) put64(b + 56 + 8 * i, kv->rng.s[i]);
    put64(b + 88, (uint64_t)kv->data_bytes);
    put32(b + 100, id);
    uint8_t *p = b + NL_KVX_KV_HEADER_BYTES;
    for (int64_t i = 0; i < kv->n_tokens; i++) put32(p + 4 * i, (uint32_t)kv->tokens[i]);
    memcpy(p + 4 * kv->n_tokens, kv->data, kv->data_bytes);
    return NL_OK;
}

nl_status nl_kvx_encode_error(const nl_kvx_shape *sh, nl_status status, const char *message, uint8_t **buf,
                              size_t *len) {
    *buf = NULL;
    *len = 0;
    size_t n = strlen(message);
    if (n > NL_KVX_MAX_TEXT) n = NL_KVX_MAX_TEXT;
    uint8_t *b = kv_header(sh, n, buf, len);
    if (!b) return NL_ERR_NOMEM;
    put32(b + 8, status ? (uint32_t)status : (uint32_t)NL_ERR_IO);
    put32(b + 96, (uint32_t)n);
    memcpy(b + NL_KVX_KV_HEADER_BYTES, message, n);
    return NL_OK;
}

nl_status nl_kvx_kv_header(const uint8_t *h, const nl_kvx_shape *x, size_t *body_bytes) {
    *body_bytes = 0;
    if (memcmp(h, MAGIC_KV, 4) == 0 && get32(h + 4) == NL_KVX_VERSION && get32(h + 8) != 0) {
        uint32_t tl = get32(h + 96); /* an error answer: only its text follows */
        if (tl > NL_KVX_MAX_TEXT)
            return nl_fail(NL_ERR_FORMAT, "KV transfer answer: error text of %u bytes (at most %d)", tl,
                           NL_KVX_MAX_TEXT);
        *body_bytes = tl;
        return NL_OK;
    }
    NL_TRY(check_common(h, MAGIC_KV, "answer", 12, x));
    uint32_t bs = get32(h + 40), nb = get32(h + 44), n = get32(h + 48), first = get32(h + 52);
    uint64_t kvb = get64(h + 88);
    if (n < 1 || (int64_t)n >= x->seq_len)
        return nl_fail(NL_ERR_FORMAT, "KV transfer answer: n_tokens %u outside [1, %lld)", n, (long long)x->seq_len);
    if (bs < 1 || bs > 4096) return nl_fail(NL_ERR_FORMAT, "KV transfer answer: block_size %u outside [1, 4096]", bs);
    if ((uint64_t)nb != ((uint64_t)n + bs - 1) / bs)
        return nl_fail(NL_ERR_FORMAT, "KV transfer answer: n_blocks %u, but %u tokens in blocks of %u take %u", nb, n,
                       bs, (n + bs - 1) / bs);
    if ((int64_t)first >= x->vocab)
        return nl_fail(NL_ERR_FORMAT, "KV transfer answer: first_token %u is outside the vocabulary [0, %lld)", first,
                       (long long)x->vocab);
    size_t want = nl_kvcache_seq_bytes(x->n_layers, x->kv_heads, x->head_dim, x->dtype, n);
    if (kvb != (uint64_t)want)
        return nl_fail(NL_ERR_FORMAT,
                       "KV transfer answer: kv_bytes %llu, but %u tokens of this model's %s KV are %zu bytes",
                       (unsigned long long)kvb, n, dtype_name((uint32_t)x->dtype), want);
    if (get32(h + 96))
        return nl_fail(NL_ERR_FORMAT, "KV transfer answer: text_len %u must be 0 in a KV answer", get32(h + 96));
    *body_bytes = (size_t)n * 4 + want;
    return NL_OK;
}

nl_status nl_kvx_parse_kv(const uint8_t *msg, size_t len, const nl_kvx_shape *x, nl_engine_kv *out) {
    memset(out, 0, sizeof *out);
    if (len < NL_KVX_KV_HEADER_BYTES)
        return nl_fail(NL_ERR_FORMAT, "KV transfer answer: %zu bytes, shorter than its %d-byte header", len,
                       NL_KVX_KV_HEADER_BYTES);
    size_t body = 0;
    NL_TRY(nl_kvx_kv_header(msg, x, &body));
    if (len != NL_KVX_KV_HEADER_BYTES + body)
        return nl_fail(NL_ERR_FORMAT, "KV transfer answer: %zu bytes, its header says %zu", len,
                       (size_t)NL_KVX_KV_HEADER_BYTES + body);
    const uint8_t *p = msg + NL_KVX_KV_HEADER_BYTES;
    uint32_t status = get32(msg + 8);
    if (status) {
        nl_status st = status <= NL_ERR_BUSY ? (nl_status)status : NL_ERR_IO;
        return nl_fail(st, "prefill server: %.*s", (int)body, (const char *)p);
    }
    int64_t n = get32(msg + 48);
    for (int64_t i = 0; i < n; i++) {
        uint32_t v = get32(p + 4 * i);
        if ((int64_t)v >= x->vocab)
            return nl_fail(NL_ERR_FORMAT,
                           "KV transfer answer: token %u at index %lld is outside the vocabulary [0, %lld)", v,
                           (long long)i, (long long)x->vocab);
    }
    out->n_layers = x->n_layers;
    out->kv_heads = x->kv_heads;
    out->head_dim = x->head_dim;
    out->dtype = x->dtype;
    out->n_tokens = n;
    out->first_token = (int32_t)get32(msg + 52);
    for (int i = 0; i < 4; i++) out->rng.s[i] = get64(msg + 56 + 8 * i);
    out->data_bytes = body - (size_t)n * 4;
    out->tokens = nl_malloc((size_t)n * sizeof(int32_t), "KV transfer prompt");
    out->data = nl_malloc(out->data_bytes ? out->data_bytes : 1, "KV transfer data");
    if (!out->tokens || !out->data) {
        nl_engine_kv_free(out);
        return NL_ERR_NOMEM;
    }
    for (int64_t i = 0; i < n; i++) out->tokens[i] = (int32_t)get32(p + 4 * i);
    memcpy(out->data, p + 4 * n, out->data_bytes);
    return NL_OK;
}

/* ---- sockets ----------------------------------------------------------------------------------- */

/* 0 when n bytes arrived, -1 on error, timeout or a closed connection. */
static int recv_all(int fd, uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t r = recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static void set_timeout(int fd, int seconds) {
    struct timeval tv = {seconds, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* "HOST:PORT" -> an IPv4 address. */
static nl_status parse_addr(const char *addr, struct sockaddr_in *sa) {
    memset(sa, 0, sizeof *sa);
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    char host[64];
    if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host)
        return nl_fail(NL_ERR_INVALID, "prefill address '%s' is not HOST:PORT (e.g. 127.0.0.1:8081)", addr ? addr : "");
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    char *end = NULL;
    long port = strtol(colon + 1, &end, 10);
    if (!colon[1] || *end || port < 1 || port > 65535)
        return nl_fail(NL_ERR_INVALID, "prefill address '%s': port must be in [1, 65535]", addr);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, !strcmp(host, "localhost") ? "127.0.0.1" : host, &sa->sin_addr) != 1)
        return nl_fail(NL_ERR_INVALID, "prefill address '%s': '%s' is not an IPv4 address", addr, host);
    return NL_OK;
}

/* A KV answer must be for the request sent: its request id and its prompt tokens. */
static nl_status check_answer_is_ours(const char *addr, const uint8_t *msg, uint32_t rid, const int32_t *prompt,
                                      int64_t n, nl_engine_kv *kv) {
    nl_status rc = NL_OK;
    if (get32(msg + 100) != rid)
        rc = nl_fail(NL_ERR_FORMAT, "prefill server %s answered request id %u, this request is %u", addr,
                     get32(msg + 100), rid);
    else if (kv->n_tokens != n)
        rc = nl_fail(NL_ERR_FORMAT, "prefill server %s answered for a prompt of %lld tokens, this one has %lld", addr,
                     (long long)kv->n_tokens, (long long)n);
    for (int64_t i = 0; !rc && i < n; i++)
        if (kv->tokens[i] != prompt[i])
            rc = nl_fail(NL_ERR_FORMAT,
                         "prefill server %s answered for another prompt: token %lld is %d, this prompt's is %d", addr,
                         (long long)i, kv->tokens[i], prompt[i]);
    if (rc) nl_engine_kv_free(kv);
    return rc;
}

/* recv_all for the decode side: 0 when n bytes arrived; -1 closed or failed, -2 *cancel became
 * nonzero, -3 `deadline` (nl_time_s) passed. Looks at both every 100 ms. */
static int recv_until(int fd, uint8_t *p, size_t n, const atomic_int *cancel, double deadline) {
    while (n > 0) {
        if (cancel && atomic_load(cancel)) return -2;
        if (nl_time_s() > deadline) return -3;
        struct pollfd pf = {fd, POLLIN, 0};
        int pr = poll(&pf, 1, 100);
        if (pr < 0 && errno != EINTR) return -1;
        if (pr <= 0) continue;
        ssize_t r = recv(fd, p, n, 0);
        if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static nl_status recv_fail(const char *addr, int why, const char *what) {
    if (why == -2) return nl_fail(NL_ERR_IO, "prefill server %s: the transfer was cancelled (shutting down)", addr);
    if (why == -3)
        return nl_fail(NL_ERR_IO, "prefill server %s did not answer within %d s", addr, NL_KVX_ANSWER_TIMEOUT_S);
    return nl_fail(NL_ERR_IO, "prefill server %s %s", addr, what);
}

nl_status nl_kvx_remote_prefill(const char *addr, const nl_kvx_shape *sh, const int32_t *prompt, int64_t n,
                                const nl_sampling *s, nl_engine_kv *out, size_t *bytes_moved) {
    return nl_kvx_remote_prefill_cancel(addr, sh, prompt, n, s, NULL, out, bytes_moved);
}

nl_status nl_kvx_remote_prefill_cancel(const char *addr, const nl_kvx_shape *sh, const int32_t *prompt, int64_t n,
                                       const nl_sampling *s, const atomic_int *cancel, nl_engine_kv *out,
                                       size_t *bytes_moved) {
    memset(out, 0, sizeof *out);
    if (bytes_moved) *bytes_moved = 0;
    struct sockaddr_in sa;
    NL_TRY(parse_addr(addr, &sa));
    uint8_t *req = NULL, *msg = NULL;
    size_t req_len = 0, body = 0;
    static atomic_uint next_id = 1;
    uint32_t rid = atomic_fetch_add(&next_id, 1) ^ ((uint32_t)getpid() << 16);
    /* the id is echoed in the answer: an answer to another request is refused */
    NL_TRY(nl_kvx_encode_request(sh, prompt, n, s, rid, &req, &req_len));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    nl_status rc = NL_OK;
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        rc = nl_fail(NL_ERR_IO, "cannot connect to the prefill server %s: %s", addr, strerror(errno));
        goto done;
    }
    set_timeout(fd, NL_KVX_ANSWER_TIMEOUT_S);
    double deadline = nl_time_s() + NL_KVX_ANSWER_TIMEOUT_S;
    if (nl_send_all(fd, req, req_len)) {
        rc = nl_fail(NL_ERR_IO, "prefill server %s: sending the request failed: %s", addr, strerror(errno));
        goto done;
    }
    uint8_t hdr[NL_KVX_KV_HEADER_BYTES];
    int why = recv_until(fd, hdr, sizeof hdr, cancel, deadline);
    if (why) {
        rc = recv_fail(addr, why, "closed the connection before its answer");
        goto done;
    }
    if ((rc = nl_kvx_kv_header(hdr, sh, &body))) goto done;
    msg = nl_malloc(sizeof hdr + body, "KV transfer answer");
    if (!msg) {
        rc = NL_ERR_NOMEM;
        goto done;
    }
    memcpy(msg, hdr, sizeof hdr);
    if ((why = recv_until(fd, msg + sizeof hdr, body, cancel, deadline))) {
        rc = recv_fail(addr, why, "cut its answer off");
        goto done;
    }
    rc = nl_kvx_parse_kv(msg, sizeof hdr + body, sh, out);
    if (!rc) rc = check_answer_is_ours(addr, msg, rid, prompt, n, out);
    if (!rc && bytes_moved) *bytes_moved = sizeof hdr + body;
done:
    if (fd >= 0) close(fd);
    nl_free(req);
    nl_free(msg);
    return rc;
}

/* ---- the prefill server ------------------------------------------------------------------------ */

struct nl_kvx_server {
    nl_engine *e;
    nl_kvx_shape sh;
    int64_t block_size;
    int lfd, port;
    pthread_t acceptor;
    nl_driver *driver;
    atomic_int stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int conns;                     /* connection threads alive */
    int conn_fd[NL_KVX_MAX_CONNS]; /* their sockets (-1: free slot), shut down by stop */
    nl_kvx_stats st;
};

typedef struct conn {
    nl_kvx_server *s;
    int fd, slot;
} conn;

static void send_error(conn *c, nl_status st, const char *msg) {
    uint8_t *b = NULL;
    size_t n = 0;
    if (!nl_kvx_encode_error(&c->s->sh, st, msg, &b, &n)) nl_send_all(c->fd, b, n);
    nl_free(b);
}

/* Runs one request through the engine; returns the finished prefill's id (0 on error: sent). */
static uint64_t run_prefill(conn *c, const nl_kvx_request *rq) {
    nl_kvx_server *s = c->s;
    uint64_t id = 0;
    if (nl_engine_submit_prefill(s->e, rq->tokens, rq->n_tokens, &rq->s, &id)) {
        send_error(c, NL_ERR_BUSY, nl_last_error());
        return 0;
    }
    for (;;) {
        int w = nl_engine_wait(s->e, id, 100);
        if (w < 0) return 0;
        nl_engine_output o;
        if (nl_engine_read(s->e, id, 1, &o)) break;
        nl_finish f = o.finish;
        nl_engine_output_free(&o);
        if (f != NL_FINISH_NONE) return id;
        if (atomic_load(&s->stop)) break;
    }
    nl_engine_cancel(s->e, id);
    nl_engine_release(s->e, id);
    send_error(c, NL_ERR_IO, "the prefill server is shutting down");
    return 0;
}

static void serve_conn(conn *c) {
    nl_kvx_server *s = c->s;
    uint8_t hdr[NL_KVX_REQ_HEADER_BYTES];
    size_t body = 0;
    if (recv_all(c->fd, hdr, sizeof hdr)) return; /* nothing within the request timeout: closed */
    if (nl_kvx_request_header(hdr, &s->sh, &body)) {
        send_error(c, NL_ERR_FORMAT, nl_last_error());
        return;
    }
    uint8_t *msg = nl_malloc(sizeof hdr + body, "KV transfer request");
    if (!msg) return;
    memcpy(msg, hdr, sizeof hdr);
    nl_kvx_request rq;
    memset(&rq, 0, sizeof rq);
    int ok = !recv_all(c->fd, msg + sizeof hdr, body);
    if (ok && nl_kvx_parse_request(msg, sizeof hdr + body, &s->sh, &rq)) {
        send_error(c, NL_ERR_FORMAT, nl_last_error());
        ok = 0;
    }
    nl_free(msg);
    if (ok) set_timeout(c->fd, NL_KVX_ANSWER_TIMEOUT_S); /* the answer may be large: more time to send */
    uint64_t id = ok ? run_prefill(c, &rq) : 0;
    uint32_t rid = rq.id;
    nl_free(rq.tokens);
    if (!id) return;
    nl_engine_kv kv;
    uint8_t *ans = NULL;
    size_t n = 0;
    nl_status rc = nl_engine_export_kv(s->e, id, &kv);
    nl_engine_release(s->e, id); /* its blocks go back now: the copy is in kv */
    if (!rc) rc = nl_kvx_encode_kv(&s->sh, &kv, s->block_size, rid, &ans, &n); /* the request's id, echoed */
    if (rc)
        send_error(c, rc, nl_last_error());
    else
        rc = nl_send_all(c->fd, ans, n) ? NL_ERR_IO : NL_OK;
    pthread_mutex_lock(&s->mu);
    if (rc)
        s->st.requests_failed++;
    else
        s->st.requests_ok++, s->st.kv_bytes_sent += (int64_t)kv.data_bytes;
    pthread_mutex_unlock(&s->mu);
    nl_engine_kv_free(&kv);
    nl_free(ans);
}

static void *conn_main(void *arg) {
    conn *c = arg;
    nl_kvx_server *s = c->s;
    serve_conn(c);
    pthread_mutex_lock(&s->mu);
    s->conn_fd[c->slot] = -1; /* before close: stop must not shut down a reused descriptor */
    pthread_mutex_unlock(&s->mu);
    close(c->fd);
    free(c);
    pthread_mutex_lock(&s->mu);
    s->conns--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void *accept_main(void *arg) {
    nl_kvx_server *s = arg;
    while (!atomic_load(&s->stop)) {
        int fd = accept(s->lfd, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (atomic_load(&s->stop)) break;
            usleep(10000);
            continue;
        }
        set_timeout(fd, NL_KVX_REQUEST_TIMEOUT_S); /* an idle connection is closed after this */
        int slot = -1;
        pthread_mutex_lock(&s->mu);
        for (int i = 0; i < NL_KVX_MAX_CONNS && slot < 0; i++)
            if (s->conn_fd[i] < 0) slot = i;
        if (slot >= 0) {
            s->conn_fd[slot] = fd;
            s->conns++;
        }
        pthread_mutex_unlock(&s->mu);
        if (slot < 0) { /* bounded: one thread per connection, at most NL_KVX_MAX_CONNS */
            conn busy = {s, fd, -1};
            char msg[96];
            snprintf(msg, sizeof msg, "the prefill server has %d connections open, its limit", NL_KVX_MAX_CONNS);
            set_timeout(fd, 1);
            send_error(&busy, NL_ERR_BUSY, msg);
            close(fd);
            continue;
        }
        conn *c = calloc(1, sizeof *c);
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (c) {
            c->s = s;
            c->fd = fd;
            c->slot = slot;
        }
        if (!c || pthread_create(&t, &at, conn_main, c)) {
            pthread_mutex_lock(&s->mu);
            s->conn_fd[slot] = -1;
            s->conns--;
            pthread_mutex_unlock(&s->mu);
            close(fd);
            free(c);
        }
        pthread_attr_destroy(&at);
    }
    return NULL;
}

nl_status nl_kvx_server_start(nl_kvx_server **out, nl_engine *e, const char *host, int port) {
    *out = NULL;
    char addr[96];
    snprintf(addr, sizeof addr, "%s:%d", host ? host : "127.0.0.1", port ? port : 1);
    struct sockaddr_in sa;
    NL_TRY(parse_addr(addr, &sa));
    sa.sin_port = htons((uint16_t)port);
    nl_kvx_server *s = calloc(1, sizeof *s);
    if (!s) return nl_fail(NL_ERR_NOMEM, "prefill server: out of memory");
    s->e = e;
    nl_kvx_shape_of(e, &s->sh);
    nl_engine_stats st;
    nl_engine_stats_get(e, &st);
    s->block_size = st.block_size;
    atomic_init(&s->stop, 0);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    for (int i = 0; i < NL_KVX_MAX_CONNS; i++) s->conn_fd[i] = -1;
    s->lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    if (s->lfd >= 0) setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&sa, sizeof sa) || listen(s->lfd, 128)) {
        int err = errno;
        if (s->lfd >= 0) close(s->lfd);
        free(s);
        return nl_fail(NL_ERR_IO, "prefill server: cannot listen on %s:%d: %s", host ? host : "127.0.0.1", port,
                       strerror(err));
    }
    socklen_t sl = sizeof sa;
    getsockname(s->lfd, (struct sockaddr *)&sa, &sl);
    s->port = ntohs(sa.sin_port);
    nl_drive_opts dopt = {.name = "prefill server"};
    if (nl_driver_start(&s->driver, e, &dopt)) {
        close(s->lfd);
        free(s);
        return nl_fail(NL_ERR_NOMEM, "prefill server: cannot start the engine thread");
    }
    if (pthread_create(&s->acceptor, NULL, accept_main, s)) {
        atomic_store(&s->stop, 1);
        nl_driver_stop(s->driver);
        close(s->lfd);
        free(s);
        return nl_fail(NL_ERR_NOMEM, "prefill server: cannot start the accept thread");
    }
    *out = s;
    return NL_OK;
}

int nl_kvx_server_port(const nl_kvx_server *s) { return s->port; }

void nl_kvx_server_stats(nl_kvx_server *s, nl_kvx_stats *st) {
    pthread_mutex_lock(&s->mu);
    *st = s->st;
    pthread_mutex_unlock(&s->mu);
}

void nl_kvx_server_stop(nl_kvx_server *s) {
    if (!s) return;
    atomic_store(&s->stop, 1);
    shutdown(s->lfd, SHUT_RDWR); /* wakes accept */
    pthread_join(s->acceptor, NULL);
    close(s->lfd);
    /* connection threads see stop within 100 ms of their wait; one blocked on a client's I/O is
     * woken by shutting its socket down, so stopping never waits for a client */
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < NL_KVX_MAX_CONNS; i++)
        if (s->conn_fd[i] >= 0) shutdown(s->conn_fd[i], SHUT_RDWR);
    while (s->conns > 0) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    nl_driver_stop(s->driver);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
