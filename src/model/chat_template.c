/* Chat templates: a Jinja subset (see nanolm/chat_template.h). Parsing builds a tree in an arena
 * owned by the template; rendering evaluates it with values in a second arena freed at the end.
 * Errors unwind with longjmp to the entry point (everything lives in the arenas). */
#include "nanolm/chat_template.h"
#include "nanolm/gguf.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- arena ---------------------------------------------------------------------------------- */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[];
} chunk;

typedef struct arena {
    chunk *head;
} arena;

static void *arena_try(arena *a, size_t n) {
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        chunk *c = malloc(sizeof(chunk) + cap);
        if (!c) return NULL;
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

static void arena_free(arena *a) {
    for (chunk *c = a->head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    a->head = NULL;
}

/* ---- errors --------------------------------------------------------------------------------- */

typedef struct outbuf {
    char *p;
    unsigned char *t; /* track: per byte, 1 where it came from the variables (data), not the template */
    int track;
    size_t n, cap;
    struct outbuf *next; /* temporaries, freed on error */
} outbuf;

typedef struct errctx {
    jmp_buf jb;
    outbuf *temps; /* temporary output buffers (malloc'd bytes) to free when unwinding */
    nl_status code;
    char msg[512];
    const char *src, *what;
    arena *ar;
    size_t used, limit; /* arena bytes taken, and the most a render may take (0: no limit) */
} errctx;

static void loc(const errctx *e, size_t pos, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < pos && e->src[i]; i++) {
        if (e->src[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

static void fail_at(errctx *e, nl_status code, size_t pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5), noreturn));
static void fail_at(errctx *e, nl_status code, size_t pos, const char *fmt, ...) {
    int line, col;
    loc(e, pos, &line, &col);
    char m[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    snprintf(e->msg, sizeof e->msg, "chat template %s line %d col %d: %s", e->what, line, col, m);
    e->code = code;
    longjmp(e->jb, 1);
}

static void *alloc(errctx *e, size_t n) {
    e->used += n;
    if (e->limit && e->used > e->limit) {
        snprintf(e->msg, sizeof e->msg, "chat template %s: rendering took more than %zu MiB", e->what, e->limit >> 20);
        e->code = NL_ERR_INVALID;
        longjmp(e->jb, 1);
    }
    void *p = arena_try(e->ar, n ? n : 1);
    if (!p) {
        snprintf(e->msg, sizeof e->msg, "chat template %s: out of memory", e->what);
        e->code = NL_ERR_NOMEM;
        longjmp(e->jb, 1);
    }
    return p;
}

static char *dupn(errctx *e, const char *s, size_t n) {
    char *p = alloc(e, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* ---- tree ------------------------------------------------------------------------------------ */

enum {
    /* statements */
    N_TEXT,
    N_OUT,
    N_IF,
    N_FOR,
    N_SET,
    N_SETBLOCK,
    N_BREAK,
    N_CONTINUE,
    N_BLOCK,
    /* expressions */
    N_STR,
    N_INT,
    N_FLOAT,
    N_BOOL,
    N_NONE,
    N_NAME,
    N_ATTR,
    N_ITEM,
    N_SLICE,
    N_CALL,
    N_FILTER,
    N_TEST,
    N_BIN,
    N_NOT,
    N_NEG,
    N_POS,
    N_AND,
    N_OR,
    N_COND,
    N_LIST,
    N_DICT,
    N_TUPLE
};

typedef struct node node;
struct node {
    int kind;
    size_t pos;
    node *a, *b, *c, *d;
    node **args;
    const char **names; /* keyword names of args (NULL entries: positional) / for-loop targets */
    int nargs, nnames;
    const char *s; /* name, string literal, attribute, filter or test, operator */
    size_t n;      /* length of s (string literals may hold NUL) */
    int64_t i;
    double f;
    node *body, *orelse, *next;
};

struct nl_chat_template {
    arena ar;
    node *root;
    char *source;
    char *what;
    char *bos, *eos;
};

/* ---- lexer of the template text --------------------------------------------------------------- */

enum { SEG_TEXT, SEG_EXPR, SEG_STMT };
typedef struct seg {
    int kind;
    size_t start, end; /* inner text (TEXT: the text after whitespace control) */
    const char *text;  /* SEG_TEXT: stripped text */
    size_t len;
} seg;

typedef struct segs {
    seg *v;
    int n, cap;
} segs;

static void push_seg(errctx *e, segs *s, seg g) {
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 64;
        seg *v = alloc(e, sizeof(seg) * (size_t)cap);
        if (s->n) memcpy(v, s->v, sizeof(seg) * (size_t)s->n);
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = g;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* Finds the end of a tag's inner text (the position of `close`), skipping string literals. */
static size_t find_close(errctx *e, const char *src, size_t n, size_t p, const char *close, size_t open_pos) {
    while (p + 1 < n) {
        char c = src[p];
        if (c == '\'' || c == '"') {
            size_t q = p + 1;
            while (q < n && src[q] != c) q += src[q] == '\\' ? 2 : 1;
            if (q >= n) fail_at(e, NL_ERR_FORMAT, p, "unterminated string literal");
            p = q + 1;
            continue;
        }
        if (c == close[0] && src[p + 1] == close[1]) return p;
        p++;
    }
    fail_at(e, NL_ERR_FORMAT, open_pos, "tag opened here is never closed with '%s'", close);
    return 0;
}

/* Splits the template into text and tags, applying Jinja's whitespace control with
 * trim_blocks and lstrip_blocks (jinja2.lexer.Lexer.tokeniter). */
static void lex(errctx *e, const char *src, size_t n, segs *out) {
    size_t p = 0;
    int line_starting = 1;
    while (p <= n) {
        /* next tag */
        size_t q = p;
        int kind = -1;
        while (q + 1 < n) {
            if (src[q] == '{' && (src[q + 1] == '{' || src[q + 1] == '%' || src[q + 1] == '#')) {
                kind = src[q + 1];
                break;
            }
            q++;
        }
        if (kind < 0) q = n;
        const char *text = src + p;
        size_t tlen = q - p;
        char sign = 0;
        if (kind >= 0 && q + 2 < n && (src[q + 2] == '-' || src[q + 2] == '+')) sign = src[q + 2];
        if (kind >= 0) {
            if (sign == '-') {
                while (tlen && is_ws(text[tlen - 1])) tlen--;
            } else if (sign != '+' && kind != '{') {
                size_t l = tlen;
                while (l && text[l - 1] != '\n') l--;
                if (l > 0 || line_starting) {
                    size_t k = l;
                    while (k < tlen && is_ws(text[k])) k++;
                    if (k == tlen) tlen = l;
                }
            }
        }
        if (tlen) push_seg(e, out, (seg){SEG_TEXT, p, q, text, tlen});
        if (kind < 0) break;
        size_t inner = q + 2 + (sign ? 1 : 0);
        size_t close;
        const char *closer = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
        if (kind == '#') {
            close = inner;
            while (close + 1 < n && !(src[close] == '#' && src[close + 1] == '}')) close++;
            if (close + 1 >= n) fail_at(e, NL_ERR_FORMAT, q, "comment opened here is never closed with '#}'");
        } else {
            close = find_close(e, src, n, inner, closer, q);
        }
        size_t iend = close;
        int rstrip = 0;
        if (iend > inner && src[iend - 1] == '-') {
            rstrip = 1;
            iend--;
        } else if (iend > inner && src[iend - 1] == '+') {
            iend--;
        }
        if (kind != '#') push_seg(e, out, (seg){kind == '{' ? SEG_EXPR : SEG_STMT, inner, iend, NULL, 0});
        p = close + 2;
        line_starting = 0;
        if (rstrip) {
            while (p < n && is_ws(src[p])) {
                line_starting = src[p] == '\n';
                p++;
            }
        } else if (kind != '{' && p < n && src[p] == '\n') {
            p++;
            line_starting = 1;
        }
        if (p >= n) break;
    }
}

/* ---- expression tokens ------------------------------------------------------------------------ */

enum { T_END, T_NAME, T_STR, T_INT, T_FLOAT, T_OP };
typedef struct tok {
    int kind;
    size_t pos;
    const char *s;
    size_t n;
    int64_t i;
    double f;
} tok;

typedef struct parser {
    errctx *e;
    const char *src;
    size_t p, end;
    tok t;
    segs *sg;
    int si; /* next segment */
} parser;

static int utf8_put(char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 63));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 63));
        o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 63));
    o[2] = (char)(0x80 | ((cp >> 6) & 63));
    o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string literal with Python's escapes (jinja2 decodes with "unicode-escape"). */
static void lex_string(parser *ps) {
    const char *s = ps->src;
    size_t p = ps->p;
    char q = s[p];
    size_t start = p;
    p++;
    char *buf = alloc(ps->e, ps->end - p + 1);
    size_t n = 0;
    while (p < ps->end && s[p] != q) {
        if (s[p] == '\\' && p + 1 < ps->end) {
            char c = s[p + 1];
            p += 2;
            switch (c) {
            case 'n': buf[n++] = '\n'; break;
            case 't': buf[n++] = '\t'; break;
            case 'r': buf[n++] = '\r'; break;
            case 'b': buf[n++] = '\b'; break;
            case 'f': buf[n++] = '\f'; break;
            case 'v': buf[n++] = '\v'; break;
            case 'a': buf[n++] = '\a'; break;
            case '0': buf[n++] = '\0'; break;
            case '\\': buf[n++] = '\\'; break;
            case '\'': buf[n++] = '\''; break;
            case '"': buf[n++] = '"'; break;
            case '\n': break;
            case 'x':
            case 'u':
            case 'U': {
                int digits = c == 'x' ? 2 : c == 'u' ? 4 : 8;
                uint32_t cp = 0;
                for (int k = 0; k < digits; k++) {
                    int h = p + (size_t)k < ps->end ? hexval(s[p + (size_t)k]) : -1;
                    if (h < 0) fail_at(ps->e, NL_ERR_FORMAT, p - 2, "bad \\%c escape in a string literal", c);
                    cp = cp * 16 + (uint32_t)h;
                }
                p += (size_t)digits;
                if (cp > 0x10FFFF) fail_at(ps->e, NL_ERR_FORMAT, p, "escape beyond U+10FFFF");
                n += (size_t)utf8_put(buf + n, cp);
                break;
            }
            default: buf[n++] = '\\'; buf[n++] = c;
            }
        } else {
            buf[n++] = s[p++];
        }
    }
    if (p >= ps->end) fail_at(ps->e, NL_ERR_FORMAT, start, "unterminated string literal");
    buf[n] = 0;
    ps->t = (tok){T_STR, start, buf, n, 0, 0};
    ps->p = p + 1;
}

static void next(parser *ps) {
    const char *s = ps->src;
    while (ps->p < ps->end && is_ws(s[ps->p])) ps->p++;
    size_t p = ps->p;
    if (p >= ps->end) {
        ps->t = (tok){T_END, p, NULL, 0, 0, 0};
        return;
    }
    char c = s[p];
    if (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
        size_t q = p;
        while (q < ps->end && (s[q] == '_' || (s[q] >= 'a' && s[q] <= 'z') || (s[q] >= 'A' && s[q] <= 'Z') ||
                               (s[q] >= '0' && s[q] <= '9')))
            q++;
        ps->t = (tok){T_NAME, p, s + p, q - p, 0, 0};
        ps->p = q;
        return;
    }
    if (c >= '0' && c <= '9') {
        size_t q = p;
        int is_float = 0;
        while (q < ps->end && ((s[q] >= '0' && s[q] <= '9') || s[q] == '_')) q++;
        if (q + 1 < ps->end && s[q] == '.' && s[q + 1] >= '0' && s[q + 1] <= '9') {
            is_float = 1;
            q++;
            while (q < ps->end && s[q] >= '0' && s[q] <= '9') q++;
        }
        if (q < ps->end && (s[q] == 'e' || s[q] == 'E')) {
            size_t r = q + 1;
            if (r < ps->end && (s[r] == '+' || s[r] == '-')) r++;
            if (r < ps->end && s[r] >= '0' && s[r] <= '9') {
                is_float = 1;
                q = r;
                while (q < ps->end && s[q] >= '0' && s[q] <= '9') q++;
            }
        }
        char num[64];
        size_t k = 0;
        for (size_t j = p; j < q && k < sizeof num - 1; j++)
            if (s[j] != '_') num[k++] = s[j];
        num[k] = 0;
        if (is_float)
            ps->t = (tok){T_FLOAT, p, NULL, 0, 0, strtod(num, NULL)};
        else
            ps->t = (tok){T_INT, p, NULL, 0, strtoll(num, NULL, 10), 0};
        ps->p = q;
        return;
    }
    if (c == '\'' || c == '"') {
        lex_string(ps);
        return;
    }
    static const char *ops2[] = {"==", "!=", "<=", ">=", "//", "**"};
    for (size_t k = 0; k < sizeof ops2 / sizeof *ops2; k++)
        if (p + 1 < ps->end && s[p] == ops2[k][0] && s[p + 1] == ops2[k][1]) {
            ps->t = (tok){T_OP, p, ops2[k], 2, 0, 0};
            ps->p = p + 2;
            return;
        }
    if (strchr("+-*/%~<>()[]{}.,:|=", c)) {
        ps->t = (tok){T_OP, p, s + p, 1, 0, 0};
        ps->p = p + 1;
        return;
    }
    fail_at(ps->e, NL_ERR_FORMAT, p, "unexpected character '%c'", c);
}

static int is_op(const parser *ps, const char *op) {
    return ps->t.kind == T_OP && ps->t.n == strlen(op) && !memcmp(ps->t.s, op, ps->t.n);
}
static int is_name(const parser *ps, const char *nm) {
    return ps->t.kind == T_NAME && ps->t.n == strlen(nm) && !memcmp(ps->t.s, nm, ps->t.n);
}
static void expect_op(parser *ps, const char *op) {
    if (!is_op(ps, op)) fail_at(ps->e, NL_ERR_FORMAT, ps->t.pos, "expected '%s'", op);
    next(ps);
}

static node *mk(parser *ps, int kind, size_t pos) {
    node *n = alloc(ps->e, sizeof(node));
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->pos = pos;
    return n;
}

static const char *tok_name(parser *ps) {
    if (ps->t.kind != T_NAME) fail_at(ps->e, NL_ERR_FORMAT, ps->t.pos, "expected a name");
    const char *s = dupn(ps->e, ps->t.s, ps->t.n);
    next(ps);
    return s;
}

static node *parse_expr(parser *ps);
static node *parse_or(parser *ps);
static node *parse_unary(parser *ps, int with_filter);

typedef struct nodevec {
    node **v;
    const char **names;
    int n, cap;
} nodevec;

static void nv_push(parser *ps, nodevec *v, node *x, const char *name) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 8;
        node **nv = alloc(ps->e, sizeof(node *) * (size_t)cap);
        const char **nn = alloc(ps->e, sizeof(char *) * (size_t)cap);
        if (v->n) {
            memcpy(nv, v->v, sizeof(node *) * (size_t)v->n);
            memcpy(nn, v->names, sizeof(char *) * (size_t)v->n);
        }
        v->v = nv;
        v->names = nn;
        v->cap = cap;
    }
    v->v[v->n] = x;
    v->names[v->n] = name;
    v->n++;
}

