/* Pictures of plans: pipeline timelines (GPipe vs 1F1B) and memory bars. */
#include "nanolm/plan.h"
#include "nanolm/svg.h"

#include <stdio.h>
#include <string.h>

/* Simulates one schedule: op order per stage, forward 1 unit, backward 2 units, each op starts
 * when its stage is free and its input is ready. Fills start times; returns the makespan. */
static double simulate(int64_t p, int64_t m, int one_f_one_b, double *fs, double *bs) {
    /* fs[s*m+i], bs[s*m+i]: start times. */
    int64_t *order = nl_malloc((size_t)(2 * m) * sizeof *order, "pipeline schedule");
    if (!order) return -1;
    double *fe = nl_calloc((size_t)(p * m), sizeof *fe, "pipeline schedule");
    double *be = nl_calloc((size_t)(p * m), sizeof *be, "pipeline schedule");
    if (!fe || !be) {
        nl_free(order);
        nl_free(fe);
        nl_free(be);
        return -1;
    }
    for (int64_t i = 0; i < p * m; i++) fs[i] = bs[i] = -1;
    /* Iterate until all scheduled (dependencies resolve stage by stage). */
    double *freet = nl_calloc((size_t)p, sizeof *freet, "pipeline schedule");
    int64_t *pos = nl_calloc((size_t)p, sizeof *pos, "pipeline schedule");
    int64_t **ord = nl_calloc((size_t)p, sizeof *ord, "pipeline schedule");
    double span = 0;
    if (!freet || !pos || !ord) goto done;
    for (int64_t s = 0; s < p; s++) {
        ord[s] = nl_malloc((size_t)(2 * m) * sizeof **ord, "pipeline schedule");
        if (!ord[s]) goto done;
        int64_t k = 0;
        if (!one_f_one_b) {
            for (int64_t i = 0; i < m; i++) ord[s][k++] = i;     /* forward i */
            for (int64_t i = 0; i < m; i++) ord[s][k++] = m + i; /* backward i */
        } else {
            int64_t w = p - s - 1 < m ? p - s - 1 : m, f = 0, b = 0;
            for (; f < w; f++) ord[s][k++] = f;
            while (f < m) {
                ord[s][k++] = f++;
                ord[s][k++] = m + b++;
            }
            while (b < m) ord[s][k++] = m + b++;
        }
    }
    for (int progress = 1; progress;) {
        progress = 0;
        for (int64_t s = 0; s < p; s++) {
            while (pos[s] < 2 * m) {
                int64_t op = ord[s][pos[s]];
                double ready;
                if (op < m) {
                    if (s > 0 && fs[(s - 1) * m + op] < 0) break;
                    ready = s > 0 ? fe[(s - 1) * m + op] : 0;
                    double st = ready > freet[s] ? ready : freet[s];
                    fs[s * m + op] = st;
                    fe[s * m + op] = st + 1;
                    freet[s] = st + 1;
                } else {
                    int64_t i = op - m;
                    if (s < p - 1 && bs[(s + 1) * m + i] < 0) break;
                    if (fs[s * m + i] < 0) break;
                    ready = s < p - 1 ? be[(s + 1) * m + i] : fe[s * m + i];
                    double st = ready > freet[s] ? ready : freet[s];
                    bs[s * m + i] = st;
                    be[s * m + i] = st + 2;
                    freet[s] = st + 2;
                }
                pos[s]++;
                progress = 1;
            }
        }
    }
    for (int64_t s = 0; s < p; s++)
        if (freet[s] > span) span = freet[s];
done:
    if (ord)
        for (int64_t s = 0; s < p; s++) nl_free(ord[s]);
    nl_free(ord);
    nl_free(pos);
    nl_free(freet);
    nl_free(fe);
    nl_free(be);
    nl_free(order);
    return span;
}

nl_status nl_plan_svg_pipeline(const char *path, int64_t p, int64_t m) {
    if (p < 1 || m < 1 || p > 64 || m > 256)
        return nl_fail(NL_ERR_INVALID, "pipeline picture: need 1 <= stages <= 64 and 1 <= microbatches <= 256");
    double *fs = nl_malloc((size_t)(2 * p * m) * sizeof *fs, "pipeline schedule");
    if (!fs) return NL_ERR_NOMEM;
    double *bs = fs + p * m;
    double unit = 900.0 / (3.0 * (double)(m + p - 1)), row = 22, top = 40;
    nl_svg s;
    nl_svg_begin(&s, 1000, top + 2 * ((double)p * row + 50) + 20);
    for (int sched = 0; sched < 2; sched++) {
        double span = simulate(p, m, sched, fs, bs);
        if (span < 0) {
            nl_svg_free(&s);
            nl_free(fs);
            return NL_ERR_NOMEM;
        }
        double y0 = top + sched * ((double)p * row + 50);
        char title[160];
        /* Idle share of the simulated timeline: each stage works 3m units of the span. */
        snprintf(title, sizeof title,
                 "%s: %lld stages, %lld microbatches: simulated idle %.0f%%; (p-1)/(m+p-1) = %lld/%lld",
                 sched ? "1F1B" : "GPipe", (long long)p, (long long)m, 100.0 * (1.0 - 3.0 * (double)m / span),
                 (long long)(p - 1), (long long)(m + p - 1));
        nl_svg_text(&s, 10, y0 - 8, 13, "start", title);
        for (int64_t st = 0; st < p; st++) {
            double y = y0 + (double)st * row;
            nl_svg_rect(&s, 80, y, span * unit, row - 2, "#eeeeee", "idle (bubble)");
            char lab[32];
            snprintf(lab, sizeof lab, "stage %lld", (long long)st);
            nl_svg_text(&s, 75, y + 15, 11, "end", lab);
            for (int64_t i = 0; i < m; i++) {
                char tip[48];
                snprintf(tip, sizeof tip, "forward %lld", (long long)i);
                nl_svg_rect(&s, 80 + fs[st * m + i] * unit, y, unit, row - 2, "#4e79a7", tip);
                snprintf(tip, sizeof tip, "backward %lld", (long long)i);
                nl_svg_rect(&s, 80 + bs[st * m + i] * unit, y, 2 * unit, row - 2, "#f28e2b", tip);
                snprintf(lab, sizeof lab, "%lld", (long long)i);
                nl_svg_text(&s, 80 + fs[st * m + i] * unit + unit / 2, y + 14, 9, "middle", lab);
                nl_svg_text(&s, 80 + bs[st * m + i] * unit + unit, y + 14, 9, "middle", lab);
            }
        }
    }
    nl_free(fs);
    return nl_svg_save(&s, path);
}

