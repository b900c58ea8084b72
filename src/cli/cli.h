/*
 * Shared helpers of the command-line tool. Each command lives in src/cli/cmd_<name>.c and
 * exposes `int nl_cmd_<name>(int argc, char **argv)` (argv[0] is the command name), registered
 * in main.c's table. Exit status: 0 ok, 1 the work failed, 2 bad usage (unknown command,
 * option or value). Errors are one line on stderr that names what was wrong.
 */
#ifndef NANOLM_CLI_H
#define NANOLM_CLI_H

#include <getopt.h>
#include <stdint.h>
#include "nanolm/base.h"

#define NL_EXIT_OK    0
#define NL_EXIT_FAIL  1
#define NL_EXIT_USAGE 2

/* Prints "nanolm: <message>" on stderr and returns NL_EXIT_USAGE. */
int nl_cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints "nanolm: <what>: <nl_last_error()>" and returns NL_EXIT_FAIL. */
int nl_cli_fail(const char *what);

/* Parse a number given to option `opt`; on failure prints an error naming the option and the
 * value and returns NL_EXIT_USAGE, else 0. Accepts 1e9, 7B / 70M / 1.5T / 2k suffixes for
 * the *_si variants. */
int nl_cli_double(const char *opt, const char *s, double *out);
int nl_cli_double_si(const char *opt, const char *s, double *out);
int nl_cli_int(const char *opt, const char *s, int64_t min, int64_t max, int64_t *out);

/* Resets getopt for a (sub)command and sets opterr = 0 so that errors are ours. */
void nl_cli_getopt_reset(void);

/* Table printing: column widths are computed from the content. */
typedef struct nl_table {
    int ncols, nrows, cap;
    char **cells; /* row-major, nrows * ncols, row 0 = header */
    int *right;   /* per column: right-align */
} nl_table;
void nl_table_init(nl_table *t, int ncols, const char *const *header);
/* A new row of ncols cells at the end of the table, for the caller to fill (NULL: out of memory). */
char **nl_table_new_row(nl_table *t);
void nl_table_print(nl_table *t, FILE *f);
void nl_table_free(nl_table *t);

#endif
