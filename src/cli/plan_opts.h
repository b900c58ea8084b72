/* Helpers shared by the planner's commands (scaling, budget, plan). */
#ifndef NANOLM_CLI_PLAN_OPTS_H
#define NANOLM_CLI_PLAN_OPTS_H

#include <stddef.h>
#include "nanolm/plan.h"

/* "7.00B", "20.2B", "1.50T", "512M" (3 significant digits). */
const char *nl_fmt_count(double v, char *buf, size_t n);
/* Bytes with a decimal unit: "12.25 GB", "201.3 MB". */
const char *nl_fmt_bytes(double bytes, char *buf, size_t n);
/* Parses a ZeRO stage: 0/ddp, 1, 2, 3/fsdp, hsdp. Returns -1 when unknown. */
int nl_parse_zero(const char *s);
/* Parses none/selective/full; -1 when unknown. */
int nl_parse_recompute(const char *s);

/* The architecture named by --model: a Hugging Face model folder or its config.json (read by
 * nl_arch_from_hf_config), a checkpoint the engine serves (NanoLM safetensors, llama2.c .bin),
 * a model JSON file, or a catalog name. Errors name the input. */
nl_status nl_cli_model_arch(nl_catalog *cat, const char *arg, nl_arch *out);

/* `plan serve` against a CPU measured by `nanolm bench machine` (cmd_plan_engine.c): prints
 * the engine cost model's predictions (plan_engine.h) as a table or JSON; returns the exit code. */
struct nl_cpu_rates;
struct nl_engine_plan_req;
int nl_cli_plan_serve_engine(const struct nl_cpu_rates *r, const struct nl_engine_plan_req *q, int json);

#endif