/* (args) after the opening parenthesis: positional and name=value arguments. */
static void parse_args(parser *ps, node *call) {
    nodevec v = {0};
    while (!is_op(ps, ")")) {
        const char *name = NULL;
        if (ps->t.kind == T_NAME) {
            /* lookahead for name= */
            size_t save_p = ps->p;
            tok save_t = ps->t;
            next(ps);
            if (is_op(ps, "=")) {
                name = dupn(ps->e, save_t.s, save_t.n);
                next(ps);
            } else {
                ps->p = save_p;
                ps->t = save_t;
            }
        }
        nv_push(ps, &v, parse_expr(ps), name);
        if (!is_op(ps, ",")) break;
        next(ps);
    }
    expect_op(ps, ")");
    call->args = v.v;
    call->names = v.names;
    call->nargs = v.n;
}

static node *parse_primary(parser *ps) {
    tok t = ps->t;
    node *n;
    switch (t.kind) {
    case T_STR: {
        /* adjacent literals concatenate */
        n = mk(ps, N_STR, t.pos);
        n->s = t.s;
        n->n = t.n;
        next(ps);
        while (ps->t.kind == T_STR) {
            char *b = alloc(ps->e, n->n + ps->t.n + 1);
            memcpy(b, n->s, n->n);
            memcpy(b + n->n, ps->t.s, ps->t.n);
            b[n->n + ps->t.n] = 0;
            n->s = b;
            n->n += ps->t.n;
            next(ps);
        }
        return n;
    }
    case T_INT:
        n = mk(ps, N_INT, t.pos);
        n->i = t.i;
        next(ps);
        return n;
    case T_FLOAT:
        n = mk(ps, N_FLOAT, t.pos);
        n->f = t.f;
        next(ps);
        return n;
    case T_NAME:
        if (is_name(ps, "true") || is_name(ps, "True") || is_name(ps, "false") || is_name(ps, "False")) {
            n = mk(ps, N_BOOL, t.pos);
            n->i = t.s[0] == 't' || t.s[0] == 'T';
            next(ps);
            return n;
        }
        if (is_name(ps, "none") || is_name(ps, "None")) {
            next(ps);
            return mk(ps, N_NONE, t.pos);
        }
        n = mk(ps, N_NAME, t.pos);
        n->s = tok_name(ps);
        return n;
    case T_OP:
        if (is_op(ps, "(")) {
            next(ps);
            if (is_op(ps, ")")) {
                next(ps);
                return mk(ps, N_TUPLE, t.pos);
            }
            node *x = parse_expr(ps);
            if (is_op(ps, ",")) {
                nodevec v = {0};
                nv_push(ps, &v, x, NULL);
                while (is_op(ps, ",")) {
                    next(ps);
                    if (is_op(ps, ")")) break;
                    nv_push(ps, &v, parse_expr(ps), NULL);
                }
                x = mk(ps, N_TUPLE, t.pos);
                x->args = v.v;
                x->nargs = v.n;
            }
            expect_op(ps, ")");
            return x;
        }
        if (is_op(ps, "[")) {
            next(ps);
            nodevec v = {0};
            while (!is_op(ps, "]")) {
                nv_push(ps, &v, parse_expr(ps), NULL);
                if (!is_op(ps, ",")) break;
                next(ps);
            }
            expect_op(ps, "]");
            n = mk(ps, N_LIST, t.pos);
            n->args = v.v;
            n->nargs = v.n;
            return n;
        }
        if (is_op(ps, "{")) {
            next(ps);
            nodevec v = {0};
            while (!is_op(ps, "}")) {
                nv_push(ps, &v, parse_expr(ps), NULL);
                expect_op(ps, ":");
                nv_push(ps, &v, parse_expr(ps), NULL);
                if (!is_op(ps, ",")) break;
                next(ps);
            }
            expect_op(ps, "}");
            n = mk(ps, N_DICT, t.pos);
            n->args = v.v;
            n->nargs = v.n;
            return n;
        }
        break;
    default: break;
    }
    if (t.kind == T_END) fail_at(ps->e, NL_ERR_FORMAT, t.pos, "expected an expression, found the end of the tag");
    fail_at(ps->e, NL_ERR_FORMAT, t.pos, "expected an expression");
    return NULL;
}

static node *parse_postfix(parser *ps, node *x) {
    for (;;) {
        if (is_op(ps, ".")) {
            size_t pos = ps->t.pos;
            next(ps);
            node *n = mk(ps, N_ATTR, pos);
            n->a = x;
            if (ps->t.kind == T_INT) { /* x.0 */
                n->kind = N_ITEM;
                n->b = mk(ps, N_INT, ps->t.pos);
                n->b->i = ps->t.i;
                next(ps);
            } else {
                n->s = tok_name(ps);
            }
            x = n;
        } else if (is_op(ps, "[")) {
            size_t pos = ps->t.pos;
            next(ps);
            node *parts[3] = {NULL, NULL, NULL};
            int nparts = 0, is_slice = 0;
            for (;;) {
                if (!is_op(ps, ":") && !is_op(ps, "]")) parts[nparts] = parse_expr(ps);
                if (is_op(ps, ":") && nparts < 2) {
                    is_slice = 1;
                    nparts++;
                    next(ps);
                    continue;
                }
                break;
            }
            expect_op(ps, "]");
            node *n = mk(ps, is_slice ? N_SLICE : N_ITEM, pos);
            n->a = x;
            if (is_slice) {
                n->b = parts[0];
                n->c = parts[1];
                n->d = parts[2];
            } else {
                if (!parts[0]) fail_at(ps->e, NL_ERR_FORMAT, pos, "empty subscript");
                n->b = parts[0];
            }
            x = n;
        } else if (is_op(ps, "(")) {
            size_t pos = ps->t.pos;
            next(ps);
            node *n = mk(ps, N_CALL, pos);
            n->a = x;
            parse_args(ps, n);
            x = n;
        } else {
            return x;
        }
    }
}

static const char *const known_filters[] = {
    "trim",       "length",     "count",  "default", "d",    "tojson", "string",      "lower",
    "upper",      "capitalize", "title",  "first",   "last", "list",   "join",        "replace",
    "selectattr", "rejectattr", "select", "reject",  "map",  "items",  "int",         "float",
    "abs",        "reverse",    "unique", "safe",    "e",    "escape", "forceescape", NULL};
static const char *const known_tests[] = {
    "defined",     "undefined", "none", "string",      "mapping",  "iterable", "sequence", "number", "integer",
    "float",       "boolean",   "true", "false",       "callable", "odd",      "even",     "lower",  "upper",
    "divisibleby", "equalto",   "eq",   "==",          "sameas",   "ne",       "!=",       "lt",     "<",
    "lessthan",    "gt",        ">",    "greaterthan", "in",       NULL};

static int listed(const char *const *l, const char *s) {
    for (; *l; l++)
        if (!strcmp(*l, s)) return 1;
    return 0;
}

static node *parse_filters_tests(parser *ps, node *x) {
    for (;;) {
        if (is_op(ps, "|")) {
            next(ps);
            node *n = mk(ps, N_FILTER, ps->t.pos);
            n->a = x;
            n->s = tok_name(ps);
            if (!listed(known_filters, n->s)) fail_at(ps->e, NL_ERR_FORMAT, n->pos, "unknown filter '%s'", n->s);
            if (is_op(ps, "(")) {
                next(ps);
                parse_args(ps, n);
            }
            x = n;
        } else if (is_name(ps, "is")) {
            next(ps);
            node *n = mk(ps, N_TEST, ps->t.pos);
            n->a = x;
            if (is_name(ps, "not")) {
                n->i = 1;
                next(ps);
            }
            if (ps->t.kind == T_NAME && (is_name(ps, "none") || is_name(ps, "true") || is_name(ps, "false"))) {
                n->s = dupn(ps->e, ps->t.s, ps->t.n);
                next(ps);
            } else if (ps->t.kind == T_OP && (is_op(ps, "==") || is_op(ps, "!=") || is_op(ps, "<") || is_op(ps, ">"))) {
                n->s = dupn(ps->e, ps->t.s, ps->t.n);
                next(ps);
            } else {
                n->s = tok_name(ps);
            }
            if (!listed(known_tests, n->s)) fail_at(ps->e, NL_ERR_FORMAT, n->pos, "unknown test '%s'", n->s);
            if (is_op(ps, "(")) {
                next(ps);
                parse_args(ps, n);
            } else if (ps->t.kind == T_STR || ps->t.kind == T_INT || ps->t.kind == T_FLOAT ||
                       (ps->t.kind == T_NAME && !is_name(ps, "and") && !is_name(ps, "or") && !is_name(ps, "else") &&
                        !is_name(ps, "if") && !is_name(ps, "in") && !is_name(ps, "is") && !is_name(ps, "not"))) {
                /* `is divisibleby 3`, `is equalto "x"`: one argument without parentheses */
                nodevec v = {0};
                nv_push(ps, &v, parse_unary(ps, 0), NULL);
                n->args = v.v;
                n->names = v.names;
                n->nargs = 1;
            }
            x = n;
        } else if (is_op(ps, "(")) {
            size_t pos = ps->t.pos;
            next(ps);
            node *n = mk(ps, N_CALL, pos);
            n->a = x;
            parse_args(ps, n);
            x = n;
        } else {
            return x;
        }
    }
}

static node *parse_unary(parser *ps, int with_filter) {
    size_t pos = ps->t.pos;
    node *x;
    if (is_op(ps, "-")) {
        next(ps);
        x = mk(ps, N_NEG, pos);
        x->a = parse_unary(ps, 0);
    } else if (is_op(ps, "+")) {
        next(ps);
        x = mk(ps, N_POS, pos);
        x->a = parse_unary(ps, 0);
    } else {
        x = parse_postfix(ps, parse_primary(ps));
    }
    if (with_filter) x = parse_filters_tests(ps, x);
    return x;
}

static node *bin(parser *ps, const char *op, size_t pos, node *a, node *b) {
    node *n = mk(ps, N_BIN, pos);
    n->s = op;
    n->a = a;
    n->b = b;
    return n;
}

static node *parse_pow(parser *ps) {
    node *x = parse_unary(ps, 1);
    while (is_op(ps, "**")) {
        size_t pos = ps->t.pos;
        next(ps);
        x = bin(ps, "**", pos, x, parse_unary(ps, 1));
    }
    return x;
}

static node *parse_math2(parser *ps) {
    node *x = parse_pow(ps);
    for (;;) {
        const char *op = is_op(ps, "*")    ? "*"
                         : is_op(ps, "/")  ? "/"
                         : is_op(ps, "//") ? "//"
                         : is_op(ps, "%")  ? "%"
                                           : NULL;
        if (!op) return x;
        size_t pos = ps->t.pos;
        next(ps);
        x = bin(ps, op, pos, x, parse_pow(ps));
    }
}

static node *parse_concat(parser *ps) {
    node *x = parse_math2(ps);
    while (is_op(ps, "~")) {
        size_t pos = ps->t.pos;
        next(ps);
        x = bin(ps, "~", pos, x, parse_math2(ps));
    }
    return x;
}

static node *parse_math1(parser *ps) {
    node *x = parse_concat(ps);
    for (;;) {
        const char *op = is_op(ps, "+") ? "+" : is_op(ps, "-") ? "-" : NULL;
        if (!op) return x;
        size_t pos = ps->t.pos;
        next(ps);
        x = bin(ps, op, pos, x, parse_concat(ps));
    }
}

static node *parse_compare(parser *ps) {
    node *x = parse_math1(ps);
    for (;;) {
        size_t pos = ps->t.pos;
        const char *op = NULL;
        static const char *cmp[] = {"==", "!=", "<=", ">=", "<", ">"};
        for (size_t k = 0; k < 6 && !op; k++)
            if (is_op(ps, cmp[k])) op = cmp[k];
        if (op) {
            next(ps);
        } else if (is_name(ps, "in")) {
            op = "in";
            next(ps);
        } else if (is_name(ps, "not")) {
            size_t save_p = ps->p;
            tok save_t = ps->t;
            next(ps);
            if (!is_name(ps, "in")) {
                ps->p = save_p;
                ps->t = save_t;
                return x;
            }
            op = "notin";
            next(ps);
        } else {
            return x;
        }
        x = bin(ps, op, pos, x, parse_math1(ps));
    }
}

static node *parse_not(parser *ps) {
    if (is_name(ps, "not")) {
        size_t pos = ps->t.pos;
        next(ps);
        node *n = mk(ps, N_NOT, pos);
        n->a = parse_not(ps);
        return n;
    }
    return parse_compare(ps);
}

static node *parse_and(parser *ps) {
    node *x = parse_not(ps);
    while (is_name(ps, "and")) {
        size_t pos = ps->t.pos;
        next(ps);
        node *n = mk(ps, N_AND, pos);
        n->a = x;
        n->b = parse_not(ps);
        x = n;
    }
    return x;
}

static node *parse_or(parser *ps) {
    node *x = parse_and(ps);
    while (is_name(ps, "or")) {
        size_t pos = ps->t.pos;
        next(ps);
        node *n = mk(ps, N_OR, pos);
        n->a = x;
        n->b = parse_and(ps);
        x = n;
    }
    return x;
}

static node *parse_expr(parser *ps) {
    node *x = parse_or(ps);
    while (is_name(ps, "if")) {
        size_t pos = ps->t.pos;
        next(ps);
        node *n = mk(ps, N_COND, pos);
        n->a = x;
        n->b = parse_or(ps);
        if (is_name(ps, "else")) {
            next(ps);
            n->c = parse_expr(ps);
        }
        x = n;
    }
    return x;
}

