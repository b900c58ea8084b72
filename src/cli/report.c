/* One writer for every command's result: text table or JSON from one description (report.h). */
#include "report.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef enum { ITEM_KV, ITEM_NOTE, ITEM_TABLE, ITEM_HEAD } item_kind;

/* How deep objects may nest (nl_report_begin_object); deeper is a programming error. */
#define REPORT_MAX_DEPTH 8

typedef struct item {
    item_kind kind;
    int depth;          /* nesting level: text indented by 2 spaces per level */
    char *label, *text; /* ITEM_KV: label and formatted value; ITEM_NOTE: text */
    char *title;        /* ITEM_TABLE, ITEM_HEAD */
    nl_table table;     /* ITEM_TABLE: text cells */
    nl_report_col *cols;
    int ncols;
    int *vis;      /* ITEM_TABLE: per column, its index in the text table, or -1 (JSON only) */
    int json_only; /* ITEM_TABLE: every column is JSON only: no text table */
} item;

struct nl_report {
    char *title;
    cJSON *json;
    cJSON *stack[REPORT_MAX_DEPTH + 1]; /* open objects: stack[0] is json, stack[depth] the current */
    int depth;
    item *items;
    int nitems, cap;
    int oom;
    int gap; /* spaces between the label column and the values in the text form */
    /* the table being filled */
    item *cur;
    cJSON *cur_rows, *cur_row;
    int cur_col;
    char **cur_cells;
    int *cur_num; /* per column of the row being filled: the cell is a number (right-aligned) */
};

static char *sdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

char *nl_json_double(double v, char buf[32]) {
    if (!isfinite(v)) {
        strcpy(buf, "null");
        return buf;
    }
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, 32, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    return buf;
}

nl_report *nl_report_new(const char *title) {
    nl_report *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->title = sdup(title ? title : "");
    r->json = cJSON_CreateObject();
    r->stack[0] = r->json;
    r->gap = 2;
    if (!r->title || !r->json) {
        nl_report_free(r);
        return NULL;
    }
    return r;
}

static void end_row_if_partial(nl_report *r);

void nl_report_free(nl_report *r) {
    if (!r) return;
    for (int i = 0; i < r->nitems; i++) {
        item *it = &r->items[i];
        free(it->label);
        free(it->text);
        free(it->title);
        if (it->kind == ITEM_TABLE) nl_table_free(&it->table);
        free(it->cols);
        free(it->vis);
    }
    free(r->items);
    free(r->cur_cells);
    free(r->cur_num);
    cJSON_Delete(r->cur_row);
    cJSON_Delete(r->json);
    free(r->title);
    free(r);
}

static item *new_item(nl_report *r, item_kind kind) {
    if (r->nitems == r->cap) {
        int cap = r->cap ? 2 * r->cap : 16;
        item *ni = realloc(r->items, (size_t)cap * sizeof *ni);
        if (!ni) {
            r->oom = 1;
            return NULL;
        }
        r->items = ni;
        r->cap = cap;
        r->cur = NULL; /* pointers into items moved: the current table is found again below */
    }
    item *it = &r->items[r->nitems++];
    memset(it, 0, sizeof *it);
    it->kind = kind;
    it->depth = r->depth;
    return it;
}

static void add_kv(nl_report *r, const char *key, const char *label, const char *text, cJSON *value) {
    if (!r) {
        cJSON_Delete(value);
        return;
    }
    end_row_if_partial(r);
    r->cur = NULL;
    if (!key) { /* text only */
        cJSON_Delete(value);
        if (!label) r->oom = 1; /* neither JSON nor text: a programming error */
    } else if (!value || !cJSON_AddItemToObject(r->stack[r->depth], key, value)) {
        cJSON_Delete(value);
        r->oom = 1;
        return;
    }
    if (label && !*label) return; /* JSON only */
    item *it = new_item(r, ITEM_KV);
    if (!it) return;
    it->label = sdup(label ? label : key);
    it->text = sdup(text);
    if (!it->label || !it->text) r->oom = 1;
}

void nl_report_num(nl_report *r, const char *key, const char *label, double v, const char *fmt, const char *unit) {
    char text[128], jbuf[32];
    if (!isfinite(v))
        snprintf(text, sizeof text, "%s", isnan(v) ? "n/a" : (v > 0 ? "inf" : "-inf"));
    else
        snprintf(text, sizeof text, fmt ? fmt : "%.6g", v);
    if (unit && *unit) {
        size_t n = strlen(text);
        snprintf(text + n, sizeof text - n, " %s", unit);
    }
    add_kv(r, key, label, text, cJSON_CreateRaw(nl_json_double(v, jbuf)));
}