nl_status nl_plan_svg_memory(const char *path, const nl_train_eval *e, size_t n, double capacity) {
    if (n == 0) return nl_fail(NL_ERR_INVALID, "memory picture: no layouts");
    if (n > 40) n = 40;
    static const char *names[] = {"weights", "grads", "optimizer", "activations", "logits", "temp+reserved"};
    static const char *colors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#bab0ac"};
    double maxv = capacity;
    for (size_t i = 0; i < n; i++)
        if (e[i].mem_total > maxv) maxv = e[i].mem_total;
    double row = 20, left = 330, width = 600;
    nl_svg s;
    nl_svg_begin(&s, left + width + 40, 70 + (double)n * row + 40);
    nl_svg_text(&s, 10, 20, 14, "start", "Memory per GPU by layout (GB); the red line is the GPU's capacity");
    for (int k = 0; k < 6; k++) {
        nl_svg_rect(&s, 10 + k * 150, 30, 12, 12, colors[k], NULL);
        nl_svg_text(&s, 26 + k * 150, 41, 11, "start", names[k]);
    }
    for (size_t i = 0; i < n; i++) {
        double v[6] = {e[i].mem_weights, e[i].mem_grads, e[i].mem_optim, e[i].mem_act, e[i].mem_logits, e[i].mem_temp};
        double x = left, y = 60 + (double)i * row;
        char lab[160];
        nl_layout_str(&e[i].L, lab, sizeof lab);
        nl_svg_text(&s, left - 6, y + 13, 10, "end", lab);
        for (int k = 0; k < 6; k++) {
            double w = v[k] / maxv * width;
            char tip[64];
            snprintf(tip, sizeof tip, "%s %.1f GB", names[k], v[k] / 1e9);
            nl_svg_rect(&s, x, y, w, row - 3, colors[k], tip);
            x += w;
        }
    }
    double cx = left + capacity / maxv * width;
    nl_svg_line(&s, cx, 50, cx, 60 + (double)n * row, "#d62728", 2);
    char cap[48];
    snprintf(cap, sizeof cap, "%.0f GB", capacity / 1e9);
    nl_svg_text(&s, cx, 60 + (double)n * row + 14, 11, "middle", cap);
    return nl_svg_save(&s, path);
}

nl_status nl_plan_svg_validate(const char *path, const nl_valid_result *r) {
    if (r->n == 0) return nl_fail(NL_ERR_INVALID, "validation picture: no cases");
    double row = 14, left = 300, half = 300, lim = 0.5; /* bars clipped at +-50% */
    nl_svg s;
    nl_svg_begin(&s, left + 2 * half + 60, 60 + (double)r->n * row + 30);
    nl_svg_text(&s, 10, 20, 14, "start",
                "Planner against published runs: signed error (predicted / published - 1), clipped at +-50%");
    double cx = left + half;
    for (int k = -2; k <= 2; k++) {
        double x = cx + k * 0.25 / lim * half;
        nl_svg_line(&s, x, 40, x, 50 + (double)r->n * row, k ? "#dddddd" : "#333333", 1);
        char lab[16];
        snprintf(lab, sizeof lab, "%+d%%", k * 25);
        nl_svg_text(&s, x, 38, 10, "middle", lab);
    }
    for (size_t i = 0; i < r->n; i++) {
        const nl_valid_case *c = &r->cases[i];
        double y = 45 + (double)i * row, e = c->err > lim ? lim : c->err < -lim ? -lim : c->err;
        const char *col = !strcmp(c->group, "train") ? "#4e79a7" : !strcmp(c->group, "memory") ? "#59a14f" : "#f28e2b";
        char tip[160];
        snprintf(tip, sizeof tip, "%s: published %.4g, predicted %.4g (%+.1f%%)", c->id, c->published, c->predicted,
                 100 * c->err);
        double w = e / lim * half;
        nl_svg_rect(&s, w < 0 ? cx + w : cx, y, w < 0 ? -w : w, row - 3, col, tip);
        nl_svg_text(&s, left - 6, y + 10, 9, "end", c->id);
    }
    return nl_svg_save(&s, path);
}

nl_status nl_plan_svg_search(const char *path, const nl_train_result *res, double capacity) {
    nl_train_eval sel[12];
    size_t ns = 0;
    for (size_t i = 0; i < res->n_fit && ns < 8; i++) sel[ns++] = res->evals[i];
    for (size_t i = res->n_fit; i < res->n && ns < 12; i++) sel[ns++] = res->evals[i];
    return nl_plan_svg_memory(path, sel, ns, capacity);
}