/* ---- statements ------------------------------------------------------------------------------ */

static void begin_tag(parser *ps, const seg *g) {
    ps->p = g->start;
    ps->end = g->end;
    next(ps);
}

static void end_tag(parser *ps) {
    if (ps->t.kind != T_END) fail_at(ps->e, NL_ERR_FORMAT, ps->t.pos, "unexpected text at the end of the tag");
}

/* Parses statements until a {% tag %} whose keyword is in `ends` (NULL-terminated); returns the
 * list and leaves ps->si at that tag (its keyword in *found), or fails at the end of input when
 * `ends` is not empty. */
static node *parse_body(parser *ps, const char *const *ends, const char **found, size_t open_pos, const char *open_kw) {
    node head = {0}, *tail = &head;
    while (ps->si < ps->sg->n) {
        const seg *g = &ps->sg->v[ps->si];
        node *n = NULL;
        if (g->kind == SEG_TEXT) {
            n = mk(ps, N_TEXT, g->start);
            n->s = g->text;
            n->n = g->len;
            ps->si++;
        } else if (g->kind == SEG_EXPR) {
            begin_tag(ps, g);
            n = mk(ps, N_OUT, g->start);
            n->a = parse_expr(ps);
            end_tag(ps);
            ps->si++;
        } else {
            begin_tag(ps, g);
            if (ps->t.kind != T_NAME) fail_at(ps->e, NL_ERR_FORMAT, g->start, "expected a statement keyword");
            for (int k = 0; ends && ends[k]; k++)
                if (is_name(ps, ends[k])) {
                    *found = ends[k];
                    tail->next = NULL;
                    return head.next;
                }
            size_t pos = ps->t.pos;
            if (is_name(ps, "if")) {
                next(ps);
                n = mk(ps, N_IF, pos);
                n->a = parse_expr(ps);
                end_tag(ps);
                ps->si++;
                static const char *const if_ends[] = {"elif", "else", "endif", NULL};
                const char *kw = NULL;
                node *cur = n;
                for (;;) {
                    cur->body = parse_body(ps, if_ends, &kw, pos, "if");
                    const seg *t = &ps->sg->v[ps->si];
                    begin_tag(ps, t);
                    next(ps); /* the keyword */
                    if (!strcmp(kw, "elif")) {
                        node *e2 = mk(ps, N_IF, t->start);
                        e2->a = parse_expr(ps);
                        end_tag(ps);
                        ps->si++;
                        cur->orelse = e2;
                        cur = e2;
                        continue;
                    }
                    end_tag(ps);
                    ps->si++;
                    if (!strcmp(kw, "else")) {
                        static const char *const else_ends[] = {"endif", NULL};
                        cur->orelse = parse_body(ps, else_ends, &kw, pos, "if");
                        begin_tag(ps, &ps->sg->v[ps->si]);
                        next(ps);
                        end_tag(ps);
                        ps->si++;
                    }
                    break;
                }
            } else if (is_name(ps, "for")) {
                next(ps);
                n = mk(ps, N_FOR, pos);
                nodevec targets = {0};
                for (;;) {
                    node *t = mk(ps, N_NAME, ps->t.pos);
                    t->s = tok_name(ps);
                    nv_push(ps, &targets, t, t->s);
                    if (!is_op(ps, ",")) break;
                    next(ps);
                }
                n->names = targets.names;
                n->nnames = targets.n;
                if (!is_name(ps, "in")) fail_at(ps->e, NL_ERR_FORMAT, ps->t.pos, "expected 'in' in a for loop");
                next(ps);
                n->a = parse_or(ps);
                if (is_name(ps, "if")) {
                    next(ps);
                    n->b = parse_expr(ps);
                }
                if (is_name(ps, "recursive"))
                    fail_at(ps->e, NL_ERR_FORMAT, ps->t.pos, "recursive loops are not supported");
                end_tag(ps);
                ps->si++;
                static const char *const for_ends[] = {"else", "endfor", NULL};
                const char *kw = NULL;
                n->body = parse_body(ps, for_ends, &kw, pos, "for");
                begin_tag(ps, &ps->sg->v[ps->si]);
                next(ps);
                end_tag(ps);
                ps->si++;
                if (!strcmp(kw, "else")) {
                    static const char *const e_ends[] = {"endfor", NULL};
                    n->orelse = parse_body(ps, e_ends, &kw, pos, "for");
                    begin_tag(ps, &ps->sg->v[ps->si]);
                    next(ps);
                    end_tag(ps);
                    ps->si++;
                }
            } else if (is_name(ps, "set")) {
                next(ps);
                n = mk(ps, N_SET, pos);
                nodevec targets = {0};
                for (;;) {
                    node *t = mk(ps, N_NAME, ps->t.pos);
                    t->s = tok_name(ps);
                    if (is_op(ps, ".")) { /* ns.attr */
                        next(ps);
                        node *at = mk(ps, N_ATTR, t->pos);
                        at->a = t;
                        at->s = tok_name(ps);
                        t = at;
                    }
                    nv_push(ps, &targets, t, NULL);
                    if (!is_op(ps, ",")) break;
                    next(ps);
                }
                n->args = targets.v;
                n->nargs = targets.n;
                if (is_op(ps, "=")) {
                    next(ps);
                    n->a = parse_expr(ps);
                    if (is_op(ps, ",")) { /* set a, b = x, y */
                        nodevec v = {0};
                        nv_push(ps, &v, n->a, NULL);
                        while (is_op(ps, ",")) {
                            next(ps);
                            nv_push(ps, &v, parse_expr(ps), NULL);
                        }
                        n->a = mk(ps, N_TUPLE, pos);
                        n->a->args = v.v;
                        n->a->nargs = v.n;
                    }
                    end_tag(ps);
                    ps->si++;
                } else {
                    if (targets.n != 1 || targets.v[0]->kind != N_NAME)
                        fail_at(ps->e, NL_ERR_FORMAT, pos, "a block set takes one name");
                    end_tag(ps);
                    ps->si++;
                    n->kind = N_SETBLOCK;
                    static const char *const s_ends[] = {"endset", NULL};
                    const char *kw = NULL;
                    n->body = parse_body(ps, s_ends, &kw, pos, "set");
                    begin_tag(ps, &ps->sg->v[ps->si]);
                    next(ps);
                    end_tag(ps);
                    ps->si++;
                }
            } else if (is_name(ps, "break") || is_name(ps, "continue")) {
                n = mk(ps, is_name(ps, "break") ? N_BREAK : N_CONTINUE, pos);
                next(ps);
                end_tag(ps);
                ps->si++;
            } else if (is_name(ps, "generation")) {
                next(ps);
                end_tag(ps);
                ps->si++;
                n = mk(ps, N_BLOCK, pos);
                static const char *const g_ends[] = {"endgeneration", NULL};
                const char *kw = NULL;
                n->body = parse_body(ps, g_ends, &kw, pos, "generation");
                begin_tag(ps, &ps->sg->v[ps->si]);
                next(ps);
                end_tag(ps);
                ps->si++;
            } else {
                char kw[40];
                snprintf(kw, sizeof kw, "%.*s", (int)(ps->t.n < 32 ? ps->t.n : 32), ps->t.s);
                int closing = !strncmp(kw, "end", 3) || !strcmp(kw, "elif") || !strcmp(kw, "else");
                if (closing) fail_at(ps->e, NL_ERR_FORMAT, pos, "'%s' without a matching opening tag", kw);
                fail_at(ps->e, NL_ERR_FORMAT, pos,
                        "unsupported statement '%s' (supported: if, for, set, break, continue, generation)", kw);
            }
        }
        tail->next = n;
        tail = n;
    }
    if (ends && ends[0])
        fail_at(ps->e, NL_ERR_FORMAT, open_pos, "'%s' opened here is never closed", open_kw ? open_kw : "block");
    tail->next = NULL;
    return head.next;
}

nl_status nl_chat_template_parse(nl_chat_template **out, const char *source, size_t bytes, const char *what) {
    *out = NULL;
    if (!source) return nl_fail(NL_ERR_INVALID, "chat template: NULL source");
    nl_chat_template *t = calloc(1, sizeof *t);
    if (!t) return nl_fail(NL_ERR_NOMEM, "chat template: out of memory");
    t->source = malloc(bytes + 1);
    t->what = strdup(what ? what : "(text)");
    if (!t->source || !t->what) {
        nl_chat_template_free(t);
        return nl_fail(NL_ERR_NOMEM, "chat template: out of memory");
    }
    memcpy(t->source, source, bytes);
    t->source[bytes] = 0;
    errctx e = {.src = t->source, .what = t->what, .ar = &t->ar};
    if (memchr(source, 0, bytes)) {
        nl_chat_template_free(t);
        return nl_fail(NL_ERR_FORMAT, "chat template %s: contains a NUL byte", what ? what : "(text)");
    }
    if (setjmp(e.jb)) {
        nl_status rc = nl_fail(e.code, "%s", e.msg);
        nl_chat_template_free(t);
        return rc;
    }
    segs sg = {0};
    lex(&e, t->source, bytes, &sg);
    parser ps = {.e = &e, .src = t->source, .sg = &sg};
    t->root = parse_body(&ps, NULL, NULL, 0, NULL);
    *out = t;
    return NL_OK;
}

void nl_chat_template_free(nl_chat_template *t) {
    if (!t) return;
    arena_free(&t->ar);
    free(t->source);
    free(t->what);
    free(t->bos);
    free(t->eos);
    free(t);
}

nl_status nl_chat_template_set_tokens(nl_chat_template *t, const char *bos_token, const char *eos_token) {
    char *b = bos_token ? strdup(bos_token) : NULL, *e = eos_token ? strdup(eos_token) : NULL;
    if ((bos_token && !b) || (eos_token && !e)) {
        free(b);
        free(e);
        return nl_fail(NL_ERR_NOMEM, "chat template: out of memory");
    }
    free(t->bos);
    free(t->eos);
    t->bos = b;
    t->eos = e;
    return NL_OK;
}
const char *nl_chat_template_bos(const nl_chat_template *t) { return t->bos; }
const char *nl_chat_template_eos(const nl_chat_template *t) { return t->eos; }
/* ---- values ---------------------------------------------------------------------------------- */

typedef enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_FUNC } vkind;
enum { F_RAISE, F_STRFTIME, F_NAMESPACE, F_RANGE, F_DICT, F_METHOD };

typedef struct val val;
struct val {
    vkind k;
    int ns;    /* a namespace() (attributes assignable) */
    int tuple; /* a tuple (prints with parentheses) */
    int64_t i; /* bool, int, function id */
    double f;
    const char *s; /* string bytes / undefined name / method name */
    size_t n;      /* string length, list / dict count */
    size_t cap;
    val **items; /* list items; dict values */
    val **keys;  /* dict keys */
    val *self;   /* bound method receiver */
    int tk;      /* strings: 0 from the template, 1 from the variables (data), 2 mixed (taint[]) */
    const unsigned char *taint;
};

typedef struct frame {
    struct frame *up;
    const char **names;
    val **vals;
    int n, cap;
} frame;

typedef struct rctx {
    errctx *e;
    outbuf *out;
    int brk;       /* 1 break, 2 continue */
    int64_t steps; /* statements run: a template that never ends is stopped at MAX_STEPS */
} rctx;

#define MAX_STEPS  2000000
#define MAX_OUTPUT ((size_t)64 << 20)

static val V_NONE_V = {.k = V_NONE};
static val V_TRUE_V = {.k = V_BOOL, .i = 1};
static val V_FALSE_V = {.k = V_BOOL};

static val *newv(errctx *e, vkind k) {
    val *v = alloc(e, sizeof(val));
    memset(v, 0, sizeof *v);
    v->k = k;
    return v;
}
static val *vbool(int b) { return b ? &V_TRUE_V : &V_FALSE_V; }
static val *vint(errctx *e, int64_t i) {
    val *v = newv(e, V_INT);
    v->i = i;
    return v;
}
static val *vfloat(errctx *e, double f) {
    val *v = newv(e, V_FLOAT);
    v->f = f;
    return v;
}
static val *vstr(errctx *e, const char *s, size_t n) {
    val *v = newv(e, V_STR);
    v->s = s;
    v->n = n;
    return v;
}
static val *vstr_copy(errctx *e, const char *s, size_t n) { return vstr(e, dupn(e, s, n), n); }
static val *vstr_c(errctx *e, const char *s) { return vstr(e, s, strlen(s)); }

static val *tmp_finish(errctx *e, outbuf *o) {
    val *v = vstr_copy(e, o->p ? o->p : "", o->n);
    if (o->track && o->n) {
        unsigned char *t = alloc(e, o->n);
        memcpy(t, o->t, o->n);
        v->tk = 2;
        v->taint = t;
    }
    free(o->p);
    free(o->t);
    o->p = NULL;
    o->t = NULL;
    return v;
}

/* 1 when a value holds a string from the variables (data). */
static int any_taint(const val *v) {
    if (v->k == V_STR) return v->tk != 0;
    if (v->k == V_LIST || v->k == V_DICT) {
        for (size_t i = 0; i < v->n; i++)
            if (any_taint(v->items[i]) || (v->k == V_DICT && any_taint(v->keys[i]))) return 1;
    }
    return 0;
}

static val *with_taint(val *r, const val *src) {
    r->tk = any_taint(src) ? 1 : 0;
    return r;
}

/* v's bytes [a, b) with their origin. */
static val *sub(errctx *e, const val *v, size_t a, size_t b) {
    val *r = vstr(e, v->s + a, b - a);
    r->tk = v->tk;
    r->taint = v->tk == 2 ? v->taint + a : NULL;
    return r;
}

static val *concat(errctx *e, const val *x, const val *y) {
    char *p = alloc(e, x->n + y->n + 1);
    memcpy(p, x->s, x->n);
    memcpy(p + x->n, y->s, y->n);
    p[x->n + y->n] = 0;
    val *r = vstr(e, p, x->n + y->n);
    if (x->tk == y->tk && x->tk != 2) {
        r->tk = x->tk;
    } else if (x->n + y->n) {
        unsigned char *t = alloc(e, x->n + y->n);
        for (size_t i = 0; i < x->n; i++) t[i] = x->tk == 1 || (x->tk == 2 && x->taint[i]);
        for (size_t i = 0; i < y->n; i++) t[x->n + i] = y->tk == 1 || (y->tk == 2 && y->taint[i]);
        r->tk = 2;
        r->taint = t;
    }
    return r;
}
static val *vundef(errctx *e, const char *name) {
    val *v = newv(e, V_UNDEF);
    v->s = name;
    return v;
}

