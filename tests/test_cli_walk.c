/* Walks every command that `nanolm --help` lists, and every subcommand that a command's --help
 * names ("nanolm quant values ...", "nanolm collectives demo|bench"), from what the help prints:
 * - every option its --help shows is accepted: `nanolm CMD [SUB] --OPT 1 <extra>` never answers
 *   that --OPT is unknown (the extra bare argument stops the command before any work);
 * - every option written in a command's source (an nl_opt table or a getopt table in
 *   src/cli/cmd_NAME*.c) appears in the --help of that command or one of its subcommands;
 * - where an example below exists for a (sub)command whose help offers --json, its stdout parses.
 * Nothing here names the options of a command: new commands and options are walked as they come. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CMDS 256
#define EXTRA    "zz-not-an-argument"

typedef struct cmd {
    char name[64]; /* "quant" or "quant values" */
    char *help;    /* its --help output */
} cmd;

static cmd cmds[MAX_CMDS];
static int ncmds;

__attribute__((noinline)) static char *run_out(const char *args, int *rc) {
    char *out = NULL;
    const tu_run_opts o = {.timeout_s = 120};
    *rc = tu_run_cli_ex(&o, args, &out, NULL);
    if (!out) fail_msg("nanolm %s: no output captured", args);
    return out;
}

static void add_cmd(const char *name) {
    for (int i = 0; i < ncmds; i++)
        if (!strcmp(cmds[i].name, name)) return;
    assert_true(ncmds < MAX_CMDS);
    char args[128];
    snprintf(args, sizeof args, "%s --help", name);
    int rc;
    char *h = run_out(args, &rc);
    if (rc != 0) fail_msg("nanolm %s exited %d: %s", args, rc, h);
    snprintf(cmds[ncmds].name, sizeof cmds[ncmds].name, "%s", name);
    cmds[ncmds++].help = h;
}

/* Subcommands named in a command's help: the words after "nanolm CMD " on a usage line
 * (alternatives split at '|'). */
static void add_subcommands(const char *top) {
    char pat[80];
    snprintf(pat, sizeof pat, "nanolm %.60s ", top);
    char *help = NULL;
    for (int i = 0; i < ncmds; i++)
        if (!strcmp(cmds[i].name, top)) help = cmds[i].help;
    for (const char *p = help; p && (p = strstr(p, pat)) != NULL; p += strlen(pat)) {
        const char *w = p + strlen(pat);
        while (islower((unsigned char)*w)) {
            char word[48];
            int n = 0;
            while ((islower((unsigned char)w[n]) || isdigit((unsigned char)w[n]) || w[n] == '-') && n < 47) n++;
            snprintf(word, sizeof word, "%.*s", n, w);
            char name[64];
            snprintf(name, sizeof name, "%.31s %.31s", top, word);
            add_cmd(name);
            w += n;
            if (*w != '|') break;
            w++;
        }
    }
}

static void walk(void) {
    if (ncmds) return;
    int rc;
    char *out = run_out("--help", &rc);
    assert_int_equal(rc, 0);
    char *block = strstr(out, "commands:\n");
    assert_non_null(block);
    char tops[64][32];
    int ntop = 0;
    for (char *line = strchr(block, '\n') + 1; *line == ' ' && ntop < 64; line = strchr(line, '\n') + 1)
        if (sscanf(line, " %31s", tops[ntop]) == 1) ntop++;
    free(out);
    assert_true(ntop >= 10);
    for (int i = 0; i < ntop; i++) add_cmd(tops[i]);
    for (int i = 0; i < ntop; i++) add_subcommands(tops[i]);
    print_message("walked %d commands and subcommands\n", ncmds);
}

/* The command an option on this line refers to: the lowercase words after the last "nanolm " or
 * backquote that precedes text[i] on its line ("quant model" in "written by `nanolm quant model
 * --out`" or "a `quant model --out` file"); "other" after a possessive ("vLLM's --load-format")
 * or on a line that says the option is refused; else "". */
