/*
 * A tiny SVG writer for the plots nanolm draws itself: loss curves, pipeline timelines,
 * memory bars, error histograms. The document is built in memory and written atomically.
 */
#ifndef NANOLM_SVG_H
#define NANOLM_SVG_H

#include <stddef.h>
#include "nanolm/base.h"

typedef struct nl_svg {
    char *buf;
    size_t len, cap;
    double width, height;
    int failed;
} nl_svg;

void nl_svg_begin(nl_svg *s, double width, double height);
/* Appends raw SVG (printf-style). */
void nl_svg_raw(nl_svg *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void nl_svg_line(nl_svg *s, double x1, double y1, double x2, double y2, const char *color, double w);
void nl_svg_rect(nl_svg *s, double x, double y, double w, double h, const char *fill,
                 const char *title /* tooltip, may be NULL */);
/* anchor: "start", "middle" or "end". Text is XML-escaped. */
void nl_svg_text(nl_svg *s, double x, double y, double size, const char *anchor, const char *text);
void nl_svg_polyline(nl_svg *s, const double *x, const double *y, size_t n, const char *color, double w);
/* Writes the document to `path` atomically and frees it (also on failure). */
nl_status nl_svg_save(nl_svg *s, const char *path);
void nl_svg_free(nl_svg *s);

/* A line plot with axes, ticks, a legend and optional log scales. */
typedef struct nl_svg_series {
    const char *name;
    const double *x, *y;
    size_t n;
    const char *color; /* NULL = palette */
    int markers;       /* draw points as dots */
} nl_svg_series;

typedef struct nl_svg_plot_opts {
    const char *title, *xlabel, *ylabel;
    int logx, logy;
    double width, height; /* 0 = 720 x 440 */
} nl_svg_plot_opts;

nl_status nl_svg_plot(const char *path, const nl_svg_plot_opts *o, const nl_svg_series *series, size_t nseries);
/* The i-th colour of the default palette. */
const char *nl_svg_color(size_t i);

#endif
