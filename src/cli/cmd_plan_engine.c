/* `nanolm plan serve --hw cpu.json`: the serving engine's cost model (plan_engine.h) on a CPU
 * measured by `nanolm bench machine`. */
#include <stdio.h>

#include "cli.h"
#include "nanolm/plan_engine.h"
#include "plan_opts.h"
#include "report.h"

/* The table: prefill, decode steps by batch, throughput, and the batch-1 step's parts. */
static void report_engine_table(nl_report *r, const nl_cpu_rates *cpu, const nl_engine_plan_req *q,
                                const nl_engine_plan *p) {
    nl_report_table(r, NULL, NULL, 3,
                    (const nl_report_col[]){{NULL, "quantity", NULL}, {NULL, "predicted", NULL}, {NULL, "how", NULL}});
    nl_plan_table_rowf(r, 3, "prefill (TTFT alone)|%.2f ms|%lld engine steps of chunks", p->prefill_s * 1e3,
                       (long long)p->prefill_steps);
    for (int i = 0; i < NL_ENGINE_PLAN_NB; i++)
        nl_plan_table_rowf(r, 3, "decode step, batch %lld|%.3f ms|%.1f tokens/s in all", (long long)p->decode_batch[i],
                           p->decode_step_s[i] * 1e3, p->decode_tokens_per_s[i]);
    nl_plan_table_rowf(r, 3,
                       "throughput, %lld sequences|%.1f tokens/s|prefill steps + decode steps, the engine's schedule",
                       (long long)q->batch, p->throughput_tokens_per_s);
    nl_plan_table_rowf(r, 3,
                       "batch-1 step: linears|%.3f ms|%.1f MB of weights, max(bytes / %.1f GB/s, FLOPs / rate at M)",
                       p->linear_s * 1e3, p->weight_bytes / 1e6, cpu->read_bw_nt / 1e9);
    nl_plan_table_rowf(r, 3, "batch-1 step: attention|%.3f ms|%.0f KiB of KV per token", p->attention_s * 1e3,
                       p->kv_bytes_per_token / 1024);
    nl_plan_table_rowf(r, 3, "batch-1 step: per-token work|%.3f ms|norms, RoPE, KV store, residuals, SwiGLU",
                       p->rows_s * 1e3);
    nl_plan_table_rowf(r, 3, "batch-1 step: overheads|%.3f ms|per step + per layer", p->overhead_s * 1e3);
}

int nl_cli_plan_serve_engine(const nl_cpu_rates *cpu, const nl_engine_plan_req *q, int json) {
    nl_engine_plan p;
    if (nl_plan_engine(q, cpu, &p)) return nl_cli_fail("plan serve");
    static const char *wf[3] = {"fp32", "bf16", "int8"}, *kf[2] = {"fp32", "int8"};
    nl_report *r = nl_report_new("plan serve");
    nl_report_str(r, "model", "", q->arch.name);
    nl_report_str(r, "hw", "", cpu->name);
    nl_report_str(r, "weights", "", wf[q->weights]);
    nl_report_str(r, "kv", "", kf[q->kv]);
    nl_report_int(r, "threads", "", cpu->threads, NULL);
    nl_report_int(r, "prompt", "", q->prompt, NULL);
    nl_report_int(r, "output", "", q->output, NULL);
    nl_report_int(r, "batch", "", q->batch, NULL);
    nl_report_int(r, "chunk", "", q->chunk, NULL);
    nl_report_num(r, "prefill_s", "", p.prefill_s, NULL, NULL);
    nl_report_int(r, "prefill_steps", "", p.prefill_steps, NULL);
    for (int i = 0; i < NL_ENGINE_PLAN_NB; i++) {
        char k[48];
        snprintf(k, sizeof k, "decode_step_s_b%lld", (long long)p.decode_batch[i]);
        nl_report_num(r, k, "", p.decode_step_s[i], NULL, NULL);
        snprintf(k, sizeof k, "decode_tokens_per_s_b%lld", (long long)p.decode_batch[i]);
        nl_report_num(r, k, "", p.decode_tokens_per_s[i], NULL, NULL);
    }
    nl_report_num(r, "throughput_tokens_per_s", "", p.throughput_tokens_per_s, NULL, NULL);
    nl_report_num(r, "weight_bytes", "", p.weight_bytes, NULL, NULL);
    nl_report_num(r, "kv_bytes_per_token", "", p.kv_bytes_per_token, NULL, NULL);
    nl_report_note(r,
                   "Serving %s on %s (%d threads, measured by `nanolm bench machine`): weights %s, KV %s, prompt "
                   "%lld, answer %lld tokens, chunk %lld.",
                   q->arch.name[0] ? q->arch.name : "the model", cpu->name, cpu->threads, wf[q->weights], kf[q->kv],
                   (long long)q->prompt, (long long)q->output, (long long)q->chunk);
    report_engine_table(r, cpu, q, &p);
    return nl_report_print(r, json);
}
