/* The MPI commands in a build without MPI (cmake -DNANOLM_MPI=OFF, or no MPI library found):
 * each says what it needs instead of being missing. Built only in place of cmd_parallel.c,
 * cmd_moe.c and cmd_collectives.c. */
#include <stdio.h>

#include "cli.h"

int nl_cmd_collectives(int argc, char **argv);
int nl_cmd_parallel(int argc, char **argv);
int nl_cmd_parallel_train(int argc, char **argv);
int nl_cmd_moe(int argc, char **argv);

/* Prints why `what` cannot run in this build; returns NL_EXIT_FAIL. */
static int needs_mpi(const char *what) {
    fprintf(stderr,
            "nanolm: '%s' needs MPI, and this nanolm was built without it "
            "(install Open MPI, Debian: libopenmpi-dev openmpi-bin, and rebuild)\n",
            what);
    return NL_EXIT_FAIL;
}

int nl_cmd_collectives(int argc, char **argv) {
    (void)argc, (void)argv;
    return needs_mpi("collectives");
}

int nl_cmd_parallel(int argc, char **argv) {
    (void)argc, (void)argv;
    return needs_mpi("parallel");
}

int nl_cmd_parallel_train(int argc, char **argv) {
    (void)argc, (void)argv;
    return needs_mpi("train with a parallel layout (--dp, --tp, --pp, --zero)");
}

int nl_cmd_moe(int argc, char **argv) {
    (void)argc, (void)argv;
    return needs_mpi("moe");
}
