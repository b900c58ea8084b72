/* nanolm par_svg: the figures of `parallel train --svg` drawn from the per-rank rows of
 * par_probe.h (NL_PAR_ROW numbers per rank): the memory layout of DDP/ZeRO and the measured
 * pipeline timeline. */
#ifndef NANOLM_PAR_SVG_H
#define NANOLM_PAR_SVG_H

#include <stddef.h>

#include "nanolm/base.h"

/* Who holds what: per rank, bars of parameters, gradients and optimizer state (the full size
 * outlined, the part held filled), and what it sent per step. zero is the ZeRO stage (0: DDP);
 * rows holds P rows of nk numbers. */
nl_status nl_par_svg_layout(const char *path, int zero, int P, size_t n_params, const double *rows, int nk);

/* The last step's pipeline timeline of P stages and M micro-batches: ev holds (P, 2M, 4) events
 * (backward?, micro-batch, start s, end s); formula is the bubble (P-1)/(M+P-1) to compare. */
nl_status nl_par_svg_timeline(const char *path, int P, int M, const char *sched, const double *ev, const double *rows,
                              int nk, double formula);

#endif
