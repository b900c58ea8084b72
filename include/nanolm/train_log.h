/*
 * nanolm train_log: reads back the CSV that `nanolm train --log` writes (nl_train_log_write_csv,
 * nanolm/train.h): one loss curve, training or validation loss against the step.
 */
#ifndef NANOLM_TRAIN_LOG_H
#define NANOLM_TRAIN_LOG_H

#include <stddef.h>

#include "nanolm/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A loss curve: n points (step[i], loss[i]). */
typedef struct nl_loss_curve {
    double *step, *loss;
    size_t n;
} nl_loss_curve;

/* Reads step and train_loss (val = 0) or val_loss (val = 1) of every row that has one.
 * NL_ERR_FORMAT (naming the file) for a file without the log's header or without a value of
 * the loss asked for; I/O errors of the read. Free with nl_loss_curve_free (also after an error). */
nl_status nl_train_log_read_curve(const char *path, int val, nl_loss_curve *c);
void nl_loss_curve_free(nl_loss_curve *c);

#ifdef __cplusplus
}
#endif

#endif
