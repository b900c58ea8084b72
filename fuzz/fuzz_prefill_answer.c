/* libFuzzer target: the decode side of disaggregation (nl_kvx_remote_prefill) against a fake
 * prefill server that answers with the fuzz input. First byte: bit 0 writes the request's id into
 * the answer (offset 100), bit 1 the request's prompt tokens after the header, so that inputs
 * reach the checks past the header; the rest is the answer as sent. Invariants: an accepted answer
 * is for this prompt (same tokens) with exactly the K/V bytes of its shape; a refused one has a
 * message; nothing leaks or hangs (the server closes after its answer). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nanolm/kv_transfer.h"
#include "nanolm/kvcache.h"

#include "fuzz_targets.h"

typedef struct fake {
    int lfd;
    const uint8_t *ans;
    size_t n;
    int flags;
} fake;

static int read_all(int fd, uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t r = recv(fd, p, n, 0);
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static void *serve_one(void *arg) {
    fake *f = arg;
    int fd = accept(f->lfd, NULL, NULL);
    if (fd < 0) return NULL;
    uint8_t req[NL_KVX_REQ_HEADER_BYTES + 4 * 64];
    uint32_t n_tok = 0;
    if (!read_all(fd, req, NL_KVX_REQ_HEADER_BYTES)) {
        memcpy(&n_tok, req + 36, 4);
        if (n_tok > 64 || read_all(fd, req + NL_KVX_REQ_HEADER_BYTES, 4 * (size_t)n_tok)) n_tok = 0;
    }
    uint8_t *a = malloc(f->n ? f->n : 1);
    memcpy(a, f->ans, f->n);
    if ((f->flags & 1) && f->n >= 104) memcpy(a + 100, req + 52, 4);
    if ((f->flags & 2) && f->n >= NL_KVX_KV_HEADER_BYTES + 4 * (size_t)n_tok)
        memcpy(a + NL_KVX_KV_HEADER_BYTES, req + NL_KVX_REQ_HEADER_BYTES, 4 * (size_t)n_tok);
    send(fd, a, f->n, MSG_NOSIGNAL);
    free(a);
    close(fd);
    return NULL;
}

int nl_fuzz_prefill_answer(const uint8_t *data, size_t size) {
    static int lfd = -1;
    static char addr[32];
    if (lfd < 0) {
        lfd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t sl = sizeof sa;
        if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) || listen(lfd, 4) ||
            getsockname(lfd, (struct sockaddr *)&sa, &sl))
            abort();
        snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(sa.sin_port));
    }
    if (size < 1) return 0;
    fake f = {lfd, data + 1, size - 1, data[0]};
    const nl_kvx_shape sh = {3, 4, 2, 16, 256, 128, NL_KV_FP32};
    int32_t prompt[10];
    for (int i = 0; i < 10; i++) prompt[i] = (int32_t)((37 + 11 * i) % 256);
    nl_sampling s;
    nl_sampling_default(&s);
    pthread_t th;
    if (pthread_create(&th, NULL, serve_one, &f)) return 0;
    nl_engine_kv kv;
    size_t moved = 0;
    nl_status rc = nl_kvx_remote_prefill(addr, &sh, prompt, 10, &s, &kv, &moved);
    pthread_join(th, NULL);
    if (rc == NL_OK) {
        if (kv.n_tokens != 10 || memcmp(kv.tokens, prompt, sizeof prompt) ||
            kv.data_bytes != nl_kvcache_seq_bytes(3, 2, 16, NL_KV_FP32, 10) || moved != size - 1)
            abort();
        nl_engine_kv_free(&kv);
    } else if (nl_last_error()[0] == '\0' || kv.data || kv.tokens) {
        abort();
    }
    return 0;
}

#ifndef NL_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return nl_fuzz_prefill_answer(data, size); }
#endif