static void list_push(errctx *e, val *l, val *x) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        val **it = alloc(e, sizeof(val *) * cap);
        if (l->n) memcpy(it, l->items, sizeof(val *) * l->n);
        l->items = it;
        l->cap = cap;
    }
    l->items[l->n++] = x;
}

static int val_eq(const val *a, const val *b);

static int64_t dict_find(const val *d, const val *key) {
    for (size_t i = 0; i < d->n; i++)
        if (val_eq(d->keys[i], key)) return (int64_t)i;
    return -1;
}

static int64_t dict_find_str(const val *d, const char *key, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->keys[i]->k == V_STR && d->keys[i]->n == n && !memcmp(d->keys[i]->s, key, n)) return (int64_t)i;
    return -1;
}

static void dict_set(errctx *e, val *d, val *key, val *x) {
    int64_t i = dict_find(d, key);
    if (i >= 0) {
        d->items[i] = x;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        val **it = alloc(e, sizeof(val *) * cap), **ks = alloc(e, sizeof(val *) * cap);
        if (d->n) {
            memcpy(it, d->items, sizeof(val *) * d->n);
            memcpy(ks, d->keys, sizeof(val *) * d->n);
        }
        d->items = it;
        d->keys = ks;
        d->cap = cap;
    }
    d->keys[d->n] = key;
    d->items[d->n] = x;
    d->n++;
}

static int is_num(const val *v) { return v->k == V_INT || v->k == V_FLOAT || v->k == V_BOOL; }
static double num(const val *v) { return v->k == V_FLOAT ? v->f : (double)v->i; }

static int val_eq(const val *a, const val *b) {
    if (is_num(a) && is_num(b)) {
        if (a->k != V_FLOAT && b->k != V_FLOAT) return a->i == b->i;
        return num(a) == num(b);
    }
    if (a->k != b->k) return 0;
    switch (a->k) {
    case V_UNDEF:
    case V_NONE: return 1;
    case V_STR: return a->n == b->n && !memcmp(a->s, b->s, a->n);
    case V_LIST:
        if (a->n != b->n) return 0;
        for (size_t i = 0; i < a->n; i++)
            if (!val_eq(a->items[i], b->items[i])) return 0;
        return 1;
    case V_DICT:
        if (a->n != b->n) return 0;
        for (size_t i = 0; i < a->n; i++) {
            int64_t j = dict_find(b, a->keys[i]);
            if (j < 0 || !val_eq(a->items[i], b->items[j])) return 0;
        }
        return 1;
    default: return a == b;
    }
}

static int truthy(const val *v) {
    switch (v->k) {
    case V_UNDEF:
    case V_NONE: return 0;
    case V_BOOL:
    case V_INT: return v->i != 0;
    case V_FLOAT: return v->f != 0;
    case V_STR:
    case V_LIST:
    case V_DICT: return v->n != 0 || v->ns;
    default: return 1;
    }
}

static const char *type_name(const val *v) {
    switch (v->k) {
    case V_UNDEF: return "undefined";
    case V_NONE: return "none";
    case V_BOOL: return "bool";
    case V_INT: return "int";
    case V_FLOAT: return "float";
    case V_STR: return "string";
    case V_LIST: return v->tuple ? "tuple" : "list";
    case V_DICT: return v->ns ? "namespace" : "dict";
    default: return "function";
    }
}

/* -- output buffers -- */

/* Appends n bytes whose origin is src's (a string value; NULL: the template's). */
static void ob_putt(errctx *e, outbuf *o, const char *s, size_t n, const val *src) {
    if (o->n + n + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 256;
        while (cap < o->n + n + 1) cap *= 2;
        char *p = realloc(o->p, cap);
        if (p) o->p = p;
        unsigned char *t = p && o->track ? realloc(o->t, cap) : NULL;
        if (t) o->t = t;
        if (!p || (o->track && !t)) {
            snprintf(e->msg, sizeof e->msg, "chat template %s: out of memory", e->what);
            e->code = NL_ERR_NOMEM;
            longjmp(e->jb, 1);
        }
        o->cap = cap;
    }
    memcpy(o->p + o->n, s, n);
    if (o->track) {
        if (!src || src->tk == 0)
            memset(o->t + o->n, 0, n);
        else if (src->tk == 1)
            memset(o->t + o->n, 1, n);
        else
            memcpy(o->t + o->n, src->taint, n);
    }
    o->n += n;
    o->p[o->n] = 0;
}
static void ob_put(errctx *e, outbuf *o, const char *s, size_t n) { ob_putt(e, o, s, n, NULL); }
static void ob_puts(errctx *e, outbuf *o, const char *s) { ob_put(e, o, s, strlen(s)); }

/* A temporary buffer (freed by tmp_finish, or by the error path through e->temps). */
static outbuf *tmp_buf(errctx *e) {
    outbuf *o = alloc(e, sizeof(outbuf));
    memset(o, 0, sizeof *o);
    o->next = e->temps;
    e->temps = o;
    return o;
}

/* The buffer's text as an arena string; releases the malloc'd bytes. */
static val *tmp_finish(errctx *e, outbuf *o);

static void free_temps(errctx *e) {
    for (outbuf *o = e->temps; o; o = o->next) {
        free(o->p);
        free(o->t);
        o->p = NULL;
        o->t = NULL;
    }
    e->temps = NULL;
}

static void fmt_float(char *buf, size_t cap, double f) {
    if (isnan(f)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, cap, f > 0 ? "inf" : "-inf");
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, f);
        if (strtod(buf, NULL) == f) break;
    }
    if (!strpbrk(buf, ".en")) strncat(buf, ".0", cap - strlen(buf) - 1);
}

static void repr_into(errctx *e, outbuf *o, const val *v);

/* str(v) as Python prints it. */
static void str_into(errctx *e, outbuf *o, const val *v) {
    char buf[64];
    switch (v->k) {
    case V_UNDEF: return;
    case V_NONE: ob_puts(e, o, "None"); return;
    case V_BOOL: ob_puts(e, o, v->i ? "True" : "False"); return;
    case V_INT: snprintf(buf, sizeof buf, "%lld", (long long)v->i); break;
    case V_FLOAT: fmt_float(buf, sizeof buf, v->f); break;
    case V_STR: ob_putt(e, o, v->s, v->n, v); return;
    case V_FUNC: ob_puts(e, o, "<function>"); return;
    default: {
        size_t start = o->n;
        repr_into(e, o, v);
        if (o->track && any_taint(v)) memset(o->t + start, 1, o->n - start);
        return;
    }
    }
    ob_puts(e, o, buf);
}

static void repr_into(errctx *e, outbuf *o, const val *v) {
    if (v->k == V_STR) {
        int dq = memchr(v->s, '\'', v->n) && !memchr(v->s, '"', v->n);
        char q = dq ? '"' : '\'';
        ob_put(e, o, &q, 1);
        for (size_t i = 0; i < v->n; i++) {
            unsigned char c = (unsigned char)v->s[i];
            char b[8];
            if (c == '\\' || c == (unsigned char)q) {
                b[0] = '\\';
                b[1] = (char)c;
                ob_put(e, o, b, 2);
            } else if (c == '\n') {
                ob_puts(e, o, "\\n");
            } else if (c == '\t') {
                ob_puts(e, o, "\\t");
            } else if (c == '\r') {
                ob_puts(e, o, "\\r");
            } else if (c < 0x20 || c == 0x7f) {
                snprintf(b, sizeof b, "\\x%02x", c);
                ob_puts(e, o, b);
            } else {
                ob_put(e, o, (const char *)&v->s[i], 1);
            }
        }
        ob_put(e, o, &q, 1);
    } else if (v->k == V_LIST) {
        ob_puts(e, o, v->tuple ? "(" : "[");
        for (size_t i = 0; i < v->n; i++) {
            if (i) ob_puts(e, o, ", ");
            repr_into(e, o, v->items[i]);
        }
        if (v->tuple && v->n == 1) ob_puts(e, o, ",");
        ob_puts(e, o, v->tuple ? ")" : "]");
    } else if (v->k == V_DICT) {
        if (v->ns) ob_puts(e, o, "<Namespace ");
        ob_puts(e, o, "{");
        for (size_t i = 0; i < v->n; i++) {
            if (i) ob_puts(e, o, ", ");
            repr_into(e, o, v->keys[i]);
            ob_puts(e, o, ": ");
            repr_into(e, o, v->items[i]);
        }
        ob_puts(e, o, "}");
        if (v->ns) ob_puts(e, o, ">");
    } else {
        str_into(e, o, v);
    }
}

static val *to_str(errctx *e, const val *v) {
    if (v->k == V_STR) return (val *)v;
    outbuf *o = tmp_buf(e);
    str_into(e, o, v);
    return with_taint(tmp_finish(e, o), v);
}

/* json.dumps(v, ensure_ascii=False, indent=indent, separators=..., sort_keys=...) */
static void json_into(errctx *e, outbuf *o, const val *v, int indent, int depth, const char *item_sep,
                      const char *key_sep, int sort_keys, size_t pos) {
    char buf[64];
    switch (v->k) {
    case V_NONE: ob_puts(e, o, "null"); return;
    case V_UNDEF: fail_at(e, NL_ERR_INVALID, pos, "tojson of an undefined value");
    case V_BOOL: ob_puts(e, o, v->i ? "true" : "false"); return;
    case V_INT:
        snprintf(buf, sizeof buf, "%lld", (long long)v->i);
        ob_puts(e, o, buf);
        return;
    case V_FLOAT:
        if (isnan(v->f))
            ob_puts(e, o, "NaN");
        else if (isinf(v->f))
            ob_puts(e, o, v->f > 0 ? "Infinity" : "-Infinity");
        else {
            fmt_float(buf, sizeof buf, v->f);
            ob_puts(e, o, buf);
        }
        return;
    case V_STR:
        ob_puts(e, o, "\"");
        for (size_t i = 0; i < v->n; i++) {
            unsigned char c = (unsigned char)v->s[i];
            switch (c) {
            case '"': ob_puts(e, o, "\\\""); break;
            case '\\': ob_puts(e, o, "\\\\"); break;
            case '\n': ob_puts(e, o, "\\n"); break;
            case '\r': ob_puts(e, o, "\\r"); break;
            case '\t': ob_puts(e, o, "\\t"); break;
            case '\b': ob_puts(e, o, "\\b"); break;
            case '\f': ob_puts(e, o, "\\f"); break;
            default:
                if (c < 0x20) {
                    snprintf(buf, sizeof buf, "\\u%04x", c);
                    ob_puts(e, o, buf);
                } else {
                    ob_put(e, o, (const char *)&v->s[i], 1);
                }
            }
        }
        ob_puts(e, o, "\"");
        return;
    case V_LIST:
    case V_DICT: {
        int is_d = v->k == V_DICT;
        ob_puts(e, o, is_d ? "{" : "[");
        if (v->n == 0) {
            ob_puts(e, o, is_d ? "}" : "]");
            return;
        }
        size_t *order = alloc(e, sizeof(size_t) * v->n);
        for (size_t i = 0; i < v->n; i++) order[i] = i;
        if (is_d && sort_keys) /* insertion sort by key bytes */
            for (size_t i = 1; i < v->n; i++) {
                size_t x = order[i], j = i;
                while (j > 0) {
                    const val *a = v->keys[order[j - 1]], *b = v->keys[x];
                    size_t m = a->n < b->n ? a->n : b->n;
                    int c = a->k == V_STR && b->k == V_STR ? memcmp(a->s, b->s, m) : 0;
                    if (c < 0 || (c == 0 && a->n <= b->n)) break;
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = x;
            }
        for (size_t k = 0; k < v->n; k++) {
            size_t i = order[k];
            if (k) ob_puts(e, o, item_sep);
            if (indent >= 0) {
                ob_puts(e, o, "\n");
                for (int s = 0; s < indent * (depth + 1); s++) ob_puts(e, o, " ");
            }
            if (is_d) {
                const val *key = v->keys[i];
                if (key->k == V_STR)
                    json_into(e, o, key, indent, depth + 1, item_sep, key_sep, sort_keys, pos);
                else {
                    ob_puts(e, o, "\"");
                    str_into(e, o, key);
                    ob_puts(e, o, "\"");
                }
                ob_puts(e, o, key_sep);
            }
            json_into(e, o, v->items[i], indent, depth + 1, item_sep, key_sep, sort_keys, pos);
        }
        if (indent >= 0) {
            ob_puts(e, o, "\n");
            for (int s = 0; s < indent * depth; s++) ob_puts(e, o, " ");
        }
        ob_puts(e, o, is_d ? "}" : "]");
        return;
    }
    default: fail_at(e, NL_ERR_INVALID, pos, "tojson of a %s", type_name(v));
    }
}

/* -- UTF-8 helpers -- */

static size_t cp_len(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) c++;
    return c;
}

/* byte offset of code point index k (k <= count) */
static size_t cp_off(const char *s, size_t n, size_t k) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) {
        if (((unsigned char)s[i] & 0xC0) != 0x80) {
            if (c == k) return i;
            c++;
        }
    }
    return n;
}

/* Python's str.isspace for the code point starting at s (its byte length in *len), 0 if not. */
static int uspace(const char *s, size_t n, size_t *len) {
    unsigned char c = (unsigned char)s[0];
    if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) {
        *len = 1;
        return 1;
    }
    if (c < 0x80) return 0;
    uint32_t cp = 0;
    size_t l = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    if (l > n) return 0;
    cp = c & (0xFF >> (l + 1));
    for (size_t i = 1; i < l; i++) cp = (cp << 6) | ((unsigned char)s[i] & 63);
    *len = l;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

static int in_chars(const char *s, size_t n, size_t at, const val *chars, size_t *len) {
    if (!chars) return uspace(s + at, n - at, len);
    unsigned char c = (unsigned char)s[at];
    size_t l = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    if (at + l > n) l = n - at;
    *len = l;
    for (size_t i = 0; i + l <= chars->n;) {
        unsigned char d = (unsigned char)chars->s[i];
        size_t dl = d < 0x80 ? 1 : d >= 0xF0 ? 4 : d >= 0xE0 ? 3 : 2;
        if (dl == l && !memcmp(chars->s + i, s + at, l)) return 1;
        i += dl;
    }
    return 0;
}

