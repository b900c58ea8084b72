/* Helpers for the cmocka tests: shared data paths, running the CLI, temp dirs. */
#ifndef NANOLM_TESTUTIL_H
#define NANOLM_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

/* Path of a data file `rel` (e.g. "tinyshakespeare/input.txt"): under the committed data/
 * folder (NANOLM_DATA), else under the optional larger-data folder (NANOLM_DATA_EXTRA, by default
 * ../shared/data), else NULL. Returned buffer is static per call slot (8 slots, round-robin). */
const char *tu_data_path(const char *rel);
/* Path of a file committed under data/; fails the test (a broken checkout) when it is missing. */
const char *tu_committed_data(const char *rel);
/* Skips the current test with a message naming the missing file when path is NULL. */
#define TU_REQUIRE_DATA(var, rel)                                                                                      \
    const char *var = tu_data_path(rel);                                                                               \
    if (!var) {                                                                                                        \
        print_message("[  SKIP    ] needs %s in data/ or NANOLM_DATA_EXTRA (not present)\n", rel);                     \
        skip();                                                                                                        \
        return;                                                                                                        \
    }
/* Runs the CLI (NANOLM_BIN) with a shell-quoted argument string; captures stdout+stderr into
 * a malloc'd string (*out, may be NULL) and returns the exit status. */
int tu_run_cli(const char *args, char **out);

/* How tu_run_cli_ex runs the CLI. Zero fields are the defaults of tu_run_cli. */
typedef struct tu_run_opts {
    int np;          /* > 0: under `mpirun -np np` (as root and oversubscribed); 0: one process */
    int timeout_s;   /* > 0: under `timeout -k 10 timeout_s` (a hang shows as status 124) */
    int one_thread;  /* OMP_NUM_THREADS=1 (ranks on a shared machine) */
    int stdout_only; /* capture stdout only (stderr goes to the test's own stderr) */
    int no_output;   /* tu_spawn_cli: stdout and stderr to /dev/null (tu_proc.out is NULL) */
} tu_run_opts;

/* Runs `[timeout] [mpirun -np N] nanolm args` as `o` says; *out (may be NULL) gets the captured
 * output as a malloc'd string (NULL when memory ran out), *elapsed_s (may be NULL) the wall
 * time. Returns the exit status, or -1 when the command could not be started or did not exit. */
int tu_run_cli_ex(const tu_run_opts *o, const char *args, char **out, double *elapsed_s);
/* Runs a shell command line as given (add 2>&1 to capture stderr too); *out (may be NULL) gets
 * its standard output as a malloc'd string. Returns the exit status, 128 + the signal when a
 * signal ended it, or -1 when it could not be started. */
int tu_run_shell(const char *cmd, char **out);
/* A CLI process started in the background (tu_spawn_cli), its output read as it comes. */
typedef struct tu_proc {
    int pid;   /* the process started: nanolm, or mpirun with np > 0 */
    FILE *out; /* its stdout (and stderr unless stdout_only) */
} tu_proc;
/* Starts `[mpirun -np N] nanolm argv[0] argv[1] ...` (argv ends with NULL) without a shell, as `o`
 * says (np, one_thread, stdout_only, no_output; timeout_s is not used: the test ends it). Returns
 * 0, or -1 when it could not be started. */
int tu_spawn_cli(const tu_run_opts *o, const char *const *argv, tu_proc *p);
/* Reads the output line by line until the n-th line containing `needle` (a line at most 511
 * bytes); returns how many such lines were seen (fewer than n: the output ended first). */
int tu_wait_for_output(tu_proc *p, const char *needle, int n);
/* Reads the rest of the output into *rest (a malloc'd string; may be NULL to discard it; NULL with
 * no_output or when memory ran out), waits for the process and returns its exit status, 128 + the
 * signal that ended it, or -1. */
int tu_proc_finish(tu_proc *p, char **rest);
/* The pids of the processes whose parent is `parent` (the ranks mpirun started), from /proc, in
 * increasing order; returns how many (at most cap). */
int tu_children_of(int parent, int *out, int cap);
/* How many files in dir have ".tmp." in their name (temporary files an atomic write left). */
int tu_count_tmp(const char *dir);
/* A `nanolm serve` started in the background on an ephemeral 127.0.0.1 port. */
typedef struct tu_server {
    int pid;
    int port;
    char log[700]; /* its stderr */
} tu_server;
/* Starts `nanolm serve ARGS --port 0 --port-file DIR/NAME.port` (ARGS as a shell would split
 * them) with stderr in DIR/NAME.log, and waits up to 60 s until it has written its port. Returns
 * 0; or -1 when it exited first or did not listen in time (killed then), with *why (may be NULL)
 * a malloc'd explanation with its log. */
int tu_server_start(tu_server *s, const char *dir, const char *name, const char *args, char **why);
/* SIGTERM, then waits up to 240 s (SIGKILL after): the exit status, or 128 + the signal. */
int tu_server_stop(tu_server *s);
/* SIGKILL and wait, for a teardown after a failed test (nothing when pid <= 0). */
void tu_server_kill(tu_server *s);
/* A fresh temporary directory (removed by tu_rmdir). */
char *tu_tmpdir(void);
void tu_rmdir(const char *dir);
/* Reads a whole file; returns malloc'd buffer or NULL. */
char *tu_read_file(const char *path, size_t *bytes);
/* Path under the source tree (NANOLM_SRC), e.g. tests/ref/x.bin. Static buffer slots. */
const char *tu_src_path(const char *rel);

#endif
