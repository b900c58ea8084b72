/* The CLI's option tables (cli_opt.h) and its one result writer (report.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/cli_opt.h"
#include "cli/report.h"

typedef struct opts {
    int64_t steps;
    int threads;
    double lr, params;
    float eps;
    const char *data;
    int json, prec, steps_given;
} opts;

static int parse(opts *o, int argc, char **argv, const char **pos, int *npos, int maxpos) {
    nl_opt table[] = {
        NL_OPT_STR("data", &o->data, "FILE", "training text"),
        NL_OPT_INT("steps", &o->steps, 1, 1000, "N", "optimizer steps (default 20)"),
        NL_OPT_INT32("threads", &o->threads, 1, 64, "N", "threads"),
        NL_OPT_DBL("lr", &o->lr, 0, INFINITY, "X", "learning rate"),
        NL_OPT_SI("params", &o->params, 1, 1e15, "N", "parameters (7B, 500M)"),
        NL_OPT_FLT("eps", &o->eps, 0, 1, "X", "epsilon"),
        NL_OPT_CHOICE("precision", &o->prec, "fp32|bf16|fp16", "number format"),
        NL_OPT_FLAG("json", &o->json, "JSON"),
    };
    table[1].given = &o->steps_given;
    table[1].aliases = "iters,num-steps";
    nl_optgroup groups[] = {{"training", table, NL_NOPTS(table)}};
    nl_cmdspec spec = {"demo", "nanolm demo [options]", NULL, groups, 1, maxpos};
    return nl_cli_parse(&spec, argc, argv, pos, npos);
}

#define ARGV(...) (char *[]){"demo", __VA_ARGS__}, (int)(sizeof((char *[]){"demo", __VA_ARGS__}) / sizeof(char *))

static int run(opts *o, char **argv, int argc) {
    memset(o, 0, sizeof *o);
    o->steps = 20;
    return parse(o, argc, argv, NULL, NULL, 0);
}

static void test_parse_types(void **state) {
    (void)state;
    opts o;
    assert_int_equal(run(&o, ARGV("--data", "x.txt", "--steps=7", "--threads", "3", "--lr", "0.5e-3", "--params", "7B",
                                  "--eps", "1e-5", "--precision", "fp16", "--json")),
                     0);
    assert_string_equal(o.data, "x.txt");
    assert_int_equal(o.steps, 7);
    assert_int_equal(o.steps_given, 1);
    assert_int_equal(o.threads, 3);
    assert_true(o.lr == 0.5e-3);
    assert_true(o.params == 7e9);
    assert_true(o.eps == 1e-5f);
    assert_int_equal(o.prec, 2);
    assert_int_equal(o.json, 1);
    /* an alias sets the same field */
    assert_int_equal(run(&o, ARGV("--num-steps", "9")), 0);
    assert_int_equal(o.steps, 9);
    assert_int_equal(run(&o, ARGV("--iters=11")), 0);
    assert_int_equal(o.steps, 11);
    /* defaults untouched when absent */
    assert_int_equal(run(&o, ARGV("--json")), 0);
    assert_int_equal(o.steps, 20);
    assert_int_equal(o.steps_given, 0);
}

static void test_parse_errors(void **state) {
    (void)state;
    opts o;
    assert_int_equal(run(&o, ARGV("--steps", "0")), NL_EXIT_USAGE);    /* below range */
    assert_int_equal(run(&o, ARGV("--steps", "1001")), NL_EXIT_USAGE); /* above range */
    assert_int_equal(run(&o, ARGV("--steps", "7x")), NL_EXIT_USAGE);   /* not an integer */
    assert_int_equal(run(&o, ARGV("--steps")), NL_EXIT_USAGE);         /* missing value */
    assert_int_equal(run(&o, ARGV("--stepz", "3")), NL_EXIT_USAGE);    /* unknown */
    assert_int_equal(run(&o, ARGV("--ste", "3")), NL_EXIT_USAGE);      /* no prefix matching */
    assert_int_equal(run(&o, ARGV("--lr", "nan")), NL_EXIT_USAGE);     /* not finite */
    assert_int_equal(run(&o, ARGV("--lr", "-1")), NL_EXIT_USAGE);      /* below 0 */
    assert_int_equal(run(&o, ARGV("--params", "-7B")), NL_EXIT_USAGE); /* negative size */
    assert_int_equal(run(&o, ARGV("--eps", "2")), NL_EXIT_USAGE);
    assert_int_equal(run(&o, ARGV("--precision", "fp64")), NL_EXIT_USAGE); /* not a choice */
    assert_int_equal(run(&o, ARGV("--json=1")), NL_EXIT_USAGE);            /* flags take no value */
    assert_int_equal(run(&o, ARGV("--data", "")), NL_EXIT_USAGE);          /* empty string */
    assert_int_equal(run(&o, ARGV("-x")), NL_EXIT_USAGE);
    assert_int_equal(run(&o, ARGV("stray")), NL_EXIT_USAGE); /* no positionals */
    assert_int_equal(run(&o, ARGV("--threads", "99999999999")), NL_EXIT_USAGE);
}

