/* Names of the collective operations (see nanolm/coll.h). */
#include "nanolm/coll.h"

const char *nl_comm_op_name(nl_comm_op c) {
    static const char *names[NL_COMM_OP_COUNT] = {"broadcast",      "reduce",     "all-reduce", "all-gather",
                                                  "reduce-scatter", "all-to-all", "send-recv"};
    return (unsigned)c < NL_COMM_OP_COUNT ? names[c] : "?";
}