static void referred_command(const char *text, size_t i, char *ref, size_t n) {
    size_t b = i, e = i;
    while (b > 0 && text[b - 1] != '\n') b--;
    while (text[e] && text[e] != '\n') e++;
    ref[0] = '\0';
    if (memmem(text + b, e - b, "refused", 7) || memmem(text + b, e - b, "rejected", 8) ||
        memmem(text + b, e - b, "not supported", 13) || (i >= b + 3 && !memcmp(text + i - 3, "'s ", 3))) {
        snprintf(ref, n, "other");
        return;
    }
    const char *last = NULL;
    size_t skip = 0;
    for (const char *p = text + b; (p = memmem(p, (size_t)(text + i - p), "nanolm ", 7)) != NULL; p += 7)
        last = p, skip = 7;
    const char *tick = memrchr(text + b, '`', i - b);
    if (tick && (!last || tick > last)) last = tick, skip = 1;
    if (!last) return;
    size_t k = 0;
    for (const char *w = last + skip; w < text + i;) {
        size_t m = 0;
        while (w + m < text + i && (islower((unsigned char)w[m]) || isdigit((unsigned char)w[m]) || w[m] == '-')) m++;
        if (m == 0 || (w[m] != ' ' && w[m] != '`') || w[0] == '-') break;
        if (k + m + 2 >= n) break;
        if (k) ref[k++] = ' ';
        memcpy(ref + k, w, m);
        k += m;
        ref[k] = '\0';
        w += m + 1;
    }
}

/* Calls fn(name, ctx) for each distinct "--name" in text[0..len) that is not an option of
 * another command named on its line (`nanolm train --log`). */
static void each_option(const char *self, const char *text, size_t len, void (*fn)(const char *opt, void *ctx),
                        void *ctx) {
    char seen[4096] = " ";
    for (size_t i = 0; i + 2 < len; i++) {
        if (text[i] != '-' || text[i + 1] != '-' || !islower((unsigned char)text[i + 2])) continue;
        if (i > 0 && (isalnum((unsigned char)text[i - 1]) || text[i - 1] == '-')) continue;
        size_t n = 2;
        while (i + n < len &&
               (islower((unsigned char)text[i + n]) || isdigit((unsigned char)text[i + n]) || text[i + n] == '-'))
            n++;
        while (text[i + n - 1] == '-') n--;
        char opt[64], ref[96];
        snprintf(opt, sizeof opt, "%.*s", (int)(n < 63 ? n : 63), text + i);
        referred_command(text, i, ref, sizeof ref);
        if (ref[0] && strcmp(ref, self) != 0) {
            i += n - 1;
            continue;
        }
        char key[70];
        snprintf(key, sizeof key, " %s ", opt);
        if (strstr(seen, key) || strlen(seen) + strlen(key) >= sizeof seen) continue;
        strcat(seen, opt);
        strcat(seen, " ");
        fn(opt, ctx);
        i += n - 1;
    }
}

/* The part of a help text that belongs to (sub)command c: all of it, unless it is the help of
 * a whole family (it shows usage lines of other subcommands), then only c's own usage lines. */
static void own_text(const cmd *c, const char **text, size_t *len) {
    const char *sp = strchr(c->name, ' ');
    *text = c->help;
    *len = strlen(c->help);
    if (!sp) return;
    char top[64], mine[96];
    snprintf(top, sizeof top, "nanolm %.*s ", (int)(sp - c->name), c->name);
    snprintf(mine, sizeof mine, "nanolm %s", c->name);
    int others = 0;
    for (const char *p = c->help; (p = strstr(p, top)) != NULL; p++)
        if (strncmp(p, mine, strlen(mine)) != 0) others = 1;
    if (!others) return;
    const char *u = strstr(c->help, mine);
    assert_non_null(u);
    const char *end = strchr(u, '\n');
    /* continuation lines: indented, neither another "nanolm ..." usage line nor an option list */
    while (end && end[1] == ' ') {
        const char *next = strchr(end + 1, '\n');
        size_t l = next ? (size_t)(next - end - 1) : strlen(end + 1);
        if (memmem(end + 1, l, "nanolm ", 7) || memmem(end + 1, l, "  --", 4) == end + 1) break;
        end = next;
    }
    *text = u;
    *len = end ? (size_t)(end - u) : strlen(u);
}

typedef struct accept_ctx {
    const cmd *c;
    int checked, failed;
} accept_ctx;

