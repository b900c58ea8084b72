/*
 * nanolm quant_compare: RTN, GPTQ, AWQ, SmoothQuant, W8A8 and LLM.int8() applied one after the
 * other to the same fp32 model and measured side by side (bytes, mean loss on an evaluation
 * text, quantization time, LLM.int8()'s outlier dimensions): what `nanolm quant compare` prints.
 */
#ifndef NANOLM_QUANT_COMPARE_H
#define NANOLM_QUANT_COMPARE_H

#include "nanolm/quant_methods.h"
#include "nanolm/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One scheme and what it measured. */
typedef struct nl_qc_row {
    nl_qm_scheme s;
    int64_t bytes;
    double loss, time_s, awq_alpha;
    int *calib_outliers, *eval_outliers; /* [L * NL_QM_SITES] (LLM.int8() schemes) or NULL */
} nl_qc_row;

/* Parses a ','-separated list of scheme names into rows[0..*n) (at most max; fp32, the
 * baseline that is always measured, is skipped). NL_ERR_INVALID naming the list's fault: a bad
 * name, a scheme listed twice, too many, or no scheme besides fp32. */
nl_status nl_qc_parse_schemes(const char *list, nl_qc_row *rows, int max, int *n);

/* The evaluation and calibration texts as tokens. When both paths are the same file, the first
 * half (up to the first newline after the middle) calibrates and the second half is evaluated.
 * Calibration keeps the first calib_n tokens (at least T), evaluation the first eval_n (0: all). */
typedef struct nl_qc_tokens {
    char *dtext, *ctext;
    int *eval_ids, *calib_ids;
    int64_t n_eval, n_calib;
} nl_qc_tokens;

/* NL_ERR_INVALID when fewer than 2 evaluation tokens or fewer than T calibration tokens; the
 * errors of reading and tokenizing. Free with nl_qc_tokens_free (also after an error). */
nl_status nl_qc_encode(const char *data, const char *calib, const nl_tokenizer *tok, int64_t T, int64_t calib_n,
                       int64_t eval_n, nl_qc_tokens *t);
void nl_qc_tokens_free(nl_qc_tokens *t);

/* Measures the fp32 baseline (*base over *scored tokens) and then every row, each scheme applied
 * to the fp32 parameters, in windows of (B, T) (activations allocated by the caller); the model
 * gets its fp32 parameters back at the end. */
nl_status nl_qc_run(nl_model *m, const nl_qc_tokens *t, int64_t B, int64_t T, nl_qc_row *rows, int n, double *base,
                    int64_t *scored);
/* A bar chart of each row's loss increase over the fp32 baseline `base` (nats/token), one bar a
 * row in its method's colour, labelled with the scheme and the increase. */
nl_status nl_qc_svg(const char *path, const nl_qc_row *rows, int n, double base);
/* Frees the outlier reports of rows[0..n). */
void nl_qc_rows_free(nl_qc_row *rows, int n);

#ifdef __cplusplus
}
#endif

#endif
