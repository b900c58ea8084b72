/* An engine over random weights of a model shape. See include/nanolm/dummy_engine.h. */
#include "nanolm/dummy_engine.h"

#include <stdio.h>
#include <string.h>

nl_status nl_dummy_engine_open(nl_dummy_engine *d, const nl_arch *a, const char *tokenizer,
                               const nl_engine_opts *opts) {
    memset(d, 0, sizeof *d);
    nl_arch shape = *a;
    if (!shape.name[0]) snprintf(shape.name, sizeof shape.name, "dummy");
    snprintf(d->name, sizeof d->name, "%s", shape.name);
    nl_status rc = nl_model_init(&d->m, &shape);
    if (rc) {
        char why[320];
        snprintf(why, sizeof why, "%s", nl_last_error());
        return nl_fail(rc, "--dummy-arch: %s", why);
    }
    nl_model_init_random(&d->m, 1);
    rc = tokenizer                 ? nl_tokenizer_load_llama2c(&d->t, tokenizer, (int)shape.vocab_size)
         : shape.vocab_size == 256 ? nl_tokenizer_init_byte(&d->t)
                                   : nl_fail(NL_ERR_INVALID, "--dummy-arch with vocab_size %lld needs --tokenizer",
                                             (long long)shape.vocab_size);
    if (!rc) rc = nl_engine_open_model(&d->e, &d->m, &d->t, opts);
    if (rc) {
        nl_tokenizer_free(&d->t);
        nl_model_free(&d->m);
        d->e = NULL;
    }
    return rc;
}

void nl_dummy_engine_close(nl_dummy_engine *d) {
    nl_engine_close(d->e);
    d->e = NULL;
    nl_model_free(&d->m);
    nl_tokenizer_free(&d->t);
}