static void test_positional(void **state) {
    (void)state;
    opts o;
    memset(&o, 0, sizeof o);
    const char *pos[2];
    int npos = -1;
    char *argv[] = {"demo", "0.3,-0.5", "--steps", "3", "--", "-1.5"};
    assert_int_equal(parse(&o, 6, argv, pos, &npos, 2), 0);
    assert_int_equal(npos, 2);
    assert_string_equal(pos[0], "0.3,-0.5");
    assert_string_equal(pos[1], "-1.5");
    /* a negative number is a positional, not an option */
    char *argv2[] = {"demo", "-0.5"};
    assert_int_equal(parse(&o, 2, argv2, pos, &npos, 2), 0);
    assert_string_equal(pos[0], "-0.5");
    char *argv3[] = {"demo", "a", "b", "c"};
    assert_int_equal(parse(&o, 4, argv3, pos, &npos, 2), NL_EXIT_USAGE);
}

static void test_help_lists_every_option(void **state) {
    (void)state;
    opts o;
    memset(&o, 0, sizeof o);
    nl_opt table[] = {
        NL_OPT_INT("steps", &o.steps, 1, 1000, "N", "optimizer steps"),
        NL_OPT_CHOICE("precision", &o.prec, "fp32|bf16", "number format"),
        NL_OPT_FLAG("json", &o.json, "JSON"),
    };
    table[0].aliases = "iters";
    nl_optgroup groups[] = {{"training", table, NL_NOPTS(table)}};
    nl_cmdspec spec = {"demo", "nanolm demo [options]", "A demo.", groups, 1, 0};
    char buf[4096];
    FILE *f = fmemopen(buf, sizeof buf, "w");
    assert_non_null(f);
    nl_cli_help(&spec, f);
    fclose(f);
    assert_non_null(strstr(buf, "usage: nanolm demo [options]"));
    assert_non_null(strstr(buf, "training:"));
    assert_non_null(strstr(buf, "--steps N"));
    assert_non_null(strstr(buf, "--iters"));
    assert_non_null(strstr(buf, "--precision fp32|bf16"));
    assert_non_null(strstr(buf, "--json"));
    assert_non_null(strstr(buf, "--help"));
}

static void test_json_doubles_round_trip(void **state) {
    (void)state;
    const double vals[] = {2.2232532501220703e-05, 0.1,  1.0 / 3.0,   6.02214076e23,      5e-324,
                           1.7976931348623157e308, -0.0, 123456789.0, 0.30000000000000004};
    char buf[32];
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        nl_json_double(vals[i], buf);
        assert_true(strtod(buf, NULL) == vals[i]);
    }
    assert_string_equal(nl_json_double(0.1, buf), "0.1"); /* shortest that round-trips */
    assert_string_equal(nl_json_double(NAN, buf), "null");
    assert_string_equal(nl_json_double(INFINITY, buf), "null");
}

static char *capture(const nl_report *r, int json) {
    static char buf[8192];
    FILE *f = fmemopen(buf, sizeof buf, "w");
    assert_non_null(f);
    assert_int_equal(nl_report_write(r, json, f), 0);
    fclose(f);
    return buf;
}

