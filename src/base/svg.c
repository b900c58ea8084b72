/* A tiny SVG writer and a line-plot helper. */
#include "nanolm/svg.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void svg_vappend(nl_svg *s, const char *fmt, va_list ap) {
    if (s->failed) return;
    for (;;) {
        va_list cp;
        va_copy(cp, ap);
        size_t room = s->cap - s->len;
        int n = vsnprintf(s->buf ? s->buf + s->len : NULL, s->buf ? room : 0, fmt, cp);
        va_end(cp);
        if (n < 0) {
            s->failed = 1;
            return;
        }
        if (s->buf && (size_t)n < room) {
            s->len += (size_t)n;
            return;
        }
        size_t ncap = (s->cap ? s->cap * 2 : 4096);
        while (ncap < s->len + (size_t)n + 1) ncap *= 2;
        char *nb = realloc(s->buf, ncap);
        if (!nb) {
            s->failed = 1;
            return;
        }
        s->buf = nb;
        s->cap = ncap;
    }
}

void nl_svg_raw(nl_svg *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    svg_vappend(s, fmt, ap);
    va_end(ap);
}

void nl_svg_begin(nl_svg *s, double width, double height) {
    memset(s, 0, sizeof *s);
    s->width = width;
    s->height = height;
    nl_svg_raw(s,
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" "
               "viewBox=\"0 0 %g %g\" font-family=\"sans-serif\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
               width, height, width, height);
}

static void svg_escaped(nl_svg *s, const char *t) {
    for (; t && *t; t++) {
        switch (*t) {
        case '<': nl_svg_raw(s, "&lt;"); break;
        case '>': nl_svg_raw(s, "&gt;"); break;
        case '&': nl_svg_raw(s, "&amp;"); break;
        case '"': nl_svg_raw(s, "&quot;"); break;
        default: nl_svg_raw(s, "%c", *t);
        }
    }
}

void nl_svg_line(nl_svg *s, double x1, double y1, double x2, double y2, const char *color, double w) {
    nl_svg_raw(s, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" stroke-width=\"%g\"/>\n", x1, y1,
               x2, y2, color ? color : "black", w);
}

void nl_svg_rect(nl_svg *s, double x, double y, double w, double h, const char *fill, const char *title) {
    nl_svg_raw(
        s,
        "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\" stroke=\"#333\" stroke-width=\"0.5\">",
        x, y, w, h, fill ? fill : "#888");
    if (title) {
        nl_svg_raw(s, "<title>");
        svg_escaped(s, title);
        nl_svg_raw(s, "</title>");
    }
    nl_svg_raw(s, "</rect>\n");
}

void nl_svg_text(nl_svg *s, double x, double y, double size, const char *anchor, const char *text) {
    nl_svg_raw(s, "<text x=\"%.2f\" y=\"%.2f\" font-size=\"%g\" text-anchor=\"%s\">", x, y, size,
               anchor ? anchor : "start");
    svg_escaped(s, text);
    nl_svg_raw(s, "</text>\n");
}

void nl_svg_polyline(nl_svg *s, const double *x, const double *y, size_t n, const char *color, double w) {
    nl_svg_raw(s, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%g\" points=\"", color ? color : "black", w);
    for (size_t i = 0; i < n; i++) nl_svg_raw(s, "%.2f,%.2f ", x[i], y[i]);
    nl_svg_raw(s, "\"/>\n");
}

void nl_svg_free(nl_svg *s) {
    free(s->buf);
    memset(s, 0, sizeof *s);
}

nl_status nl_svg_save(nl_svg *s, const char *path) {
    nl_svg_raw(s, "</svg>\n");
    nl_status rc;
    if (s->failed)
        rc = nl_fail(NL_ERR_NOMEM, "out of memory building SVG %s", path);
    else
        rc = nl_write_file_atomic(path, s->buf, s->len);
    nl_svg_free(s);
    return rc;
}

