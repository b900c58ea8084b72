/*
 * `nanolm serve`: an OpenAI-compatible HTTP server in front of the serving engine (engine.h),
 * on libmicrohttpd with one thread per connection.
 *
 *   POST /v1/completions   completion, or server-sent events with "stream": true
 *   POST /v1/chat/completions  the same for a conversation, through the model's chat template
 *   GET  /v1/models        the one model served
 *   GET  /health           200 {"status":"ok"} (503 "draining" while shutting down)
 *   GET  /metrics          Prometheus text (server_metrics.h)
 *
 * Threads: the driver (driver.h) steps the engine on a thread of its own; HTTP threads only submit, cancel,
 * wait on and read requests (engine.h's thread-safety contract). A connection that closes before
 * its completion is done cancels the request, which frees its sequence and KV blocks.
 * Bad input gets an OpenAI-style error (http_request.h): 400 for a bad body or a prompt longer
 * than the context, 404/405 for an unknown path or method, 413 for a body over max_body_bytes,
 * 429 when the engine's waiting queue is full, 503 while shutting down.
 * With prefill_addr (the decode role of prefill/decode disaggregation) each prompt is sent to a
 * prefill server and its KV imported into this engine; /metrics then also counts the transfers.
 */
#ifndef NANOLM_SERVER_H
#define NANOLM_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/base.h"
#include "nanolm/chat_template.h"
#include "nanolm/engine.h"

#define NL_SERVER_RESERVED_CONNS 16

typedef struct nl_server_opts {
    const char *host;         /* IPv4 address to listen on (default "127.0.0.1"; "localhost" accepted) */
    int port;                 /* 0: an ephemeral port (read it with nl_server_port) */
    const char *model_name;   /* reported by /v1/models and in responses (default "nanolm") */
    size_t max_body_bytes;    /* larger bodies get 413 (default 1 MiB) */
    int max_connections;      /* connections that may send completions (default 512); NL_SERVER_RESERVED_CONNS
                                more are accepted for GET /health, /metrics and /v1/models only */
    int idle_timeout_s;       /* a connection with no activity for this long is closed, and a request
                                body must arrive within it (default 30) */
    int header_timeout_s;     /* a request's headers must arrive whole within this long of the
                                connection opening or of its previous response (keep-alive), or the
                                connection is closed, however steadily they trickle (default 10) */
    double drain_timeout_s;   /* at shutdown, how long running requests may finish before they are
                                cancelled (default 30) */
    const nl_chat_template *chat_template; /* POST /v1/chat/completions renders messages with it; NULL:
                                              that endpoint answers 400 (the model has no template) */
    const char *prefill_addr; /* decode role: "HOST:PORT" of a prefill server (kv_transfer.h) that
                                computes each prompt's KV, imported here (502 when it fails);
                                NULL: colocated (prefill and decode in this engine) */
} nl_server_opts;

typedef struct nl_server nl_server;

void nl_server_opts_default(nl_server_opts *o);
/* The name a checkpoint is served under unless one is given: its file name without the folder
 * and the extension ("stories260K" for models/stories260K.bin), in buf[n]; returns buf. */
const char *nl_server_model_name(const char *ckpt, char *buf, size_t n);

/* Starts the driver thread and the HTTP daemon on an engine the caller opened (and closes after
 * nl_server_stop). NL_ERR_INVALID for a bad host, NL_ERR_IO naming host:port when it cannot
 * listen, NL_ERR_NOMEM. */
nl_status nl_server_start(nl_server **s, nl_engine *e, const nl_server_opts *o);
/* The port the server listens on. */
int nl_server_port(const nl_server *s);
/* Serves a connected stream socket fd (a socket pair's end, for tests and fuzzing) as if it had
 * been accepted; the server owns and closes it. NL_ERR_IO when it cannot take it. */
nl_status nl_server_add_connection(nl_server *s, int fd);
/* Graceful stop: refuses new connections and requests, lets running requests finish for up to
 * drain_timeout_s, cancels what is left (streams get an error event and [DONE]), stops the HTTP
 * threads and the driver, and frees the server (not the engine). Safe on NULL. */
void nl_server_stop(nl_server *s);

#endif