static void check_accepted(const char *opt, void *vctx) {
    accept_ctx *x = vctx;
    if (!strcmp(opt, "--help")) return;
    char args[256];
    snprintf(args, sizeof args, "%s %s 1 " EXTRA, x->c->name, opt);
    int rc;
    char *out = run_out(args, &rc);
    x->checked++;
    /* "unknown option '--x'", "unknown option or missing value: '--x'" */
    char quoted[80];
    snprintf(quoted, sizeof quoted, "'%s'", opt);
    if ((strstr(out, "unknown") && strstr(out, quoted)) || rc < 0 || rc > 2) {
        print_message("nanolm %s: its --help shows %s, but: (exit %d) %s", x->c->name, opt, rc, out);
        x->failed++;
    }
    free(out);
}

static void test_every_option_in_help_is_accepted(void **state) {
    (void)state;
    walk();
    int total = 0, failed = 0;
    for (int i = 0; i < ncmds; i++) {
        /* a family's own help lists its subcommands' options: those are checked per subcommand */
        int is_family = 0;
        for (int j = 0; j < ncmds; j++)
            if (j != i && !strncmp(cmds[j].name, cmds[i].name, strlen(cmds[i].name)) &&
                cmds[j].name[strlen(cmds[i].name)] == ' ')
                is_family = 1;
        if (is_family) continue;
        accept_ctx x = {&cmds[i], 0, 0};
        const char *text;
        size_t len;
        own_text(&cmds[i], &text, &len);
        each_option(cmds[i].name, text, len, check_accepted, &x);
        total += x.checked;
        failed += x.failed;
    }
    print_message("%d options shown by --help tried, %d refused\n", total, failed);
    assert_true(total > 50);
    assert_int_equal(failed, 0);
}

/* ---- every option of a command's source appears in its help ---- */

typedef struct src_ctx {
    const char *helps;
    const char *file;
    int failed, checked;
} src_ctx;

/* Option names declared in a source: NL_OPT_*("name", ...) and getopt tables {"name", ..._argument. */
static void check_source_options(const char *file, const char *text, src_ctx *x) {
    for (const char *p = text; (p = strstr(p, "{\"")) != NULL; p++) {
        const char *q = strchr(p + 2, '"');
        if (!q || q - p > 40) continue;
        const char *after = q + 1;
        while (*after == ',' || *after == ' ') after++;
        if (strncmp(after, "required_argument", 17) && strncmp(after, "no_argument", 11) &&
            strncmp(after, "optional_argument", 17))
            continue;
        char opt[64];
        snprintf(opt, sizeof opt, "--%.*s", (int)(q - p - 2), p + 2);
        if (!strcmp(opt, "--help")) continue;
        x->checked++;
        if (!strstr(x->helps, opt)) {
            print_message("%s declares %s, which no --help of its command shows\n", file, opt);
            x->failed++;
        }
    }
    for (const char *p = text; (p = strstr(p, "NL_OPT_")) != NULL; p++) {
        const char *paren = strchr(p, '(');
        if (!paren || paren - p > 16 || paren[1] != '"') continue;
        const char *q = strchr(paren + 2, '"');
        if (!q) continue;
        char opt[64];
        snprintf(opt, sizeof opt, "--%.*s", (int)(q - paren - 2 < 60 ? q - paren - 2 : 60), paren + 2);
        x->checked++;
        if (!strstr(x->helps, opt)) {
            print_message("%s declares %s, which no --help of its command shows\n", file, opt);
            x->failed++;
        }
    }
}

static void test_every_declared_option_in_help(void **state) {
    (void)state;
    walk();
    DIR *d = opendir(tu_src_path("src/cli"));
    assert_non_null(d);
    struct dirent *e;
    int checked = 0, failed = 0;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, "cmd_", 4) != 0 || n < 7 || strcmp(e->d_name + n - 2, ".c") != 0) continue;
        /* cmd_quant_model.c belongs to "quant" (and "quant-compare"): the first word of the name */
        char fam[64];
        snprintf(fam, sizeof fam, "%.*s", (int)strcspn(e->d_name + 4, "_."), e->d_name + 4);
        size_t cap = 1, used = 0;
        for (int i = 0; i < ncmds; i++) cap += strlen(cmds[i].help) + 1;
        char *helps = calloc(cap, 1);
        assert_non_null(helps);
        for (int i = 0; i < ncmds; i++)
            if (!strncmp(cmds[i].name, fam, strlen(fam))) {
                memcpy(helps + used, cmds[i].help, strlen(cmds[i].help));
                used += strlen(cmds[i].help);
                helps[used++] = '\n';
            }
        if (used == 0) { /* a file whose command has another name: any help will do */
            for (int i = 0; i < ncmds; i++) {
                memcpy(helps + used, cmds[i].help, strlen(cmds[i].help));
                used += strlen(cmds[i].help);
                helps[used++] = '\n';
            }
        }
        char rel[300];
        snprintf(rel, sizeof rel, "src/cli/%s", e->d_name);
        char *text = tu_read_file(tu_src_path(rel), NULL);
        assert_non_null(text);
        src_ctx x = {helps, e->d_name, 0, 0};
        check_source_options(e->d_name, text, &x);
        checked += x.checked;
        failed += x.failed;
        free(text);
        free(helps);
    }
    closedir(d);
    print_message("%d declared options looked up in the help texts, %d missing\n", checked, failed);
    assert_true(checked > 50);
    assert_int_equal(failed, 0);
}

