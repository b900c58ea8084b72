/* libFuzzer target: the HTTP server end to end (libmicrohttpd, the handlers, the engine) over a
 * socket pair: the input is written as the client's bytes, the client then half-closes and reads
 * whatever comes back, for at most 2 s. The server (a tiny random model, byte tokenizer, context
 * 64) is started once. Invariants: every answer starts with an HTTP/1.x status line; the server
 * keeps answering (a GET /health on a fresh pair after each input gets 200). */
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nanolm/engine.h"
#include "nanolm/model.h"
#include "nanolm/server.h"

#include "fuzz_targets.h"

static nl_server *server(void) {
    static nl_server *s;
    static nl_model m;
    static nl_engine *e;
    if (s) return s;
    nl_arch a = {.name = "fuzz",
                 .vocab_size = 256,
                 .dim = 16,
                 .n_layers = 1,
                 .n_heads = 2,
                 .n_kv_heads = 1,
                 .hidden_dim = 32,
                 .seq_len = 64,
                 .rope_theta = 10000,
                 .norm_eps = 1e-5};
    nl_engine_opts o;
    nl_engine_opts_default(&o);
    o.threads = 1;
    o.max_batch = 4;
    o.max_waiting = 4;
    nl_server_opts so;
    nl_server_opts_default(&so);
    so.port = 0;
    so.max_body_bytes = 1 << 16;
    so.drain_timeout_s = 1;
    if (nl_model_init(&m, &a) || (nl_model_init_random(&m, 1), nl_engine_open_model(&e, &m, NULL, &o)) ||
        nl_server_start(&s, e, &so))
        abort();
    return s;
}

/* Sends n bytes over a fresh pair, half-closes, reads the answer into out (up to cap). */
static size_t exchange(const void *req, size_t n, char *out, size_t cap) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) abort();
    if (nl_server_add_connection(server(), sv[1])) {
        close(sv[0]);
        close(sv[1]);
        return 0;
    }
    size_t done = 0;
    while (done < n) {
        ssize_t w = send(sv[0], (const char *)req + done, n - done, MSG_NOSIGNAL);
        if (w <= 0) break;
        done += (size_t)w;
    }
    shutdown(sv[0], SHUT_WR);
    size_t got = 0;
    for (int waited = 0; got < cap && waited < 2000;) {
        struct pollfd p = {sv[0], POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) {
            waited += 100;
            continue;
        }
        ssize_t r = recv(sv[0], out + got, cap - got, 0);
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(sv[0]);
    return got;
}

int nl_fuzz_http_server(const uint8_t *data, size_t size) {
    static char out[1 << 16];
    size_t got = exchange(data, size, out, sizeof out);
    if (got > 0 && (got < 9 || memcmp(out, "HTTP/1.", 7))) abort();
    static const char health[] = "GET /health HTTP/1.1\r\nHost: f\r\n\r\n";
    got = exchange(health, sizeof health - 1, out, sizeof out);
    if (got < 12 || memcmp(out + 9, "200", 3)) abort();
    return 0;
}

#ifndef NL_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return nl_fuzz_http_server(data, size); }
#endif
