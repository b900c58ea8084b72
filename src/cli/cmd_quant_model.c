/* nanolm quant model: quantize a NanoLM checkpoint's linear layers with several schemes and
 * report bytes, compression, mean loss and how many greedy tokens stay the same as fp32. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"
#include "nanolm/quantize_model.h"
#include "nanolm/train.h"

#define MAX_SCHEMES 24
#define MAX_GEN 256

static const char *const DEFAULT_SCHEMES[] = {"int8-channel", "int8-tensor", "int8-b32", "int8-b64", "int8-b128",
                                              "int4-b32",     "int4-b64",    "int4-b128", "mxfp8", "mxfp4"};

typedef struct qrow {
    char scheme[64];
    const char *mode;
    size_t linear_bytes, model_bytes;
    double loss;
    int gen[MAX_GEN];
    int n_gen, shared;
    char text[2048];
} qrow;

static void usage(FILE *f) {
    fprintf(f,
            "usage: nanolm quant model --ckpt F --data TEXT [--tokenizer tok512.bin] [--scheme S ...]\n"
            "                          [--mode w8a8|weight-only] [--out Q.safetensors] [--prompt TEXT]\n"
            "                          [--gen N] [--max-tokens N] [--seq T] [--batch B] [--json]\n"
            "  Quantizes q, k, v, o, w1, w2, w3 of every layer (embeddings, classifier and norms stay fp32)\n"
            "  and reports bytes of the linear weights and of the model, compression, mean loss on TEXT,\n"
            "  its change vs fp32, and how many of the first --gen (20) greedy tokens after --prompt\n"
            "  ('Once upon a time') equal fp32's. Schemes (repeat --scheme; default: int8-channel int8-tensor\n"
            "  int8-b32/64/128 int4-b32/64/128 mxfp8 mxfp4): int<b>-channel|tensor|b<k>, affine-(u)int<b>-...,\n"
            "  mxfp8, mxfp8-e5m2, mxfp6-e3m2, mxfp6-e2m3, mxfp4, mxint8. int8-channel runs W8A8 by default\n"
            "  (--mode weight-only to dequantize on the fly); the others run weight-only.\n"
            "  --out writes the (single) quantized scheme as safetensors; a quantized --ckpt is loaded and\n"
            "  evaluated as it is. --max-tokens evaluates only the first N tokens of TEXT.\n");
}

/* Greedy continuation of the prompt: the first n_gen generated tokens. */
static nl_status greedy(nl_model *m, const nl_tokenizer *tok, const int *ids, int64_t n_prompt, int n_gen, qrow *r) {
    if (!m->kv_cache) NL_TRY(nl_model_alloc_kv(m));
    nl_rng rng; /* unused by greedy decoding, but never NULL */
    nl_rng_seed(&rng, 1);
    int token = ids[0];
    size_t tl = 0;
    r->n_gen = 0;
    r->text[0] = 0;
    for (int64_t pos = 0; pos < m->arch.seq_len && r->n_gen < n_gen; pos++) {
        float *logits = nl_model_step(m, token, pos);
        if (!logits) return nl_fail(NL_ERR_NUMERIC, "generation failed at position %lld", (long long)pos);
        int next = pos < n_prompt - 1 ? ids[pos + 1] : nl_model_sample(logits, m->V, 0.0f, &rng);
        if (pos >= n_prompt - 1) r->gen[r->n_gen++] = next;
        size_t len;
        const char *piece = nl_tokenizer_piece(tok, token, next, &len);
        if (piece && pos >= n_prompt - 1 && nl_tokenizer_piece_printable(piece, len) && tl + len + 1 < sizeof r->text) {
            memcpy(r->text + tl, piece, len);
            tl += len;
            r->text[tl] = 0;
        }
        token = next;
    }
    return NL_OK;
}

static nl_status evaluate(nl_model *m, const nl_tokenizer *tok, const int *ids, int64_t n, int64_t B, int64_t T,
                          const int *pids, int64_t np, int n_gen, qrow *r) {
    int64_t scored;
    NL_TRY(nl_eval_loss_tokens(m, ids, n, B, T, &r->loss, &scored));
    return greedy(m, tok, pids, np, n_gen, r);
}

