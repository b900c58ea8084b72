/* Reads back a training log (the CSV of nanolm train --log) as one loss curve (nanolm/train_log.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/svg.h"
#include "nanolm/train.h"
#include "nanolm/train_log.h"

void nl_loss_curve_free(nl_loss_curve *c) {
    nl_free(c->step);
    nl_free(c->loss);
    c->step = c->loss = NULL;
    c->n = 0;
}

/* Splits "step,lr,train_loss,val_loss,..." in place into its first four fields (NULL if absent). */
static void split4(char *line, char *f[4]) {
    f[0] = line;
    for (int k = 1; k < 4; k++) {
        char *comma = f[k - 1] ? strchr(f[k - 1], ',') : NULL;
        f[k] = NULL;
        if (comma) {
            *comma = 0;
            f[k] = comma + 1;
        }
    }
}

nl_status nl_train_log_read_curve(const char *path, int val, nl_loss_curve *c) {
    char *text;
    size_t bytes;
    c->step = c->loss = NULL;
    c->n = 0;
    NL_TRY(nl_read_file(path, &text, &bytes));
    size_t lines = 0;
    for (size_t i = 0; i < bytes; i++) lines += text[i] == '\n';
    c->step = nl_malloc((lines + 1) * sizeof(double), "curve");
    c->loss = nl_malloc((lines + 1) * sizeof(double), "curve");
    if (!c->step || !c->loss) {
        nl_free(text);
        return NL_ERR_NOMEM;
    }
    char *save = NULL, *line = strtok_r(text, "\n", &save);
    if (!line || strncmp(line, "step,lr,train_loss,val_loss", 27)) {
        nl_free(text);
        return nl_fail(NL_ERR_FORMAT, "%s: not a training log (expected the header of nanolm train --log)", path);
    }
    while ((line = strtok_r(NULL, "\n", &save))) {
        char *f[4];
        split4(line, f); /* val_loss may be empty */
        if (!f[3]) continue;
        const char *v = val ? f[3] : f[2];
        if (!*v || *v == ',') continue;
        c->step[c->n] = atof(f[0]);
        c->loss[c->n] = atof(v);
        c->n++;
    }
    nl_free(text);
    if (c->n == 0) return nl_fail(NL_ERR_FORMAT, "%s: no %s loss values", path, val ? "validation" : "training");
    return NL_OK;
}

nl_status nl_loss_curves_svg(const char *path, const char *title, const char *const *labels,
                             const nl_loss_curve *curves, int n, int markers) {
    if (n < 1 || n > 16) return nl_fail(NL_ERR_INVALID, "%s: %d loss curves to plot (1..16)", path, n);
    nl_svg_series ser[16];
    for (int i = 0; i < n; i++)
        ser[i] = (nl_svg_series){
            .name = labels[i], .x = curves[i].step, .y = curves[i].loss, .n = curves[i].n, .markers = markers};
    nl_svg_plot_opts po = {.title = title, .xlabel = "step", .ylabel = "loss (nats/token)"};
    return nl_svg_plot(path, &po, ser, (size_t)n);
}

nl_status nl_train_log_svg(const nl_trainer *t, const char *path) {
    int64_t n = t->n_log, nv = 0;
    double *x = nl_malloc((size_t)(2 * n + 1) * sizeof(double), "plot"),
           *y = nl_malloc((size_t)(2 * n + 1) * sizeof(double), "plot");
    if (!x || !y) {
        nl_free(x);
        nl_free(y);
        return NL_ERR_NOMEM;
    }
    double *vx = x + n, *vy = y + n;
    for (int64_t i = 0; i < n; i++) {
        x[i] = (double)t->log[i].step;
        y[i] = t->log[i].loss;
        if (!isnan(t->log[i].val_loss)) {
            vx[nv] = x[i];
            vy[nv++] = t->log[i].val_loss;
        }
    }
    nl_svg_series s[2] = {{"train loss", x, y, (size_t)n, NULL, 0}, {"validation loss", vx, vy, (size_t)nv, NULL, 1}};
    nl_svg_plot_opts po = {.title = "NanoLM training", .xlabel = "step", .ylabel = "loss (nats/token)"};
    nl_status rc = nl_svg_plot(path, &po, s, nv ? 2 : 1);
    nl_free(x);
    nl_free(y);
    return rc;
}
