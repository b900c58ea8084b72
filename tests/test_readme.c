/* The README's tour runs as written. Every fenced block of README.md that holds command lines
 * ("$ " then the command, continued by a trailing backslash) is run from a scratch folder that
 * looks like the repository root (data/ and build/ link to the real ones; files a block writes,
 * such as run.st, stay there for the blocks after it), and each command's standard output is
 * compared with the lines shown under it:
 *   - by default, line for line (trailing spaces ignored);
 *   - `...` on a line of its own stands for any number of lines, inside a line for any text;
 *   - `X±T` (a number, the sign ±, a tolerance) stands for any number within T of X: for figures
 *     that legitimately move with the CPU (OpenBLAS's sgemm kernels differ between AVX2 and
 *     AVX-512), so the README holds on every machine without one machine's digits. Such a
 *     line is compared word by word (runs of spaces are one separator);
 *   - a command with no lines shown under it only has to exit 0; every command has to exit 0;
 *   - lines that start with `#` (after spaces) are comments, not output.
 * An HTML comment on the line before the opening fence changes that, directives separated by ';':
 *   <!-- docs-test: excerpt -->              the lines shown must appear in order, others may
 *                                            come between (a stable excerpt of a long output)
 *   <!-- docs-test: sub OLD => NEW -->       run the command with OLD replaced by NEW (to shorten
 *                                            a long run; repeat for several)
 *   <!-- docs-test: run-only -->             run, but do not compare the output
 *   <!-- docs-test: mpi -->                  runs under the MPI launcher (skipped in a build without MPI)
 *   <!-- docs-test: skip REASON -->          not run (a server, a 30-minute sweep): say why
 * NANOLM_README=path checks another Markdown file the same way. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_LINES 400
#define MAX_SUBS  8

typedef struct block_opts {
    int excerpt, run_only, mpi, skip;
    char skip_reason[256];
    int nsubs;
    char sub_old[MAX_SUBS][256], sub_new[MAX_SUBS][256];
} block_opts;

/* Splits text into lines in place (no trailing spaces); returns the count. */
static int split_lines(char *text, char **lines, int max) {
    int n = 0;
    char *p = text;
    while (*p && n < max) {
        char *e = strchr(p, '\n');
        if (e) *e = '\0';
        size_t len = strlen(p);
        while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\r' || p[len - 1] == '\t')) p[--len] = '\0';
        lines[n++] = p;
        if (!e) break;
        p = e + 1;
    }
    while (n > 0 && lines[n - 1][0] == '\0') n--;
    return n;
}

#define PLUS_MINUS "\xc2\xb1" /* U+00B1 in UTF-8 */

/* 1 when the word w (len n) is the number x +- tol, as written in a `X±T` word. */
static int word_within(const char *pat, size_t pn, const char *w, size_t n) {
    char pb[64], wb[64];
    if (pn >= sizeof pb || n >= sizeof wb) return 0;
    memcpy(pb, pat, pn);
    pb[pn] = '\0';
    memcpy(wb, w, n);
    wb[n] = '\0';
    char *pm = strstr(pb, PLUS_MINUS), *end;
    *pm = '\0';
    const double x = strtod(pb, &end);
    if (end == pb || *end) return 0;
    const double tol = strtod(pm + 2, &end);
    if (end == pm + 2 || *end) return 0;
    const double v = strtod(wb, &end);
    if (end == wb) return 0;
    /* a unit may follow the number in the output (1.46%): it must follow it in the pattern too */
    return fabs(v - x) <= tol * (1 + 1e-9) && !*end;
}

/* Word-by-word comparison of a line holding `X±T` words (see the top of the file). */
static int words_match(const char *pat, const char *line) {
    for (;;) {
        while (*pat == ' ') pat++;
        while (*line == ' ') line++;
        if (!*pat || !*line) return !*pat && !*line;
        const size_t pn = strcspn(pat, " "), n = strcspn(line, " ");
        const char *pm = strstr(pat, PLUS_MINUS);
        if (pm && pm < pat + pn) {
            if (!word_within(pat, pn, line, n)) return 0;
        } else if (pn != n || strncmp(pat, line, n) != 0)
            return 0;
        pat += pn;
        line += n;
    }
}

/* 1 when `line` matches `pat`, where "..." inside pat stands for any text. */
static int line_matches(const char *pat, const char *line) {
    if (strstr(pat, PLUS_MINUS)) return words_match(pat, line);
    const char *dots = strstr(pat, "...");
    if (!dots) return strcmp(pat, line) == 0;
    size_t head = (size_t)(dots - pat);
    if (strncmp(pat, line, head) != 0) return 0;
    const char *rest = dots + 3;
    for (const char *s = line + head;; s++) {
        if (line_matches(rest, s)) return 1;
        if (!*s) return 0;
    }
}

