/*
 * Quantization-aware training (QAT) of NanoLM: the model's linear hook (nl_linear_ops) runs the
 * transformer linears (q, k, v, o, gate, up, down of every layer) with fake-quantized weights.
 *
 *   forward   w^ = dequant(quant(w))   int<b> absmax per group of g consecutive input columns
 *                                      (nl_quant_absmax_into + nl_quant_dequantize, nanolm/quant.h)
 *             y  = x . w^T
 *   backward  dx  = dy . w^          (the quantized weights, as used in forward)
 *             dW += dy^T . x         straight-through estimator: d loss / d w := d loss / d w^,
 *                                      so the gradient reaches the fp32 master weights unchanged
 * The embedding, the classifier, the norms and the optimizer stay fp32; the master weights are
 * what the checkpoint stores, and RTN of them (the same quantizer) is exactly the model that was
 * trained. Needs fp32 matmul precision (the bf16/fp16 paths read their own weight copy).
 */
#ifndef NANOLM_QAT_H
#define NANOLM_QAT_H

#include "nanolm/data.h"
#include "nanolm/linear_hook.h"
#include "nanolm/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nl_qat {
    nl_model *model;          /* borrowed; model->linear_ops == &ops while installed */
    nl_quant_spec spec;       /* symmetric absmax, per channel or per block */
    nl_qtensor *qt;           /* (L, 4) one per fused site: qkv, o, gate_up, down */
    float *wq;                /* (n_params) fake-quantized weights at each site's offset */
    nl_linear_hook hook;      /* installed as model->linear_ops over the previous hook (restored on remove) */
    int64_t fake_quant_calls; /* weight fake-quantizations done (one per site per forward) */
    nl_status status;         /* first failure inside a hook (hooks cannot return one) */
    char error[256];
} nl_qat;

/* Parses "int<b>-g<G>" (b = 2..8, G > 0: absmax per group of G input columns) or
 * "int<b>-channel" (one scale per output row) into *spec. NL_ERR_INVALID naming the text
 * otherwise. */
nl_status nl_qat_parse(const char *name, nl_quant_spec *spec);

/* Installs fake quantization with `spec` (symmetric; per channel or per block) on the linears
 * of m, which must be a dense model in fp32 precision and outlive q. Errors: NL_ERR_INVALID (an
 * affine/MX/per-tensor spec, bf16/fp16 precision), NL_ERR_UNSUPPORTED (MoE), NL_ERR_NOMEM. */
nl_status nl_qat_install(nl_qat *q, nl_model *m, const nl_quant_spec *spec);
/* Restores the previous linear ops and frees q's buffers; safe on a zeroed struct. */
void nl_qat_remove(nl_qat *q);
/* NL_OK or the first error met inside a hook (a failed site writes NaN outputs, so the loss
 * becomes NaN and training stops); the message is in q->error. */
nl_status nl_qat_status(const nl_qat *q);

/* Replaces the 7 linear weights of every layer of m by their fake-quantized values (RTN with
 * the same quantizer as the hook), in place. Errors as nl_quant_absmax_into. */
nl_status nl_qat_rtn_inplace(nl_model *m, const nl_quant_spec *spec);

/* How much of RTN's loss increase a QAT run recovered, and whether that figure means anything. */
typedef struct nl_qat_recovery {
    double rtn_delta;  /* rtn_start - fp32_start: what RTN costs before training */
    double fp32_drift; /* fp32_end - fp32_start: how far training moved the fp32 loss itself */
    double fraction;   /* (rtn_start - qat_end) / rtn_delta; NAN when not meaningful */
    const char *why;   /* NULL when meaningful, else why the fraction is not reported */
} nl_qat_recovery;

/* The smallest RTN delta (nats/token) from which a recovered fraction is reported. */
#define NL_QAT_MIN_RTN_DELTA 1e-3

/*
 * The share of RTN's validation-loss increase that QAT recovered, from four validation losses:
 * fp32 and RTN fake-quantized weights before training, fake-quantized and fp32 master weights
 * after. The fraction is meaningful only when RTN costs something (rtn_delta >=
 * NL_QAT_MIN_RTN_DELTA) and training did not move the fp32 loss by more than that delta (else
 * the figure measures training, not recovery: e.g. from a random init); otherwise fraction is
 * NAN and `why` says which. A NaN or infinite loss gives NAN with its own reason.
 */
nl_qat_recovery nl_qat_recovered(double fp32_start, double rtn_start, double qat_end, double fp32_end);

/* The validation losses around a QAT run (windows of (B, T), the first `windows` of the split):
 * the starting weights in fp32 and fake-quantized (= RTN), and after training fake-quantized and
 * with the fp32 master weights alone. */
typedef struct nl_qat_losses {
    double fp32_start, rtn_start, end, fp32_end;
} nl_qat_losses;

/* Measures l->fp32_start, installs q on m (nl_qat_install) and measures l->rtn_start. */
nl_status nl_qat_begin(nl_qat *q, nl_model *m, const nl_quant_spec *spec, const nl_data *d, int64_t B, int64_t T,
                       int64_t windows, nl_qat_losses *l);
/* Measures l->end, removes q (nl_qat_remove) and measures l->fp32_end. */
nl_status nl_qat_end(nl_qat *q, const nl_data *d, int64_t B, int64_t T, int64_t windows, nl_qat_losses *l);

#ifdef __cplusplus
}
#endif
#endif
