/* One writer for every command's result: text table or JSON from one description (report.h). */
#include "report.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef enum { ITEM_KV, ITEM_NOTE, ITEM_TABLE } item_kind;

typedef struct item {
    item_kind kind;
    char *label, *text; /* ITEM_KV: label and formatted value; ITEM_NOTE: text */
    char *title;        /* ITEM_TABLE */
    nl_table table;     /* ITEM_TABLE: text cells */
    nl_report_col *cols;
    int ncols;
} item;

struct nl_report {
    char *title;
    cJSON *json;
    item *items;
    int nitems, cap;
    int oom;
    /* the table being filled */
    item *cur;
    cJSON *cur_rows, *cur_row;
    int cur_col;
    char **cur_cells;
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
    }
    free(r->items);
    free(r->cur_cells);
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
    return it;
}

static void add_kv(nl_report *r, const char *key, const char *label, const char *text, cJSON *value) {
    if (!r) {
        cJSON_Delete(value);
        return;
    }
    end_row_if_partial(r);
    r->cur = NULL;
    if (!value || !cJSON_AddItemToObject(r->json, key, value)) {
        cJSON_Delete(value);
        r->oom = 1;
        return;
    }
    item *it = new_item(r, ITEM_KV);
    if (!it) return;
    it->label = sdup(label ? label : key);
    it->text = sdup(text);
    if (!it->label || !it->text) r->oom = 1;
}

void nl_report_num(nl_report *r, const char *key, const char *label, double v, const char *fmt, const char *unit) {
    char text[128], jbuf[32];
    if (!isfinite(v)) snprintf(text, sizeof text, "%s", isnan(v) ? "n/a" : (v > 0 ? "inf" : "-inf"));
    else snprintf(text, sizeof text, fmt ? fmt : "%.6g", v);
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
    cJSON *rows = cJSON_CreateArray();
    if (!rows || !cJSON_AddItemToObject(r->json, key, rows)) {
        cJSON_Delete(rows);
        r->oom = 1;
        return;
    }
    item *it = new_item(r, ITEM_TABLE);
    if (!it) return;
    it->title = sdup(title);
    it->ncols = ncols;
    it->cols = calloc((size_t)ncols, sizeof *it->cols);
    const char **hdr = calloc((size_t)ncols, sizeof *hdr);
    free(r->cur_cells);
    r->cur_cells = calloc((size_t)ncols, sizeof *r->cur_cells);
    if (!it->cols || !hdr || !r->cur_cells || (title && !it->title)) {
        free(hdr);
        r->oom = 1;
        return;
    }
    for (int c = 0; c < ncols; c++) {
        it->cols[c] = cols[c];
        hdr[c] = cols[c].header ? cols[c].header : cols[c].key;
    }
    nl_table_init(&it->table, ncols, hdr);
    free(hdr);
    if (it->table.ncols == 0) r->oom = 1;
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
    cJSON_AddItemToObject(r->cur_row, it->cols[r->cur_col].key, value);
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
    if (!isfinite(v)) snprintf(text, sizeof text, "%s", isnan(v) ? "n/a" : (v > 0 ? "inf" : "-inf"));
    else snprintf(text, sizeof text, fmt ? fmt : "%.6g", v);
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

void nl_report_row_end(nl_report *r) {
    if (!r || !r->cur) return;
    item *it = r->cur;
    if (r->cur_col != it->ncols) r->oom = 1; /* fewer cells than columns */
    char **row = NULL;
    if (!r->oom) {
        /* nl_table_row takes exactly ncols strings; build the row through rowf-free path */
        nl_table *t = &it->table;
        if (t->nrows == t->cap) {
            char **nc = realloc(t->cells, (size_t)t->cap * 2 * (size_t)t->ncols * sizeof(char *));
            if (!nc) r->oom = 1;
            else {
                t->cells = nc;
                t->cap *= 2;
            }
        }
        if (!r->oom) {
            row = &t->cells[(size_t)t->nrows++ * (size_t)t->ncols];
            for (int c = 0; c < it->ncols; c++) {
                row[c] = r->cur_cells[c];
                r->cur_cells[c] = NULL;
                /* numbers right-aligned: a column whose cells are numbers in JSON */
                cJSON *v = cJSON_GetObjectItemCaseSensitive(r->cur_row, it->cols[c].key);
                if (v && cJSON_IsRaw(v)) t->right[c] = 1;
            }
        }
    }
    if (r->cur_row && !cJSON_AddItemToArray(r->cur_rows, r->cur_row)) {
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
    if (!r || r->oom) return -1;
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
            int n = (int)strlen(r->items[i].label);
            if (n > w) w = n;
        }
    for (int i = 0; i < r->nitems; i++) {
        const item *it = &r->items[i];
        switch (it->kind) {
        case ITEM_KV: fprintf(f, "%-*s  %s\n", w, it->label, it->text); break;
        case ITEM_NOTE: fprintf(f, "%s\n", it->text); break;
        case ITEM_TABLE:
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