static val *strip(errctx *e, const val *v, const val *chars, int left, int right) {
    size_t a = 0, b = v->n, l;
    if (left)
        while (a < b && in_chars(v->s, v->n, a, chars, &l)) a += l;
    if (right)
        while (b > a) {
            size_t k = b - 1;
            while (k > a && ((unsigned char)v->s[k] & 0xC0) == 0x80) k--;
            if (!in_chars(v->s, b, k, chars, &l)) break;
            b = k;
        }
    return sub(e, v, a, b);
}

static val *case_map(errctx *e, const val *v, int mode /* 0 lower 1 upper 2 title 3 capitalize */) {
    char *p = dupn(e, v->s, v->n);
    int word_start = 1;
    for (size_t i = 0; i < v->n; i++) {
        char c = p[i];
        int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        int up = 0;
        if (mode == 1)
            up = 1;
        else if (mode == 2)
            up = word_start;
        else if (mode == 3)
            up = i == 0;
        if (alpha) p[i] = up ? (char)(c >= 'a' && c <= 'z' ? c - 32 : c) : (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
        if (mode == 2) word_start = !alpha && !(c >= '0' && c <= '9') && !((unsigned char)c >= 0x80);
    }
    return with_taint(vstr(e, p, v->n), v);
}

static val *replace(errctx *e, const val *v, const val *from, const val *to, int64_t count) {
    outbuf o = {0};
    if (from->n == 0) return (val *)v;
    size_t i = 0;
    int64_t done = 0;
    char *tmp = alloc(e, v->n * (to->n + 1) + v->n + 1); /* upper bound when from->n >= 1 */
    size_t m = 0;
    (void)o;
    while (i < v->n) {
        if ((count < 0 || done < count) && i + from->n <= v->n && !memcmp(v->s + i, from->s, from->n)) {
            memcpy(tmp + m, to->s, to->n);
            m += to->n;
            i += from->n;
            done++;
        } else {
            tmp[m++] = v->s[i++];
        }
    }
    tmp[m] = 0;
    val *r = vstr(e, tmp, m);
    r->tk = v->tk || to->tk ? 1 : 0;
    return r;
}

/* ---- evaluation ------------------------------------------------------------------------------ */

static val *eval(rctx *r, frame *f, node *n);

static val *lookup(frame *f, const char *name) {
    for (; f; f = f->up)
        for (int i = f->n - 1; i >= 0; i--)
            if (!strcmp(f->names[i], name)) return f->vals[i];
    return NULL;
}

static void bind(errctx *e, frame *f, const char *name, val *v) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) {
            f->vals[i] = v;
            return;
        }
    if (f->n == f->cap) {
        int cap = f->cap ? f->cap * 2 : 8;
        const char **nm = alloc(e, sizeof(char *) * (size_t)cap);
        val **vs = alloc(e, sizeof(val *) * (size_t)cap);
        if (f->n) {
            memcpy(nm, f->names, sizeof(char *) * (size_t)f->n);
            memcpy(vs, f->vals, sizeof(val *) * (size_t)f->n);
        }
        f->names = nm;
        f->vals = vs;
        f->cap = cap;
    }
    f->names[f->n] = name;
    f->vals[f->n] = v;
    f->n++;
}

static const char *str_methods[] = {"strip", "lstrip", "rstrip",     "startswith", "endswith", "split", "upper",
                                    "lower", "title",  "capitalize", "replace",    "find",     "count", NULL};
static const char *dict_methods[] = {"items", "keys", "values", "get", NULL};

static int in_list(const char *const *l, const char *s) {
    for (; *l; l++)
        if (!strcmp(*l, s)) return 1;
    return 0;
}

/* getattr(obj, name) as Jinja's: a dict key (or a method), else undefined; an attribute of an
 * undefined value is an error. */
static val *get_attr(rctx *r, val *obj, const char *name, size_t pos) {
    errctx *e = r->e;
    if (obj->k == V_UNDEF) {
        if (obj->s) fail_at(e, NL_ERR_INVALID, pos, "'%s' is undefined (reading its attribute '%s')", obj->s, name);
        fail_at(e, NL_ERR_INVALID, pos, "reading attribute '%s' of an undefined value", name);
    }
    if (obj->k == V_DICT) {
        int64_t i = dict_find_str(obj, name, strlen(name));
        if (i >= 0) return obj->items[i];
        if (!obj->ns && in_list(dict_methods, name)) {
            val *m = newv(e, V_FUNC);
            m->i = F_METHOD;
            m->s = name;
            m->self = obj;
            return m;
        }
    } else if (obj->k == V_STR && in_list(str_methods, name)) {
        val *m = newv(e, V_FUNC);
        m->i = F_METHOD;
        m->s = name;
        m->self = obj;
        return m;
    }
    return vundef(e, NULL);
}

static int64_t norm_index(int64_t i, size_t n) { return i < 0 ? i + (int64_t)n : i; }

static val *get_item(rctx *r, val *obj, val *key, size_t pos) {
    errctx *e = r->e;
    if (obj->k == V_UNDEF) {
        if (obj->s) fail_at(e, NL_ERR_INVALID, pos, "'%s' is undefined (subscripting it)", obj->s);
        fail_at(e, NL_ERR_INVALID, pos, "subscript of an undefined value");
    }
    if (obj->k == V_DICT) {
        int64_t i = dict_find(obj, key);
        if (i >= 0) return obj->items[i];
        if (key->k == V_STR) return get_attr(r, obj, dupn(e, key->s, key->n), pos);
        return vundef(e, NULL);
    }
    if ((obj->k == V_LIST || obj->k == V_STR) && (key->k == V_INT || key->k == V_BOOL)) {
        size_t count = obj->k == V_LIST ? obj->n : cp_len(obj->s, obj->n);
        int64_t i = norm_index(key->i, count);
        if (i < 0 || i >= (int64_t)count) return vundef(e, NULL);
        if (obj->k == V_LIST) return obj->items[i];
        size_t a = cp_off(obj->s, obj->n, (size_t)i), b = cp_off(obj->s, obj->n, (size_t)i + 1);
        return sub(e, obj, a, b);
    }
    if (key->k == V_STR) return get_attr(r, obj, dupn(e, key->s, key->n), pos);
    return vundef(e, NULL);
}

static int64_t as_int(rctx *r, val *v, size_t pos, const char *what) {
    if (v->k == V_INT || v->k == V_BOOL) return v->i;
    fail_at(r->e, NL_ERR_INVALID, pos, "%s must be an integer, got a %s", what, type_name(v));
    return 0;
}

static val *slice(rctx *r, val *obj, val *va, val *vb, val *vc, size_t pos) {
    errctx *e = r->e;
    if (obj->k != V_LIST && obj->k != V_STR) fail_at(e, NL_ERR_INVALID, pos, "cannot slice a %s", type_name(obj));
    size_t count = obj->k == V_LIST ? obj->n : cp_len(obj->s, obj->n);
    int64_t step = vc && vc->k != V_NONE ? as_int(r, vc, pos, "slice step") : 1;
    if (step == 0) fail_at(e, NL_ERR_INVALID, pos, "slice step cannot be zero");
    int64_t n = (int64_t)count, a, b;
    if (!va || va->k == V_NONE)
        a = step > 0 ? 0 : n - 1;
    else {
        a = as_int(r, va, pos, "slice start");
        if (a < 0) a += n;
        if (a < 0) a = step > 0 ? 0 : -1;
        if (a >= n) a = step > 0 ? n : n - 1;
    }
    if (!vb || vb->k == V_NONE)
        b = step > 0 ? n : -1;
    else {
        b = as_int(r, vb, pos, "slice stop");
        if (b < 0) b += n;
        if (b < 0) b = step > 0 ? 0 : -1;
        if (b >= n) b = step > 0 ? n : n - 1;
    }
    val *res = newv(e, obj->k == V_LIST ? V_LIST : V_STR);
    res->tuple = obj->tuple;
    if (obj->k == V_LIST) {
        for (int64_t i = a; step > 0 ? i < b : i > b; i += step) list_push(e, res, obj->items[i]);
        return res;
    }
    if (step == 1) {
        if (b < a) b = a;
        size_t x = cp_off(obj->s, obj->n, (size_t)a), y = cp_off(obj->s, obj->n, (size_t)b);
        return sub(e, obj, x, y);
    }
    char *buf = alloc(e, obj->n + 1);
    size_t m = 0;
    for (int64_t i = a; step > 0 ? i < b : i > b; i += step) {
        size_t x = cp_off(obj->s, obj->n, (size_t)i), y = cp_off(obj->s, obj->n, (size_t)i + 1);
        memcpy(buf + m, obj->s + x, y - x);
        m += y - x;
    }
    return with_taint(vstr(e, buf, m), obj);
}

/* Items of an iterable: a list's items, a dict's keys, a string's characters. */
static val *iter_items(rctx *r, val *v, size_t pos) {
    errctx *e = r->e;
    if (v->k == V_LIST) return v;
    val *l = newv(e, V_LIST);
    if (v->k == V_UNDEF || v->k == V_NONE) {
        if (v->k == V_NONE) fail_at(e, NL_ERR_INVALID, pos, "cannot iterate over none");
        return l;
    }
    if (v->k == V_DICT) {
        for (size_t i = 0; i < v->n; i++) list_push(e, l, v->keys[i]);
        return l;
    }
    if (v->k == V_STR) {
        size_t count = cp_len(v->s, v->n);
        for (size_t i = 0; i < count; i++) {
            size_t a = cp_off(v->s, v->n, i), b = cp_off(v->s, v->n, i + 1);
            list_push(e, l, sub(e, v, a, b));
        }
        return l;
    }
    fail_at(e, NL_ERR_INVALID, pos, "a %s is not iterable", type_name(v));
    return NULL;
}

typedef struct args {
    val **pos;
    int npos;
    const char **kwn;
    val **kwv;
    int nkw;
} args;

static args eval_args(rctx *r, frame *f, node *call) {
    args a = {0};
    a.pos = alloc(r->e, sizeof(val *) * (size_t)(call->nargs + 1));
    a.kwn = alloc(r->e, sizeof(char *) * (size_t)(call->nargs + 1));
    a.kwv = alloc(r->e, sizeof(val *) * (size_t)(call->nargs + 1));
    for (int i = 0; i < call->nargs; i++) {
        val *v = eval(r, f, call->args[i]);
        if (call->names && call->names[i]) {
            a.kwn[a.nkw] = call->names[i];
            a.kwv[a.nkw++] = v;
        } else {
            a.pos[a.npos++] = v;
        }
    }
    return a;
}

/* argument i (positional) or keyword `name`, or NULL */
static val *arg(const args *a, int i, const char *name) {
    if (i >= 0 && i < a->npos) return a->pos[i];
    for (int k = 0; k < a->nkw; k++)
        if (name && !strcmp(a->kwn[k], name)) return a->kwv[k];
    return NULL;
}

static val *need_str(rctx *r, val *v, size_t pos, const char *what) {
    if (!v || v->k != V_STR)
        fail_at(r->e, NL_ERR_INVALID, pos, "%s expects a string, got a %s", what, v ? type_name(v) : "nothing");
    return v;
}

static int apply_test(rctx *r, const char *name, val *v, const args *a, size_t pos);

static val *call_method(rctx *r, val *m, const args *a, size_t pos) {
    errctx *e = r->e;
    val *self = m->self;
    const char *name = m->s;
    if (self->k == V_DICT) {
        if (!strcmp(name, "items") || !strcmp(name, "keys") || !strcmp(name, "values")) {
            val *l = newv(e, V_LIST);
            for (size_t i = 0; i < self->n; i++) {
                if (name[0] == 'k')
                    list_push(e, l, self->keys[i]);
                else if (name[0] == 'v')
                    list_push(e, l, self->items[i]);
                else {
                    val *t = newv(e, V_LIST);
                    t->tuple = 1;
                    list_push(e, t, self->keys[i]);
                    list_push(e, t, self->items[i]);
                    list_push(e, l, t);
                }
            }
            return l;
        }
        /* get */
        val *k = arg(a, 0, "key");
        if (!k) fail_at(e, NL_ERR_INVALID, pos, "get() needs a key");
        int64_t i = dict_find(self, k);
        if (i >= 0) return self->items[i];
        val *d = arg(a, 1, "default");
        return d ? d : &V_NONE_V;
    }
    /* string methods */
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        val *chars = arg(a, 0, "chars");
        if (chars && chars->k == V_NONE) chars = NULL;
        if (chars) need_str(r, chars, pos, name);
        return strip(e, self, chars, name[0] != 'r', name[0] != 'l');
    }
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        val *x = arg(a, 0, "prefix");
        if (!x) fail_at(e, NL_ERR_INVALID, pos, "%s() needs an argument", name);
        val one = *x, *cands[1] = {&one};
        val **list = cands;
        size_t count = 1;
        if (x->k == V_LIST && x->tuple) {
            list = x->items;
            count = x->n;
        }
        for (size_t k = 0; k < count; k++) {
            val *p = need_str(r, list[k], pos, name);
            if (p->n > self->n) continue;
            if (name[0] == 's' ? !memcmp(self->s, p->s, p->n) : !memcmp(self->s + self->n - p->n, p->s, p->n))
                return &V_TRUE_V;
        }
        return &V_FALSE_V;
    }
    if (!strcmp(name, "upper")) return case_map(e, self, 1);
    if (!strcmp(name, "lower")) return case_map(e, self, 0);
    if (!strcmp(name, "title")) return case_map(e, self, 2);
    if (!strcmp(name, "capitalize")) {
        val *low = case_map(e, self, 0);
        return case_map(e, low, 3);
    }
    if (!strcmp(name, "replace")) {
        val *from = need_str(r, arg(a, 0, "old"), pos, name), *to = need_str(r, arg(a, 1, "new"), pos, name);
        val *cnt = arg(a, 2, "count");
        return replace(e, self, from, to, cnt ? as_int(r, cnt, pos, "count") : -1);
    }
    if (!strcmp(name, "find") || !strcmp(name, "count")) {
        val *x = need_str(r, arg(a, 0, "sub"), pos, name);
        int64_t found = -1, cnt = 0;
        for (size_t i = 0; i + x->n <= self->n;) {
            if (!memcmp(self->s + i, x->s, x->n)) {
                if (found < 0) found = (int64_t)cp_len(self->s, i);
                cnt++;
                i += x->n ? x->n : 1;
            } else {
                i++;
            }
        }
        return vint(e, name[0] == 'f' ? found : cnt);
    }
    if (!strcmp(name, "split")) {
        val *sep = arg(a, 0, "sep");
        val *mx = arg(a, 1, "maxsplit");
        int64_t maxsplit = mx ? as_int(r, mx, pos, "maxsplit") : -1;
        val *l = newv(e, V_LIST);
        if (!sep || sep->k == V_NONE) {
            size_t i = 0, sl;
            int64_t done = 0;
            while (i < self->n) {
                while (i < self->n && uspace(self->s + i, self->n - i, &sl)) i += sl;
                if (i >= self->n) break;
                if (maxsplit >= 0 && done >= maxsplit) {
                    size_t end = self->n;
                    list_push(e, l, strip(e, sub(e, self, i, end), NULL, 0, 1));
                    break;
                }
                size_t j = i;
                while (j < self->n && !uspace(self->s + j, self->n - j, &sl)) j++;
                list_push(e, l, sub(e, self, i, j));
                done++;
                i = j;
            }
            return l;
        }
        need_str(r, sep, pos, "split");
        if (sep->n == 0) fail_at(e, NL_ERR_INVALID, pos, "split(): empty separator");
        size_t i = 0, start = 0;
        int64_t done = 0;
        while (i + sep->n <= self->n) {
            if ((maxsplit < 0 || done < maxsplit) && !memcmp(self->s + i, sep->s, sep->n)) {
                list_push(e, l, sub(e, self, start, i));
                i += sep->n;
                start = i;
                done++;
            } else {
                i++;
            }
        }
        list_push(e, l, sub(e, self, start, self->n));
        return l;
    }
    fail_at(e, NL_ERR_INVALID, pos, "unknown method '%s'", name);
    return NULL;
}