void nl_report_int(nl_report *r, const char *key, const char *label, long long v, const char *unit) {
    char text[96], jbuf[32];
    snprintf(text, sizeof text, "%lld%s%s", v, unit && *unit ? " " : "", unit ? unit : "");
    snprintf(jbuf, sizeof jbuf, "%lld", v);
    add_kv(r, key, label, text, cJSON_CreateRaw(jbuf));
}

void nl_report_str(nl_report *r, const char *key, const char *label, const char *s) {
    add_kv(r, key, label, s ? s : "", s ? cJSON_CreateString(s) : cJSON_CreateNull());
}

void nl_report_bool(nl_report *r, const char *key, const char *label, int v) {
    add_kv(r, key, label, v ? "yes" : "no", cJSON_CreateBool(v));
}

/* Appends `piece` (and a space before it when the text is not empty) to text[cap]; marks the
 * report broken when it does not fit. */
static void append_text(nl_report *r, char *text, size_t cap, const char *piece) {
    size_t n = strlen(text);
    int w = snprintf(text + n, cap - n, "%s%s", n ? " " : "", piece);
    if (w < 0 || (size_t)w >= cap - n) r->oom = 1;
}

/* The text (values with `fmt`, then `unit`) and the JSON array of a list of n numbers; marks the
 * report broken and returns -1 when out of memory. */
static int format_list(nl_report *r, const double *v, int n, const char *fmt, const char *unit, char **text,
                       cJSON **arr) {
    size_t cap = 32 + (size_t)(n > 0 ? n : 0) * 40 + (unit ? strlen(unit) : 0);
    *text = calloc(cap, 1);
    *arr = cJSON_CreateArray();
    if (!*text || !*arr || n < 0 || (n > 0 && !v)) {
        free(*text);
        cJSON_Delete(*arr);
        *text = NULL;
        *arr = NULL;
        r->oom = 1;
        return -1;
    }
    for (int i = 0; i < n; i++) {
        char piece[96], jbuf[32];
        if (!isfinite(v[i]))
            snprintf(piece, sizeof piece, "%s", isnan(v[i]) ? "n/a" : (v[i] > 0 ? "inf" : "-inf"));
        else
            snprintf(piece, sizeof piece, fmt ? fmt : "%.6g", v[i]);
        append_text(r, *text, cap, piece);
        cJSON *x = cJSON_CreateRaw(nl_json_double(v[i], jbuf));
        if (!x || !cJSON_AddItemToArray(*arr, x)) {
            cJSON_Delete(x);
            r->oom = 1;
        }
    }
    if (unit && *unit) append_text(r, *text, cap, unit);
    return 0;
}

void nl_report_nums(nl_report *r, const char *key, const char *label, const double *v, int n, const char *fmt,
                    const char *unit) {
    if (!r) return;
    char *text;
    cJSON *arr;
    if (format_list(r, v, n, fmt, unit, &text, &arr)) return;
    add_kv(r, key, label, text, arr);
    free(text);
}

void nl_report_strs(nl_report *r, const char *key, const char *label, const char *const *s, int n) {
    if (!r) return;
    size_t cap = 1;
    for (int i = 0; i < n && s; i++) cap += (s[i] ? strlen(s[i]) : 1) + 1;
    char *text = calloc(cap, 1);
    cJSON *arr = cJSON_CreateArray();
    if (!text || !arr || n < 0 || (n > 0 && !s)) {
        free(text);
        cJSON_Delete(arr);
        r->oom = 1;
        return;
    }
    for (int i = 0; i < n; i++) {
        append_text(r, text, cap, s[i] ? s[i] : "-");
        cJSON *x = s[i] ? cJSON_CreateString(s[i]) : cJSON_CreateNull();
        if (!x || !cJSON_AddItemToArray(arr, x)) {
            cJSON_Delete(x);
            r->oom = 1;
        }
    }
    add_kv(r, key, label, text, arr);
    free(text);
}

void nl_report_begin_object(nl_report *r, const char *key, const char *title) {
    if (!r) return;
    end_row_if_partial(r);
    r->cur = NULL;
    if (r->depth >= REPORT_MAX_DEPTH) {
        r->oom = 1; /* nested too deep: a programming error, reported as a failure */
        return;
    }
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddItemToObject(r->stack[r->depth], key, o)) {
        cJSON_Delete(o);
        r->oom = 1;
        return;
    }
    if (title) {
        item *it = new_item(r, ITEM_HEAD);
        if (it && !(it->title = sdup(title))) r->oom = 1;
    }
    r->stack[++r->depth] = o;
}

