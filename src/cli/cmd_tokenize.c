/* nanolm tokenize: a text through a tokenizer, token by token (ids, the vocabulary pieces, the bytes
 * each decodes to) and the counts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_opt.h"
#include "nanolm/hf.h"
#include "nanolm/tokenizer.h"
#include "report.h"

int nl_cmd_tokenize(int argc, char **argv) {
    const char *tok_path = NULL, *text = NULL, *file = NULL;
    int json = 0, special = 0, bos = 0, count_only = 0;
    nl_opt opts[] = {
        NL_OPT_STR("tokenizer", &tok_path, "PATH",
                   "a Hugging Face model folder, a tokenizer.json, a llama2.c tokenizer.bin, a GGUF file, or "
                   "\"byte\" (required)"),
        NL_OPT_STR("text", &text, "TEXT", "the text to tokenize"),
        NL_OPT_STR("file", &file, "FILE", "instead of --text: the whole file"),
        NL_OPT_FLAG("special", &special, "match special tokens written in the text (\"<|eot_id|>\", \"</s>\")"),
        NL_OPT_FLAG("bos", &bos, "put the tokenizer's BOS first"),
        NL_OPT_FLAG("count", &count_only, "only the counts, not the tokens"),
        NL_OPT_FLAG("json", &json, "print the result as JSON"),
    };
    opts[0].aliases = "model";
    nl_optgroup groups[] = {{"options", opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {"tokenize",
                       "nanolm tokenize --tokenizer PATH (--text TEXT | --file FILE) [options]",
                       "Encodes a text with a tokenizer and shows each token: its id, its vocabulary piece as the "
                       "tokenizer spells it, and the bytes it decodes to; then the counts (tokens, bytes, bytes per "
                       "token).",
                       groups,
                       1,
                       0};
    int prc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (prc) return prc == NL_CLI_HELP ? NL_EXIT_OK : prc;
    if (!tok_path) return nl_cli_usage_error("tokenize: --tokenizer PATH is required");
    if (!text == !file) return nl_cli_usage_error("tokenize: give --text TEXT or --file FILE (one of them)");
    char *body = NULL;
    size_t n = 0;
    if (file) {
        if (nl_read_file(file, &body, &n)) return nl_cli_fail("tokenize: --file");
    } else {
        n = strlen(text);
    }
    const char *t = file ? body : text;
    nl_tokenizer tok;
    if (nl_hf_open_tokenizer(tok_path, &tok)) {
        nl_free(body);
        return nl_cli_fail("tokenize");
    }
    int *ids = NULL;
    int64_t k = 0;
    if (nl_tokenizer_encode_special(&tok, t, n, bos, 0, special, &ids, &k)) {
        nl_free(body);
        nl_tokenizer_free(&tok);
        return nl_cli_fail("tokenize");
    }
    size_t chars = 0;
    for (size_t i = 0; i < n; i++) chars += ((unsigned char)t[i] & 0xC0) != 0x80;
    nl_report *r = nl_report_new("tokenize");
    nl_report_str(r, "tokenizer", "tokenizer", tok_path);
    nl_report_str(r, "kind", "kind", nl_tokenizer_kind_name(tok.kind));
    nl_report_int(r, "vocab_size", "vocabulary", tok.vocab_size, NULL);
    if (!count_only) {
        nl_report_table(
            r, "tokens", NULL, 4,
            (const nl_report_col[]){
                {"index", "i", NULL}, {"id", "id", NULL}, {"piece", "piece", NULL}, {"text", "text", NULL}});
        int prev = tok.bos_id, fail = 0; /* the first token reads as after BOS: no dummy-prefix space */
        for (int64_t i = 0; i < k && !fail; i++) {
            const char *piece = nl_tokenizer_vocab_piece(&tok, ids[i]);
            size_t len = 0;
            const char *bytes = nl_tokenizer_piece(&tok, prev, ids[i], &len);
            char *ep = piece ? nl_tokenizer_escape(piece, strlen(piece)) : NULL,
                 *eb = bytes ? nl_tokenizer_escape(bytes, len) : NULL;
            fail = (piece && !ep) || (bytes && !eb);
            nl_report_cell_int(r, i);
            nl_report_cell_int(r, ids[i]);
            nl_report_cell_str(r, ep ? ep : "");
            nl_report_cell_str(r, eb ? eb : "");
            nl_report_row_end(r);
            nl_free(ep);
            nl_free(eb);
            prev = ids[i];
        }
    }
    nl_report_int(r, "n_tokens", "tokens", (long long)k, NULL);
    nl_report_int(r, "n_bytes", "bytes", (long long)n, NULL);
    nl_report_int(r, "n_chars", "characters", (long long)chars, NULL);
    nl_report_num(r, "bytes_per_token", "bytes per token", k ? (double)n / (double)k : 0, "%.3f", NULL);
    int rc = nl_report_print(r, json);
    nl_free(ids);
    nl_free(body);
    nl_tokenizer_free(&tok);
    return rc;
}
