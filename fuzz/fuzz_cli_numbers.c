/* libFuzzer target: the CLI's number parsing (nl_cli_double, nl_cli_double_si, nl_cli_int) on
 * arbitrary strings. Accepted values must be finite and integers inside the asked range. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "fuzz_util.h"

#include "fuzz_targets.h"

int nl_fuzz_cli_numbers(const uint8_t *data, size_t size) {
    int64_t lo = (int64_t)fz_take(&data, &size, 8);
    int64_t hi = (int64_t)fz_take(&data, &size, 8);
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    double v;
    if (nl_cli_double("--x", s, &v) == 0 && !isfinite(v)) abort();
    if (nl_cli_double_si("--x", s, &v) == 0 && !isfinite(v)) abort();
    int64_t i;
    if (nl_cli_int("--n", s, lo, hi, &i) == 0 && (i < lo || i > hi)) abort();
    if (nl_cli_int("--n", s, INT64_MIN, INT64_MAX, &i) == 0 && size == 0) abort();
    free(s);
    return 0;
}

#ifndef NL_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return nl_fuzz_cli_numbers(data, size); }
#endif
