/* Shared helpers of the command-line tool: errors, number parsing, JSON, tables. */
#include "cli.h"
#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int nl_cli_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("nanolm: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return NL_EXIT_USAGE;
}

int nl_cli_fail(const char *what) {
    fprintf(stderr, "nanolm: %s: %s\n", what, nl_last_error());
    return NL_EXIT_FAIL;
}

static int parse_double(const char *s, double *out, int si) {
    if (!s || !*s) return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (end == s || errno == ERANGE) return -1;
    if (si && *end) {
        double m = 1;
        switch (*end) {
        case 'k':
        case 'K': m = 1e3; break;
        case 'M':
        case 'm': m = 1e6; break;
        case 'B':
        case 'b':
        case 'G':
        case 'g': m = 1e9; break;
        case 'T':
        case 't': m = 1e12; break;
        default: return -1;
        }
        v *= m;
        end++;
    }
    if (*end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

int nl_cli_double(const char *opt, const char *s, double *out) {
    if (parse_double(s, out, 0)) return nl_cli_usage_error("invalid number '%s' for %s", s ? s : "", opt);
    return 0;
}

int nl_cli_double_si(const char *opt, const char *s, double *out) {
    if (parse_double(s, out, 1))
        return nl_cli_usage_error("invalid number '%s' for %s (examples: 7e9, 7B, 500M, 15T)", s ? s : "", opt);
    return 0;
}

int nl_cli_int(const char *opt, const char *s, int64_t min, int64_t max, int64_t *out) {
    if (!s || !*s) return nl_cli_usage_error("missing integer for %s", opt);
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end || errno == ERANGE || end == s) return nl_cli_usage_error("invalid integer '%s' for %s", s, opt);
    if (v < min || v > max)
        return nl_cli_usage_error("%s must be in [%lld, %lld], got %lld", opt, (long long)min, (long long)max, v);
    *out = v;
    return 0;
}

void nl_cli_getopt_reset(void) {
    optind = 0; /* glibc: 0 forces a full re-initialisation */
    opterr = 0;
}

/* ---- tables ---- */

static char *str_dup(const char *s) {
    size_t n = strlen(s ? s : "") + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s ? s : "", n);
    return d;
}

void nl_table_init(nl_table *t, int ncols, const char *const *header) {
    t->ncols = ncols;
    t->nrows = 0;
    t->cap = 16;
    t->cells = calloc((size_t)t->cap * (size_t)ncols, sizeof(char *));
    t->right = calloc((size_t)ncols, sizeof(int));
    if (!t->cells || !t->right) {
        t->ncols = 0;
        return;
    }
    for (int c = 0; c < ncols; c++) t->cells[c] = str_dup(header[c]);
    t->nrows = 1;
}

char **nl_table_new_row(nl_table *t) {
    if (t->ncols == 0) return NULL;
    if (t->nrows == t->cap) {
        char **nc = realloc(t->cells, (size_t)t->cap * 2 * (size_t)t->ncols * sizeof(char *));
        if (!nc) return NULL;
        t->cells = nc;
        t->cap *= 2;
    }
    return &t->cells[(size_t)t->nrows++ * (size_t)t->ncols];
}

void nl_table_print(nl_table *t, FILE *f) {
    if (t->ncols == 0) return;
    int *w = calloc((size_t)t->ncols, sizeof(int));
    if (!w) return;
    for (int r = 0; r < t->nrows; r++)
        for (int c = 0; c < t->ncols; c++) {
            int n = (int)strlen(t->cells[r * t->ncols + c]);
            if (n > w[c]) w[c] = n;
        }
    for (int r = 0; r < t->nrows; r++) {
        for (int c = 0; c < t->ncols; c++) {
            const char *s = t->cells[r * t->ncols + c];
            int right = r > 0 && t->right[c];
            int last = c == t->ncols - 1;
            if (last && !right)
                fprintf(f, c ? "  %s" : "%s", s); /* no trailing blanks */
            else
                fprintf(f, c ? "  %*s" : "%*s", right ? w[c] : -w[c], s);
        }
        fputc('\n', f);
        if (r == 0) {
            int tot = 0;
            for (int c = 0; c < t->ncols; c++) tot += w[c] + (c ? 2 : 0);
            for (int i = 0; i < tot; i++) fputc('-', f);
            fputc('\n', f);
        }
    }
    free(w);
}

void nl_table_free(nl_table *t) {
    for (int i = 0; i < t->nrows * t->ncols; i++) free(t->cells[i]);
    free(t->cells);
    free(t->right);
    memset(t, 0, sizeof *t);
}
