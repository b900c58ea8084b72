/* libFuzzer target: the planner's catalog JSON files (--hw / --model files: nl_catalog_load_hw,
 * nl_catalog_load_model) on arbitrary bytes. The first byte picks GPU or model; an accepted model
 * is counted (nl_arch_count_params) and looked up, an accepted GPU looked up. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "nanolm/plan.h"

#include "fuzz_targets.h"

int nl_fuzz_catalog(const uint8_t *data, size_t size) {
    int models = (int)(fz_take(&data, &size, 1) & 1);
    const char *path = fz_memfile(data, size);
    if (!path) return 0;
    static nl_catalog c;
    nl_catalog_init(&c);
    nl_status rc = models ? nl_catalog_load_model(&c, path) : nl_catalog_load_hw(&c, path);
    if (rc != NL_OK) {
        if (nl_last_error()[0] == '\0') abort();
        return 0;
    }
    if (c.n_hw > NL_CATALOG_MAX || c.n_models > NL_CATALOG_MAX) abort();
    for (size_t i = 0; i < c.n_models; i++) {
        nl_arch a;
        if (nl_catalog_find_model(&c, c.models[i].arch.name, &a) != NL_OK) abort();
        nl_arch_params p;
        nl_arch_count_params(&a, &p);
    }
    for (size_t i = 0; i < c.n_hw; i++) {
        nl_hw h;
        if (nl_catalog_find_hw(&c, c.hw[i].name, &h) != NL_OK) abort();
    }
    char buf[4096];
    nl_catalog_hw_names(&c, buf, sizeof buf);
    nl_catalog_model_names(&c, buf, sizeof buf);
    return 0;
}

#ifndef NL_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return nl_fuzz_catalog(data, size); }
#endif