const char *nl_svg_color(size_t i) {
    static const char *pal[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
    return pal[i % (sizeof pal / sizeof pal[0])];
}

/* Picks "nice" tick spacing for [lo, hi]. */
static double nice_step(double range, int target) {
    double raw = range / target, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

nl_status nl_svg_plot(const char *path, const nl_svg_plot_opts *o, const nl_svg_series *series, size_t nseries) {
    double W = o->width > 0 ? o->width : 720, H = o->height > 0 ? o->height : 440;
    double L = 70, R = 20, T = 40, B = 50;
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    for (size_t k = 0; k < nseries; k++)
        for (size_t i = 0; i < series[k].n; i++) {
            double x = series[k].x[i], y = series[k].y[i];
            if (!isfinite(x) || !isfinite(y)) continue;
            if ((o->logx && x <= 0) || (o->logy && y <= 0)) continue;
            if (o->logx) x = log10(x);
            if (o->logy) y = log10(y);
            xmin = fmin(xmin, x);
            xmax = fmax(xmax, x);
            ymin = fmin(ymin, y);
            ymax = fmax(ymax, y);
        }
    if (!(xmin <= xmax) || !(ymin <= ymax)) return nl_fail(NL_ERR_INVALID, "plot %s has no finite points", path);
    if (xmax == xmin) {
        xmin -= 0.5;
        xmax += 0.5;
    }
    if (ymax == ymin) {
        ymin -= 0.5;
        ymax += 0.5;
    }
    double ypad = 0.05 * (ymax - ymin);
    ymin -= ypad;
    ymax += ypad;
    nl_svg s;
    nl_svg_begin(&s, W, H);
#define PX(v) (L + ((v)-xmin) / (xmax - xmin) * (W - L - R))
#define PY(v) (H - B - ((v)-ymin) / (ymax - ymin) * (H - T - B))
    if (o->title) nl_svg_text(&s, W / 2, 24, 16, "middle", o->title);
    nl_svg_line(&s, L, H - B, W - R, H - B, "black", 1);
    nl_svg_line(&s, L, T, L, H - B, "black", 1);
    char lab[64];
    double xs = nice_step(xmax - xmin, 6), ys = nice_step(ymax - ymin, 6);
    for (double v = ceil(xmin / xs) * xs; v <= xmax + 1e-12 * fabs(xmax); v += xs) {
        nl_svg_line(&s, PX(v), H - B, PX(v), H - B + 5, "black", 1);
        nl_svg_line(&s, PX(v), T, PX(v), H - B, "#eee", 1);
        snprintf(lab, sizeof lab, "%.4g", o->logx ? pow(10, v) : v);
        nl_svg_text(&s, PX(v), H - B + 18, 11, "middle", lab);
    }
    for (double v = ceil(ymin / ys) * ys; v <= ymax + 1e-12 * fabs(ymax); v += ys) {
        nl_svg_line(&s, L - 5, PY(v), L, PY(v), "black", 1);
        nl_svg_line(&s, L, PY(v), W - R, PY(v), "#eee", 1);
        snprintf(lab, sizeof lab, "%.4g", o->logy ? pow(10, v) : v);
        nl_svg_text(&s, L - 8, PY(v) + 4, 11, "end", lab);
    }
    if (o->xlabel) nl_svg_text(&s, (L + W - R) / 2, H - 12, 13, "middle", o->xlabel);
    if (o->ylabel) {
        nl_svg_raw(&s, "<g transform=\"translate(16,%.1f) rotate(-90)\">", (T + H - B) / 2);
        nl_svg_text(&s, 0, 0, 13, "middle", o->ylabel);
        nl_svg_raw(&s, "</g>\n");
    }
    for (size_t k = 0; k < nseries; k++) {
        const nl_svg_series *se = &series[k];
        const char *col = se->color ? se->color : nl_svg_color(k);
        double *px = malloc((se->n + 1) * sizeof *px), *py = malloc((se->n + 1) * sizeof *py);
        if (!px || !py) {
            free(px);
            free(py);
            nl_svg_free(&s);
            return nl_fail(NL_ERR_NOMEM, "out of memory plotting %s", path);
        }
        size_t m = 0;
        for (size_t i = 0; i < se->n; i++) {
            double x = se->x[i], y = se->y[i];
            if (!isfinite(x) || !isfinite(y) || (o->logx && x <= 0) || (o->logy && y <= 0)) continue;
            px[m] = PX(o->logx ? log10(x) : x);
            py[m] = PY(o->logy ? log10(y) : y);
            m++;
        }
        nl_svg_polyline(&s, px, py, m, col, 1.6);
        if (se->markers)
            for (size_t i = 0; i < m; i++)
                nl_svg_raw(&s, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3\" fill=\"%s\"/>\n", px[i], py[i], col);
        free(px);
        free(py);
        if (se->name) {
            double ly = T + 8 + 16 * (double)k;
            nl_svg_line(&s, W - R - 150, ly, W - R - 130, ly, col, 2.5);
            nl_svg_text(&s, W - R - 125, ly + 4, 11, "start", se->name);
        }
    }
#undef PX
#undef PY
    return nl_svg_save(&s, path);
}
