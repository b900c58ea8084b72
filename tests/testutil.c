#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char slots[8][4096];
static int slot_i;

static char *next_slot(void) { return slots[slot_i++ % 8]; }

const char *tu_data_path(const char *rel) {
    const char *roots[2] = {getenv("NANOLM_DATA"), getenv("NANOLM_DATA_EXTRA")};
    if (!roots[0]) roots[0] = "data";
    if (!roots[1]) roots[1] = "../shared/data";
    char *p = next_slot();
    for (int i = 0; i < 2; i++) {
        snprintf(p, 4096, "%s/%s", roots[i], rel);
        struct stat st;
        if (stat(p, &st) == 0) return p;
    }
    return NULL;
}

const char *tu_committed_data(const char *rel) {
    const char *root = getenv("NANOLM_DATA");
    char *p = next_slot();
    snprintf(p, 4096, "%s/%s", root ? root : "data", rel);
    struct stat st;
    if (stat(p, &st) != 0) fail_msg("%s is missing: it is committed under data/", p);
    return p;
}

const char *tu_src_path(const char *rel) {
    const char *root = getenv("NANOLM_SRC");
    char *p = next_slot();
    snprintf(p, 4096, "%s/%s", root ? root : ".", rel);
    return p;
}

int tu_run_cli(const char *args, char **out) {
    const char *bin = getenv("NANOLM_BIN");
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", bin ? bin : "build/nanolm", args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += n;
        if (cap - len < 2) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
    }
    if (buf) buf[len] = '\0';
    int st = pclose(p);
    if (out) *out = buf; else free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

char *tu_tmpdir(void) {
    char *t = malloc(64);
    snprintf(t, 64, "/tmp/nanolm-test-XXXXXX");
    if (!mkdtemp(t)) { free(t); return NULL; }
    return t;
}

void tu_rmdir(const char *dir) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

char *tu_read_file(const char *path, size_t *bytes) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    if (b) b[n] = '\0';
    fclose(f);
    if (bytes) *bytes = (size_t)n;
    return b;
}