void nl_report_end_object(nl_report *r) {
    if (!r) return;
    end_row_if_partial(r);
    r->cur = NULL;
    if (r->depth == 0) {
        r->oom = 1; /* more ends than begins */
        return;
    }
    r->stack[r->depth--] = NULL;
}

void nl_report_set_gap(nl_report *r, int spaces) {
    if (r) r->gap = spaces < 1 ? 1 : spaces;
}

void nl_report_note(nl_report *r, const char *fmt, ...) {
    if (!r) return;
    end_row_if_partial(r);
    r->cur = NULL;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    item *it = new_item(r, ITEM_NOTE);
    if (!it) return;
    it->text = sdup(buf);
    if (!it->text) r->oom = 1;
}

void nl_report_table(nl_report *r, const char *key, const char *title, int ncols, const nl_report_col *cols) {
    if (!r) return;
    end_row_if_partial(r);
    r->cur = NULL;
    cJSON *rows = NULL;
    if (key) { /* key NULL: a table of the text form only */
        rows = cJSON_CreateArray();
        if (!rows || !cJSON_AddItemToObject(r->stack[r->depth], key, rows)) {
            cJSON_Delete(rows);
            r->oom = 1;
            return;
        }
    }
    item *it = new_item(r, ITEM_TABLE);
    if (!it) return;
    it->title = sdup(title);
    it->ncols = ncols;
    it->cols = calloc((size_t)ncols, sizeof *it->cols);
    it->vis = calloc((size_t)ncols, sizeof *it->vis);
    const char **hdr = calloc((size_t)ncols, sizeof *hdr);
    free(r->cur_cells);
    free(r->cur_num);
    r->cur_cells = calloc((size_t)ncols, sizeof *r->cur_cells);
    r->cur_num = calloc((size_t)ncols, sizeof *r->cur_num);
    if (!it->cols || !it->vis || !hdr || !r->cur_cells || !r->cur_num || (title && !it->title)) {
        free(hdr);
        r->oom = 1;
        return;
    }
    int nvis = 0;
    for (int c = 0; c < ncols; c++) {
        it->cols[c] = cols[c];
        const char *h = cols[c].header ? cols[c].header : cols[c].key;
        if (!h || (!cols[c].key && !cols[c].header)) r->oom = 1; /* a column with neither key nor header */
        it->vis[c] = h && *h ? nvis : -1;
        if (h && *h) hdr[nvis++] = h;
    }
    it->json_only = nvis == 0;
    if (!it->json_only) nl_table_init(&it->table, nvis, hdr);
    free(hdr);
    if (!it->json_only && it->table.ncols == 0) r->oom = 1;
    if (it->json_only && !key) r->oom = 1; /* neither text nor JSON */
    r->cur = it;
    r->cur_rows = rows;
    r->cur_col = 0;
}

/* The table being filled, or NULL (then the cell is dropped and the report marked broken). */
static item *cur_table(nl_report *r) {
    if (!r) return NULL;
    if (!r->cur || r->oom) {
        r->oom = 1;
        return NULL;
    }
    if (r->cur_col >= r->cur->ncols) {
        r->oom = 1; /* more cells than columns: a programming error, reported as a failure */
        return NULL;
    }
    if (!r->cur_row) {
        r->cur_row = cJSON_CreateObject();
        if (!r->cur_row) {
            r->oom = 1;
            return NULL;
        }
    }
    return r->cur;
}

static void add_cell(nl_report *r, const char *text, cJSON *value) {
    item *it = cur_table(r);
    if (!it || !value) {
        cJSON_Delete(value);
        if (r) r->oom = 1;
        return;
    }
    r->cur_num[r->cur_col] = cJSON_IsRaw(value);
    if (it->cols[r->cur_col].key)
        cJSON_AddItemToObject(r->cur_row, it->cols[r->cur_col].key, value);
    else
        cJSON_Delete(value); /* a text-only column */
    r->cur_cells[r->cur_col] = sdup(text);
    if (!r->cur_cells[r->cur_col]) r->oom = 1;
    r->cur_col++;
}

void nl_report_cell_num(nl_report *r, double v) {
    char text[96], jbuf[32];
    if (!r || !r->cur || r->cur_col >= r->cur->ncols) {
        add_cell(r, "", NULL);
        return;
    }
    const char *fmt = r->cur->cols[r->cur_col].fmt;
    if (!isfinite(v))
        snprintf(text, sizeof text, "%s", isnan(v) ? "n/a" : (v > 0 ? "inf" : "-inf"));
    else
        snprintf(text, sizeof text, fmt ? fmt : "%.6g", v);
    add_cell(r, text, cJSON_CreateRaw(nl_json_double(v, jbuf)));
}

