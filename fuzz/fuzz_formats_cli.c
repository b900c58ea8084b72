/* libFuzzer target: `nanolm formats cast ARGS...` with up to 8 arguments cut from the input at
 * NUL bytes (value, --to, --rounding, --overflow, --seed, --json, in any order and spelling).
 * The command must return 0, 1 or 2 and never crash. */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "fuzz_util.h"

int nl_cmd_formats(int argc, char **argv);
#include "fuzz_targets.h"

int nl_fuzz_formats_cli(const uint8_t *data, size_t size) {
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    char *argv[11] = {"formats", "cast"};
    int argc = 2;
    for (char *p = buf; argc < 10 && p <= buf + size; p += strlen(p) + 1) argv[argc++] = p;
    argv[argc] = NULL;
    nl_cli_getopt_reset();
    int rc = nl_cmd_formats(argc, argv);
    if (rc < 0 || rc > 2) abort();
    free(buf);
    return 0;
}

#ifndef NL_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return nl_fuzz_formats_cli(data, size); }
#endif
