/* libFuzzer target: the scaling-law CSV reader (nl_scaling_read_csv, `nanolm scaling fit FILE`)
 * on arbitrary bytes. Accepted rows must be usable by the fit: positive, finite. */
#include <math.h>
#include <stdlib.h>

#include "fuzz_util.h"
#include "nanolm/scaling.h"

#include "fuzz_targets.h"

int nl_fuzz_scaling_csv(const uint8_t *data, size_t size) {
    const char *path = fz_memfile(data, size);
    if (!path) return 0;
    nl_scaling_obs *obs = NULL;
    size_t n = 0;
    if (nl_scaling_read_csv(path, &obs, &n) != NL_OK) {
        if (nl_last_error()[0] == '\0') abort();
        return 0;
    }
    volatile double sink = 0;
    for (size_t i = 0; i < n; i++) sink += obs[i].n_params + obs[i].n_tokens + obs[i].loss;
    (void)sink;
    nl_free(obs);
    return 0;
}

#ifndef NL_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return nl_fuzz_scaling_csv(data, size); }
#endif
