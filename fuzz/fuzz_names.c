/* libFuzzer target: every name parser of the numerics on arbitrary strings: format names
 * (nl_fmt_from_name), quantization schemes (nl_quant_spec_parse), FP8 scalings and formats.
 * An accepted name must round-trip: its canonical name parses to the same thing. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "nanolm/formats.h"
#include "nanolm/fp8.h"
#include "nanolm/quant.h"

#include "fuzz_targets.h"

int nl_fuzz_names(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    nl_format f, f2;
    if (nl_fmt_from_name(s, &f) == NL_OK) {
        if (f < 0 || f >= NL_FMT_COUNT) abort();
        if (nl_fmt_from_name(nl_fmt_name(f), &f2) != NL_OK || f2 != f) abort();
    } else if (nl_last_error()[0] == '\0') {
        abort();
    }
    nl_quant_spec q, q2;
    if (nl_quant_spec_parse(s, &q) == NL_OK) {
        char buf[64];
        if (nl_quant_check_spec(&q) != NL_OK) abort();
        nl_quant_spec_name(&q, buf, sizeof buf);
        if (nl_quant_spec_parse(buf, &q2) != NL_OK) abort();
        if (q2.kind != q.kind || q2.gran != q.gran || q2.bits != q.bits || q2.block != q.block ||
            q2.is_unsigned != q.is_unsigned ||
            (q.kind == NL_QUANT_MX && (q2.mx_elem != q.mx_elem || q2.mx_ties != q.mx_ties)))
            abort();
    } else if (nl_last_error()[0] == '\0') {
        abort();
    }
    nl_fp8_scaling sc;
    if (nl_fp8_scaling_from_name(s, &sc) == NL_OK && (sc < 0 || sc >= NL_FP8_SCALE_COUNT)) abort();
    if (nl_fp8_format_from_name(s, &f) == NL_OK && f != NL_FMT_E4M3 && f != NL_FMT_E5M2) abort();
    free(s);
    return 0;
}

#ifndef NL_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return nl_fuzz_names(data, size); }
#endif
