/* nanolm export: a checkpoint (or model folder) as a Hugging Face folder or a llama2.c file. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"
#include "nanolm/checkpoint.h"
#include "nanolm/hf.h"
#include "nanolm/model_export.h"

int nl_cmd_export(int argc, char **argv) {
    static const struct option opts[] = {
        {"ckpt", required_argument, 0, 'c'},      {"model", required_argument, 0, 'c'},
        {"to", required_argument, 0, 'o'},        {"dtype", required_argument, 0, 'd'},
        {"shard-mb", required_argument, 0, 's'},  {"tokenizer", required_argument, 0, 'k'},
        {"json", no_argument, 0, 'j'},            {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    const char *ckpt = NULL, *to = NULL, *tok_path = NULL;
    nl_st_dtype dtype = NL_ST_BF16;
    int64_t shard_mb = 0;
    int json = 0, c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'c': ckpt = optarg; break;
        case 'o': to = optarg; break;
        case 'k': tok_path = optarg; break;
        case 'd':
            if (!strcmp(optarg, "bf16")) dtype = NL_ST_BF16;
            else if (!strcmp(optarg, "f16") || !strcmp(optarg, "fp16")) dtype = NL_ST_F16;
            else if (!strcmp(optarg, "f32") || !strcmp(optarg, "fp32")) dtype = NL_ST_F32;
            else return nl_cli_usage_error("export: unknown --dtype '%s' (known: bf16, f16, f32)", optarg);
            break;
        case 's': if (nl_cli_int("--shard-mb", optarg, 1, 1 << 20, &shard_mb)) return NL_EXIT_USAGE; break;
        case 'j': json = 1; break;
        case 'h':
            printf("usage: nanolm export --ckpt F --to hf DIR [--dtype bf16|f16|f32] [--shard-mb N] [--json]\n"
                   "       nanolm export --ckpt F --to llama2c FILE\n"
                   "  --ckpt (alias --model) takes a checkpoint, a llama2.c .bin or a model folder.\n"
                   "  --to hf DIR writes config.json, model.safetensors (or shards of at most --shard-mb MB\n"
                   "  with model.safetensors.index.json) and tokenizer.json. --dtype defaults to bf16;\n"
                   "  f32 keeps every bit, so loading the folder gives back the checkpoint's weights.\n"
                   "  --to llama2c FILE writes llama2.c's legacy .bin (no biases, rope_theta 10000,\n"
                   "  norm_eps 1e-5 only). --tokenizer as for generate (needed for llama2.c .bin inputs).\n");
            return NL_EXIT_OK;
        default: return nl_cli_bad_option("export", argv);
        }
    }
    if (!ckpt) return nl_cli_usage_error("export: --ckpt F is required");
    if (!to) return nl_cli_usage_error("export: --to hf DIR or --to llama2c FILE is required");
    if (strcmp(to, "hf") && strcmp(to, "llama2c"))
        return nl_cli_usage_error("export: unknown --to '%s' (known: hf, llama2c)", to);
    if (optind + 1 != argc)
        return nl_cli_usage_error("export: give exactly one output path after the options (--to %s PATH)", to);
    const char *out = argv[optind];
    int hf = !strcmp(to, "hf");
    if (!hf && (shard_mb || dtype != NL_ST_BF16))
        return nl_cli_usage_error("export: --dtype and --shard-mb apply to --to hf only (llama2.c files are fp32)");
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
        char kind[64];
        if (nl_hf_is_folder(ckpt) ? nl_hf_load_model(ckpt, 0, &m) : nl_ckpt_load_model(ckpt, &m, kind))
            return nl_cli_fail("export");
        rc = hf ? nl_hf_save(out, &m, NULL, dtype, (uint64_t)shard_mb << 20) : nl_model_save_llama2c(out, &m);
    } else {
        rc = hf ? nl_hf_save(out, &m, &tok, dtype, (uint64_t)shard_mb << 20) : nl_model_save_llama2c(out, &m);
    }
    int rcode = rc ? nl_cli_fail("export") : NL_EXIT_OK;
    if (!rc) {
        if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "to", to);
            cJSON_AddStringToObject(o, "path", out);
            cJSON_AddStringToObject(o, "arch", m.arch.name);
            cJSON_AddNumberToObject(o, "params", (double)m.n_params);
            if (hf) cJSON_AddStringToObject(o, "dtype", nl_st_dtype_name(dtype));
            cJSON_AddBoolToObject(o, "tokenizer", hf && tok.vocab_size > 0);
            nl_cli_print_json(o);
        } else {
            printf("exported %s (%lld parameters) to %s %s%s\n", m.arch.name, (long long)m.n_params, to, out,
                   hf && tok.vocab_size == 0 ? " (no tokenizer.json)" : "");
        }
    }
    nl_model_free(&m);
    nl_tokenizer_free(&tok);
    return rcode;
}
