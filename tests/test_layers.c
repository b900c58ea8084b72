/* The layers of DESIGN.md hold by test, and the public API is used.
 *
 * includes_point_down: reads every #include of src/ and include/nanolm/ and fails on one that
 * points up. A file's layer is its folder (src/<layer>/); a public header's layer is the folder
 * of the source file it is named after (include/nanolm/model.h -> src/model/model.c), or the
 * table below for the three headers that several files implement. Allowed, from DESIGN.md:
 *     cli      -> everything
 *     tools    -> serve, parallel, train, model, numerics, base   (load generator, client, probe)
 *     serve    -> parallel, train, model, numerics, base
 *     parallel -> train, model, numerics, base
 *     train    -> model, numerics, base
 *     model    -> numerics, base
 *     numerics -> base
 *     plan     -> numerics, base   (never model/, train/, serve/ or parallel/)
 * tests/layers-allow.txt names known exceptions, one "file include" a line; an exception that no
 * longer occurs fails too, so the list only shrinks.
 *
 * public_functions_used: a function declared in a public header (include/nanolm/NAME.h) that nothing outside its own
 * file calls (in src/, bench/, fuzz/ or the Python binding; the tests do not count) is either
 * made static, removed, or listed in tests/api-on-purpose.txt with the reason it is public. */
#include "testutil.h"

#include <ctype.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { L_BASE, L_NUMERICS, L_MODEL, L_TRAIN, L_PARALLEL, L_SERVE, L_TOOLS, L_PLAN, L_CLI, N_LAYERS };
static const char *const layer_names[N_LAYERS] = {"base",  "numerics", "model", "train", "parallel",
                                                  "serve", "tools",    "plan",  "cli"};
#define B(l) (1u << (l))
static const unsigned allowed[N_LAYERS] = {
    [L_BASE] = B(L_BASE),
    [L_NUMERICS] = B(L_NUMERICS) | B(L_BASE),
    [L_MODEL] = B(L_MODEL) | B(L_NUMERICS) | B(L_BASE),
    [L_TRAIN] = B(L_TRAIN) | B(L_MODEL) | B(L_NUMERICS) | B(L_BASE),
    [L_PARALLEL] = B(L_PARALLEL) | B(L_TRAIN) | B(L_MODEL) | B(L_NUMERICS) | B(L_BASE),
    [L_SERVE] = B(L_SERVE) | B(L_PARALLEL) | B(L_TRAIN) | B(L_MODEL) | B(L_NUMERICS) | B(L_BASE),
    [L_TOOLS] = B(L_TOOLS) | B(L_SERVE) | B(L_PARALLEL) | B(L_TRAIN) | B(L_MODEL) | B(L_NUMERICS) | B(L_BASE),
    [L_PLAN] = B(L_PLAN) | B(L_NUMERICS) | B(L_BASE),
    [L_CLI] = ~0u,
};
/* Public headers that no single source file is named after. */
static const struct {
    const char *header, *layer;
} header_layers[] = {{"base.h", "base"}, {"plan.h", "plan"}, {"train.h", "train"}};

static char root[1024];

