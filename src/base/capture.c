/* A command's output captured in this process (capture.h). */
#include "nanolm/capture.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Reads all of f from the start into a malloc'd string. */
static char *slurp(FILE *f) {
    if (fseek(f, 0, SEEK_END)) return NULL;
    long n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET)) return NULL;
    char *b = malloc((size_t)n + 1);
    if (!b) return NULL;
    size_t got = fread(b, 1, (size_t)n, f);
    b[got] = 0;
    return b;
}

char *nl_capture_run(nl_capture_fn fn, int argc, char **argv, int *status) {
    FILE *out = tmpfile(), *err = tmpfile();
    if (!out || !err) {
        if (out) fclose(out);
        if (err) fclose(err);
        return NULL;
    }
    /* The command writes to stdout and stderr as it does for a user: both go to temporary files. */
    fflush(stdout);
    fflush(stderr);
    int o1 = dup(1), o2 = dup(2);
    if (o1 < 0 || o2 < 0 || dup2(fileno(out), 1) < 0 || dup2(fileno(err), 2) < 0) {
        if (o1 >= 0) close(o1);
        if (o2 >= 0) close(o2);
        fclose(out);
        fclose(err);
        return NULL;
    }
    int rc = fn(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(o1, 1);
    dup2(o2, 2);
    close(o1);
    close(o2);
    char *text = slurp(rc ? err : out);
    fclose(out);
    fclose(err);
    *status = rc;
    return text;
}
