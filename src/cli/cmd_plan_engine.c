/* `nanolm plan serve --hw cpu.json`: the serving engine's cost model (plan_engine.h) on a CPU
 * measured by `nanolm bench machine`. */
#include <stdio.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "nanolm/plan_engine.h"
#include "plan_opts.h"

int nl_cli_plan_serve_engine(const nl_cpu_rates *r, const nl_engine_plan_req *q, int json) {
    nl_engine_plan p;
    if (nl_plan_engine(q, r, &p)) return nl_cli_fail("plan serve");
    static const char *wf[3] = {"fp32", "bf16", "int8"}, *kf[2] = {"fp32", "int8"};
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "model", q->arch.name);
        cJSON_AddStringToObject(j, "hw", r->name);
        cJSON_AddStringToObject(j, "weights", wf[q->weights]);
        cJSON_AddStringToObject(j, "kv", kf[q->kv]);
        cJSON_AddNumberToObject(j, "threads", r->threads);
        cJSON_AddNumberToObject(j, "prompt", (double)q->prompt);
        cJSON_AddNumberToObject(j, "output", (double)q->output);
        cJSON_AddNumberToObject(j, "batch", (double)q->batch);
        cJSON_AddNumberToObject(j, "chunk", (double)q->chunk);
        cJSON_AddNumberToObject(j, "prefill_s", p.prefill_s);
        cJSON_AddNumberToObject(j, "prefill_steps", (double)p.prefill_steps);
        for (int i = 0; i < NL_ENGINE_PLAN_NB; i++) {
            char k[48];
            snprintf(k, sizeof k, "decode_step_s_b%lld", (long long)p.decode_batch[i]);
            cJSON_AddNumberToObject(j, k, p.decode_step_s[i]);
            snprintf(k, sizeof k, "decode_tokens_per_s_b%lld", (long long)p.decode_batch[i]);
            cJSON_AddNumberToObject(j, k, p.decode_tokens_per_s[i]);
        }
        cJSON_AddNumberToObject(j, "throughput_tokens_per_s", p.throughput_tokens_per_s);
        cJSON_AddNumberToObject(j, "weight_bytes", p.weight_bytes);
        cJSON_AddNumberToObject(j, "kv_bytes_per_token", p.kv_bytes_per_token);
        return nl_cli_print_json(j);
    }
    printf("Serving %s on %s (%d threads, measured by `nanolm bench machine`): weights %s, KV %s, prompt %lld, "
           "answer %lld tokens, chunk %lld.\n\n",
           q->arch.name[0] ? q->arch.name : "the model", r->name, r->threads, wf[q->weights], kf[q->kv],
           (long long)q->prompt, (long long)q->output, (long long)q->chunk);
    static const char *hdr[] = {"quantity", "predicted", "how"};
    nl_table t;
    nl_table_init(&t, 3, hdr);
    nl_table_rowf(&t, "prefill (TTFT alone)|%.2f ms|%lld engine steps of chunks", p.prefill_s * 1e3,
                  (long long)p.prefill_steps);
    for (int i = 0; i < NL_ENGINE_PLAN_NB; i++)
        nl_table_rowf(&t, "decode step, batch %lld|%.3f ms|%.1f tokens/s in all", (long long)p.decode_batch[i],
                      p.decode_step_s[i] * 1e3, p.decode_tokens_per_s[i]);
    nl_table_rowf(&t, "throughput, %lld sequences|%.1f tokens/s|prefill steps + decode steps, the engine's schedule",
                  (long long)q->batch, p.throughput_tokens_per_s);
    nl_table_rowf(&t, "batch-1 step: linears|%.3f ms|%.1f MB of weights, max(bytes / %.1f GB/s, FLOPs / rate at M)",
                  p.linear_s * 1e3, p.weight_bytes / 1e6, r->read_bw_nt / 1e9);
    nl_table_rowf(&t, "batch-1 step: attention|%.3f ms|%.0f KiB of KV per token", p.attention_s * 1e3,
                  p.kv_bytes_per_token / 1024);
    nl_table_rowf(&t, "batch-1 step: per-token work|%.3f ms|norms, RoPE, KV store, residuals, SwiGLU", p.rows_s * 1e3);
    nl_table_rowf(&t, "batch-1 step: overheads|%.3f ms|per step + per layer", p.overhead_s * 1e3);
    nl_table_print(&t, stdout);
    nl_table_free(&t);
    return NL_EXIT_OK;
}
