/* nanolm export: a checkpoint (or model folder) as a Hugging Face folder, a GGUF file or a llama2.c file. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"
#include "cli_opt.h"
#include "nanolm/gguf.h"
#include "nanolm/gguf_model.h"
#include "nanolm/hf.h"
#include "nanolm/model_export.h"
#include "nanolm/model_load.h"
#include "report.h"

int nl_cmd_export(int argc, char **argv) {
    const char *ckpt = NULL, *tok_path = NULL;
    int to_i = -1, dtype_i = 0, json = 0;
    int64_t shard_mb = 0;
    nl_opt opts[] = {
        NL_OPT_STR("ckpt", &ckpt, "F", "checkpoint, llama2.c .bin or model folder (required)"),
        NL_OPT_CHOICE("to", &to_i, "hf|llama2c|gguf",
                      "hf: a Hugging Face folder; llama2c: llama2.c's .bin; gguf: llama.cpp's GGUF (required)"),
        NL_OPT_CHOICE("dtype", &dtype_i, "bf16|f16|f32|q8_0|q4_0",
                      "tensor type of --to hf (bf16, f16, f32) or --to gguf (all; the matrices, norms stay f32) "
                      "(default bf16; f32 keeps every bit)"),
        NL_OPT_INT("shard-mb", &shard_mb, 1, 1 << 20, "N",
                   "--to hf: shards of at most N MB with model.safetensors.index.json (default one file)"),
        NL_OPT_STR("tokenizer", &tok_path, "FILE", "tokenizer.json or llama2.c tokenizer.bin (as for generate)"),
        NL_OPT_FLAG("json", &json, "print the result as JSON"),
    };
    opts[0].aliases = "model";
    nl_optgroup groups[] = {{"options", opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {
        "export",
        "nanolm export --ckpt F --to hf|llama2c|gguf PATH [options]",
        "Writes a model as a Hugging Face folder (config.json, model.safetensors or shards with "
        "an index, tokenizer.json) that transformers, vLLM and llama.cpp's converters read, as a GGUF file "
        "(llama architecture, f32/f16/bf16/q8_0/q4_0) that llama.cpp runs, or as "
        "llama2.c's legacy .bin (no biases or RoPE scaling; readers assume rope_theta 10000 and norm_eps 1e-5: "
        "models that need more are refused).",
        groups,
        1,
        1};
    const char *pos[1];
    int npos = 0;
    int prc = nl_cli_parse(&spec, argc, argv, pos, &npos);
    if (prc) return prc == NL_CLI_HELP ? NL_EXIT_OK : prc;
    if (!ckpt) return nl_cli_usage_error("export: --ckpt F is required");
    if (to_i < 0) return nl_cli_usage_error("export: --to hf DIR, --to gguf FILE or --to llama2c FILE is required");
    const char *to = to_i == 0 ? "hf" : to_i == 1 ? "llama2c" : "gguf";
    if (npos != 1) return nl_cli_usage_error("export: give the output path after the options (--to %s PATH)", to);
    const char *out = pos[0];
    int hf = to_i == 0, gguf = to_i == 2;
    static const nl_st_dtype dtypes[] = {NL_ST_BF16, NL_ST_F16, NL_ST_F32, NL_ST_F32, NL_ST_F32};
    static const uint32_t gtypes[] = {NL_GGML_BF16, NL_GGML_F16, NL_GGML_F32, NL_GGML_Q8_0, NL_GGML_Q4_0};
    static const char *const dnames[] = {"bf16", "f16", "f32", "q8_0", "q4_0"};
    nl_st_dtype dtype = dtypes[dtype_i];
    if (to_i == 1 && (shard_mb || dtype_i))
        return nl_cli_usage_error(
            "export: --dtype and --shard-mb apply to --to hf and gguf only (llama2.c files are fp32)");
    if (gguf && shard_mb) return nl_cli_usage_error("export: --shard-mb applies to --to hf only");
    if (hf && dtype_i > 2) return nl_cli_usage_error("export: --dtype %s applies to --to gguf only", dnames[dtype_i]);
    nl_model m;
    nl_tokenizer tok;
    nl_status rc;
    if (nl_cli_load_model(ckpt, tok_path, &m, &tok)) {
        /* a checkpoint without a tokenizer still exports its weights */
        char first[512];
        snprintf(first, sizeof first, "%s", nl_last_error());
        if (!strstr(first, "tokenizer")) return nl_cli_fail("export");
        fprintf(stderr, "nanolm: export: %s; writing no tokenizer.json\n", first);
        memset(&tok, 0, sizeof tok);
        if (nl_model_load(ckpt, NULL, 0, &m, NULL, NULL)) return nl_cli_fail("export");
        rc = hf     ? nl_hf_save(out, &m, NULL, dtype, (uint64_t)shard_mb << 20)
             : gguf ? nl_gguf_save(out, &m, NULL, gtypes[dtype_i])
                    : nl_model_save_llama2c(out, &m);
    } else {
        rc = hf     ? nl_hf_save(out, &m, &tok, dtype, (uint64_t)shard_mb << 20)
             : gguf ? nl_gguf_save(out, &m, &tok, gtypes[dtype_i])
                    : nl_model_save_llama2c(out, &m);
    }
    int rcode = rc ? nl_cli_fail("export") : NL_EXIT_OK;
    if (!rc) { /* the result, once: one line of text, or the JSON */
        nl_report *r = nl_report_new("export");
        nl_report_note(r, "exported %s (%lld parameters) to %s %s%s", m.arch.name, (long long)m.n_params, to, out,
                       hf && tok.vocab_size == 0 ? " (no tokenizer.json)" : "");
        nl_report_str(r, "to", "", to);
        nl_report_str(r, "path", "", out);
        nl_report_str(r, "arch", "", m.arch.name);
        nl_report_int(r, "params", "", (long long)m.n_params, NULL);
        if (hf) nl_report_str(r, "dtype", "", nl_st_dtype_name(dtype));
        if (gguf) nl_report_str(r, "dtype", "", dnames[dtype_i]);
        nl_report_bool(r, "tokenizer", "", (hf || gguf) && tok.vocab_size > 0);
        rcode = nl_report_print(r, json);
    }
    nl_model_free(&m);
    nl_tokenizer_free(&tok);
    return rcode;
}
