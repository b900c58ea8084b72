/* An engine over random weights of a model shape (vLLM's --load-format dummy): load tests of a
 * shape without its checkpoint. The engine borrows the model and tokenizer kept here. */
#ifndef NANOLM_DUMMY_ENGINE_H
#define NANOLM_DUMMY_ENGINE_H

#include "nanolm/engine.h"
#include "nanolm/model.h"
#include "nanolm/tokenizer.h"

typedef struct nl_dummy_engine {
    nl_engine *e;
    nl_model m;     /* random weights (seed 1) of the shape */
    nl_tokenizer t; /* the llama2.c tokenizer given, else bytes (vocab_size 256 only) */
    char name[64];  /* the shape's name, "dummy" if it has none */
} nl_dummy_engine;

/* Opens *d over random weights of shape *a with opts. tokenizer: a llama2.c tokenizer file, or
 * NULL for the 256-byte vocabulary (other vocab_size: NL_ERR_INVALID). A shape the model cannot
 * take fails with its message after "--dummy-arch: ". On error *d holds nothing to close. */
nl_status nl_dummy_engine_open(nl_dummy_engine *d, const nl_arch *a, const char *tokenizer, const nl_engine_opts *opts);
/* Closes the engine, then frees the model and tokenizer. */
void nl_dummy_engine_close(nl_dummy_engine *d);

#endif
