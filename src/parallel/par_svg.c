/* The SVG figures of `parallel train` (par_svg.h): who holds what, and a pipeline's timeline. */
#include "nanolm/par_svg.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nanolm/coll.h"
#include "nanolm/svg.h"

/* Who holds what: per rank, bars of parameters, gradients and optimizer state (the full size
 * outlined, the part held filled; a shard sits at the rank's slice), and what it sent per step. */
nl_status nl_par_svg_layout(const char *path, int zero, int P, size_t n_params, const double *rows, int nk) {
    nl_svg s;
    double W = 900, rowh = 64, top = 60, H = top + rowh * P + 70, x0 = 80, barw = 420;
    nl_svg_begin(&s, W, H);
    char t[256];
    snprintf(t, sizeof t, "%s on %d ranks, %zu parameters (fp32 + AdamW): what each rank holds", zero ? "ZeRO" : "DDP",
             P, n_params);
    if (zero)
        snprintf(t, sizeof t, "ZeRO-%d on %d ranks, %zu parameters (fp32 + AdamW): what each rank holds", zero, P,
                 n_params);
    nl_svg_text(&s, W / 2, 24, 15, "middle", t);
    const char *names[3] = {"params", "grads", "Adam m,v"};
    const char *colors[3] = {"#4e79a7", "#f28e2b", "#59a14f"};
    double full[3] = {4.0 * n_params, 4.0 * n_params, 8.0 * n_params};
    double scale = barw / full[2];
    for (int r = 0; r < P; r++) {
        const double *x = rows + (size_t)r * nk;
        double y = top + r * rowh;
        snprintf(t, sizeof t, "rank %d", r);
        nl_svg_text(&s, 10, y + 28, 13, "start", t);
        for (int k = 0; k < 3; k++) {
            double held = x[2 + NL_COMM_OP_COUNT + k], by = y + k * 18, fw = full[k] * scale;
            nl_svg_rect(&s, x0, by, fw, 14, "#eeeeee", "full size");
            int sharded = held < 0.9 * full[k];
            double hx = sharded ? x0 + fw * r / P : x0, hw = held * scale;
            snprintf(t, sizeof t, "%s: %.0f bytes held", names[k], held);
            nl_svg_rect(&s, hx, by, hw, 14, colors[k], t);
            snprintf(t, sizeof t, "%s %s", names[k], sharded ? "1/p shard" : "full");
            nl_svg_text(&s, x0 + barw + 8, by + 11, 10, "start", t);
        }
        double sent = x[0];
        char m[256] = "";
        for (int k = 0; k < NL_COMM_OP_COUNT; k++)
            if (x[2 + k] > 0) {
                char part[64];
                snprintf(part, sizeof part, "%s%s %.0f", m[0] ? ", " : "", nl_comm_op_name((nl_comm_op)k), x[2 + k]);
                strncat(m, part, sizeof m - strlen(m) - 1);
            }
        snprintf(t, sizeof t, "sends %.0f B/step (%.3f x params)", sent, sent / full[0]);
        nl_svg_text(&s, x0 + barw + 110, y + 18, 11, "start", t);
        nl_svg_text(&s, x0 + barw + 110, y + 34, 10, "start", m);
    }
    static const char *moves[4] = {
        "moves: gradients all-reduced per layer bucket during backward (2(p-1)/p of the gradient bytes)",
        "moves: gradients reduce-scattered per unit, updated shard all-gathered (same 2(p-1)/p as DDP)",
        "moves: as ZeRO-1; only the reduced gradient shard is kept between steps",
        "moves: each layer all-gathered before forward and before backward, gradients reduce-scattered (~3(p-1)/p)"};
    nl_svg_text(&s, 10, H - 30, 12, "start", moves[zero]);
    return nl_svg_save(&s, path);
}

/* The last step's pipeline timeline: one row per rank, forward (blue) and backward (green)
 * boxes of each micro-batch where the stage computed; white is the bubble. */
nl_status nl_par_svg_timeline(const char *path, int P, int M, const char *sched, const double *ev, const double *rows,
                              int nk, double formula) {
    nl_svg s;
    double W = 900, x0 = 120, rowh = 34, top = 50, H = top + rowh * P + 50, tmax = 0;
    for (int r = 0; r < P; r++)
        for (int i = 0; i < 2 * M; i++) tmax = fmax(tmax, ev[((size_t)r * 2 * M + i) * 4 + 3]);
    if (tmax <= 0) tmax = 1;
    nl_svg_begin(&s, W, H);
    double sb = 0, si = 0;
    for (int r = 0; r < P; r++) {
        sb += rows[(size_t)r * nk + 6 + NL_COMM_OP_COUNT];
        si += rows[(size_t)r * nk + 7 + NL_COMM_OP_COUNT];
    }
    char t[200];
    snprintf(t, sizeof t,
             "%s, %d ranks, %d micro-batches (last step): measured bubble %.3f, formula (P-1)/(M+P-1) = %.3f", sched, P,
             M, si / (sb + si), formula);
    nl_svg_text(&s, W / 2, 24, 14, "middle", t);
    double scale = (W - x0 - 20) / tmax;
    for (int r = 0; r < P; r++) {
        double y = top + r * rowh;
        snprintf(t, sizeof t, "rank %d (stage %.0f)", r, rows[(size_t)r * nk + 8 + NL_COMM_OP_COUNT]);
        nl_svg_text(&s, 8, y + 18, 11, "start", t);
        nl_svg_rect(&s, x0, y, tmax * scale, rowh - 8, "#ffffff", "idle");
        for (int i = 0; i < 2 * M; i++) {
            const double *e = ev + ((size_t)r * 2 * M + i) * 4;
            if (e[3] <= e[2]) continue;
            snprintf(t, sizeof t, "%s micro-batch %.0f: %.2f ms", e[0] ? "backward" : "forward", e[1],
                     (e[3] - e[2]) * 1e3);
            nl_svg_rect(&s, x0 + e[2] * scale, y, (e[3] - e[2]) * scale, rowh - 8, e[0] ? "#59a14f" : "#4e79a7", t);
            if ((e[3] - e[2]) * scale > 14) {
                snprintf(t, sizeof t, "%s%.0f", e[0] ? "B" : "F", e[1]);
                nl_svg_text(&s, x0 + (e[2] + e[3]) / 2 * scale, y + 17, 10, "middle", t);
            }
        }
    }
    snprintf(t, sizeof t, "time (0 .. %.2f ms); blue forward, green backward, white waiting", tmax * 1e3);
    nl_svg_text(&s, x0, H - 20, 11, "start", t);
    return nl_svg_save(&s, path);
}