/* Exact match of shown lines against actual ones, "..." lines matching any run of lines. */
static int lines_match(char **pat, int np, char **act, int na) {
    if (np == 0) return na == 0;
    if (!strcmp(pat[0], "...")) {
        for (int k = 0; k <= na; k++)
            if (lines_match(pat + 1, np - 1, act + k, na - k)) return 1;
        return 0;
    }
    return na > 0 && line_matches(pat[0], act[0]) && lines_match(pat + 1, np - 1, act + 1, na - 1);
}

/* Every shown line appears in order among the actual ones. */
static int lines_in_order(char **pat, int np, char **act, int na) {
    int j = 0;
    for (int i = 0; i < np; i++) {
        if (!strcmp(pat[i], "...")) continue;
        while (j < na && !line_matches(pat[i], act[j])) j++;
        if (j == na) return 0;
        j++;
    }
    return 1;
}

static void parse_marker(const char *line, block_opts *o) {
    memset(o, 0, sizeof *o);
    const char *p = strstr(line, "<!-- docs-test:");
    if (!p) return;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", p + strlen("<!-- docs-test:"));
    char *end = strstr(buf, "-->");
    if (end) *end = '\0';
    char *save = NULL;
    for (char *d = strtok_r(buf, ";", &save); d; d = strtok_r(NULL, ";", &save)) {
        while (*d == ' ') d++;
        size_t len = strlen(d);
        while (len > 0 && d[len - 1] == ' ') d[--len] = '\0';
        if (!strcmp(d, "excerpt"))
            o->excerpt = 1;
        else if (!strcmp(d, "run-only"))
            o->run_only = 1;
        else if (!strcmp(d, "mpi"))
            o->mpi = 1;
        else if (!strncmp(d, "skip", 4)) {
            o->skip = 1;
            snprintf(o->skip_reason, sizeof o->skip_reason, "%s", d[4] ? d + 5 : "(no reason given)");
        } else if (!strncmp(d, "sub ", 4) && strstr(d, " => ") && o->nsubs < MAX_SUBS) {
            char *arrow = strstr(d, " => ");
            *arrow = '\0';
            snprintf(o->sub_old[o->nsubs], 256, "%s", d + 4);
            snprintf(o->sub_new[o->nsubs], 256, "%s", arrow + 4);
            o->nsubs++;
        } else
            fail_msg("README: unknown docs-test directive '%s'", d);
    }
}

/* Replaces every `old` in cmd (capacity cap) by `new`; returns how many were replaced. */
static int substitute(char *cmd, size_t cap, const char *old, const char *new) {
    int n = 0;
    char out[8192];
    out[0] = '\0';
    const char *p = cmd, *hit;
    size_t ol = strlen(old);
    while ((hit = strstr(p, old)) != NULL) {
        strncat(out, p, (size_t)(hit - p));
        strncat(out, new, sizeof out - strlen(out) - 1);
        p = hit + ol;
        n++;
    }
    strncat(out, p, sizeof out - strlen(out) - 1);
    snprintf(cmd, cap, "%s", out);
    return n;
}

typedef struct run_state {
    const char *dir;
    int have_mpi, commands, compared, failures, skipped;
} run_state;

/* Runs one command from the scratch folder; compares its stdout with the shown lines. */
static void run_command(run_state *rs, const block_opts *o, const char *shown_cmd, char **want, int nwant) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s", shown_cmd);
    for (int i = 0; i < o->nsubs; i++)
        if (!substitute(cmd, sizeof cmd, o->sub_old[i], o->sub_new[i]))
            fail_msg("README: 'sub %s' matches nothing in: %s", o->sub_old[i], shown_cmd);
    char full[9000], errpath[600];
    snprintf(errpath, sizeof errpath, "%s/.stderr", rs->dir);
    /* timeout: a hang detector only */
    snprintf(full, sizeof full, "cd '%s' && timeout -k 10 900 sh -c '%s' 2>'%s'", rs->dir, "eval \"$NANOLM_DOCS_CMD\"",
             errpath);
    setenv("NANOLM_DOCS_CMD", cmd, 1);
    fflush(NULL);
    char *out = NULL;
    int code = tu_run_shell(full, &out);
    assert_non_null(out);
    rs->commands++;
    char *act[MAX_LINES * 4];
    char *copy = strdup(out);
    assert_non_null(copy);
    int nact = split_lines(copy, act, MAX_LINES * 4);
    int ok = code == 0;
    const char *why = ok ? NULL : "exit status not 0";
    if (ok && nwant > 0 && !o->run_only) {
        rs->compared++;
        ok = o->excerpt ? lines_in_order(want, nwant, act, nact) : lines_match(want, nwant, act, nact);
        if (!ok)
            why =
                o->excerpt ? "the lines shown do not all appear, in order" : "the output differs from the lines shown";
    }
    if (!ok) {
        rs->failures++;
        char *err = tu_read_file(errpath, NULL);
        print_message("README command failed (%s): %s\n  ran: %s\n  exit %d\n--- shown ---\n", why, shown_cmd, cmd,
                      code);
        for (int i = 0; i < nwant; i++) print_message("%s\n", want[i]);
        print_message("--- stdout ---\n%s--- stderr ---\n%s------\n", out, err ? err : "");
        free(err);
    } else {
        print_message("ok: %s\n", cmd);
    }
    free(copy);
    free(out);
}

