/* Model FLOPs utilisation of a finished one-process training run (nanolm/mfu.h). */
#include <string.h>

#include "nanolm/mfu.h"

nl_status nl_mfu_measure(const nl_trainer *t, nl_mfu *f) {
    memset(f, 0, sizeof *f);
    if (t->layout || t->wall_s <= 0 || !t->tokens_done) return NL_OK;
    f->threads = nl_threads();
    f->path = nl_peak_auto();
    /* short (~60 ms of CPU per thread): both are timed on the CPU clock, steady from the first run */
    NL_TRY(nl_peak_fma(f->path, f->threads, 0.003, 2, &f->fma_peak));
    NL_TRY(nl_peak_sgemm(NL_PEAK_SGEMM_N, f->threads, 0.001, 3, &f->sgemm));
    f->flops_per_token = nl_train_flops_per_token(&t->model, t->seq);
    f->model_flops = f->flops_per_token * (double)t->tokens_done / t->wall_s;
    f->measured = 1;
    return NL_OK;
}
