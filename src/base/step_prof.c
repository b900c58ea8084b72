/* The training step profile (see nanolm/step_prof.h). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nanolm/base.h"
#include "nanolm/step_prof.h"

static const char *const phase_names[NL_PROF_COUNT] = {"gemm (linears)", "attention", "rmsnorm",      "rope",
                                                       "swiglu",         "loss",      "embedding",    "optimizer",
                                                       "data",           "other",     "barrier waits"};

const char *nl_prof_phase_name(nl_prof_phase ph) { return ph >= 0 && ph < NL_PROF_COUNT ? phase_names[ph] : "?"; }

int nl_step_prof_wanted(void) {
    const char *s = getenv("NANOLM_STEP_PROFILE");
    return s && *s && strcmp(s, "0") != 0;
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void nl_step_prof_init(nl_step_prof *p, int threads) {
    memset(p, 0, sizeof *p);
    p->threads = threads > 0 ? threads : 1;
}

void nl_step_prof_begin(nl_step_prof *p) {
    p->t_wall = nl_time_s();
    p->t_cpu = cpu_now();
}

void nl_step_prof_mark(nl_step_prof *p, nl_prof_phase ph) {
    if (!p || ph < 0 || ph >= NL_PROF_COUNT) return;
    double w = nl_time_s(), c = cpu_now();
    p->wall[ph] += w - p->t_wall;
    p->cpu[ph] += c - p->t_cpu;
    p->t_wall = w;
    p->t_cpu = c;
}

void nl_step_prof_print(const nl_step_prof *p, FILE *f, const char *title) {
    double wall = 0, cpu = 0, n = p->steps > 0 ? (double)p->steps : 1.0;
    for (int i = 0; i < NL_PROF_COUNT; i++) {
        wall += p->wall[i];
        cpu += p->cpu[i];
    }
    fprintf(f, "%s: %lld steps, %d threads, %.2f ms/step wall, %.2f ms/step CPU (all threads)\n", title,
            (long long)p->steps, p->threads, 1e3 * wall / n, 1e3 * cpu / n);
    fprintf(f, "  %-16s %10s %7s %10s %8s\n", "phase", "ms/step", "share", "CPU ms", "busy");
    for (int i = 0; i < NL_PROF_COUNT; i++) {
        double busy = p->wall[i] > 0 ? p->cpu[i] / (p->wall[i] * p->threads) : 0;
        fprintf(f, "  %-16s %10.3f %6.1f%% %10.3f %7.0f%%\n", phase_names[i], 1e3 * p->wall[i] / n,
                wall > 0 ? 100.0 * p->wall[i] / wall : 0.0, 1e3 * p->cpu[i] / n, 100.0 * busy);
    }
    double idle = wall * p->threads - cpu;
    fprintf(f, "  threads waiting: %.2f ms/step of %d x %.2f ms (%.1f%% of the threads' time)\n", 1e3 * idle / n,
            p->threads, 1e3 * wall / n, wall > 0 ? 100.0 * idle / (wall * p->threads) : 0.0);
}
