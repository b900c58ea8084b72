/* nanolm version: version and build configuration. */
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

#define NANOLM_VERSION "0.1.0"

int nl_cmd_version(int argc, char **argv) {
    static const struct option opts[] = {{"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int json = 0, c;
    while ((c = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = 1; break;
        case 'h': printf("usage: nanolm version [--json]\n"); return NL_EXIT_OK;
        default: return nl_cli_bad_option("version", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("version: unexpected argument '%s'", argv[optind]);
    if (json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "version", NANOLM_VERSION);
        cJSON_AddNumberToObject(d, "threads", omp_get_max_threads());
        return nl_cli_print_json(d);
    }
    printf("nanolm %s (threads: %d)\n", NANOLM_VERSION, omp_get_max_threads());
    return NL_EXIT_OK;
}
