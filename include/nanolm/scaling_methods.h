/*
 * nanolm scaling_methods: one compute budget (or one model size) through the five ways of
 * choosing a model size and token count that `nanolm scaling optimal` compares: 20 tokens per
 * parameter, Chinchilla's approaches 1 and 3 (and approach 3 with the paper's rounded
 * constants), and Kaplan et al. 2020; each with the loss approach 3's law predicts.
 */
#ifndef NANOLM_SCALING_METHODS_H
#define NANOLM_SCALING_METHODS_H

#include "nanolm/scaling.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { NL_SCALING_METHODS = 5 };

typedef struct nl_scaling_choice {
    const char *method;
    double n, d, c, loss; /* parameters, tokens, FLOPs = 6 N D, predicted loss */
} nl_scaling_choice;

/* flops > 0: the size and tokens each method picks for that budget; else the budget and tokens
 * each method gives a model of `params` parameters. */
void nl_scaling_methods(double flops, double params, nl_scaling_choice r[NL_SCALING_METHODS]);

#ifdef __cplusplus
}
#endif

#endif
