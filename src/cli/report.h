/*
 * One writer for every command's result: the command fills a report once (named values and
 * tables), and nl_report_print writes it either as the human table or as JSON. Nothing is
 * written twice by hand.
 *
 *     nl_report *r = nl_report_new("plan train");
 *     nl_report_str(r, "model", "model", "llama-7b");
 *     nl_report_num(r, "params", "parameters", 6.74e9, "%.3g", NULL);
 *     nl_report_num(r, "step_time_s", "step time", 1.25, "%.2f", "s");
 *     nl_report_table(r, "layers", "per layer", 3, (const nl_report_col[]){
 *         {"name", "layer", NULL}, {"bytes", "bytes", "%.0f"}, {"share", "share", "%.1f%%"}});
 *     nl_report_cell_str(r, "attn"); nl_report_cell_num(r, 1.5e6); nl_report_cell_num(r, 42.0);
 *     nl_report_row_end(r);
 *     return nl_report_print(r, json);   // prints and frees; returns NL_EXIT_OK or NL_EXIT_FAIL
 *
 * Text form: the named values as aligned "label  value unit" lines, then each table with a title
 * line and aligned columns. JSON form: one object; named values under their keys, each table as
 * an array of row objects under its key.
 *
 * Nested objects and lists:
 *
 *     nl_report_begin_object(r, "block1", "block 1 (values 1..4):");  // {"block1": {...}}
 *     nl_report_num(r, "scale", "scale", 0.0118, "%.4g", NULL);       // text: "  scale  0.0118"
 *     nl_report_nums(r, "codes", "q", codes, 4, "%.0f", NULL);        // [25, -42, 10, 127]; "25 -42 10 127"
 *     nl_report_end_object(r);
 *
 * In the text form an object prints its title line (when not NULL) and indents its named values and
 * notes by two spaces per level (tables are not indented); labels stay aligned across the report. Numbers in JSON are printed with the fewest digits that
 * parse back to the same double (17 at most); NaN and infinities print as null.
 */
#ifndef NANOLM_CLI_REPORT_H
#define NANOLM_CLI_REPORT_H

#include <stdio.h>

typedef struct nl_report nl_report;

typedef struct nl_report_col {
    const char *key;    /* JSON key of the column; NULL: a column of the text table only */
    const char *header; /* column heading in the table (NULL: the key; "": a column of the JSON only) */
    const char *fmt;    /* printf format of a number cell in the table ("%.2f"); NULL: "%.6g". Number
                         * columns are right-aligned, except with the '-' flag ("%-.3e"): left */
} nl_report_col;

/* A new empty report; NULL when out of memory (every other function accepts NULL and does nothing). */
nl_report *nl_report_new(const char *title);
void nl_report_free(nl_report *r);

/* Named values. `key` is the JSON key, `label` the text label (NULL: the key), `fmt` the printf
 * format of the text form (NULL: "%.6g"), `unit` printed after the text value (or NULL).
 * A value that only one form shows: label "" puts it in the JSON only; key NULL in the text only
 * (for a line that words several JSON values together: "256 below, 258 above"). */
void nl_report_num(nl_report *r, const char *key, const char *label, double v, const char *fmt, const char *unit);
void nl_report_int(nl_report *r, const char *key, const char *label, long long v, const char *unit);
void nl_report_str(nl_report *r, const char *key, const char *label, const char *s);
void nl_report_bool(nl_report *r, const char *key, const char *label, int v);
/* A list of numbers (JSON: an array of numbers that round-trip; text: the values formatted with `fmt`
 * (NULL: "%.6g") separated by spaces, then `unit`). v holds n values (n may be 0). */
void nl_report_nums(nl_report *r, const char *key, const char *label, const double *v, int n, const char *fmt,
                    const char *unit);
/* A list of strings (JSON: an array of strings, NULL entries as null; text: space-separated, NULL as "-"). */
void nl_report_strs(nl_report *r, const char *key, const char *label, const char *const *s, int n);

/* Opens a nested object under `key` (JSON: {"key": {...}}); what is added until the matching
 * nl_report_end_object goes inside it. `title` (or NULL) is a heading line in the text form.
 * Objects nest up to 8 deep; an object left open or an end without a begin makes the report fail
 * to print (nl_report_write returns -1). */
void nl_report_begin_object(nl_report *r, const char *key, const char *title);
void nl_report_end_object(nl_report *r);

/* Spaces between the label column and the values in the text form (default 2, at least 1). */
void nl_report_set_gap(nl_report *r, int spaces);

/* A free text line in the table form only (a note, a heading); not in the JSON. */
void nl_report_note(nl_report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Starts a table of ncols columns (copied). Cells are then given in column order, row by row.
 * key NULL: a table of the text form only; every header "": a table of the JSON only. */
void nl_report_table(nl_report *r, const char *key, const char *title, int ncols, const nl_report_col *cols);
void nl_report_cell_num(nl_report *r, double v);
void nl_report_cell_int(nl_report *r, long long v);
void nl_report_cell_str(nl_report *r, const char *s);
void nl_report_cell_bool(nl_report *r, int v); /* JSON true/false; text "yes"/"no" */
/* A cell holding a list of n numbers (JSON array; text: the values with the column's format). */
void nl_report_cell_nums(nl_report *r, const double *v, int n);
void nl_report_row_end(nl_report *r);

/* Writes the report to stdout, as JSON when json != 0, then frees it. Returns NL_EXIT_OK, or
 * NL_EXIT_FAIL when the report ran out of memory along the way (and says so on stderr). */
int nl_report_print(nl_report *r, int json);
/* The same to any stream; does not free. Returns 0 or -1 (out of memory). */
int nl_report_write(const nl_report *r, int json, FILE *f);

/* Formats a double so that strtod gives back the same value (shortest of %.15g..%.17g); NaN and
 * infinities as "null". buf must hold 32 bytes. Returns buf. */
char *nl_json_double(double v, char buf[32]);

#endif