void nl_report_cell_int(nl_report *r, long long v) {
    char text[32];
    snprintf(text, sizeof text, "%lld", v);
    add_cell(r, text, cJSON_CreateRaw(text));
}

void nl_report_cell_str(nl_report *r, const char *s) {
    add_cell(r, s ? s : "", s ? cJSON_CreateString(s) : cJSON_CreateNull());
}

void nl_report_cell_nums(nl_report *r, const double *v, int n) {
    if (!r || !r->cur || r->cur_col >= r->cur->ncols) {
        add_cell(r, "", NULL);
        return;
    }
    char *text;
    cJSON *arr;
    if (format_list(r, v, n, r->cur->cols[r->cur_col].fmt, NULL, &text, &arr)) return;
    int col = r->cur_col;
    add_cell(r, text, arr);
    if (r->cur_col == col + 1) r->cur_num[col] = 0; /* a list: left-aligned */
    free(text);
}

void nl_report_cell_bool(nl_report *r, int v) { add_cell(r, v ? "yes" : "no", cJSON_CreateBool(v)); }

void nl_report_row_end(nl_report *r) {
    if (!r || !r->cur) return;
    item *it = r->cur;
    if (r->cur_col != it->ncols) r->oom = 1; /* fewer cells than columns */
    char **row = NULL;
    if (!r->oom && !it->json_only && !(row = nl_table_new_row(&it->table))) r->oom = 1;
    for (int c = 0; row && c < it->ncols; c++) {
        int k = it->vis[c];
        if (k < 0) continue; /* JSON only */
        row[k] = r->cur_cells[c];
        r->cur_cells[c] = NULL;
        const char *fmt = it->cols[c].fmt;
        if (r->cur_num[c] && !(fmt && fmt[0] == '%' && fmt[1] == '-')) it->table.right[k] = 1; /* numbers right */
    }
    if (r->cur_row && !r->cur_rows) {
        cJSON_Delete(r->cur_row); /* a text-only table */
    } else if (r->cur_row && !cJSON_AddItemToArray(r->cur_rows, r->cur_row)) {
        cJSON_Delete(r->cur_row);
        r->oom = 1;
    }
    r->cur_row = NULL;
    for (int c = 0; c < it->ncols; c++) {
        free(r->cur_cells[c]);
        r->cur_cells[c] = NULL;
    }
    r->cur_col = 0;
}

static void end_row_if_partial(nl_report *r) {
    if (r && r->cur && r->cur_col > 0) nl_report_row_end(r);
}

int nl_report_write(const nl_report *r, int json, FILE *f) {
    if (!r || r->oom || r->depth != 0) return -1; /* an object left open is a programming error */
    if (json) {
        char *s = cJSON_Print(r->json);
        if (!s) return -1;
        fputs(s, f);
        fputc('\n', f);
        cJSON_free(s);
        return 0;
    }
    int w = 0;
    for (int i = 0; i < r->nitems; i++)
        if (r->items[i].kind == ITEM_KV) {
            int n = 2 * r->items[i].depth + (int)strlen(r->items[i].label);
            if (n > w) w = n;
        }
    for (int i = 0; i < r->nitems; i++) {
        const item *it = &r->items[i];
        int ind = 2 * it->depth;
        switch (it->kind) {
        case ITEM_KV: fprintf(f, "%*s%-*s%*s%s\n", ind, "", w - ind, it->label, r->gap, "", it->text); break;
        case ITEM_NOTE: fprintf(f, "%*s%s\n", ind, "", it->text); break;
        case ITEM_HEAD: fprintf(f, "%*s%s\n", ind, "", it->title); break;
        case ITEM_TABLE:
            if (it->json_only) break;
            if (i > 0) fputc('\n', f);
            if (it->title) fprintf(f, "%s\n", it->title);
            nl_table_print((nl_table *)&it->table, f);
            break;
        }
    }
    return 0;
}

int nl_report_print(nl_report *r, int json) {
    if (r) end_row_if_partial(r);
    int rc = nl_report_write(r, json, stdout);
    nl_report_free(r);
    if (rc) {
        fprintf(stderr, "nanolm: out of memory while writing the result\n");
        return NL_EXIT_FAIL;
    }
    return NL_EXIT_OK;
}
