/* nanolm version: version and build configuration. */
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "nanolm/isa.h"
#include "cli_opt.h"
#include "report.h"

#define NANOLM_VERSION "0.1.0"

int nl_cmd_version(int argc, char **argv) {
    int json = 0;
    nl_opt opts[] = {NL_OPT_FLAG("json", &json, "print the result as JSON")};
    nl_optgroup groups[] = {{"options", opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {
        "version",
        "nanolm version [--json]",
        "The version, the OpenMP threads a run will use, the kernels OpenBLAS runs and the instruction "
        "set nanolm's own kernels use (the CPU's, under the cap NANOLM_ISA=auto|avx512|avx2|neon|scalar).",
        groups,
        1,
        0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    nl_report *r = nl_report_new("version");
    nl_report_str(r, "version", "nanolm", NANOLM_VERSION);
    nl_report_int(r, "threads", "threads", omp_get_max_threads(), NULL);
    nl_report_str(r, "blas_kernels", "blas", nl_blas_core());
    nl_report_str(r, "isa_detected", "instruction set (CPU)", nl_isa_name(nl_isa_detected()));
    nl_report_str(r, "isa", "instruction set (kernels, NANOLM_ISA)", nl_isa_name(nl_isa_active()));
    return nl_report_print(r, json);
}