static void run_markdown(const char *path, run_state *rs) {
    size_t bytes = 0;
    char *text = tu_read_file(path, &bytes);
    if (!text) fail_msg("cannot read %s", path);
    char **lines = malloc(sizeof(char *) * (bytes + 2));
    assert_non_null(lines);
    int n = split_lines(text, lines, (int)bytes + 1);
    for (int i = 0; i < n; i++) {
        if (strncmp(lines[i], "```", 3) != 0) continue;
        int start = i + 1, end = start;
        while (end < n && strncmp(lines[end], "```", 3) != 0) end++;
        int prev = i - 1;
        while (prev >= 0 && lines[prev][0] == '\0') prev--;
        block_opts o;
        parse_marker(prev >= 0 ? lines[prev] : "", &o);
        int has_cmd = 0;
        for (int k = start; k < end; k++) has_cmd |= !strncmp(lines[k], "$ ", 2);
        if (has_cmd && (o.skip || (o.mpi && !rs->have_mpi))) {
            rs->skipped++;
            print_message("skipped block at %s:%d: %s\n", path, i + 1,
                          o.skip ? o.skip_reason : "an MPI block (this build has no MPI)");
        } else if (has_cmd) {
            for (int k = start; k < end;) {
                if (strncmp(lines[k], "$ ", 2) != 0) {
                    k++;
                    continue;
                }
                char cmd[8192];
                snprintf(cmd, sizeof cmd, "%s", lines[k] + 2);
                k++;
                while (strlen(cmd) > 0 && cmd[strlen(cmd) - 1] == '\\' && k < end) {
                    cmd[strlen(cmd) - 1] = ' ';
                    const char *cont = lines[k++];
                    while (*cont == ' ') cont++;
                    strncat(cmd, cont, sizeof cmd - strlen(cmd) - 1);
                }
                char *want[MAX_LINES];
                int nwant = 0;
                while (k < end && strncmp(lines[k], "$ ", 2) != 0) {
                    const char *s = lines[k];
                    while (*s == ' ') s++;
                    if (*s != '#' && nwant < MAX_LINES) want[nwant++] = lines[k];
                    k++;
                }
                while (nwant > 0 && want[nwant - 1][0] == '\0') nwant--;
                run_command(rs, &o, cmd, want, nwant);
            }
        }
        i = end;
    }
    free(lines);
    free(text);
}

static void test_readme_tour_runs_as_written(void **state) {
    (void)state;
    const char *bin = getenv("NANOLM_BIN");
    const char *src = getenv("NANOLM_SRC");
    if (!bin || !src) {
        print_message("[  SKIP    ] run under ctest (needs NANOLM_BIN and NANOLM_SRC)\n");
        skip();
        return;
    }
    char readme[4096];
    const char *which = getenv("NANOLM_README");
    if (which)
        snprintf(readme, sizeof readme, "%s", which);
    else
        snprintf(readme, sizeof readme, "%s/README.md", src);
    char *dir = tu_tmpdir();
    assert_non_null(dir);
    char cmd[9000];
    /* The scratch folder looks like the repository root: data/, python/ and build/ (this build),
     * and the Python package loads this build's libnanolm.so. */
    snprintf(cmd, sizeof cmd,
             "ln -s '%s/data' '%s/data' && ln -s '%s/python' '%s/python' && ln -s \"$(cd \"$(dirname '%s')\" && pwd)\" "
             "'%s/build'",
             src, dir, src, dir, bin, dir);
    assert_int_equal(system(cmd), 0);
    char lib[4200];
    snprintf(lib, sizeof lib, "%s/build/libnanolm.so", dir);
    if (access(lib, R_OK) == 0) setenv("NANOLM_LIB", lib, 1);
    const char *mpi = getenv("NANOLM_HAVE_MPI");
    run_state rs = {.dir = dir, .have_mpi = !mpi || strcmp(mpi, "0") != 0};
    run_markdown(readme, &rs);
    print_message("%s: %d commands run, %d outputs compared, %d blocks skipped, %d failed\n", readme, rs.commands,
                  rs.compared, rs.skipped, rs.failures);
    tu_rmdir(dir);
    free(dir);
    assert_true(rs.commands > 0);
    assert_int_equal(rs.failures, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_readme_tour_runs_as_written),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
