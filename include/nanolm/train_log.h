/*
 * nanolm train_log: reads back the CSV that `nanolm train --log` writes (nl_train_log_write_csv,
 * nanolm/train.h): one loss curve, training or validation loss against the step; and the plots of
 * loss curves, a trainer's own or several runs' read back.
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

/* Plots curves[0..n) (at most 16), curve i named labels[i], as lines (markers 0) or points
 * (markers 1) of loss (nats/token) against the step, under `title`. */
nl_status nl_loss_curves_svg(const char *path, const char *title, const char *const *labels,
                             const nl_loss_curve *curves, int n, int markers);

struct nl_trainer;
/* The plot of a run (`nanolm train --svg`): the training loss of every step of t's log as a line
 * and the validation loss where the log has one as points, titled "NanoLM training". */
nl_status nl_train_log_svg(const struct nl_trainer *t, const char *path);

#ifdef __cplusplus
}
#endif

#endif
