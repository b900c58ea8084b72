/* nanolm emergence_set: scores a set of checkpoints on one text (nl_emergence_eval_file) and
 * orders them by per-token accuracy, the rows of `scaling emergence`. */
#ifndef NANOLM_EMERGENCE_SET_H
#define NANOLM_EMERGENCE_SET_H

#include "nanolm/emergence.h"

typedef struct nl_emergence_row {
    char name[256]; /* the checkpoint's file name, without its folder */
    nl_emergence e;
} nl_emergence_row;

/* Called after each checkpoint is scored. */
typedef void (*nl_emergence_progress)(void *user, const nl_emergence_row *row);

/* Scores paths[0..n) into rows[0..n) and sorts the rows by rising accuracy. *kmax becomes the
 * smallest exact-match length every model allows. Errors name the file. */
nl_status nl_emergence_eval_set(const char *const *paths, int n, const char *text, nl_data_split split, int64_t windows,
                                int *kmax, nl_emergence_row *rows, nl_emergence_progress progress, void *user);

/* The exact-match lengths k that the tables and plots of a set show: 1, 2, 4, 8, 16, 32. */
#define NL_EMERGENCE_NKS 6
extern const int nl_emergence_ks[NL_EMERGENCE_NKS];
/* How many of nl_emergence_ks are at most kmax (the first ones). */
int nl_emergence_nks(int kmax);

/* The scales of nl_emergence_svg. */
typedef enum nl_emergence_scale {
    NL_EMERGENCE_LINEAR,   /* exact match of k tokens and p^k as they are */
    NL_EMERGENCE_LOG,      /* on a log axis; p^k below a tenth of one hit among the start positions left out */
    NL_EMERGENCE_RELATIVE, /* k <= 8 only, each series over its largest value across the rows */
} nl_emergence_scale;

/* The plot of rows[0..n): for each k of nl_emergence_ks up to kmax, exact match of the next k
 * tokens (points, "exact match k=K") and p^k (a line, "p^K") against the per-token accuracy p. */
nl_status nl_emergence_svg(const char *path, nl_emergence_scale scale, const nl_emergence_row *rows, int n, int kmax);

#endif