/* ---- --json parses ---- */

/* Quick invocations (a second or less each). A (sub)command whose help offers --json and that has
 * no example here is named in the test's output, not failed: add one. */
static const char *const examples[] = {
    "version --json",
    "formats --json",
    "formats cast 0.1 --to e4m3 --json",
    "formats sum --format bf16 --value 0.01 --count 1000 --json",
    "quant demo --json",
    "quant values 0.3,-0.5,0.12,1.5 --block 2 --json",
    "quant outliers --rows 16 --cols 64 --json",
    "collectives demo --json",
    "scaling optimal --params 1B --json",
    "scaling overtrain --params 1B --tokens 100B --json",
    "fp8 gemm --m 8 --n 8 --k 64 --json",
    "plan catalog --json",
};

static void test_json_parses(void **state) {
    (void)state;
    walk();
    int parsed = 0;
    for (int i = 0; i < ncmds; i++) {
        const char *text;
        size_t len;
        own_text(&cmds[i], &text, &len);
        if (!memmem(text, len, "--json", 6)) continue;
        int found = 0;
        for (size_t k = 0; k < sizeof examples / sizeof examples[0]; k++) {
            size_t n = strlen(cmds[i].name);
            if (strncmp(examples[k], cmds[i].name, n) || examples[k][n] != ' ') continue;
            /* "quant values ..." is an example of "quant values", not of "quant" */
            int deeper = 0;
            for (int j = 0; j < ncmds; j++)
                if (j != i && strlen(cmds[j].name) > n && !strncmp(examples[k], cmds[j].name, strlen(cmds[j].name)) &&
                    examples[k][strlen(cmds[j].name)] == ' ')
                    deeper = 1;
            if (deeper) continue;
            found = 1;
            char *out = NULL;
            const tu_run_opts o = {.timeout_s = 120, .stdout_only = 1};
            /* A command that starts MPI runs without leak checking under a sanitizer, as `make
             * check` runs the MPI tests: LeakSanitizer's tracer, stopping Open MPI's threads at
             * exit, crashed now and then (signal 11 in the tracer, exit 1, no report), and what
             * Open MPI keeps it cannot name once the plugins are unloaded. */
            int mpi = getenv("NANOLM_SANITIZED") && !strncmp(examples[k], "collectives ", 12);
            char *saved = mpi && getenv("ASAN_OPTIONS") ? strdup(getenv("ASAN_OPTIONS")) : NULL;
            if (mpi) setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
            int rc = tu_run_cli_ex(&o, examples[k], &out, NULL);
            if (mpi) saved ? setenv("ASAN_OPTIONS", saved, 1) : unsetenv("ASAN_OPTIONS");
            free(saved);
            if (rc != 0) fail_msg("nanolm %s exited %d: %s", examples[k], rc, out ? out : "");
            cJSON *doc = cJSON_Parse(out);
            if (!doc) fail_msg("nanolm %s: stdout is not JSON:\n%s", examples[k], out);
            cJSON_Delete(doc);
            free(out);
            parsed++;
        }
        if (!found) print_message("note: no --json example for 'nanolm %s' (not checked)\n", cmds[i].name);
    }
    print_message("%d --json outputs parsed\n", parsed);
    assert_true(parsed >= 8);
}

static int teardown(void **state) {
    (void)state;
    for (int i = 0; i < ncmds; i++) free(cmds[i].help);
    ncmds = 0;
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_option_in_help_is_accepted),
        cmocka_unit_test(test_every_declared_option_in_help),
        cmocka_unit_test(test_json_parses),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