static void test_report_table_and_json(void **state) {
    (void)state;
    nl_report *r = nl_report_new("demo");
    assert_non_null(r);
    nl_report_str(r, "model", "model", "llama-7b");
    nl_report_num(r, "fp16", "fp16 value", 2.2232532501220703e-05, "%.4g", NULL);
    nl_report_int(r, "steps", "steps", 7, "steps");
    nl_report_table(r, "rows", "per layer", 2,
                    (const nl_report_col[]){{"name", "layer", NULL}, {"bytes", "bytes", "%.1f"}});
    nl_report_cell_str(r, "attn");
    nl_report_cell_num(r, 1.5);
    nl_report_row_end(r);
    nl_report_cell_str(r, "mlp");
    nl_report_cell_num(r, 0.1);
    nl_report_row_end(r);
    const char *text = capture(r, 0);
    assert_non_null(strstr(text, "model       llama-7b"));
    assert_non_null(strstr(text, "fp16 value  2.223e-05"));
    assert_non_null(strstr(text, "per layer"));
    assert_non_null(strstr(text, "attn     1.5"));
    cJSON *doc = cJSON_Parse(capture(r, 1));
    assert_non_null(doc);
    assert_string_equal(cJSON_GetObjectItem(doc, "model")->valuestring, "llama-7b");
    assert_true(cJSON_GetObjectItem(doc, "fp16")->valuedouble == 2.2232532501220703e-05);
    assert_int_equal(cJSON_GetObjectItem(doc, "steps")->valueint, 7);
    cJSON *rows = cJSON_GetObjectItem(doc, "rows");
    assert_int_equal(cJSON_GetArraySize(rows), 2);
    assert_true(cJSON_GetObjectItem(cJSON_GetArrayItem(rows, 1), "bytes")->valuedouble == 0.1);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(rows, 0), "name")->valuestring, "attn");
    cJSON_Delete(doc);
    nl_report_free(r);
}

/* Nested objects and lists: the JSON parses back with the same doubles (bit for bit), in the same
 * nesting; the text form indents the object and prints the lists on one line. */
static void test_report_objects_and_lists(void **state) {
    (void)state;
    /* doubles that need 17 digits, a subnormal, the fp16 value of issue 17, a negative zero */
    const double v[] = {0.1, 1.0 / 3.0, 2.2232532501220703e-05, 4.9406564584124654e-324, -0.0, 1e300, 25.0};
    const int nv = (int)(sizeof v / sizeof v[0]);
    const char *names[] = {"int8", "int4", NULL};
    nl_report *r = nl_report_new("nested");
    assert_non_null(r);
    nl_report_str(r, "scheme", "scheme", "int8-tensor");
    nl_report_begin_object(r, "block1", "block 1:");
    nl_report_num(r, "scale", "scale", 1.5 / 127, "%.4g", NULL);
    nl_report_nums(r, "values", "x", v, nv, "%g", "units");
    nl_report_begin_object(r, "inner", NULL);
    nl_report_strs(r, "schemes", "schemes", names, 3);
    nl_report_nums(r, "empty", "empty", NULL, 0, NULL, NULL);
    nl_report_end_object(r);
    nl_report_table(r, "rows", "rows", 1, (const nl_report_col[]){{"k", "k", NULL}});
    nl_report_cell_num(r, 1.0 / 7.0);
    nl_report_row_end(r);
    nl_report_end_object(r);
    nl_report_int(r, "after", "after", 3, NULL);

    const char *text = capture(r, 0);
    assert_non_null(strstr(text, "block 1:\n"));
    assert_non_null(strstr(text, "\n  scale "));
    assert_non_null(strstr(text, "0.1 0.333333 2.22325e-05 4.94066e-324 -0 1e+300 25 units"));
    assert_non_null(strstr(text, "\n    schemes"));
    assert_non_null(strstr(text, "int8 int4 -\n"));

    cJSON *doc = cJSON_Parse(capture(r, 1));
    assert_non_null(doc);
    cJSON *b1 = cJSON_GetObjectItem(doc, "block1");
    assert_true(cJSON_IsObject(b1));
    assert_true(cJSON_GetObjectItem(b1, "scale")->valuedouble == 1.5 / 127);
    cJSON *vals = cJSON_GetObjectItem(b1, "values");
    assert_int_equal(cJSON_GetArraySize(vals), nv);
    for (int i = 0; i < nv; i++) {
        double back = cJSON_GetArrayItem(vals, i)->valuedouble;
        assert_memory_equal(&back, &v[i], sizeof back); /* bit-identical, -0 included */
    }
    cJSON *inner = cJSON_GetObjectItem(b1, "inner");
    cJSON *sch = cJSON_GetObjectItem(inner, "schemes");
    assert_int_equal(cJSON_GetArraySize(sch), 3);
    assert_string_equal(cJSON_GetArrayItem(sch, 1)->valuestring, "int4");
    assert_true(cJSON_IsNull(cJSON_GetArrayItem(sch, 2)));
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(inner, "empty")), 0);
    cJSON *row = cJSON_GetArrayItem(cJSON_GetObjectItem(b1, "rows"), 0);
    assert_true(cJSON_GetObjectItem(row, "k")->valuedouble == 1.0 / 7.0);
    assert_null(cJSON_GetObjectItem(doc, "rows"));                    /* the table went inside block1 */
    assert_int_equal(cJSON_GetObjectItem(doc, "after")->valueint, 3); /* and back at the top after end */
    cJSON_Delete(doc);
    nl_report_free(r);
}

