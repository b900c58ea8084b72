/* libFuzzer target: the training-state JSON of a checkpoint (__metadata__ nanolm.train) on
 * arbitrary bytes. The bytes are parsed and validated (nl_ckpt_state_parse); a state that is
 * accepted is then written into a small model's checkpoint (with zero moments) and fed through
 * the resume path: nl_trainer_init with --resume, then the two steps that remain of a run of
 * step + 2, on a few hundred tokens in memory. Any crash, or a refusal without a message, is a
 * finding. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "fuzz_targets.h"
#include "fuzz_util.h"
#include "nanolm/checkpoint.h"
#include "nanolm/safetensors.h"
#include "nanolm/train.h"

#include "fuzz_targets.h"

/* A checkpoint of a 1-layer, 8-wide model with `json` as its training state. */
static nl_status write_ckpt(const char *path, const nl_model *m, const char *json) {
    nl_st_writer w;
    nl_st_writer_init(&w);
    char *aj = nl_arch_to_json(&m->arch);
    nl_status rc = aj ? NL_OK : NL_ERR_NOMEM;
    if (!rc) rc = nl_st_writer_meta(&w, "format", "pt");
    if (!rc) rc = nl_st_writer_meta(&w, "nanolm.arch", aj);
    if (!rc) rc = nl_st_writer_meta(&w, "nanolm.tokenizer", "byte");
    if (!rc) rc = nl_st_writer_meta(&w, "nanolm.train", json);
    float *zeros = calloc(m->n_params, sizeof(float));
    if (!zeros) rc = NL_ERR_NOMEM;
    const nl_param_info *tab;
    int nt = nl_model_params_table(m, &tab);
    char name[160];
    for (int i = 0; i < nt && !rc; i++) {
        rc = nl_st_writer_add(&w, tab[i].name, NL_ST_F32, tab[i].ndim, tab[i].shape, m->params + tab[i].offset);
        snprintf(name, sizeof name, "optimizer.exp_avg.%s", tab[i].name);
        if (!rc) rc = nl_st_writer_add(&w, name, NL_ST_F32, tab[i].ndim, tab[i].shape, zeros);
        snprintf(name, sizeof name, "optimizer.exp_avg_sq.%s", tab[i].name);
        if (!rc) rc = nl_st_writer_add(&w, name, NL_ST_F32, tab[i].ndim, tab[i].shape, zeros);
    }
    if (!rc) rc = nl_st_writer_write(&w, path);
    nl_st_writer_free(&w);
    free(zeros);
    if (aj) cJSON_free(aj);
    return rc;
}

/* Resumes a run of st->step + 2 steps from the state (as `nanolm train --resume` would, with the
 * options the state records) and trains the two steps that remain. */
static void resume_from(const char *json, const nl_ckpt_state *st) {
    static char dir[64];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/nanolm-fuzz-XXXXXX");
        if (!mkdtemp(dir)) abort();
    }
    char path[128];
    snprintf(path, sizeof path, "%s/state.st", dir);
    nl_arch a;
    if (nl_arch_preset("shakespeare-char", &a) != NL_OK) abort();
    snprintf(a.name, sizeof a.name, "fuzz");
    a.vocab_size = 32, a.dim = 8, a.n_layers = 1, a.n_heads = 2, a.n_kv_heads = 2, a.hidden_dim = 16, a.seq_len = 8;
    nl_model m;
    if (nl_model_init(&m, &a) != NL_OK) abort();
    nl_model_init_random(&m, 1);
    nl_status rc = write_ckpt(path, &m, json);
    nl_model_free(&m);
    if (rc) return; /* the disk, not the input */
    nl_train_opts o;
    nl_train_opts_default(&o);
    o.steps = st->step + 2;
    o.batch = 2;
    o.seq = 8;
    o.warmup = st->run.warmup >= 0 ? st->run.warmup : 0;
    o.precision = st->precision;
    o.mup_base_dim = st->run.mup_base_dim;
    o.no_loss_scaling = !st->run.loss_scaling;
    o.qat = st->run.qat[0] ? st->run.qat : NULL;
    o.fp8 = st->run.fp8[0] ? st->run.fp8 : NULL;
    o.eval_every = 0;
    o.eval_windows = 1;
    o.resume = path;
    nl_trainer t;
    if (nl_trainer_init(&t, NULL, &o) != NL_OK) {
        if (nl_last_error()[0] == '\0') abort();
        unlink(path);
        return;
    }
    int tokens[400];
    for (int i = 0; i < 400; i++) tokens[i] = (i * 7 + i / 13) % 32;
    nl_data d;
    if (nl_data_from_tokens(&d, "fuzz tokens", tokens, 400, 32) == NL_OK) {
        rc = nl_trainer_run(&t, &o, &d, NULL, NULL);
        if (rc && nl_last_error()[0] == '\0') abort();
        if (!rc && (t.n_log > t.log_cap || t.step != o.steps)) abort();
        nl_data_free(&d);
    }
    nl_trainer_free(&t);
    unlink(path);
}

int nl_fuzz_train_state(const uint8_t *data, size_t size) {
    char *json = malloc(size + 1);
    if (!json) return 0;
    memcpy(json, data, size);
    json[size] = '\0';
    nl_ckpt_state st;
    memset(&st, 0, sizeof st);
    nl_adamw opt;
    memset(&opt, 0, sizeof opt);
    st.opt = &opt;
    if (nl_ckpt_state_parse("fuzz.st", json, &st) != NL_OK) {
        if (nl_last_error()[0] == '\0') abort();
    } else {
        if (st.step < 0 || opt.t < 0 || opt.t > st.step || !(st.scaler.scale > 0)) abort();
        if (strlen(json) == size) resume_from(json, &st); /* metadata is a C string */
    }
    free(json);
    return 0;
}

#ifndef NL_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return nl_fuzz_train_state(data, size); }
#endif
