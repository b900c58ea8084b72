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

#endif
