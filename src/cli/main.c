/* nanolm <command> [subcommand] [options]: dispatch to one file per command. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "nanolm/isa.h"

typedef struct nl_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
} nl_command;

int nl_cmd_version(int argc, char **argv);
int nl_cmd_formats(int argc, char **argv);
int nl_cmd_quant(int argc, char **argv);
int nl_cmd_train(int argc, char **argv);
int nl_cmd_eval(int argc, char **argv);
int nl_cmd_generate(int argc, char **argv);
int nl_cmd_quant_compare(int argc, char **argv);
int nl_cmd_fp8(int argc, char **argv);
int nl_cmd_collectives(int argc, char **argv);
int nl_cmd_parallel(int argc, char **argv);
int nl_cmd_moe(int argc, char **argv);
int nl_cmd_scaling(int argc, char **argv);
int nl_cmd_budget(int argc, char **argv);
int nl_cmd_plan(int argc, char **argv);
int nl_cmd_precision(int argc, char **argv);
int nl_cmd_export(int argc, char **argv);
int nl_cmd_serve(int argc, char **argv);
int nl_cmd_bench(int argc, char **argv);
int nl_cmd_tokenize(int argc, char **argv);

/* One line per command; each lives in src/cli/cmd_<name>.c. */
static const nl_command commands[] = {
    {"version", "print the version and build configuration", nl_cmd_version},
    {"formats", "number formats: properties table, cast a value, rounded running sums", nl_cmd_formats},
    {"quant", "quantization: course demo, outliers, quantize a model", nl_cmd_quant},
    {"train", "train NanoLM on a text file (AdamW, cosine, fp32/bf16/fp16)", nl_cmd_train},
    {"eval", "mean loss and perplexity of a checkpoint on a text file", nl_cmd_eval},
    {"generate", "continue a prompt with a checkpoint (KV cache, sampling)", nl_cmd_generate},
    {"export", "write a checkpoint as a Hugging Face folder or a llama2.c file", nl_cmd_export},
    {"tokenize", "a text through a tokenizer: ids, vocabulary pieces, bytes, counts", nl_cmd_tokenize},
    {"quant-compare", "RTN vs GPTQ, AWQ, SmoothQuant, LLM.int8() on a checkpoint (= quant compare)",
     nl_cmd_quant_compare},
    {"fp8", "emulated FP8 GEMM: scaling recipes, limited accumulators, error vs fp64", nl_cmd_fp8},
    {"collectives", "MPI collectives: the course demo and a benchmark (ours vs native)", nl_cmd_collectives},
    {"parallel", "data-parallel training over MPI: DDP, ZeRO-1/2/3 (mpirun -np N nanolm parallel train)",
     nl_cmd_parallel},
    {"moe", "mixture-of-experts NanoLM with expert parallelism (mpirun -np N nanolm moe train --ep E)", nl_cmd_moe},
    {"scaling", "scaling laws: compute-optimal size, over-training, fitting", nl_cmd_scaling},
    {"budget", "memory: training state by ZeRO stage, activations term by term", nl_cmd_budget},
    {"plan", "parallel training and serving plans for real clusters", nl_cmd_plan},
    {"serve", "OpenAI-compatible HTTP server: continuous batching, paged KV cache, SSE streaming, /metrics",
     nl_cmd_serve},
    {"bench", "load generator for OpenAI-compatible servers: throughput, TTFT/TPOT/ITL percentiles, goodput",
     nl_cmd_bench},
    {"precision", "gradient underflow/overflow in fp16 (with and without loss scaling) and bf16", nl_cmd_precision},
};

#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f) {
    fprintf(f, "nanolm: the economics of large language models, computable and checkable.\n\n"
               "usage: nanolm <command> [subcommand] [options]\n"
               "       nanolm <command> --help\n\n"
               "commands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++) fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nEvery command prints a table by default and the same data with --json.\n");
}

int main(int argc, char **argv) {
    nl_runtime_reexec(argv);
    if (nl_isa_check_env() != NL_OK) {
        fprintf(stderr, "nanolm: %s\n", nl_last_error());
        return NL_EXIT_USAGE;
    }
    if (argc < 2) {
        usage(stderr);
        return NL_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return NL_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version")) return nl_cmd_version(argc - 1, argv + 1);
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            nl_cli_getopt_reset();
            return commands[i].run(argc - 1, argv + 1);
        }
    fprintf(stderr, "nanolm: unknown command '%s' (commands:", argv[1]);
    for (size_t i = 0; i < NCOMMANDS; i++) fprintf(stderr, " %s", commands[i].name);
    fprintf(stderr, ")\n");
    return NL_EXIT_USAGE;
}