/* A value in one form only (label "": JSON only; key NULL: text only) and the label gap. */
static void test_report_one_form_values(void **state) {
    (void)state;
    nl_report *r = nl_report_new("forms");
    nl_report_set_gap(r, 1);
    nl_report_num(r, "below", "", 256.0, NULL, NULL);
    nl_report_num(r, "above", "", 258.0, NULL, NULL);
    nl_report_str(r, NULL, "neighbours", "256 below, 258 above");
    nl_report_str(r, "input", "input", "257");
    const char *text = capture(r, 0);
    assert_string_equal(text, "neighbours 256 below, 258 above\ninput      257\n");
    cJSON *doc = cJSON_Parse(capture(r, 1));
    assert_non_null(doc);
    assert_int_equal(cJSON_GetArraySize(doc), 3); /* below, above, input: no text-only entry */
    assert_true(cJSON_GetObjectItem(doc, "above")->valuedouble == 258.0);
    assert_null(cJSON_GetObjectItem(doc, "neighbours"));
    cJSON_Delete(doc);
    nl_report_free(r);
    /* a table with a JSON-only column (header "") and a text-only column (key NULL) */
    r = nl_report_new("cols");
    nl_report_table(r, "formats", NULL, 3,
                    (const nl_report_col[]){{"name", "format", NULL}, {"description", "", NULL}, {NULL, "NaN", NULL}});
    nl_report_cell_str(r, "bf16");
    nl_report_cell_str(r, "bfloat16");
    nl_report_cell_str(r, "yes");
    nl_report_row_end(r);
    text = capture(r, 0);
    assert_null(strstr(text, "bfloat16"));
    assert_non_null(strstr(text, "format  NaN"));
    assert_non_null(strstr(text, "bf16    yes"));
    doc = cJSON_Parse(capture(r, 1));
    cJSON *row = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "formats"), 0);
    assert_string_equal(cJSON_GetObjectItem(row, "description")->valuestring, "bfloat16");
    assert_int_equal(cJSON_GetArraySize(row), 2);
    cJSON_Delete(doc);
    nl_report_free(r);
}

/* A repeatable option keeps every value in order; a bare number ("-inf", "-1.5") is positional;
 * more than NL_OPT_LIST_MAX values is refused. */
static void test_list_option_and_negative_positional(void **state) {
    (void)state;
    nl_opt_list runs = {{0}, 0};
    nl_opt table[] = {NL_OPT_LIST("run", &runs, "L=F", "a run")};
    nl_optgroup groups[] = {{NULL, table, 1}};
    nl_cmdspec spec = {"demo", "nanolm demo", NULL, groups, 1, 2};
    const char *pos[2] = {0};
    int npos = 0;
    char *argv[] = {"demo", "--run", "a=1.csv", "-inf", "--run=b=2.csv", "-1.5"};
    assert_int_equal(nl_cli_parse(&spec, 6, argv, pos, &npos), 0);
    assert_int_equal(runs.n, 2);
    assert_string_equal(runs.v[0], "a=1.csv");
    assert_string_equal(runs.v[1], "b=2.csv");
    assert_int_equal(npos, 2);
    assert_string_equal(pos[0], "-inf");
    assert_string_equal(pos[1], "-1.5");
    char *many[3 + 2 * NL_OPT_LIST_MAX];
    many[0] = "demo";
    for (int i = 0; i <= NL_OPT_LIST_MAX; i++) many[1 + 2 * i] = "--run", many[2 + 2 * i] = "x";
    runs.n = 0;
    assert_int_equal(nl_cli_parse(&spec, 3 + 2 * NL_OPT_LIST_MAX, many, pos, &npos), NL_EXIT_USAGE);
    char *bad[] = {"demo", "-x"};
    assert_int_equal(nl_cli_parse(&spec, 2, bad, pos, &npos), NL_EXIT_USAGE);
}