static val *call_func(rctx *r, val *fn, const args *a, size_t pos) {
    errctx *e = r->e;
    switch (fn->i) {
    case F_RAISE: {
        val *m = arg(a, 0, "message");
        val *ms = m ? to_str(e, m) : vstr(e, "", 0);
        char msg[300];
        snprintf(msg, sizeof msg, "%.*s", (int)(ms->n < 299 ? ms->n : 299), ms->s);
        fail_at(e, NL_ERR_INVALID, pos, "raise_exception: %s", msg);
        return NULL;
    }
    case F_STRFTIME: {
        val *fmt = need_str(r, arg(a, 0, "format"), pos, "strftime_now");
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char buf[256];
        char *f = dupn(e, fmt->s, fmt->n);
        size_t n = strftime(buf, sizeof buf, f, &tm);
        return vstr_copy(e, buf, n);
    }
    case F_NAMESPACE:
    case F_DICT: {
        val *d = newv(e, V_DICT);
        d->ns = fn->i == F_NAMESPACE;
        for (int i = 0; i < a->npos; i++) {
            val *src = a->pos[i];
            if (src->k != V_DICT)
                fail_at(e, NL_ERR_INVALID, pos, "namespace()/dict() takes a dict, got a %s", type_name(src));
            for (size_t k = 0; k < src->n; k++) dict_set(e, d, src->keys[k], src->items[k]);
        }
        for (int k = 0; k < a->nkw; k++) dict_set(e, d, vstr_c(e, a->kwn[k]), a->kwv[k]);
        return d;
    }
    case F_RANGE: {
        int64_t start = 0, stop, step = 1;
        if (a->npos == 1)
            stop = as_int(r, a->pos[0], pos, "range()");
        else if (a->npos >= 2) {
            start = as_int(r, a->pos[0], pos, "range()");
            stop = as_int(r, a->pos[1], pos, "range()");
            if (a->npos >= 3) step = as_int(r, a->pos[2], pos, "range()");
        } else {
            fail_at(e, NL_ERR_INVALID, pos, "range() needs an argument");
            return NULL;
        }
        if (step == 0) fail_at(e, NL_ERR_INVALID, pos, "range() step cannot be zero");
        val *l = newv(e, V_LIST);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (l->n >= 1000000) fail_at(e, NL_ERR_INVALID, pos, "range() longer than 1000000");
            list_push(e, l, vint(e, i));
        }
        return l;
    }
    case F_METHOD: return call_method(r, fn, a, pos);
    }
    fail_at(e, NL_ERR_INVALID, pos, "not callable");
    return NULL;
}

static int cmp_vals(rctx *r, val *a, val *b, size_t pos) {
    if (is_num(a) && is_num(b)) {
        double x = num(a), y = num(b);
        return x < y ? -1 : x > y;
    }
    if (a->k == V_STR && b->k == V_STR) {
        size_t m = a->n < b->n ? a->n : b->n;
        int c = memcmp(a->s, b->s, m);
        if (c) return c < 0 ? -1 : 1;
        return a->n < b->n ? -1 : a->n > b->n;
    }
    fail_at(r->e, NL_ERR_INVALID, pos, "cannot order a %s and a %s", type_name(a), type_name(b));
    return 0;
}

static int contains(rctx *r, val *hay, val *needle, size_t pos) {
    errctx *e = r->e;
    if (hay->k == V_STR) {
        if (needle->k != V_STR)
            fail_at(e, NL_ERR_INVALID, pos, "'in <string>' needs a string on the left, got a %s", type_name(needle));
        if (needle->n == 0) return 1;
        for (size_t i = 0; i + needle->n <= hay->n; i++)
            if (!memcmp(hay->s + i, needle->s, needle->n)) return 1;
        return 0;
    }
    if (hay->k == V_LIST) {
        for (size_t i = 0; i < hay->n; i++)
            if (val_eq(hay->items[i], needle)) return 1;
        return 0;
    }
    if (hay->k == V_DICT) return dict_find(hay, needle) >= 0;
    if (hay->k == V_UNDEF) return 0;
    fail_at(e, NL_ERR_INVALID, pos, "'in' needs a string, list or dict on the right, got a %s", type_name(hay));
    return 0;
}

static val *arith(rctx *r, const char *op, val *a, val *b, size_t pos) {
    errctx *e = r->e;
    if (!strcmp(op, "~")) return concat(e, to_str(e, a), to_str(e, b));
    if (a->k == V_UNDEF || b->k == V_UNDEF) {
        const val *u = a->k == V_UNDEF ? a : b;
        if (u->s) fail_at(e, NL_ERR_INVALID, pos, "'%s' is undefined (operand of '%s')", u->s, op);
        fail_at(e, NL_ERR_INVALID, pos, "an undefined value is an operand of '%s'", op);
    }
    if (!strcmp(op, "+")) {
        if (a->k == V_STR && b->k == V_STR) return concat(e, a, b);
        if (a->k == V_LIST && b->k == V_LIST) {
            val *l = newv(e, V_LIST);
            for (size_t i = 0; i < a->n; i++) list_push(e, l, a->items[i]);
            for (size_t i = 0; i < b->n; i++) list_push(e, l, b->items[i]);
            return l;
        }
    }
    if (!strcmp(op, "*") && ((a->k == V_STR && (b->k == V_INT || b->k == V_BOOL)) ||
                             (b->k == V_STR && (a->k == V_INT || a->k == V_BOOL)))) {
        val *s = a->k == V_STR ? a : b;
        int64_t k = a->k == V_STR ? b->i : a->i;
        if (k <= 0) return vstr(e, "", 0);
        if ((uint64_t)k * s->n > (1u << 26)) fail_at(e, NL_ERR_INVALID, pos, "string repetition too long");
        char *p = alloc(e, s->n * (size_t)k + 1);
        for (int64_t i = 0; i < k; i++) memcpy(p + (size_t)i * s->n, s->s, s->n);
        p[s->n * (size_t)k] = 0;
        return with_taint(vstr(e, p, s->n * (size_t)k), s);
    }
    if (!is_num(a) || !is_num(b))
        fail_at(e, NL_ERR_INVALID, pos, "unsupported operand types for %s: %s and %s", op, type_name(a), type_name(b));
    int ints = a->k != V_FLOAT && b->k != V_FLOAT;
    if (ints) {
        int64_t x = a->i, y = b->i;
        if (!strcmp(op, "+")) return vint(e, x + y);
        if (!strcmp(op, "-")) return vint(e, x - y);
        if (!strcmp(op, "*")) return vint(e, x * y);
        if (!strcmp(op, "/")) {
            if (y == 0) fail_at(e, NL_ERR_INVALID, pos, "division by zero");
            return vfloat(e, (double)x / (double)y);
        }
        if (!strcmp(op, "//") || !strcmp(op, "%")) {
            if (y == 0) fail_at(e, NL_ERR_INVALID, pos, "integer division or modulo by zero");
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q--;
                m += y;
            }
            return vint(e, op[0] == '%' ? m : q);
        }
        if (!strcmp(op, "**")) {
            if (y < 0) return vfloat(e, pow((double)x, (double)y));
            int64_t p = 1;
            for (int64_t i = 0; i < y && i < 64; i++) p *= x;
            return vint(e, p);
        }
    }
    double x = num(a), y = num(b);
    if (!strcmp(op, "+")) return vfloat(e, x + y);
    if (!strcmp(op, "-")) return vfloat(e, x - y);
    if (!strcmp(op, "*")) return vfloat(e, x * y);
    if (!strcmp(op, "**")) return vfloat(e, pow(x, y));
    if (y == 0) fail_at(e, NL_ERR_INVALID, pos, "float division by zero");
    if (!strcmp(op, "/")) return vfloat(e, x / y);
    if (!strcmp(op, "//")) return vfloat(e, floor(x / y));
    double m = fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return vfloat(e, m);
}

static int apply_test(rctx *r, const char *name, val *v, const args *a, size_t pos) {
    val *x = arg(a, 0, NULL);
    if (!strcmp(name, "defined")) return v->k != V_UNDEF;
    if (!strcmp(name, "undefined")) return v->k == V_UNDEF;
    if (!strcmp(name, "none")) return v->k == V_NONE;
    if (!strcmp(name, "string")) return v->k == V_STR;
    if (!strcmp(name, "mapping")) return v->k == V_DICT;
    if (!strcmp(name, "iterable")) return v->k == V_LIST || v->k == V_DICT || v->k == V_STR;
    if (!strcmp(name, "sequence")) return v->k == V_LIST || v->k == V_DICT || v->k == V_STR;
    if (!strcmp(name, "number")) return is_num(v);
    if (!strcmp(name, "integer")) return v->k == V_INT;
    if (!strcmp(name, "float")) return v->k == V_FLOAT;
    if (!strcmp(name, "boolean")) return v->k == V_BOOL;
    if (!strcmp(name, "true")) return v->k == V_BOOL && v->i;
    if (!strcmp(name, "false")) return v->k == V_BOOL && !v->i;
    if (!strcmp(name, "callable")) return v->k == V_FUNC;
    if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        int64_t i = as_int(r, v, pos, name);
        return (((i % 2) + 2) % 2) == (name[0] == 'o');
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (v->k != V_STR) return 0;
        val *m = case_map(r->e, v, name[0] == 'u');
        return m->n == v->n && !memcmp(m->s, v->s, v->n);
    }
    if (!x) fail_at(r->e, NL_ERR_INVALID, pos, "test '%s' %s", name, "is unknown or needs an argument");
    if (!strcmp(name, "divisibleby")) {
        int64_t d = as_int(r, x, pos, name);
        return d != 0 && as_int(r, v, pos, name) % d == 0;
    }
    if (!strcmp(name, "equalto") || !strcmp(name, "eq") || !strcmp(name, "==") || !strcmp(name, "sameas"))
        return val_eq(v, x);
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) return !val_eq(v, x);
    if (!strcmp(name, "lt") || !strcmp(name, "<") || !strcmp(name, "lessthan")) return cmp_vals(r, v, x, pos) < 0;
    if (!strcmp(name, "gt") || !strcmp(name, ">") || !strcmp(name, "greaterthan")) return cmp_vals(r, v, x, pos) > 0;
    if (!strcmp(name, "in")) return contains(r, x, v, pos);
    fail_at(r->e, NL_ERR_INVALID, pos, "unknown test '%s'", name);
    return 0;
}

static val *attr_path(rctx *r, val *v, val *attr, size_t pos) {
    need_str(r, attr, pos, "attribute");
    val *cur = v;
    size_t i = 0;
    while (i <= attr->n) {
        size_t j = i;
        while (j < attr->n && attr->s[j] != '.') j++;
        if (cur->k == V_UNDEF) return cur;
        cur = get_item(r, cur, vstr(r->e, attr->s + i, j - i), pos);
        i = j + 1;
    }
    return cur;
}

static val *apply_filter(rctx *r, const char *name, val *v, const args *a, size_t pos);

static val *select_items(rctx *r, val *v, const args *a, int by_attr, int keep, size_t pos) {
    errctx *e = r->e;
    val *items = iter_items(r, v, pos);
    val *out = newv(e, V_LIST);
    int first_test = by_attr ? 1 : 0;
    const char *test = NULL;
    if (a->npos > first_test)
        test = dupn(e, need_str(r, a->pos[first_test], pos, "test name")->s, a->pos[first_test]->n);
    args targs = {0};
    targs.pos = a->pos + first_test + 1;
    targs.npos = a->npos > first_test + 1 ? a->npos - first_test - 1 : 0;
    for (size_t i = 0; i < items->n; i++) {
        val *x = items->items[i];
        if (by_attr) x = attr_path(r, x, a->pos[0], pos);
        int t = test ? apply_test(r, test, x, &targs, pos) : truthy(x);
        if (t == keep) list_push(e, out, items->items[i]);
    }
    return out;
}

