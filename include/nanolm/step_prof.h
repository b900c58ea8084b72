/*
 * NANOLM_STEP_PROFILE=1: where a training step's time goes. The code that runs a step calls
 * nl_step_prof_mark(p, phase) after each piece of work; the time since the previous mark, on the
 * wall clock and on the process's CPU clock (all threads), goes to that phase. A phase's CPU time
 * over (wall time x threads) is how busy the threads were in it; the rest of the threads' time
 * went to waiting (for the other threads at the end of a parallel region, or for the CPU when
 * other processes share it).
 */
#ifndef NANOLM_STEP_PROF_H
#define NANOLM_STEP_PROF_H

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nl_prof_phase {
    NL_PROF_GEMM,   /* the linear layers (sgemm), forward and backward */
    NL_PROF_ATTN,   /* attention: scores, causal softmax, weighted values, and their backward */
    NL_PROF_NORM,   /* RMSNorm forward (with the residual add) and backward */
    NL_PROF_ROPE,   /* RoPE and its inverse */
    NL_PROF_SWIGLU, /* SwiGLU forward and backward */
    NL_PROF_LOSS,   /* cross-entropy: log-softmax of the logits, d logits */
    NL_PROF_EMBED,  /* embedding lookup and its gradient */
    NL_PROF_OPTIM,  /* zeroing the gradients, clipping, AdamW */
    NL_PROF_DATA,   /* drawing the batch */
    NL_PROF_OTHER,  /* the rest: checks, biases, mixture-of-experts routing */
    NL_PROF_COUNT
} nl_prof_phase;

typedef struct nl_step_prof {
    double wall[NL_PROF_COUNT], cpu[NL_PROF_COUNT]; /* seconds summed over the steps */
    double t_wall, t_cpu;                           /* the clocks at the last mark */
    int64_t steps;
    int threads;
} nl_step_prof;

const char *nl_prof_phase_name(nl_prof_phase ph);
/* 1 when the environment asks for the profile (NANOLM_STEP_PROFILE set, not empty or "0"). */
int nl_step_prof_wanted(void);
/* Zeroes p for `threads` threads. */
void nl_step_prof_init(nl_step_prof *p, int threads);
/* Reads the clocks: the next mark counts from here (call at the start of each step). */
void nl_step_prof_begin(nl_step_prof *p);
/* Adds the time since the last mark (or begin) to phase ph. p may be NULL (nothing happens). */
void nl_step_prof_mark(nl_step_prof *p, nl_prof_phase ph);
/* Prints the table: per phase ms/step on the wall clock, its share, CPU ms/step and how busy the
 * threads were; then the threads' waiting time per step. */
void nl_step_prof_print(const nl_step_prof *p, FILE *f, const char *title);

#ifdef __cplusplus
}
#endif
#endif