int nl_cmd_quant_model(int argc, char **argv) {
    static const struct option opts[] = {
        {"ckpt", required_argument, 0, 'c'},   {"data", required_argument, 0, 'd'},
        {"tokenizer", required_argument, 0, 'k'}, {"scheme", required_argument, 0, 'S'},
        {"mode", required_argument, 0, 'm'},   {"out", required_argument, 0, 'o'},
        {"prompt", required_argument, 0, 'p'}, {"gen", required_argument, 0, 'g'},
        {"max-tokens", required_argument, 0, 'n'}, {"seq", required_argument, 0, 's'},
        {"batch", required_argument, 0, 'b'},  {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
    const char *ckpt = NULL, *data = NULL, *tok_path = NULL, *out = NULL, *prompt = "Once upon a time";
    const char *schemes[MAX_SCHEMES];
    nl_quant_spec specs[MAX_SCHEMES];
    int ns = 0, json = 0, c, mode_set = 0;
    nl_qlinear_mode mode = NL_QLINEAR_W8A8;
    int64_t n_gen = 20, max_tokens = 0, T = 0, B = 4;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'c': ckpt = optarg; break;
        case 'd': data = optarg; break;
        case 'k': tok_path = optarg; break;
        case 'S':
            if (ns == MAX_SCHEMES) return nl_cli_usage_error("quant model: at most %d --scheme", MAX_SCHEMES);
            if (nl_quant_spec_parse(optarg, &specs[ns])) return nl_cli_usage_error("quant model: --scheme: %s", nl_last_error());
            schemes[ns++] = optarg;
            break;
        case 'm':
            if (!strcmp(optarg, "w8a8")) mode = NL_QLINEAR_W8A8;
            else if (!strcmp(optarg, "weight-only")) mode = NL_QLINEAR_WEIGHT_ONLY;
            else return nl_cli_usage_error("quant model: --mode must be w8a8 or weight-only, got '%s'", optarg);
            mode_set = 1;
            break;
        case 'o': out = optarg; break;
        case 'p': prompt = optarg; break;
        case 'g': if (nl_cli_int("--gen", optarg, 1, MAX_GEN, &n_gen)) return NL_EXIT_USAGE; break;
        case 'n': if (nl_cli_int("--max-tokens", optarg, 2, INT64_MAX, &max_tokens)) return NL_EXIT_USAGE; break;
        case 's': if (nl_cli_int("--seq", optarg, 1, 1 << 20, &T)) return NL_EXIT_USAGE; break;
        case 'b': if (nl_cli_int("--batch", optarg, 1, 4096, &B)) return NL_EXIT_USAGE; break;
        case 'j': json = 1; break;
        case 'h': usage(stdout); return NL_EXIT_OK;
        default: return nl_cli_bad_option("quant model", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("quant model: unexpected argument '%s'", argv[optind]);
    if (!ckpt || !data) return nl_cli_usage_error("quant model: --ckpt F and --data TEXT are required");
    if (out && ns != 1) return nl_cli_usage_error("quant model: --out needs exactly one --scheme");
    if (out && nl_check_writable(out, "--out")) return nl_cli_fail("quant model"); /* before any work */
    if (ns == 0)
        for (size_t i = 0; i < sizeof DEFAULT_SCHEMES / sizeof DEFAULT_SCHEMES[0]; i++) {
            nl_quant_spec_parse(DEFAULT_SCHEMES[i], &specs[ns]);
            schemes[ns++] = DEFAULT_SCHEMES[i];
        }
    (void)schemes;

    const int loaded_q = nl_qmodel_is_quantized(ckpt);
    nl_model m;
    nl_tokenizer tok;
    nl_qmodel lq;
    memset(&lq, 0, sizeof lq);
    memset(&tok, 0, sizeof tok);
    char tkind[64] = "byte";
    if (loaded_q) {
        if (nl_qmodel_load(ckpt, &m, &lq, tkind)) return nl_cli_fail("quant model");
        nl_status rc = tok_path ? nl_tokenizer_load_llama2c(&tok, tok_path, (int)m.V)
                       : !strcmp(tkind, "byte") ? nl_tokenizer_init_byte(&tok)
                       : nl_fail(NL_ERR_INVALID, "%s uses the %s tokenizer: pass its file with --tokenizer", ckpt, tkind);
        if (rc) { nl_qmodel_free(&lq); nl_model_free(&m); return nl_cli_fail("quant model"); }
    } else if (nl_cli_load_model(ckpt, tok_path, &m, &tok)) {
        return nl_cli_fail("quant model");
    } else if (tok_path) {
        snprintf(tkind, sizeof tkind, "tok512");
    }
    int rcode = NL_EXIT_OK;
    char *text = NULL;
    size_t bytes = 0;
    int *ids = NULL, *pids = NULL;
    int64_t n = 0, np = 0;
    qrow *rows = nl_calloc((size_t)ns + 1, sizeof(qrow), "result rows");
    if (!rows) { rcode = nl_cli_fail("quant model"); goto done; }
    if (T == 0) T = m.arch.seq_len;
    if (T > m.arch.seq_len) {
        rcode = nl_cli_usage_error("quant model: --seq %lld exceeds the model's seq_len %lld", (long long)T, (long long)m.arch.seq_len);
        goto done;
    }
    if (nl_read_file(data, &text, &bytes)) { rcode = nl_cli_fail("quant model"); goto done; }
    if (nl_tokenizer_encode(&tok, text, bytes, 1, 0, &ids, &n) ||
        nl_tokenizer_encode(&tok, prompt, strlen(prompt), 1, 0, &pids, &np)) { rcode = nl_cli_fail("quant model"); goto done; }
    if (max_tokens && n > max_tokens) n = max_tokens;
    if (n < 2) { nl_fail(NL_ERR_INVALID, "%s has %lld tokens; evaluation needs at least 2", data, (long long)n); rcode = nl_cli_fail("quant model"); goto done; }
    if (np < 1 || np >= m.arch.seq_len) { rcode = nl_cli_usage_error("quant model: --prompt must be 1..seq_len-1 tokens"); goto done; }
    if (nl_model_alloc_acts(&m, B, T)) { rcode = nl_cli_fail("quant model"); goto done; }

    int nrows = 0;
    /* Row 0: the model as loaded (fp32, or the quantized checkpoint). */
    qrow *r0 = &rows[nrows++];
    if (loaded_q) {
        char sn[64];
        snprintf(r0->scheme, sizeof r0->scheme, "%s (loaded)", nl_quant_spec_name(&lq.spec, sn, sizeof sn));
        r0->mode = lq.mode == NL_QLINEAR_W8A8 ? "w8a8" : "weight-only";
        r0->model_bytes = nl_qmodel_size_bytes(&m, &lq, &r0->linear_bytes);
    } else {
        snprintf(r0->scheme, sizeof r0->scheme, "fp32");
        r0->mode = "fp32";
        r0->model_bytes = nl_qmodel_size_bytes(&m, NULL, &r0->linear_bytes);
    }
    if (evaluate(&m, &tok, ids, n, B, T, pids, np, (int)n_gen, r0)) { rcode = nl_cli_fail("quant model"); goto done; }
    size_t fp32_linear = 0;
    nl_qmodel_size_bytes(&m, NULL, &fp32_linear);
    for (int s = 0; s < ns && !loaded_q; s++) {
        nl_qmodel qm;
        const int int8c = specs[s].kind == NL_QUANT_SYMMETRIC && specs[s].bits == 8 && specs[s].gran == NL_QUANT_PER_CHANNEL;
        nl_qlinear_mode md = int8c ? mode : NL_QLINEAR_WEIGHT_ONLY;
        if (mode_set && mode == NL_QLINEAR_W8A8 && !int8c) {
            rcode = nl_cli_usage_error("quant model: --mode w8a8 needs --scheme int8-channel, not %s", schemes[s]);
            goto done;
        }
        if (nl_qmodel_quantize(&qm, &m, &specs[s], md)) { rcode = nl_cli_fail("quant model"); goto done; }
        qrow *r = &rows[nrows++];
        nl_quant_spec_name(&specs[s], r->scheme, sizeof r->scheme);
        r->mode = md == NL_QLINEAR_W8A8 ? "w8a8" : "weight-only";
        r->model_bytes = nl_qmodel_size_bytes(&m, &qm, &r->linear_bytes);
        nl_status rc = evaluate(&m, &tok, ids, n, B, T, pids, np, (int)n_gen, r);
        if (!rc && out) rc = nl_qmodel_save(&qm, out, tkind);
        nl_qmodel_free(&qm);
        if (rc) { rcode = nl_cli_fail("quant model"); goto done; }
    }
    for (int i = 0; i < nrows; i++) {
        int k = 0;
        while (k < rows[i].n_gen && k < rows[0].n_gen && rows[i].gen[k] == rows[0].gen[k]) k++;
        rows[i].shared = k;
    }
    if (json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "checkpoint", ckpt);
        cJSON_AddStringToObject(d, "data", data);
        cJSON_AddNumberToObject(d, "tokens", (double)n);
        cJSON_AddStringToObject(d, "prompt", prompt);
        cJSON_AddNumberToObject(d, "fp32_linear_bytes", (double)fp32_linear);
        if (out) cJSON_AddStringToObject(d, "out", out);
        cJSON *a = cJSON_AddArrayToObject(d, "schemes");
        for (int i = 0; i < nrows; i++) {
            qrow *r = &rows[i];
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "scheme", r->scheme);
            cJSON_AddStringToObject(o, "mode", r->mode);
            cJSON_AddNumberToObject(o, "linear_bytes", (double)r->linear_bytes);
            cJSON_AddNumberToObject(o, "model_bytes", (double)r->model_bytes);
            cJSON_AddNumberToObject(o, "linear_compression", (double)fp32_linear / (double)r->linear_bytes);
            cJSON_AddNumberToObject(o, "mean_loss", r->loss);
            cJSON_AddNumberToObject(o, "delta_loss", r->loss - rows[0].loss);
            cJSON_AddNumberToObject(o, "delta_loss_rel", (r->loss - rows[0].loss) / rows[0].loss);
            cJSON *g = cJSON_AddArrayToObject(o, "greedy_tokens");
            for (int k = 0; k < r->n_gen; k++) cJSON_AddItemToArray(g, cJSON_CreateNumber(r->gen[k]));
            cJSON_AddNumberToObject(o, "greedy_shared_with_first", r->shared);
            cJSON_AddStringToObject(o, "greedy_text", r->text);
            cJSON_AddItemToArray(a, o);
        }
        nl_cli_print_json(d);
    } else {
        printf("%s on %s (%lld tokens); greedy: first %lld tokens after \"%s\"\n\n", ckpt, data, (long long)n,
               (long long)n_gen, prompt);
        static const char *const hdr[] = {"scheme", "mode", "linear bytes", "model bytes", "linear x smaller",
                                          "mean loss", "d loss", "d loss %", "greedy same"};
        nl_table t;
        nl_table_init(&t, 9, hdr);
        for (int i = 0; i < nrows; i++) {
            qrow *r = &rows[i];
            nl_table_rowf(&t, "%s|%s|%zu|%zu|%.2f|%.4f|%+.4f|%+.2f|%d/%d", r->scheme, r->mode, r->linear_bytes,
                          r->model_bytes, (double)fp32_linear / (double)r->linear_bytes, r->loss, r->loss - rows[0].loss,
                          100.0 * (r->loss - rows[0].loss) / rows[0].loss, r->shared, r->n_gen);
        }
        nl_table_print(&t, stdout);
        nl_table_free(&t);
        printf("\n");
        for (int i = 0; i < nrows; i++) printf("%-14s %s|%s\n", rows[i].scheme, prompt, rows[i].text);
        if (out) printf("\nwrote %s\n", out);
    }
done:
    nl_free(rows);
    nl_free(ids);
    nl_free(pids);
    nl_free(text);
    nl_tokenizer_free(&tok);
    nl_qmodel_free(&lq);
    nl_model_free(&m);
    return rcode;
}
