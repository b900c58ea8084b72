/* HTTP/1.1 client on plain sockets with an SSE event splitter. See include/nanolm/client.h. */
#include "nanolm/client.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

nl_status nl_http_parse_url(const char *url, nl_http_url *u) {
    memset(u, 0, sizeof *u);
    if (!url || !*url) return nl_fail(NL_ERR_INVALID, "URL is empty");
    const char *p = url;
    if (!strncmp(p, "https://", 8))
        return nl_fail(NL_ERR_INVALID, "URL '%s': https is not supported (use http://)", url);
    if (!strncmp(p, "http://", 7))
        p += 7;
    else if (strstr(p, "://"))
        return nl_fail(NL_ERR_INVALID, "URL '%s': only http:// is supported", url);
    const char *host = p, *hend;
    if (*p == '[') { /* [v6]:port */
        hend = strchr(p, ']');
        if (!hend) return nl_fail(NL_ERR_INVALID, "URL '%s': unterminated '[' in the host", url);
        host = p + 1;
        p = hend + 1;
    } else {
        while (*p && *p != ':' && *p != '/') p++;
        hend = p;
    }
    size_t hl = (size_t)(hend - host);
    if (hl == 0 || hl >= sizeof u->host) return nl_fail(NL_ERR_INVALID, "URL '%s': bad host", url);
    memcpy(u->host, host, hl);
    u->port = 80;
    if (*p == ':') {
        char *end;
        long port = strtol(p + 1, &end, 10);
        if (end == p + 1 || port < 1 || port > 65535 || (*end && *end != '/'))
            return nl_fail(NL_ERR_INVALID, "URL '%s': bad port", url);
        u->port = (int)port;
        p = end;
    }
    if (*p && *p != '/') return nl_fail(NL_ERR_INVALID, "URL '%s': expected '/' after the host", url);
    if (strlen(p) >= sizeof u->path) return nl_fail(NL_ERR_INVALID, "URL '%s': path too long", url);
    strcpy(u->path, p);
    return NL_OK;
}

static int connect_to(const char *host, int port, double timeout_s) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, ps, &hints, &res) || !res) return -1;
    int fd = -1;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        struct timeval tv = {(time_t)timeout_s, (suseconds_t)((timeout_s - (double)(time_t)timeout_s) * 1e6)};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

/* Response decoding state: header bytes, then body (identity or chunked), then SSE events. */
typedef struct rx {
    nl_http_response *resp;
    nl_http_buf raw; /* undecoded bytes not yet consumed */
    int in_body, chunked, sse, done;
    int64_t content_length; /* -1: until close */
    int64_t chunk_left;     /* chunked: bytes left in the current chunk; -1 expecting a size line */
    size_t sse_from;        /* body offset where the next SSE line starts */
    nl_http_buf event;      /* data of the event being assembled */
    int has_event;
    nl_http_event_fn on_event;
    void *ctx;
} rx;

/* Splits new body bytes into SSE lines; dispatches complete events. Returns nonzero to stop. */
static int sse_feed(rx *r) {
    nl_http_buf *b = &r->resp->body;
    while (r->sse_from < b->len) {
        char *line = b->data + r->sse_from;
        char *nl = memchr(line, '\n', b->len - r->sse_from);
        if (!nl) return 0;
        size_t ll = (size_t)(nl - line);
        r->sse_from += ll + 1;
        if (ll && line[ll - 1] == '\r') ll--;
        if (ll == 0) { /* blank line: dispatch */
            if (r->has_event && r->on_event) {
                int stop = r->on_event(r->ctx, r->event.data ? r->event.data : "", r->event.len, nl_time_s());
                if (stop) return 1;
            }
            r->event.len = 0;
            if (r->event.data) r->event.data[0] = 0;
            r->has_event = 0;
            continue;
        }
        if (ll >= 5 && !memcmp(line, "data:", 5)) {
            size_t off = 5;
            if (off < ll && line[off] == ' ') off++;
            if (r->has_event && nl_http_buf_append(&r->event, "\n", 1)) return 1;
            if (nl_http_buf_append(&r->event, line + off, ll - off)) return 1;
            if (!r->event.data && nl_http_buf_append(&r->event, "", 0)) return 1;
            r->has_event = 1;
        }
    }
    return 0;
}

static int body_bytes(rx *r, const char *p, size_t n) {
    if (nl_http_buf_append(&r->resp->body, p, n)) return -1;
    if (r->sse && sse_feed(r)) {
        r->resp->closed_early = 1;
        return 1;
    }
    return 0;
}

