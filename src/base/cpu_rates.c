/* The rows per kernel call that `nanolm bench machine` measures (cpu_rates.h). */
#include "nanolm/cpu_rates.h"

const int64_t nl_cpu_m[NL_CPU_NM] = {1, 8, 32, 128, 256, 512};