/* A text-only table (key NULL), a JSON-only table (every header ""), list cells, and a '-' format
 * flag that keeps numbers left-aligned. */
static void test_report_one_form_tables(void **state) {
    (void)state;
    const double ks[] = {128, 256}, errs[] = {2.5e-4, 4.0e-4};
    nl_report *r = nl_report_new("tables");
    nl_report_table(r, NULL, "text only", 2, (const nl_report_col[]){{NULL, "K", "%-.0f"}, {NULL, "err", "%.1e"}});
    nl_report_cell_num(r, 128);
    nl_report_cell_num(r, 2.5e-4);
    nl_report_row_end(r);
    nl_report_cell_num(r, 16384);
    nl_report_cell_num(r, 4e-4);
    nl_report_row_end(r);
    nl_report_table(r, "series", NULL, 2, (const nl_report_col[]){{"k", "", NULL}, {"err", "", NULL}});
    nl_report_cell_nums(r, ks, 2);
    nl_report_cell_nums(r, errs, 2);
    nl_report_row_end(r);
    const char *text = capture(r, 0);
    assert_non_null(strstr(text, "text only\nK      err\n"));
    assert_non_null(strstr(text, "\n128    2.5e-04\n")); /* K left-aligned, err right-aligned */
    assert_null(strstr(text, "series"));
    cJSON *doc = cJSON_Parse(capture(r, 1));
    assert_non_null(doc);
    assert_int_equal(cJSON_GetArraySize(doc), 1); /* only the JSON table */
    cJSON *row = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "series"), 0);
    assert_true(cJSON_GetArrayItem(cJSON_GetObjectItem(row, "err"), 1)->valuedouble == 4.0e-4);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(row, "k")), 2);
    cJSON_Delete(doc);
    nl_report_free(r);
}

/* An object left open, or closed twice, makes the report fail to print instead of printing
 * something half-nested. */
static void test_report_unbalanced_objects_fail(void **state) {
    (void)state;
    FILE *f = fopen("/dev/null", "w");
    assert_non_null(f);
    nl_report *r = nl_report_new("open");
    nl_report_begin_object(r, "a", NULL);
    assert_int_equal(nl_report_write(r, 1, f), -1);
    nl_report_free(r);
    r = nl_report_new("closed twice");
    nl_report_begin_object(r, "a", NULL);
    nl_report_end_object(r);
    nl_report_end_object(r);
    assert_int_equal(nl_report_write(r, 0, f), -1);
    nl_report_free(r);
    r = nl_report_new("too deep");
    for (int i = 0; i < 9; i++) nl_report_begin_object(r, "d", NULL);
    for (int i = 0; i < 9; i++) nl_report_end_object(r);
    assert_int_equal(nl_report_write(r, 1, f), -1);
    nl_report_free(r);
    fclose(f);
}

static void test_report_misuse_is_an_error(void **state) {
    (void)state;
    nl_report *r = nl_report_new("bad");
    nl_report_cell_num(r, 1.0); /* a cell with no table */
    FILE *f = fopen("/dev/null", "w");
    assert_int_equal(nl_report_write(r, 0, f), -1);
    fclose(f);
    nl_report_free(r);
    /* NULL report: every call is a no-op and printing fails cleanly */
    nl_report_num(NULL, "x", NULL, 1, NULL, NULL);
    assert_int_equal(nl_report_write(NULL, 1, stdout), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_types),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_positional),
        cmocka_unit_test(test_help_lists_every_option),
        cmocka_unit_test(test_json_doubles_round_trip),
        cmocka_unit_test(test_report_table_and_json),
        cmocka_unit_test(test_report_misuse_is_an_error),
        cmocka_unit_test(test_report_objects_and_lists),
        cmocka_unit_test(test_report_unbalanced_objects_fail),
        cmocka_unit_test(test_report_one_form_values),
        cmocka_unit_test(test_list_option_and_negative_positional),
        cmocka_unit_test(test_report_one_form_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