/* Consumes what it can from r->raw. Returns -1 on a malformed response, 1 to stop, else 0. */
static int rx_process(rx *r) {
    size_t used = 0;
    char *d = r->raw.data;
    if (!r->in_body) {
        char *end = r->raw.len ? memmem(d, r->raw.len, "\r\n\r\n", 4) : NULL;
        if (!end) return r->raw.len > 65536 ? -1 : 0;
        r->resp->t_headers_s = nl_time_s();
        *end = 0;
        int major, minor, status;
        if (sscanf(d, "HTTP/%d.%d %d", &major, &minor, &status) != 3) return -1;
        r->resp->status = status;
        r->content_length = -1;
        for (char *line = strstr(d, "\r\n"); line; line = strstr(line, "\r\n")) {
            line += 2;
            if (!strncasecmp(line, "content-length:", 15))
                r->content_length = strtoll(line + 15, NULL, 10);
            else if (!strncasecmp(line, "transfer-encoding:", 18) && strstr(line, "chunked"))
                r->chunked = 1;
            else if (!strncasecmp(line, "content-type:", 13)) {
                const char *v = line + 13;
                while (*v == ' ') v++;
                size_t vl = strcspn(v, "\r");
                if (vl >= sizeof r->resp->content_type) vl = sizeof r->resp->content_type - 1;
                memcpy(r->resp->content_type, v, vl);
                r->resp->content_type[vl] = 0;
                if (!strncasecmp(v, "text/event-stream", 17)) r->sse = 1;
            }
        }
        r->in_body = 1;
        r->chunk_left = -1;
        used = (size_t)(end + 4 - d);
        if (status == 204 || status == 304 || (status >= 100 && status < 200)) r->done = 1;
        if (!r->chunked && r->content_length == 0) r->done = 1;
    }
    while (!r->done && used < r->raw.len) {
        size_t avail = r->raw.len - used;
        if (!r->chunked) {
            size_t take = avail;
            if (r->content_length >= 0) {
                int64_t left = r->content_length - (int64_t)r->resp->body.len;
                if ((int64_t)take > left) take = (size_t)left;
            }
            int rc = body_bytes(r, d + used, take);
            used += take;
            if (rc) return rc;
            if (r->content_length >= 0 && (int64_t)r->resp->body.len >= r->content_length) r->done = 1;
            break;
        }
        if (r->chunk_left < 0) {
            char *eol = memmem(d + used, avail, "\r\n", 2);
            if (!eol) break;
            char *endp;
            long long sz = strtoll(d + used, &endp, 16);
            if (endp == d + used || sz < 0) return -1;
            used = (size_t)(eol + 2 - d);
            if (sz == 0) {
                r->done = 1;
                break;
            }
            r->chunk_left = sz;
            continue;
        }
        if (r->chunk_left > 0) {
            size_t take = avail < (size_t)r->chunk_left ? avail : (size_t)r->chunk_left;
            int rc = body_bytes(r, d + used, take);
            used += take;
            r->chunk_left -= (int64_t)take;
            if (rc) return rc;
            continue;
        }
        if (avail < 2) break; /* the CRLF after a chunk */
        used += 2;
        r->chunk_left = -1;
    }
    memmove(r->raw.data, r->raw.data + used, r->raw.len - used);
    r->raw.len -= used;
    return 0;
}

nl_status nl_http_request(const char *host, int port, const char *method, const char *path, const char *body,
                          size_t body_bytes_n, double timeout_s, nl_http_event_fn on_event, void *ctx,
                          nl_http_response *resp) {
    memset(resp, 0, sizeof *resp);
    if (timeout_s <= 0) timeout_s = 60;
    int fd = connect_to(host, port, timeout_s);
    if (fd < 0) return nl_fail(NL_ERR_IO, "cannot connect to %s:%d: %s", host, port, strerror(errno));
    nl_http_buf req = {0};
    nl_status rc = nl_http_buf_printf(&req,
                                      "%s %s HTTP/1.1\r\nHost: %s:%d\r\nUser-Agent: nanolm\r\nAccept: */*\r\n"
                                      "Connection: close\r\n",
                                      method, path && *path ? path : "/", host, port);
    if (!rc && body)
        rc = nl_http_buf_printf(&req, "Content-Type: application/json\r\nContent-Length: %zu\r\n", body_bytes_n);
    if (!rc) rc = nl_http_buf_append(&req, "\r\n", 2);
    if (!rc && body) rc = nl_http_buf_append(&req, body, body_bytes_n);
    if (rc) {
        close(fd);
        nl_http_buf_free(&req);
        return rc;
    }
    resp->t_sent_s = nl_time_s();
    if (nl_send_all(fd, req.data, req.len)) {
        int e = errno;
        nl_http_buf_free(&req);
        /* The server may answer (413) and close before reading all of a large body: read on. */
        if (e != EPIPE && e != ECONNRESET) {
            close(fd);
            return nl_fail(NL_ERR_IO, "sending %s %s to %s:%d failed: %s", method, path, host, port, strerror(e));
        }
    } else {
        nl_http_buf_free(&req);
    }
    rx r = {0};
    r.resp = resp;
    r.on_event = on_event;
    r.ctx = ctx;
    char chunk[16384];
    rc = NL_OK;
    for (;;) {
        ssize_t n = recv(fd, chunk, sizeof chunk, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            rc = nl_fail(NL_ERR_IO, "reading the response of %s %s from %s:%d failed: %s", method, path, host, port,
                         strerror(errno));
            break;
        }
        if (n == 0) {
            if (!r.in_body)
                rc = nl_fail(NL_ERR_IO, "%s:%d closed the connection before a response to %s %s", host, port, method,
                             path);
            else if (!r.done && (r.chunked || r.content_length >= 0))
                rc = nl_fail(NL_ERR_IO, "%s:%d closed the connection in the middle of the response to %s %s", host,
                             port, method, path);
            else if (r.sse)
                sse_feed(&r);
            break;
        }
        if (nl_http_buf_append(&r.raw, chunk, (size_t)n)) {
            rc = NL_ERR_NOMEM;
            break;
        }
        int pr = rx_process(&r);
        if (pr < 0) {
            rc = nl_fail(NL_ERR_FORMAT, "the response from %s:%d to %s %s is not HTTP/1.x", host, port, method, path);
            break;
        }
        if (pr > 0 || r.done) break;
    }
    close(fd);
    nl_http_buf_free(&r.raw);
    nl_http_buf_free(&r.event);
    return rc;
}

void nl_http_response_free(nl_http_response *resp) {
    nl_http_buf_free(&resp->body);
    memset(resp, 0, sizeof *resp);
}