static int layer_index(const char *name, size_t n) {
    for (int l = 0; l < N_LAYERS; l++)
        if (strlen(layer_names[l]) == n && !strncmp(layer_names[l], name, n)) return l;
    return -1;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

/* A copy of C text with comments and the insides of string and character literals blanked (the
 * quotes and newlines stay, so offsets match the original). */
static char *strip_c(const char *t) {
    size_t n = strlen(t);
    char *o = malloc(n + 1);
    memcpy(o, t, n + 1);
    for (size_t i = 0; i < n;) {
        if (t[i] == '/' && t[i + 1] == '*') {
            const char *e = strstr(t + i + 2, "*/");
            size_t j = e ? (size_t)(e - t) + 2 : n;
            for (size_t k = i; k < j; k++)
                if (o[k] != '\n') o[k] = ' ';
            i = j;
        } else if (t[i] == '/' && t[i + 1] == '/') {
            while (i < n && t[i] != '\n') o[i++] = ' ';
        } else if (t[i] == '"' || t[i] == '\'') {
            char q = t[i];
            size_t j = i + 1;
            while (j < n && t[j] != q && t[j] != '\n') j += t[j] == '\\' ? 2 : 1;
            for (size_t k = i + 1; k < j && k < n; k++) o[k] = ' ';
            i = j < n ? j + 1 : n;
        } else {
            i++;
        }
    }
    return o;
}

/* Blanks preprocessor lines (with their continuations) and `extern "C" {` of a stripped text, so
 * that what remains at brace depth 0 is declarations and definitions. */
static void blank_preprocessor(char *c) {
    int line_start = 1;
    for (char *p = c; *p; p++) {
        if (line_start) {
            char *q = p;
            while (*q == ' ' || *q == '\t') q++;
            if (*q == '#') {
                for (; *q && !(*q == '\n' && q[-1] != '\\'); q++)
                    if (*q != '\n') *q = ' ';
                p = q;
                if (!*p) break;
            }
        }
        line_start = *p == '\n';
        if (!strncmp(p, "extern", 6) && (p == c || !(isalnum((unsigned char)p[-1]) || p[-1] == '_'))) {
            char *q = p + 6;
            while (isspace((unsigned char)*q)) q++;
            if (*q++ != '"') continue;
            while (*q == ' ') q++;
            if (*q++ != '"') continue;
            while (isspace((unsigned char)*q)) q++;
            if (*q != '{') continue;
            memset(p, ' ', (size_t)(q - p) + 1);
            /* its closing brace: the last one of the file */
            char *last = strrchr(c, '}');
            if (last) *last = ' ';
        }
    }
}

typedef struct file_list {
    char **v;
    int n, cap;
} file_list;

static void list_add(file_list *l, const char *s) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->v = realloc(l->v, (size_t)l->cap * sizeof *l->v);
    }
    l->v[l->n++] = strdup(s);
}

static void list_free(file_list *l) {
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    *l = (file_list){0};
}

static int list_has(const file_list *l, const char *s) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->v[i], s)) return 1;
    return 0;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* Adds rel/<name> (relative to the repository) for every file of rel ending in one of sufs. */
static void list_dir(file_list *l, const char *rel, const char *const *sufs) {
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    DIR *d = opendir(path);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));)
        for (const char *const *s = sufs; *s; s++)
            if (e->d_name[0] != '.' && ends_with(e->d_name, *s)) {
                snprintf(path, sizeof path, "%s/%s", rel, e->d_name);
                list_add(l, path);
                break;
            }
    closedir(d);
}

static int exists(const char *rel) {
    char path[2500];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    return access(path, F_OK) == 0;
}

/* The layer of public header `name` ("model.h"), or -1. */
static int header_layer(const char *name) {
    for (size_t i = 0; i < sizeof header_layers / sizeof header_layers[0]; i++)
        if (!strcmp(header_layers[i].header, name))
            return layer_index(header_layers[i].layer, strlen(header_layers[i].layer));
    char rel[1400];
    size_t n = strlen(name);
    if (n < 3) return -1;
    for (int l = 0; l < N_LAYERS; l++) {
        snprintf(rel, sizeof rel, "src/%s/%.*s.c", layer_names[l], (int)(n - 2), name);
        if (exists(rel)) return l;
    }
    return -1;
}

/* The layer of a file named relative to the repository (src/<layer>/... or include/nanolm/...). */
static int file_layer(const char *rel) {
    if (!strncmp(rel, "src/", 4)) {
        const char *s = strchr(rel + 4, '/');
        return s ? layer_index(rel + 4, (size_t)(s - rel - 4)) : -1;
    }
    if (!strncmp(rel, "include/nanolm/", 15)) return header_layer(rel + 15);
    return -1;
}

/* The layer an #include "inc" of file `from` (layer lf) points to; -1 when it is outside the
 * project (a system header). */
static int include_layer(const char *from, int lf, const char *inc) {
    if (!strncmp(inc, "nanolm/", 7)) return header_layer(inc + 7);
    const char *slash = strchr(inc, '/');
    if (slash) return layer_index(inc, (size_t)(slash - inc));
    char rel[1400];
    const char *dir_end = strrchr(from, '/');
    snprintf(rel, sizeof rel, "%.*s/%s", (int)(dir_end - from), from, inc);
    return exists(rel) ? lf : -1;
}