static val *apply_filter(rctx *r, const char *name, val *v, const args *a, size_t pos) {
    errctx *e = r->e;
    if (!strcmp(name, "safe") || !strcmp(name, "e") || !strcmp(name, "escape") || !strcmp(name, "forceescape")) {
        if (name[0] == 's') return v;
        /* markupsafe escape */
        val *s = to_str(e, v);
        outbuf *o = tmp_buf(e);
        for (size_t i = 0; i < s->n; i++) {
            char c = s->s[i];
            const char *rep = c == '&'    ? "&amp;"
                              : c == '<'  ? "&lt;"
                              : c == '>'  ? "&gt;"
                              : c == '"'  ? "&#34;"
                              : c == '\'' ? "&#39;"
                                          : NULL;
            if (rep)
                ob_puts(e, o, rep);
            else
                ob_put(e, o, &c, 1);
        }
        return with_taint(tmp_finish(e, o), s);
    }
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        val *def = arg(a, 0, "default_value");
        val *boolean = arg(a, 1, "boolean");
        if (!def) def = vstr(e, "", 0);
        if (v->k == V_UNDEF || (boolean && truthy(boolean) && !truthy(v))) return def;
        return v;
    }
    if (v->k == V_UNDEF && strcmp(name, "length") && strcmp(name, "count") && strcmp(name, "string") &&
        strcmp(name, "list") && strcmp(name, "trim")) {
        if (v->s) fail_at(e, NL_ERR_INVALID, pos, "'%s' is undefined (filter '%s')", v->s, name);
        fail_at(e, NL_ERR_INVALID, pos, "filter '%s' of an undefined value", name);
    }
    if (!strcmp(name, "trim")) {
        val *s = to_str(e, v);
        val *chars = arg(a, 0, "chars");
        if (chars && chars->k == V_NONE) chars = NULL;
        return strip(e, s, chars, 1, 1);
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        if (v->k == V_STR) return vint(e, (int64_t)cp_len(v->s, v->n));
        if (v->k == V_LIST || v->k == V_DICT) return vint(e, (int64_t)v->n);
        if (v->k == V_UNDEF) return vint(e, 0);
        fail_at(e, NL_ERR_INVALID, pos, "a %s has no length", type_name(v));
    }
    if (!strcmp(name, "tojson")) {
        val *ind = arg(a, 0, "indent");
        int indent = ind && ind->k != V_NONE ? (int)as_int(r, ind, pos, "indent") : -1;
        val *sk = arg(a, -1, "sort_keys");
        val *sep = arg(a, -1, "separators");
        const char *item_sep = indent >= 0 ? "," : ", ", *key_sep = ": ";
        if (sep && sep->k == V_LIST && sep->n == 2 && sep->items[0]->k == V_STR && sep->items[1]->k == V_STR) {
            item_sep = dupn(e, sep->items[0]->s, sep->items[0]->n);
            key_sep = dupn(e, sep->items[1]->s, sep->items[1]->n);
        }
        outbuf *o = tmp_buf(e);
        json_into(e, o, v, indent, 0, item_sep, key_sep, sk && truthy(sk), pos);
        return with_taint(tmp_finish(e, o), v);
    }
    if (!strcmp(name, "string")) return to_str(e, v);
    if (!strcmp(name, "lower") || !strcmp(name, "upper") || !strcmp(name, "title") || !strcmp(name, "capitalize")) {
        val *s = to_str(e, v);
        if (name[0] == 'l') return case_map(e, s, 0);
        if (name[0] == 'u') return case_map(e, s, 1);
        if (name[0] == 't') return case_map(e, s, 2);
        return case_map(e, case_map(e, s, 0), 3);
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        val *items = iter_items(r, v, pos);
        if (!items->n) return vundef(e, NULL);
        return items->items[name[0] == 'f' ? 0 : items->n - 1];
    }
    if (!strcmp(name, "list")) return iter_items(r, v, pos);
    if (!strcmp(name, "reverse")) {
        if (v->k == V_STR) {
            val *step = vint(e, -1);
            return slice(r, v, NULL, NULL, step, pos);
        }
        val *items = iter_items(r, v, pos), *l = newv(e, V_LIST);
        for (size_t i = items->n; i-- > 0;) list_push(e, l, items->items[i]);
        return l;
    }
    if (!strcmp(name, "unique")) {
        val *items = iter_items(r, v, pos), *l = newv(e, V_LIST);
        for (size_t i = 0; i < items->n; i++)
            if (!contains(r, l, items->items[i], pos)) list_push(e, l, items->items[i]);
        return l;
    }
    if (!strcmp(name, "join")) {
        val *sep = arg(a, 0, "d");
        val *attr = arg(a, 1, "attribute");
        val *items = iter_items(r, v, pos);
        val *acc = vstr(e, "", 0);
        for (size_t i = 0; i < items->n; i++) {
            if (i && sep) acc = arith(r, "~", acc, sep, pos);
            val *x = attr ? attr_path(r, items->items[i], attr, pos) : items->items[i];
            acc = arith(r, "~", acc, x, pos);
        }
        return acc;
    }
    if (!strcmp(name, "replace")) {
        val *s = to_str(e, v);
        val *from = to_str(e, arg(a, 0, "old") ? arg(a, 0, "old") : vstr(e, "", 0));
        val *to = to_str(e, arg(a, 1, "new") ? arg(a, 1, "new") : vstr(e, "", 0));
        val *cnt = arg(a, 2, "count");
        return replace(e, s, from, to, cnt && cnt->k != V_NONE ? as_int(r, cnt, pos, "count") : -1);
    }
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr")) {
        if (a->npos < 1) fail_at(e, NL_ERR_INVALID, pos, "%s needs an attribute name", name);
        return select_items(r, v, a, 1, name[0] == 's', pos);
    }
    if (!strcmp(name, "select") || !strcmp(name, "reject")) return select_items(r, v, a, 0, name[0] == 's', pos);
    if (!strcmp(name, "map")) {
        val *items = iter_items(r, v, pos), *l = newv(e, V_LIST);
        val *attr = arg(a, -1, "attribute");
        val *def = arg(a, -1, "default");
        for (size_t i = 0; i < items->n; i++) {
            val *x;
            if (attr) {
                x = attr_path(r, items->items[i], attr, pos);
                if (x->k == V_UNDEF && def) x = def;
            } else {
                if (a->npos < 1) fail_at(e, NL_ERR_INVALID, pos, "map needs a filter name or attribute=");
                val *fname = need_str(r, a->pos[0], pos, "map");
                args fa = {0};
                fa.pos = a->pos + 1;
                fa.npos = a->npos - 1;
                x = apply_filter(r, dupn(e, fname->s, fname->n), items->items[i], &fa, pos);
            }
            list_push(e, l, x);
        }
        return l;
    }
    if (!strcmp(name, "items")) {
        if (v->k != V_DICT) fail_at(e, NL_ERR_INVALID, pos, "items of a %s", type_name(v));
        val m = {.k = V_FUNC, .i = F_METHOD, .s = "items", .self = v};
        args none = {0};
        return call_method(r, &m, &none, pos);
    }
    if (!strcmp(name, "int")) {
        if (v->k == V_INT) return v;
        if (v->k == V_BOOL) return vint(e, v->i);
        if (v->k == V_FLOAT) return vint(e, (int64_t)v->f);
        if (v->k == V_STR) {
            char *s = dupn(e, v->s, v->n), *end;
            long long x = strtoll(s, &end, 10);
            if (end != s && !*end) return vint(e, x);
            double d = strtod(s, &end);
            if (end != s && !*end) return vint(e, (int64_t)d);
        }
        val *def = arg(a, 0, "default");
        return def ? def : vint(e, 0);
    }
    if (!strcmp(name, "float")) {
        if (is_num(v)) return vfloat(e, num(v));
        if (v->k == V_STR) {
            char *s = dupn(e, v->s, v->n), *end;
            double d = strtod(s, &end);
            if (end != s && !*end) return vfloat(e, d);
        }
        val *def = arg(a, 0, "default");
        return def ? def : vfloat(e, 0);
    }
    if (!strcmp(name, "abs")) {
        if (v->k == V_INT || v->k == V_BOOL) return vint(e, v->i < 0 ? -v->i : v->i);
        if (v->k == V_FLOAT) return vfloat(e, fabs(v->f));
        fail_at(e, NL_ERR_INVALID, pos, "abs of a %s", type_name(v));
    }
    fail_at(e, NL_ERR_INVALID, pos, "unknown filter '%s'", name);
    return NULL;
}

static val *eval(rctx *r, frame *f, node *n) {
    errctx *e = r->e;
    switch (n->kind) {
    case N_STR: return vstr(e, n->s, n->n);
    case N_INT: return vint(e, n->i);
    case N_FLOAT: return vfloat(e, n->f);
    case N_BOOL: return vbool((int)n->i);
    case N_NONE: return &V_NONE_V;
    case N_NAME: {
        val *v = lookup(f, n->s);
        return v ? v : vundef(e, n->s);
    }
    case N_ATTR: return get_attr(r, eval(r, f, n->a), n->s, n->pos);
    case N_ITEM: return get_item(r, eval(r, f, n->a), eval(r, f, n->b), n->pos);
    case N_SLICE:
        return slice(r, eval(r, f, n->a), n->b ? eval(r, f, n->b) : NULL, n->c ? eval(r, f, n->c) : NULL,
                     n->d ? eval(r, f, n->d) : NULL, n->pos);
    case N_CALL: {
        val *fn = eval(r, f, n->a);
        if (fn->k != V_FUNC) {
            if (fn->k == V_UNDEF && n->a->kind == N_NAME)
                fail_at(e, NL_ERR_INVALID, n->pos, "'%s' is undefined (called as a function)", n->a->s);
            if (fn->k == V_UNDEF && n->a->kind == N_ATTR)
                fail_at(e, NL_ERR_INVALID, n->pos, "no method '%s' on a %s", n->a->s, type_name(eval(r, f, n->a->a)));
            fail_at(e, NL_ERR_INVALID, n->pos, "a %s is not callable", type_name(fn));
        }
        args a = eval_args(r, f, n);
        return call_func(r, fn, &a, n->pos);
    }
    case N_FILTER: {
        val *v = eval(r, f, n->a);
        args a = eval_args(r, f, n);
        return apply_filter(r, n->s, v, &a, n->pos);
    }
    case N_TEST: {
        val *v = eval(r, f, n->a);
        args a = eval_args(r, f, n);
        int t = apply_test(r, n->s, v, &a, n->pos);
        return vbool(n->i ? !t : t);
    }
    case N_BIN: {
        val *a = eval(r, f, n->a), *b = eval(r, f, n->b);
        const char *op = n->s;
        if (!strcmp(op, "==")) return vbool(val_eq(a, b));
        if (!strcmp(op, "!=")) return vbool(!val_eq(a, b));
        if (!strcmp(op, "<")) return vbool(cmp_vals(r, a, b, n->pos) < 0);
        if (!strcmp(op, "<=")) return vbool(cmp_vals(r, a, b, n->pos) <= 0);
        if (!strcmp(op, ">")) return vbool(cmp_vals(r, a, b, n->pos) > 0);
        if (!strcmp(op, ">=")) return vbool(cmp_vals(r, a, b, n->pos) >= 0);
        if (!strcmp(op, "in")) return vbool(contains(r, b, a, n->pos));
        if (!strcmp(op, "notin")) return vbool(!contains(r, b, a, n->pos));
        return arith(r, op, a, b, n->pos);
    }
    case N_NOT: return vbool(!truthy(eval(r, f, n->a)));
    case N_NEG:
    case N_POS: {
        val *v = eval(r, f, n->a);
        if (v->k == V_INT || v->k == V_BOOL) return vint(e, n->kind == N_NEG ? -v->i : v->i);
        if (v->k == V_FLOAT) return vfloat(e, n->kind == N_NEG ? -v->f : v->f);
        fail_at(e, NL_ERR_INVALID, n->pos, "bad operand type for unary %c: %s", n->kind == N_NEG ? '-' : '+',
                type_name(v));
        return NULL;
    }
    case N_AND: {
        val *a = eval(r, f, n->a);
        return truthy(a) ? eval(r, f, n->b) : a;
    }
    case N_OR: {
        val *a = eval(r, f, n->a);
        return truthy(a) ? a : eval(r, f, n->b);
    }
    case N_COND:
        if (truthy(eval(r, f, n->b))) return eval(r, f, n->a);
        return n->c ? eval(r, f, n->c) : vundef(e, NULL);
    case N_LIST:
    case N_TUPLE: {
        val *l = newv(e, V_LIST);
        l->tuple = n->kind == N_TUPLE;
        for (int i = 0; i < n->nargs; i++) list_push(e, l, eval(r, f, n->args[i]));
        return l;
    }
    case N_DICT: {
        val *d = newv(e, V_DICT);
        for (int i = 0; i + 1 < n->nargs; i += 2) dict_set(e, d, eval(r, f, n->args[i]), eval(r, f, n->args[i + 1]));
        return d;
    }
    default: fail_at(e, NL_ERR_INVALID, n->pos, "internal: not an expression");
    }
    return NULL;
}

static void exec_list(rctx *r, frame *f, node *n);

static void assign_targets(rctx *r, frame *f, const char **names, int count, val *v, size_t pos) {
    if (count == 1) {
        bind(r->e, f, names[0], v);
        return;
    }
    if (v->k != V_LIST || (int)v->n != count)
        fail_at(r->e, NL_ERR_INVALID, pos, "cannot unpack a %s into %d names", type_name(v), count);
    for (int i = 0; i < count; i++) bind(r->e, f, names[i], v->items[i]);
}

static void exec_for(rctx *r, frame *f, node *n) {
    errctx *e = r->e;
    val *items = iter_items(r, eval(r, f, n->a), n->a->pos);
    frame lf = {.up = f};
    if (n->b) { /* loop filter: items that pass, before loop.* counts them */
        val *kept = newv(e, V_LIST);
        for (size_t i = 0; i < items->n; i++) {
            frame tf = {.up = f};
            assign_targets(r, &tf, n->names, n->nnames, items->items[i], n->pos);
            if (truthy(eval(r, &tf, n->b))) list_push(e, kept, items->items[i]);
        }
        items = kept;
    }
    if (items->n == 0) {
        if (n->orelse) exec_list(r, &lf, n->orelse);
        return;
    }
    size_t len = items->n;
    for (size_t i = 0; i < len; i++) {
        if ((r->steps += 1) > MAX_STEPS)
            fail_at(e, NL_ERR_INVALID, n->pos, "the template ran more than %d statements (a runaway loop?)", MAX_STEPS);
        val *loop = newv(e, V_DICT);
        dict_set(e, loop, vstr_c(e, "index0"), vint(e, (int64_t)i));
        dict_set(e, loop, vstr_c(e, "index"), vint(e, (int64_t)i + 1));
        dict_set(e, loop, vstr_c(e, "revindex0"), vint(e, (int64_t)(len - 1 - i)));
        dict_set(e, loop, vstr_c(e, "revindex"), vint(e, (int64_t)(len - i)));
        dict_set(e, loop, vstr_c(e, "first"), vbool(i == 0));
        dict_set(e, loop, vstr_c(e, "last"), vbool(i + 1 == len));
        dict_set(e, loop, vstr_c(e, "length"), vint(e, (int64_t)len));
        dict_set(e, loop, vstr_c(e, "previtem"), i ? items->items[i - 1] : vundef(e, NULL));
        dict_set(e, loop, vstr_c(e, "nextitem"), i + 1 < len ? items->items[i + 1] : vundef(e, NULL));
        loop->ns = 0;
        bind(e, &lf, "loop", loop);
        assign_targets(r, &lf, n->names, n->nnames, items->items[i], n->pos);
        exec_list(r, &lf, n->body);
        if (r->brk == 1) {
            r->brk = 0;
            break;
        }
        r->brk = 0;
    }
}

