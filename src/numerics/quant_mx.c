/* OCP Microscaling (MX) block formats: placeholder until the formats module is merged. */
#include "nanolm/quant.h"

static const char *const NAMES[] = {"e4m3", "e5m2", "e3m2", "e2m3", "e2m1", "int8"};
static const int BITS[] = {8, 8, 6, 6, 4, 8};
static const int EMAX[] = {8, 15, 4, 2, 2, 0};
static const double MAXV[] = {448.0, 57344.0, 28.0, 7.5, 6.0, 127.0 / 64.0};

const char *nl_mx_elem_name(nl_mx_elem e) { return (unsigned)e <= NL_MX_INT8 ? NAMES[e] : "?"; }
int nl_mx_elem_bits(nl_mx_elem e) { return (unsigned)e <= NL_MX_INT8 ? BITS[e] : 0; }
int nl_mx_elem_emax(nl_mx_elem e) { return (unsigned)e <= NL_MX_INT8 ? EMAX[e] : 0; }
double nl_mx_elem_max(nl_mx_elem e) { return (unsigned)e <= NL_MX_INT8 ? MAXV[e] : 0; }
float nl_mx_elem_decode(nl_mx_elem e, uint32_t code) { (void)e; (void)code; return 0.0f; }

nl_status nl_quant_mx(const float *x, int64_t rows, int64_t cols, nl_mx_elem elem, nl_mx_ties ties, nl_qtensor *out) {
    (void)x; (void)rows; (void)cols; (void)elem; (void)ties; (void)out;
    return nl_fail(NL_ERR_UNSUPPORTED, "MX formats need the formats module (not merged yet)");
}