/* Reads tests/<name>: one entry a line, '#' starts a comment; fields joined by one space. */
static void read_list(const char *name, file_list *l) {
    char path[1400];
    snprintf(path, sizeof path, "%s/tests/%s", root, name);
    char *t = slurp(path);
    assert_non_null(t);
    for (char *save = NULL, *line = strtok_r(t, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *h = strchr(line, '#');
        if (h) *h = 0;
        char entry[600] = "", *w_save = NULL;
        for (char *w = strtok_r(line, " \t", &w_save); w; w = strtok_r(NULL, " \t", &w_save)) {
            if (*entry) strncat(entry, " ", sizeof entry - strlen(entry) - 1);
            strncat(entry, w, sizeof entry - strlen(entry) - 1);
        }
        if (*entry) list_add(l, entry);
    }
    free(t);
}

static void project_files(file_list *files) {
    static const char *const c_and_h[] = {".c", ".h", NULL};
    static const char *const h[] = {".h", NULL};
    for (int l = 0; l < N_LAYERS; l++) {
        char rel[64];
        snprintf(rel, sizeof rel, "src/%s", layer_names[l]);
        list_dir(files, rel, c_and_h);
    }
    list_dir(files, "include/nanolm", h);
}

static void includes_point_down(void **state) {
    (void)state;
    file_list files = {0}, allow = {0}, seen = {0};
    project_files(&files);
    assert_true(files.n > 100); /* the tree was found */
    read_list("layers-allow.txt", &allow);
    int bad = 0;
    for (int i = 0; i < files.n; i++) {
        const char *rel = files.v[i];
        int lf = file_layer(rel);
        if (lf < 0) {
            print_error("%s: no layer (a public header is named after its source file src/<layer>/NAME.c)\n", rel);
            bad++;
            continue;
        }
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", root, rel);
        char *raw = slurp(path);
        assert_non_null(raw);
        char *code = strip_c(raw);
        for (char *p = code; (p = strstr(p, "include"));) {
            char *q = p;
            while (q > code && (q[-1] == ' ' || q[-1] == '\t')) q--;
            int directive = q > code && q[-1] == '#';
            p += 7;
            if (!directive) continue;
            while (*p == ' ' || *p == '\t') p++;
            if (*p != '"' && *p != '<') continue;
            char close = *p == '"' ? '"' : '>';
            const char *s = raw + (p - code) + 1, *e = strchr(s, close);
            if (!e || e - s >= 512) continue;
            char inc[512];
            snprintf(inc, sizeof inc, "%.*s", (int)(e - s), s);
            if (close == '>' && strncmp(inc, "nanolm/", 7)) continue; /* a system header */
            int lt = include_layer(rel, lf, inc);
            if (lt < 0 && !strncmp(inc, "nanolm/", 7)) {
                print_error("%s includes %s: a public header with no layer\n", rel, inc);
                bad++;
            }
            if (lt < 0 || (allowed[lf] & B(lt))) continue;
            char entry[1100];
            snprintf(entry, sizeof entry, "%s %s", rel, inc);
            if (list_has(&allow, entry)) {
                list_add(&seen, entry);
                continue;
            }
            print_error("%s (%s) includes %s (%s): DESIGN.md's layers point down only\n", rel, layer_names[lf], inc,
                        layer_names[lt]);
            bad++;
        }
        free(code);
        free(raw);
    }
    for (int i = 0; i < allow.n; i++)
        if (!list_has(&seen, allow.v[i])) {
            print_error("tests/layers-allow.txt: '%s' no longer occurs: remove it\n", allow.v[i]);
            bad++;
        }
    list_free(&files);
    list_free(&allow);
    list_free(&seen);
    assert_int_equal(bad, 0);
}

/* An identifier character. */
static int idc(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* Calls fn(name, at_depth0_call, user) for every identifier starting with "nl_" in stripped code;
 * at_depth0_call: at brace depth 0 and followed by '(' (a declaration or a definition). */
static void scan_names(const char *code, void (*fn)(const char *, int, void *), void *user) {
    int depth = 0;
    for (const char *p = code; *p; p++) {
        if (*p == '{') depth++;
        if (*p == '}') depth--;
        if (p[0] == 'n' && p[1] == 'l' && p[2] == '_' && (p == code || !idc(p[-1]))) {
            const char *e = p;
            while (idc(*e)) e++;
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)(e - p), p);
            while (isspace((unsigned char)*e)) e++;
            fn(name, depth == 0 && *e == '(', user);
            p = e - 1;
        }
    }
}

typedef struct api {
    file_list names, headers; /* public functions and the header that declares each */
    file_list *defs, *uses;   /* per name: the files that define/declare it, that use it */
    const char *file;         /* the file being scanned */
} api;

static int api_find(const api *a, const char *name) {
    for (int i = 0; i < a->names.n; i++)
        if (!strcmp(a->names.v[i], name)) return i;
    return -1;
}

