/*
 * nanolm mfu: model FLOPs utilisation of a finished training run: its model FLOPs per second
 * (nl_train_flops_per_token x tokens/s) against this machine's fp32 FMA peak and its sgemm rate,
 * both measured after the run on the run's thread count (nanolm/peak.h; about 60 ms of CPU per
 * thread, timed on the CPU clock).
 */
#ifndef NANOLM_MFU_H
#define NANOLM_MFU_H

#include "nanolm/peak.h"
#include "nanolm/train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nl_mfu {
    int measured; /* 0: a layout run (other processes share the work), or nothing trained */
    double flops_per_token, model_flops, fma_peak, sgemm;
    int threads;
    nl_peak_path path;
} nl_mfu;

/* Fills f for the one-process run t. Errors: those of the peak measurements (f->measured 0). */
nl_status nl_mfu_measure(const nl_trainer *t, nl_mfu *f);

#ifdef __cplusplus
}
#endif

#endif
