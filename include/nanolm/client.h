/*
 * A small HTTP/1.1 client on plain sockets, for the tests and the load generator: one request per
 * connection ("Connection: close"), Content-Length or chunked responses, and server-sent events
 * delivered one by one with the time they arrived, so that time to first token and inter-token
 * latency are measured where the client sees them.
 */
#ifndef NANOLM_CLIENT_H
#define NANOLM_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/http_request.h"

typedef struct nl_http_url {
    char host[256];
    int port;
    char path[1024]; /* "" when the URL has none */
} nl_http_url;

/* Parses "http://host[:port][/path]" (the scheme may be omitted; port defaults to 80).
 * NL_ERR_INVALID naming the URL when it is not of that form (https is refused). */
nl_status nl_http_parse_url(const char *url, nl_http_url *u);

/* Called with the payload of each SSE event's data lines (joined by '\n', without "data: ") and
 * the monotonic time it was complete (nl_time_s). Return nonzero to close the connection at once
 * (a client that goes away mid-stream). */
typedef int (*nl_http_event_fn)(void *ctx, const char *data, size_t n, double t_s);

typedef struct nl_http_response {
    int status; /* HTTP status code */
    char content_type[128];
    nl_http_buf body;   /* the decoded body (all events included for a stream) */
    int closed_early;   /* the event callback asked to close */
    double t_sent_s;    /* when the request was written */
    double t_headers_s; /* when the response headers were read */
} nl_http_response;

/* Sends `method path` with an optional body to host:port and reads the whole response. A body
 * served as text/event-stream is also cut into events for on_event (may be NULL). timeout_s bounds
 * each read and write (0: 60 s). Returns NL_OK when a response was read (whatever its status);
 * NL_ERR_IO naming host:port when the connection or the exchange failed; NL_ERR_FORMAT when the
 * response is not HTTP/1.x. Free *resp with nl_http_response_free in every case. */
nl_status nl_http_request(const char *host, int port, const char *method, const char *path, const char *body,
                          size_t body_bytes, double timeout_s, nl_http_event_fn on_event, void *ctx,
                          nl_http_response *resp);
void nl_http_response_free(nl_http_response *resp);

#endif