static void on_public(const char *name, int decl, void *user) {
    api *a = user;
    if (decl && api_find(a, name) < 0) {
        list_add(&a->names, name);
        list_add(&a->headers, a->file);
    }
}

static void on_use(const char *name, int decl, void *user) {
    api *a = user;
    int i = api_find(a, name);
    if (i < 0) return;
    file_list *l = decl ? &a->defs[i] : &a->uses[i];
    if (!list_has(l, a->file)) list_add(l, a->file);
}

static void public_functions_used(void **state) {
    (void)state;
    api a = {0};
    file_list headers = {0}, users = {0}, py = {0}, on_purpose = {0};
    static const char *const h[] = {".h", NULL}, *const c_and_h[] = {".c", ".h", NULL}, *const c[] = {".c", NULL},
                             *const pyext[] = {".py", NULL};
    list_dir(&headers, "include/nanolm", h);
    for (int i = 0; i < headers.n; i++) {
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", root, headers.v[i]);
        char *raw = slurp(path), *code = strip_c(raw);
        blank_preprocessor(code);
        a.file = headers.v[i];
        scan_names(code, on_public, &a);
        free(code);
        free(raw);
    }
    assert_true(a.names.n > 100);
    a.defs = calloc((size_t)a.names.n, sizeof *a.defs);
    a.uses = calloc((size_t)a.names.n, sizeof *a.uses);
    for (int l = 0; l < N_LAYERS; l++) {
        char rel[64];
        snprintf(rel, sizeof rel, "src/%s", layer_names[l]);
        list_dir(&users, rel, c_and_h);
    }
    list_dir(&users, "bench", c);
    list_dir(&users, "fuzz", c);
    for (int i = 0; i < users.n; i++) {
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", root, users.v[i]);
        char *raw = slurp(path), *code = strip_c(raw);
        a.file = users.v[i];
        scan_names(code, on_use, &a);
        free(code);
        free(raw);
    }
    /* The Python binding calls functions by name (ctypes). */
    list_dir(&py, "python/nanolm", pyext);
    for (int i = 0; i < py.n; i++) {
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", root, py.v[i]);
        char *raw = slurp(path);
        a.file = py.v[i];
        for (char *p = raw; (p = strstr(p, "nl_")); p++)
            if (p == raw || !idc(p[-1])) {
                const char *e = p;
                while (idc(*e)) e++;
                char name[128];
                snprintf(name, sizeof name, "%.*s", (int)(e - p), p);
                on_use(name, 0, &a);
            }
        free(raw);
    }
    read_list("api-on-purpose.txt", &on_purpose);
    int bad = 0;
    for (int i = 0; i < a.names.n; i++) {
        int used = 0;
        for (int k = 0; k < a.uses[i].n; k++) used |= !list_has(&a.defs[i], a.uses[i].v[k]);
        int listed = 0;
        for (int k = 0; k < on_purpose.n; k++) {
            size_t n = strlen(a.names.v[i]);
            listed |= !strncmp(on_purpose.v[k], a.names.v[i], n) && (!on_purpose.v[k][n] || on_purpose.v[k][n] == ' ');
        }
        if (!used && !listed) {
            print_error("%s (%s): nothing outside %s calls it: make it static, remove it, or list it in "
                        "tests/api-on-purpose.txt with the reason it is public\n",
                        a.names.v[i], a.headers.v[i], a.defs[i].n ? a.defs[i].v[0] : "its own file");
            bad++;
        }
        if (used && listed) {
            print_error("tests/api-on-purpose.txt: %s is now called outside its own file: remove it from the list\n",
                        a.names.v[i]);
            bad++;
        }
    }
    for (int k = 0; k < on_purpose.n; k++) {
        char name[128];
        sscanf(on_purpose.v[k], "%127s", name);
        if (api_find(&a, name) < 0) {
            print_error("tests/api-on-purpose.txt: %s is not a public function (any more): remove it\n", name);
            bad++;
        }
    }
    for (int i = 0; i < a.names.n; i++) {
        list_free(&a.defs[i]);
        list_free(&a.uses[i]);
    }
    free(a.defs);
    free(a.uses);
    list_free(&a.names);
    list_free(&a.headers);
    list_free(&headers);
    list_free(&users);
    list_free(&py);
    list_free(&on_purpose);
    assert_int_equal(bad, 0);
}

int main(void) {
    const char *src = getenv("NANOLM_SRC");
    snprintf(root, sizeof root, "%s", src && *src ? src : ".");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(includes_point_down),
        cmocka_unit_test(public_functions_used),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