static void exec_list(rctx *r, frame *f, node *n) {
    errctx *e = r->e;
    for (; n && !r->brk; n = n->next) {
        if (++r->steps > MAX_STEPS)
            fail_at(e, NL_ERR_INVALID, n->pos, "the template ran more than %d statements (a runaway loop?)", MAX_STEPS);
        if (r->out->n > MAX_OUTPUT)
            fail_at(e, NL_ERR_INVALID, n->pos, "the template wrote more than %zu MiB", MAX_OUTPUT >> 20);
        switch (n->kind) {
        case N_TEXT: ob_put(e, r->out, n->s, n->n); break;
        case N_OUT: str_into(e, r->out, eval(r, f, n->a)); break;
        case N_IF:
            if (truthy(eval(r, f, n->a)))
                exec_list(r, f, n->body);
            else if (n->orelse)
                exec_list(r, f, n->orelse); /* else, or an elif as a nested if */
            break;
        case N_FOR: exec_for(r, f, n); break;
        case N_SET: {
            val *v = eval(r, f, n->a);
            if (n->nargs > 1) {
                if (v->k != V_LIST || (int)v->n != n->nargs)
                    fail_at(e, NL_ERR_INVALID, n->pos, "cannot unpack a %s into %d names", type_name(v), n->nargs);
            }
            for (int i = 0; i < n->nargs; i++) {
                val *x = n->nargs > 1 ? v->items[i] : v;
                node *t = n->args[i];
                if (t->kind == N_NAME) {
                    bind(e, f, t->s, x);
                } else {
                    val *obj = eval(r, f, t->a);
                    if (obj->k != V_DICT || !obj->ns)
                        fail_at(e, NL_ERR_INVALID, t->pos,
                                "cannot assign attribute '%s' of a %s (only of a namespace())", t->s, type_name(obj));
                    dict_set(e, obj, vstr_c(e, t->s), x);
                }
            }
            break;
        }
        case N_SETBLOCK: {
            outbuf *saved = r->out;
            outbuf *o = tmp_buf(e);
            o->track = saved->track;
            r->out = o;
            exec_list(r, f, n->body);
            r->out = saved;
            bind(e, f, n->args[0]->s, tmp_finish(e, o));
            break;
        }
        case N_BREAK: r->brk = 1; break;
        case N_CONTINUE: r->brk = 2; break;
        case N_BLOCK: exec_list(r, f, n->body); break;
        default: fail_at(e, NL_ERR_INVALID, n->pos, "internal: not a statement");
        }
    }
}

/* -- JSON context -- */

static val *from_json(errctx *e, const cJSON *j) {
    if (cJSON_IsNull(j)) return &V_NONE_V;
    if (cJSON_IsBool(j)) return vbool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9.007199254740992e15) return vint(e, (int64_t)d);
        return vfloat(e, d);
    }
    if (cJSON_IsString(j)) {
        val *v = vstr_c(e, j->valuestring);
        v->tk = 1; /* data: special-token text in it is not a special token */
        return v;
    }
    if (cJSON_IsArray(j)) {
        val *l = newv(e, V_LIST);
        for (const cJSON *c = j->child; c; c = c->next) list_push(e, l, from_json(e, c));
        return l;
    }
    val *d = newv(e, V_DICT);
    for (const cJSON *c = j->child; c; c = c->next) dict_set(e, d, vstr_c(e, c->string), from_json(e, c));
    return d;
}

static nl_status render(const nl_chat_template *t, const cJSON *vars, char **out, size_t *out_bytes,
                        unsigned char **from_data) {
    arena ar = {0};
    errctx e = {.src = t->source, .what = t->what, .ar = &ar, .limit = (size_t)256 << 20};
    outbuf o = {0};
    o.track = from_data != NULL;
    if (setjmp(e.jb)) {
        free(o.p);
        free(o.t);
        free_temps(&e);
        arena_free(&ar);
        return nl_fail(e.code, "%s", e.msg);
    }
    frame globals = {0};
    static const struct {
        const char *name;
        int id;
    } fns[] = {{"raise_exception", F_RAISE},
               {"strftime_now", F_STRFTIME},
               {"namespace", F_NAMESPACE},
               {"range", F_RANGE},
               {"dict", F_DICT}};
    for (size_t i = 0; i < sizeof fns / sizeof *fns; i++) {
        val *fn = newv(&e, V_FUNC);
        fn->i = fns[i].id;
        bind(&e, &globals, fns[i].name, fn);
    }
    frame ctx = {.up = &globals};
    bind(&e, &ctx, "tools", &V_NONE_V);
    bind(&e, &ctx, "documents", &V_NONE_V);
    bind(&e, &ctx, "add_generation_prompt", &V_FALSE_V);
    if (t->bos) bind(&e, &ctx, "bos_token", vstr_c(&e, t->bos));
    if (t->eos) bind(&e, &ctx, "eos_token", vstr_c(&e, t->eos));
    for (const cJSON *c = vars->child; c; c = c->next) bind(&e, &ctx, c->string, from_json(&e, c));
    rctx r = {.e = &e, .out = &o};
    ob_put(&e, &o, "", 0);
    exec_list(&r, &ctx, t->root);
    free_temps(&e);
    arena_free(&ar);
    *out = o.p;
    if (out_bytes) *out_bytes = o.n;
    if (from_data) *from_data = o.t;
    return NL_OK;
}

nl_status nl_chat_template_render_json(const nl_chat_template *t, const char *vars_json, size_t vars_bytes, char **out,
                                       size_t *out_bytes) {
    *out = NULL;
    cJSON *vars = cJSON_ParseWithLength(vars_json, vars_bytes);
    if (!vars || !cJSON_IsObject(vars)) {
        cJSON_Delete(vars);
        return nl_fail(NL_ERR_INVALID, "chat template %s: the variables are not a JSON object", t->what);
    }
    nl_status rc = render(t, vars, out, out_bytes, NULL);
    cJSON_Delete(vars);
    return rc;
}

nl_status nl_chat_template_apply(const nl_chat_template *t, const nl_chat_message *messages, int n_messages,
                                 int add_generation_prompt, char **out, size_t *out_bytes) {
    return nl_chat_template_apply_marked(t, messages, n_messages, add_generation_prompt, out, out_bytes, NULL);
}

nl_status nl_chat_template_apply_marked(const nl_chat_template *t, const nl_chat_message *messages, int n_messages,
                                        int add_generation_prompt, char **out, size_t *out_bytes,
                                        unsigned char **from_data) {
    *out = NULL;
    if (from_data) *from_data = NULL;
    cJSON *vars = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(vars, "messages");
    if (!vars || !msgs) {
        cJSON_Delete(vars);
        return nl_fail(NL_ERR_NOMEM, "chat template: out of memory");
    }
    for (int i = 0; i < n_messages; i++) {
        cJSON *m = cJSON_CreateObject();
        if (!m || !cJSON_AddStringToObject(m, "role", messages[i].role ? messages[i].role : "") ||
            !cJSON_AddStringToObject(m, "content", messages[i].content ? messages[i].content : "")) {
            cJSON_Delete(m);
            cJSON_Delete(vars);
            return nl_fail(NL_ERR_NOMEM, "chat template: out of memory");
        }
        cJSON_AddItemToArray(msgs, m);
    }
    cJSON_AddBoolToObject(vars, "add_generation_prompt", add_generation_prompt != 0);
    nl_status rc = render(t, vars, out, out_bytes, from_data);
    cJSON_Delete(vars);
    return rc;
}

/* ---- Hugging Face folders -------------------------------------------------------------------- */

static char *token_string(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? strdup(v->valuestring) : NULL;
}

nl_status nl_chat_template_load_hf(nl_chat_template **out, const char *dir) {
    *out = NULL;
    size_t dl = strlen(dir);
    char *jinja_path = malloc(dl + 32), *cfg_path = malloc(dl + 32);
    if (!jinja_path || !cfg_path) {
        free(jinja_path);
        free(cfg_path);
        return nl_fail(NL_ERR_NOMEM, "chat template: out of memory");
    }
    snprintf(jinja_path, dl + 32, "%s/chat_template.jinja", dir);
    snprintf(cfg_path, dl + 32, "%s/tokenizer_config.json", dir);
    char *text = NULL, *cfg_text = NULL;
    size_t text_bytes = 0, cfg_bytes = 0;
    cJSON *cfg = NULL;
    nl_status rc = NL_OK;
    const char *what = NULL;
    FILE *probe = fopen(cfg_path, "rb");
    if (probe) {
        fclose(probe);
        rc = nl_read_file(cfg_path, &cfg_text, &cfg_bytes);
        if (rc) goto done;
        cfg = cJSON_ParseWithLength(cfg_text, cfg_bytes);
        if (!cfg || !cJSON_IsObject(cfg)) {
            rc = nl_fail(NL_ERR_FORMAT, "%s: not a JSON object", cfg_path);
            goto done;
        }
    }
    probe = fopen(jinja_path, "rb");
    if (probe) {
        fclose(probe);
        char *file_text = NULL;
        rc = nl_read_file(jinja_path, &file_text, &text_bytes);
        if (rc) goto done;
        text = malloc(text_bytes + 1);
        if (text) memcpy(text, file_text, text_bytes + 1);
        nl_free(file_text);
        if (!text) {
            rc = nl_fail(NL_ERR_NOMEM, "%s: out of memory", jinja_path);
            goto done;
        }
        what = jinja_path;
    } else if (cfg) {
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
        if (cJSON_IsString(ct)) {
            text = strdup(ct->valuestring);
            text_bytes = text ? strlen(text) : 0;
        } else if (cJSON_IsArray(ct)) {
            for (const cJSON *c = ct->child; c; c = c->next) {
                const cJSON *nm = cJSON_GetObjectItemCaseSensitive(c, "name");
                const cJSON *tp = cJSON_GetObjectItemCaseSensitive(c, "template");
                if (cJSON_IsString(nm) && !strcmp(nm->valuestring, "default") && cJSON_IsString(tp)) {
                    text = strdup(tp->valuestring);
                    text_bytes = text ? strlen(text) : 0;
                }
            }
            if (!text) {
                rc = nl_fail(NL_ERR_FORMAT, "%s: chat_template is a list without a \"default\" entry", cfg_path);
                goto done;
            }
        } else if (ct && !cJSON_IsNull(ct)) {
            rc = nl_fail(NL_ERR_FORMAT, "%s: chat_template is neither a string nor a list", cfg_path);
            goto done;
        }
        if (text) what = cfg_path;
    }
    if (!text) {
        rc = nl_fail(NL_ERR_UNSUPPORTED,
                     "%s has no chat template (neither chat_template.jinja nor a \"chat_template\" in "
                     "tokenizer_config.json)",
                     dir);
        goto done;
    }
    rc = nl_chat_template_parse(out, text, text_bytes, what);
    if (rc) goto done;
    if (cfg) {
        char *bos = token_string(cfg, "bos_token"), *eos = token_string(cfg, "eos_token");
        rc = nl_chat_template_set_tokens(*out, bos, eos);
        free(bos);
        free(eos);
        if (rc) {
            nl_chat_template_free(*out);
            *out = NULL;
        }
    }
done:
    cJSON_Delete(cfg);
    nl_free(cfg_text);
    free(text);
    free(jinja_path);
    free(cfg_path);
    return rc;
}

/* The entry `key` (an id) of tokenizer.ggml.tokens as a new string, or NULL. */
static char *gguf_token(const nl_gguf_file *f, const char *key) {
    int64_t id = -1;
    const nl_gguf_kv *toks = nl_gguf_find_kv(f, "tokenizer.ggml.tokens");
    if (nl_gguf_get_int_def(f, key, -1, &id) || id < 0 || !toks || toks->type != NL_GGUF_ARRAY ||
        toks->arr_type != NL_GGUF_STRING || (uint64_t)id >= toks->n)
        return NULL;
    uint64_t len = 0;
    const char *s = nl_gguf_arr_str(toks, (uint64_t)id, &len);
    char *c = s ? malloc(len + 1) : NULL;
    if (c) {
        memcpy(c, s, len);
        c[len] = 0;
    }
    return c;
}

nl_status nl_chat_template_load_gguf(nl_chat_template **out, const char *path) {
    *out = NULL;
    nl_gguf_file f;
    NL_TRY(nl_gguf_open(&f, path));
    nl_status rc;
    const char *text = NULL;
    uint64_t len = 0;
    if (!nl_gguf_find_kv(&f, "tokenizer.chat_template")) {
        rc = nl_fail(NL_ERR_UNSUPPORTED, "%s has no chat template (no tokenizer.chat_template)", path);
    } else if (!(rc = nl_gguf_get_str(&f, "tokenizer.chat_template", &text, &len))) {
        size_t pl = strlen(path);
        char *what = malloc(pl + 32);
        if (!what) {
            rc = nl_fail(NL_ERR_NOMEM, "%s: out of memory", path);
        } else {
            snprintf(what, pl + 32, "%s tokenizer.chat_template", path);
            rc = nl_chat_template_parse(out, text, (size_t)len, what);
            free(what);
        }
        if (!rc) {
            char *bos = gguf_token(&f, "tokenizer.ggml.bos_token_id"),
                 *eos = gguf_token(&f, "tokenizer.ggml.eos_token_id");
            rc = nl_chat_template_set_tokens(*out, bos, eos);
            free(bos);
            free(eos);
            if (rc) {
                nl_chat_template_free(*out);
                *out = NULL;
            }
        }
    }
    nl_gguf_close(&f);
    return rc;
}
