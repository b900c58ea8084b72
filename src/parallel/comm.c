/*
 * Collectives over MPI: our ring / chain / pairwise algorithms on point-to-point messages, and
 * the native MPI calls, with per-communicator byte counters. See include/nanolm/comm.h.
 *
 * Ring reduce-scatter on p ranks (rank r sends to r+1, receives from r-1), p-1 steps:
 *   step s: send the partial sum of chunk (r-s-1) mod p, receive chunk (r-s-2) mod p and add
 *   this rank's own data to it. After the last step (s = p-2) rank r holds chunk r reduced.
 *   Rank r sends every chunk but its own: (n - chunk_r) elements, (p-1)/p of the array.
 * Ring all-gather, p-1 steps: step s sends chunk (r-s) mod p, receives chunk (r-s-1) mod p.
 * All-reduce = reduce-scatter + all-gather: 2(p-1)/p of the array sent per rank.
 * Broadcast and reduce: a chain root -> root+1 -> ... (reduce flows the other way), cut into
 * segments so that all links work at once (pipelined).
 * All-to-all: p-1 steps of pairwise exchange, step s sends to r+s and receives from r-s.
 */
#include "nanolm/comm.h"
#include "nanolm/formats.h"

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Open MPI keeps allocations past MPI_Finalize (and frees others from plugins it has unloaded),
 * which LeakSanitizer reports as leaks of the program. In sanitizer builds, allocations made
 * inside MPI's set-up and tear-down are not counted; nanolm's own allocations still are. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define MPI_QUIET_BEGIN() __lsan_disable()
#define MPI_QUIET_END()   __lsan_enable()
/* OpenBLAS allocates per-thread buffers on the threads MPI starts and never frees them. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libopenblas\n"; }
#else
#define MPI_QUIET_BEGIN() ((void)0)
#define MPI_QUIET_END()   ((void)0)
#endif

struct nl_comm {
    MPI_Comm mpi;
    int rank, size;
    int *world_of; /* (size) world rank of each rank of this communicator (for the watchdog) */
    int is_world;
    unsigned seq; /* collective calls so far: all ranks agree, so it makes unique tags */
    char name[32];
    nl_comm_stats stats;
    void *scratch[2];
    size_t scratch_bytes[2];
};

struct nl_comm_request {
    nl_comm *c;
    char *buf;
    size_t n;
    nl_comm_dtype dt;
    nl_comm_impl impl;
    int p2p; /* a point-to-point send (r[0]) */
    int tag;
    int step;   /* ours: 0 .. 2(p-1); == 2(p-1) when done */
    int posted; /* ours: messages of `step` are in flight */
    int cr;     /* ours: chunk being received in `step` */
    char *tmp;  /* ours: receive buffer, one chunk */
    MPI_Request r[2];
    double t0;
    uint64_t sent, recvd;
};

static nl_comm *g_world;
static int g_we_initialized;
static nl_comm_stats g_total;
static MPI_Op g_bf16_sum = MPI_OP_NULL;

/* Tags: collectives use 0..16383 (sequence number), user point-to-point 16384 + tag. */
#define NL_TAG_P2P_BASE 16384
#define NL_TAG_P2P_MAX  16383
/* Pipeline segment of chain broadcast / reduce, in bytes. */
#define NL_CHAIN_SEGMENT_BYTES (256u * 1024u)

/* ---- names, sizes, chunks ------------------------------------------------------------------ */

size_t nl_comm_dtype_bytes(nl_comm_dtype dt) { return dt == NL_COMM_BF16 ? 2 : 4; }
const char *nl_comm_dtype_name(nl_comm_dtype dt) { return dt == NL_COMM_BF16 ? "bf16" : "f32"; }
const char *nl_comm_impl_name(nl_comm_impl impl) { return impl == NL_COMM_NATIVE ? "native" : "ours"; }

size_t nl_comm_chunk_offset(size_t n, int p, int i) {
    size_t q = n / (size_t)p, rem = n % (size_t)p, ii = (size_t)i;
    return ii * q + (ii < rem ? ii : rem);
}
size_t nl_comm_chunk_count(size_t n, int p, int i) { return n / (size_t)p + ((size_t)i < n % (size_t)p ? 1 : 0); }

static int mod(int a, int p) { return ((a % p) + p) % p; }

/* ---- bf16: rounded by formats.h (nearest even, canonical NaN) ------------------------------ */

/* dst = a + b (n elements); dst may equal a. bf16 adds in fp32 and rounds once. */
static void add_into(void *dst, const void *a, const void *b, size_t n, nl_comm_dtype dt) {
    if (dt == NL_COMM_F32) {
        float *d = dst;
        const float *x = a, *y = b;
        for (size_t i = 0; i < n; i++) d[i] = x[i] + y[i];
    } else {
        uint16_t *d = dst;
        const uint16_t *x = a, *y = b;
        for (size_t i = 0; i < n; i++) d[i] = nl_bf16_from_f32(nl_f32_from_bf16(x[i]) + nl_f32_from_bf16(y[i]));
    }
}

static void bf16_sum_op(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    add_into(inout, inout, in, (size_t)*len, NL_COMM_BF16);
}

/* ---- errors, counters, scratch --------------------------------------------------------------- */

static nl_status mpi_fail(const nl_comm *c, const char *what, int rc) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", rc);
    return nl_fail(NL_ERR_COMM, "%s on communicator '%s' (rank %d of %d, world rank %d) failed: %s", what,
                   c ? c->name : "?", c ? c->rank : -1, c ? c->size : 0, nl_comm_world_rank(), msg);
}

static MPI_Datatype mpi_type(nl_comm_dtype dt) { return dt == NL_COMM_BF16 ? MPI_UINT16_T : MPI_FLOAT; }
static MPI_Op mpi_sum(nl_comm_dtype dt) { return dt == NL_COMM_BF16 ? g_bf16_sum : MPI_SUM; }

static void count(nl_comm *c, nl_comm_op k, uint64_t sent, uint64_t recvd, double dt_s, int call) {
    nl_comm_counter *a = &c->stats.coll[k], *b = &g_total.coll[k];
    a->sent_bytes += sent;
    a->recv_bytes += recvd;
    a->time_s += dt_s;
    b->sent_bytes += sent;
    b->recv_bytes += recvd;
    b->time_s += dt_s;
    if (call) {
        a->calls++;
        b->calls++;
    }
}

static void *scratch(nl_comm *c, int which, size_t bytes) {
    if (c->scratch_bytes[which] >= bytes) return c->scratch[which];
    nl_free(c->scratch[which]);
    c->scratch[which] = nl_malloc(bytes ? bytes : 64, "collective scratch buffer");
    c->scratch_bytes[which] = c->scratch[which] ? bytes : 0;
    return c->scratch[which];
}

static int next_tag(nl_comm *c) { return (int)(c->seq++ & 0x3fffu); }

static nl_status check_count(const nl_comm *c, const char *what, size_t n, nl_comm_dtype dt) {
    if (n * nl_comm_dtype_bytes(dt) > (size_t)INT_MAX)
        return nl_fail(NL_ERR_INVALID, "%s on communicator '%s': %zu elements exceed one MPI message", what, c->name,
                       n);
    return NL_OK;
}

static nl_status check_root(const nl_comm *c, const char *what, int root) {
    if (root < 0 || root >= c->size)
        return nl_fail(NL_ERR_INVALID, "%s on communicator '%s': root %d is not a rank (size %d)", what, c->name, root,
                       c->size);
    return NL_OK;
}

/* ---- the collective watchdog ------------------------------------------------------------------
 * A rank that stops (SIGSTOP, a debugger, a hung device) leaves the others blocked in MPI
 * forever. Every blocking wait records when it began and what it is, and counts itself in a
 * heartbeat (the number of blocking waits this rank has entered). A thread checks every 100 ms.
 * When a wait outlasts the timeout, the thread asks every other rank, over a communicator of its
 * own (a duplicate of the world), for its heartbeat; each rank's watchdog thread answers within
 * 100 ms, also while its main thread is blocked. A rank that does not answer within the grace
 * time (the timeout, clamped to [2, 10] s) is the one that did not arrive: stopped, hung in the
 * kernel or unreachable (a stopped process runs none of its threads). The thread prints "nanolm:
 * rank R of P: <what> waited S s for rank Q, which did not arrive ..." and ends the process
 * (exit 75), upon which mpirun ends the job. When every rank answers, the report names the ranks
 * that are not waiting (busy or hung in computation), or says that all wait (a deadlock), with
 * each rank's heartbeat. Like PyTorch's process-group timeout, the verdict comes from what the
 * ranks say about themselves, not from the ring position of the first rank to time out.
 * Without MPI_THREAD_MULTIPLE (MPI started by someone else at a lower level), the report names
 * the peer this rank waited for (the ring neighbour or chain peer), or no rank for the MPI
 * library's own collectives. */
static _Atomic double g_wd_timeout_s = 600.0;
static _Atomic long long g_wd_since_us; /* 0: not waiting */
static _Atomic long long g_wd_entered;  /* the heartbeat: blocking waits entered so far */
static _Atomic int g_wd_peer = -1;      /* world rank waited for, -1 unknown */
static const char *_Atomic g_wd_what;
static _Atomic int g_wd_run;
static pthread_t g_wd_thread;
static int g_wd_started;
static MPI_Comm g_wd_comm = MPI_COMM_NULL; /* the watchdog's own messages (MPI_THREAD_MULTIPLE) */

enum { WD_TAG_ASK = 1, WD_TAG_ANSWER = 2 };

static long long now_us(void) { return (long long)(nl_time_s() * 1e6); }

static void wd_begin(const nl_comm *c, int peer, const char *what) {
    g_wd_peer = peer >= 0 && c->world_of ? c->world_of[peer] : -1;
    g_wd_what = what;
    g_wd_entered++;
    g_wd_since_us = now_us();
}
static void wd_end(void) { g_wd_since_us = 0; }

/* Answers every pending question of another rank's watchdog: {heartbeat, microseconds waiting
 * in the current wait (-1: not waiting)}. 16 bytes go eagerly: the send does not block. */
static void wd_answer(void) {
    for (;;) {
        int flag = 0, ask = 0;
        MPI_Status s;
        if (MPI_Iprobe(MPI_ANY_SOURCE, WD_TAG_ASK, g_wd_comm, &flag, &s) != MPI_SUCCESS || !flag) return;
        MPI_Recv(&ask, 1, MPI_INT, s.MPI_SOURCE, WD_TAG_ASK, g_wd_comm, MPI_STATUS_IGNORE);
        long long since = g_wd_since_us, a[2] = {g_wd_entered, since ? now_us() - since : -1};
        MPI_Send(a, 2, MPI_LONG_LONG, s.MPI_SOURCE, WD_TAG_ANSWER, g_wd_comm);
    }
}

/* Appends " r" (comma-separated) for each rank q with pick[q] to `out` (`cap` bytes); returns the count. */
static int wd_list(char *out, size_t cap, const int *pick, int p) {
    int k = 0;
    out[0] = 0;
    for (int q = 0; q < p; q++)
        if (pick[q]) {
            size_t len = strlen(out);
            snprintf(out + len, cap - len, "%s%d", k++ ? ", " : "", q);
        }
    return k;
}

/* Asks every other rank for its heartbeat for up to `grace_s` and writes into `who` (`cap`
 * bytes) which rank the wait is for: the ranks that did not answer, else those not waiting,
 * else the heartbeats of all (a deadlock). */
static void wd_diagnose(char *who, size_t cap, double grace_s) {
    int p = g_world->size, me = g_world->rank, ask = 1, n_ans = 0;
    int *answered = calloc((size_t)p, sizeof(int)), *busy = calloc((size_t)p, sizeof(int));
    int *missing = calloc((size_t)p, sizeof(int));
    long long *beat = calloc((size_t)p, sizeof(long long));
    MPI_Request *req = calloc((size_t)p, sizeof(MPI_Request));
    if (!answered || !busy || !missing || !beat || !req) {
        snprintf(who, cap, "a rank (out of memory while asking the others)");
        return; /* the process ends next: nothing to free */
    }
    for (int q = 0; q < p; q++)
        if (q != me) MPI_Isend(&ask, 1, MPI_INT, q, WD_TAG_ASK, g_wd_comm, &req[q]);
    long long until = now_us() + (long long)(grace_s * 1e6);
    while (n_ans < p - 1 && now_us() < until) {
        wd_answer(); /* the others may be asking at the same time */
        int flag = 0;
        MPI_Status s;
        if (MPI_Iprobe(MPI_ANY_SOURCE, WD_TAG_ANSWER, g_wd_comm, &flag, &s) == MPI_SUCCESS && flag) {
            long long a[2];
            MPI_Recv(a, 2, MPI_LONG_LONG, s.MPI_SOURCE, WD_TAG_ANSWER, g_wd_comm, MPI_STATUS_IGNORE);
            if (!answered[s.MPI_SOURCE]) n_ans++;
            answered[s.MPI_SOURCE] = 1;
            beat[s.MPI_SOURCE] = a[0];
            busy[s.MPI_SOURCE] = a[1] < 0;
            continue;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    answered[me] = 1;
    beat[me] = g_wd_entered;
    for (int q = 0; q < p; q++) missing[q] = !answered[q];
    char list[256];
    int k = wd_list(list, sizeof list, missing, p);
    if (k) {
        snprintf(who, cap,
                 "rank%s %s, which did not arrive (stopped, hung or unreachable: no answer to the watchdog "
                 "within %.0f s)",
                 k > 1 ? "s" : "", list, grace_s);
    } else if ((k = wd_list(list, sizeof list, busy, p)) > 0) {
        snprintf(who, cap, "rank%s %s, which answered but did not enter the collective (busy or hung in computation)",
                 k > 1 ? "s" : "", list);
    } else {
        size_t len = (size_t)snprintf(who, cap,
                                      "every rank, all waiting (a deadlock: the ranks called different "
                                      "collectives); waits entered per rank:");
        for (int q = 0; q < p && len < cap; q++) len += (size_t)snprintf(who + len, cap - len, " %lld", beat[q]);
    }
}

static void *wd_main(void *arg) {
    (void)arg;
    while (g_wd_run) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        if (g_wd_comm != MPI_COMM_NULL) wd_answer();
        long long since = g_wd_since_us;
        double limit = g_wd_timeout_s;
        if (!since || limit <= 0 || (double)(now_us() - since) / 1e6 <= limit) continue;
        int peer = g_wd_peer;
        const char *what = g_wd_what;
        double waited_s = (double)(now_us() - since) / 1e6;
        char who[512];
        if (g_wd_comm != MPI_COMM_NULL)
            wd_diagnose(who, sizeof who, limit < 2 ? 2 : limit > 10 ? 10 : limit);
        else if (peer < 0)
            snprintf(who, sizeof who, "a rank (the MPI library's collective does not say which)");
        else
            snprintf(who, sizeof who, "rank %d (the peer this rank receives from; it may itself be waiting)", peer);
        fprintf(stderr, "nanolm: rank %d of %d: %s waited %.1f s for %s; ending the job (timeout %g s)\n",
                g_world ? g_world->rank : -1, g_world ? g_world->size : -1, what ? what : "a collective", waited_s, who,
                limit);
        fflush(stderr);
        _exit(75); /* EX_TEMPFAIL: not 124, which timeout(1) uses for a hang */
    }
    return NULL;
}

void nl_comm_set_timeout(double seconds) { g_wd_timeout_s = seconds; }

/* One exchange of the ring: send `scount` elements to `dest`, receive `rcount` from `src`. */
static nl_status sendrecv(nl_comm *c, const char *what, const void *sbuf, size_t scount, int dest, void *rbuf,
                          size_t rcount, int src, int tag, nl_comm_dtype dt, uint64_t *sent, uint64_t *recvd) {
    size_t es = nl_comm_dtype_bytes(dt);
    wd_begin(c, src, what);
    int rc = MPI_Sendrecv(sbuf, (int)(scount * es), MPI_BYTE, dest, tag, rbuf, (int)(rcount * es), MPI_BYTE, src, tag,
                          c->mpi, MPI_STATUS_IGNORE);
    wd_end();
    if (rc != MPI_SUCCESS) return mpi_fail(c, what, rc);
    *sent += scount * es;
    *recvd += rcount * es;
    return NL_OK;
}

/* ---- lifecycle ------------------------------------------------------------------------------- */

/* ---- a rank that leaves early says so ---------------------------------------------------------
 * mpirun ends the whole job when one rank exits or dies; these hooks add a line that names the
 * rank. A normal exit() before nl_comm_finalize and a crash signal (SEGV, BUS, FPE, ILL, ABRT)
 * print "nanolm: rank R of P ..." on stderr; the crash handler then hands the signal on to the
 * handler that was there before (Open MPI's or a sanitizer's). _exit() and SIGKILL run no code:
 * then mpirun's own report names the process ("process rank R", or "[[job,1],R]"). */
static char g_crash_prefix[96];
static size_t g_crash_prefix_len;
static struct sigaction g_old_action[32];
static const int g_crash_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

static void on_crash(int sig) {
    char msg[160];
    size_t k = g_crash_prefix_len;
    memcpy(msg, g_crash_prefix, k);
    const char *mid = "crashed with signal ";
    memcpy(msg + k, mid, strlen(mid));
    k += strlen(mid);
    if (sig >= 10) msg[k++] = (char)('0' + sig / 10);
    msg[k++] = (char)('0' + sig % 10);
    const char *tail = "; mpirun ends the job\n";
    memcpy(msg + k, tail, strlen(tail));
    k += strlen(tail);
    if (write(STDERR_FILENO, msg, k) < 0) { /* nothing more to do in a signal handler */
    }
    sigaction(sig, &g_old_action[sig], NULL);
    raise(sig);
}

static void on_exit_early(int status, void *arg) {
    (void)arg;
    int fin = 1;
    if (!g_world) return;
    MPI_Finalized(&fin);
    if (fin) return;
    fprintf(stderr, "nanolm: rank %d of %d exited (status %d) before the job finished; mpirun ends the job\n",
            g_world->rank, g_world->size, status);
}

static void install_fault_hooks(int rank, int size) {
    snprintf(g_crash_prefix, sizeof g_crash_prefix, "nanolm: rank %d of %d (pid %ld) ", rank, size, (long)getpid());
    g_crash_prefix_len = strlen(g_crash_prefix);
    if (size > 1) on_exit(on_exit_early, NULL);
    for (size_t i = 0; i < sizeof g_crash_signals / sizeof g_crash_signals[0]; i++) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_crash;
        sigemptyset(&sa.sa_mask);
        sigaction(g_crash_signals[i], &sa, &g_old_action[g_crash_signals[i]]);
    }
}

static nl_comm *comm_wrap(MPI_Comm m, const char *name) {
    nl_comm *c = nl_calloc(1, sizeof *c, "communicator");
    if (!c) return NULL;
    c->mpi = m;
    MPI_Comm_rank(m, &c->rank);
    MPI_Comm_size(m, &c->size);
    snprintf(c->name, sizeof c->name, "%s", name ? name : "?");
    c->world_of = nl_calloc((size_t)c->size, sizeof(int), "communicator ranks");
    int *mine = nl_calloc((size_t)c->size, sizeof(int), "communicator ranks");
    MPI_Group g, gw;
    if (c->world_of && mine && MPI_Comm_group(m, &g) == MPI_SUCCESS) {
        if (MPI_Comm_group(MPI_COMM_WORLD, &gw) == MPI_SUCCESS) {
            for (int i = 0; i < c->size; i++) mine[i] = i;
            if (MPI_Group_translate_ranks(g, c->size, mine, gw, c->world_of) != MPI_SUCCESS) {
                nl_free(c->world_of);
                c->world_of = NULL;
            }
            MPI_Group_free(&gw);
        }
        MPI_Group_free(&g);
    }
    nl_free(mine);
    return c;
}

nl_status nl_comm_init(int *argc, char ***argv) {
    if (g_world) return NL_OK;
    int inited = 0, rc;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        MPI_QUIET_BEGIN();
        rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided); /* the watchdog thread asks too */
        MPI_QUIET_END();
        if (rc != MPI_SUCCESS) return nl_fail(NL_ERR_COMM, "MPI_Init failed (error %d)", rc);
        g_we_initialized = 1;
    }
    MPI_QUIET_BEGIN();
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (g_bf16_sum == MPI_OP_NULL) MPI_Op_create(bf16_sum_op, 1, &g_bf16_sum);
    MPI_QUIET_END();
    g_world = comm_wrap(MPI_COMM_WORLD, "world");
    if (!g_world) return NL_ERR_NOMEM;
    g_world->is_world = 1;
    static int hooks;
    if (!hooks++) install_fault_hooks(g_world->rank, g_world->size);
    if (g_world->size > 1 && !g_wd_started) { /* the watchdog (only where a peer can be missing) */
        int level = 0;
        MPI_Query_thread(&level);
        if (level >= MPI_THREAD_MULTIPLE && g_wd_comm == MPI_COMM_NULL) {
            MPI_QUIET_BEGIN();
            if (MPI_Comm_dup(MPI_COMM_WORLD, &g_wd_comm) != MPI_SUCCESS) g_wd_comm = MPI_COMM_NULL;
            MPI_QUIET_END();
        }
        g_wd_run = 1;
        g_wd_started = pthread_create(&g_wd_thread, NULL, wd_main, NULL) == 0;
    }
    return NL_OK;
}

void nl_comm_finalize(void) {
    if (!g_world) return;
    if (g_wd_started) {
        g_wd_run = 0;
        pthread_join(g_wd_thread, NULL);
        g_wd_started = 0;
    }
    int fin0 = 0;
    MPI_Finalized(&fin0);
    if (g_wd_comm != MPI_COMM_NULL && !fin0) {
        MPI_QUIET_BEGIN();
        MPI_Comm_free(&g_wd_comm);
        MPI_QUIET_END();
    }
    g_wd_comm = MPI_COMM_NULL;
    nl_free(g_world->world_of);
    nl_free(g_world->scratch[0]);
    nl_free(g_world->scratch[1]);
    nl_free(g_world);
    g_world = NULL;
    MPI_QUIET_BEGIN();
    if (g_bf16_sum != MPI_OP_NULL) MPI_Op_free(&g_bf16_sum);
    int fin = 0;
    MPI_Finalized(&fin);
    if (g_we_initialized && !fin) MPI_Finalize();
    MPI_QUIET_END();
    g_we_initialized = 0;
}

nl_comm *nl_comm_world(void) { return g_world; }

nl_status nl_comm_split(nl_comm *parent, int color, int key, const char *name, nl_comm **out) {
    *out = NULL;
    if (!parent)
        return nl_fail(NL_ERR_INVALID, "nl_comm_split '%s': no parent communicator (call nl_comm_init)",
                       name ? name : "?");
    MPI_Comm m;
    MPI_QUIET_BEGIN();
    int rc = MPI_Comm_split(parent->mpi, color, key, &m);
    MPI_QUIET_END();
    if (rc != MPI_SUCCESS) return mpi_fail(parent, "MPI_Comm_split", rc);
    *out = comm_wrap(m, name);
    if (!*out) {
        MPI_Comm_free(&m);
        return NL_ERR_NOMEM;
    }
    return NL_OK;
}

void nl_comm_free(nl_comm *c) {
    if (!c || c->is_world) return;
    nl_free(c->world_of);
    nl_free(c->scratch[0]);
    nl_free(c->scratch[1]);
    int fin = 0;
    MPI_Finalized(&fin);
    MPI_QUIET_BEGIN();
    if (!fin) MPI_Comm_free(&c->mpi);
    MPI_QUIET_END();
    nl_free(c);
}

int nl_comm_rank(const nl_comm *c) { return c ? c->rank : 0; }
int nl_comm_size(const nl_comm *c) { return c ? c->size : 1; }
int nl_comm_world_rank(void) { return g_world ? g_world->rank : 0; }

nl_status nl_layout_init(nl_comm *world, int dp, int tp, int pp, nl_layout *out) {
    memset(out, 0, sizeof *out);
    if (!world) return nl_fail(NL_ERR_INVALID, "layout: no world communicator (call nl_comm_init)");
    if (dp < 1 || tp < 1 || pp < 1 || (long)dp * tp * pp != world->size)
        return nl_fail(NL_ERR_INVALID, "layout: dp %d x tp %d x pp %d must equal the number of ranks %d", dp, tp, pp,
                       world->size);
    int r = world->rank;
    out->dp = dp;
    out->tp = tp;
    out->pp = pp;
    out->tp_rank = r % tp;
    out->dp_rank = (r / tp) % dp;
    out->pp_rank = r / (tp * dp);
    nl_status st = nl_comm_split(world, out->pp_rank * tp + out->tp_rank, out->dp_rank, "dp", &out->dp_comm);
    if (!st) st = nl_comm_split(world, out->pp_rank * dp + out->dp_rank, out->tp_rank, "tp", &out->tp_comm);
    if (!st) st = nl_comm_split(world, out->dp_rank * tp + out->tp_rank, out->pp_rank, "pp", &out->pp_comm);
    if (st) nl_layout_free(out);
    return st;
}

void nl_layout_free(nl_layout *l) {
    nl_comm_free(l->dp_comm);
    nl_comm_free(l->tp_comm);
    nl_comm_free(l->pp_comm);
    l->dp_comm = l->tp_comm = l->pp_comm = NULL;
}

/* ---- the algorithms on point-to-point ---------------------------------------------------------- */

/* Ring reduce-scatter of send (n) into out (chunk rank). If `inplace`, send is the caller's
 * mutable buffer and partial sums are accumulated in it (out must be send + offset(rank));
 * otherwise send is left untouched and partial sums travel through a scratch chunk. */
static nl_status ring_reduce_scatter(nl_comm *c, const char *what, char *send, char *out, size_t n, nl_comm_dtype dt,
                                     int inplace, int tag, uint64_t *sent, uint64_t *recvd) {
    int p = c->size, r = c->rank;
    size_t es = nl_comm_dtype_bytes(dt);
    if (p == 1) {
        if (out != send) memmove(out, send, n * es);
        return NL_OK;
    }
    size_t maxc = nl_comm_chunk_count(n, p, 0);
    char *tmp = scratch(c, 0, maxc * es);
    char *acc = inplace ? NULL : scratch(c, 1, maxc * es);
    if (!tmp || (!inplace && !acc)) return NL_ERR_NOMEM;
    int right = mod(r + 1, p), left = mod(r - 1, p);
    for (int s = 0; s < p - 1; s++) {
        int cs = mod(r - s - 1, p), cr = mod(r - s - 2, p);
        size_t ns = nl_comm_chunk_count(n, p, cs), nr = nl_comm_chunk_count(n, p, cr);
        const char *sp = (s == 0 || inplace) ? send + nl_comm_chunk_offset(n, p, cs) * es : acc;
        NL_TRY(sendrecv(c, what, sp, ns, right, tmp, nr, left, tag, dt, sent, recvd));
        char *own = send + nl_comm_chunk_offset(n, p, cr) * es;
        char *dst = (s == p - 2) ? out : (inplace ? own : acc);
        add_into(dst, own, tmp, nr, dt);
    }
    return NL_OK;
}

/* Ring all-gather in place: buf (n) holds this rank's chunk at its offset. */
static nl_status ring_all_gather(nl_comm *c, const char *what, char *buf, size_t n, nl_comm_dtype dt, int tag,
                                 uint64_t *sent, uint64_t *recvd) {
    int p = c->size, r = c->rank;
    size_t es = nl_comm_dtype_bytes(dt);
    int right = mod(r + 1, p), left = mod(r - 1, p);
    for (int s = 0; s < p - 1; s++) {
        int cs = mod(r - s, p), cr = mod(r - s - 1, p);
        NL_TRY(sendrecv(c, what, buf + nl_comm_chunk_offset(n, p, cs) * es, nl_comm_chunk_count(n, p, cs), right,
                        buf + nl_comm_chunk_offset(n, p, cr) * es, nl_comm_chunk_count(n, p, cr), left, tag, dt, sent,
                        recvd));
    }
    return NL_OK;
}

static nl_status wait_all(nl_comm *c, const char *what, int cnt, MPI_Request *reqs) {
    if (cnt == 0) return NL_OK;
    wd_begin(c, -1, what);
    int rc = MPI_Waitall(cnt, reqs, MPI_STATUSES_IGNORE);
    wd_end();
    return rc == MPI_SUCCESS ? NL_OK : mpi_fail(c, what, rc);
}

/* Chain broadcast root -> root+1 -> ... -> root-1, in segments. */
static nl_status chain_broadcast(nl_comm *c, char *buf, size_t n, nl_comm_dtype dt, int root, int tag, uint64_t *sent,
                                 uint64_t *recvd) {
    int p = c->size, pos = mod(c->rank - root, p);
    if (p == 1 || n == 0) return NL_OK;
    size_t es = nl_comm_dtype_bytes(dt), seg = NL_CHAIN_SEGMENT_BYTES / es;
    size_t nseg = (n + seg - 1) / seg;
    int prev = mod(c->rank - 1, p), next = mod(c->rank + 1, p);
    MPI_Request *reqs = nl_malloc(nseg * sizeof *reqs, "broadcast requests");
    if (!reqs) return NL_ERR_NOMEM;
    int nreq = 0, rc = MPI_SUCCESS;
    for (size_t k = 0; k < nseg && rc == MPI_SUCCESS; k++) {
        size_t off = k * seg, len = n - off < seg ? n - off : seg;
        if (pos > 0) {
            wd_begin(c, prev, "broadcast");
            rc = MPI_Recv(buf + off * es, (int)(len * es), MPI_BYTE, prev, tag, c->mpi, MPI_STATUS_IGNORE);
            wd_end();
            if (rc == MPI_SUCCESS) *recvd += len * es;
        }
        if (rc == MPI_SUCCESS && pos < p - 1) {
            rc = MPI_Isend(buf + off * es, (int)(len * es), MPI_BYTE, next, tag, c->mpi, &reqs[nreq++]);
            if (rc == MPI_SUCCESS) *sent += len * es;
        }
    }
    nl_status st = rc == MPI_SUCCESS ? wait_all(c, "broadcast", nreq, reqs) : mpi_fail(c, "broadcast", rc);
    nl_free(reqs);
    return st;
}

/* Chain reduce towards root: the rank before the root in ring order starts; each rank adds its
 * own data to what arrives from the rank after it and passes the sum on, segment by segment. */
static nl_status chain_reduce(nl_comm *c, const char *send, char *recv, size_t n, nl_comm_dtype dt, int root, int tag,
                              uint64_t *sent, uint64_t *recvd) {
    int p = c->size, pos = mod(c->rank - root, p);
    size_t es = nl_comm_dtype_bytes(dt);
    if (p == 1) {
        if (recv != send) memmove(recv, send, n * es);
        return NL_OK;
    }
    if (n == 0) return NL_OK;
    size_t seg = NL_CHAIN_SEGMENT_BYTES / es, nseg = (n + seg - 1) / seg;
    int prev = mod(c->rank - 1, p), next = mod(c->rank + 1, p);
    int tail = pos == p - 1;
    /* The partial sums leave through `acc` (a full-size scratch unless this is the root, which
     * accumulates into recv, or the tail, which sends its own data). */
    char *acc = pos == 0 ? recv : (tail ? (char *)send : scratch(c, 1, n * es));
    char *tmp = tail ? NULL : scratch(c, 0, seg * es);
    MPI_Request *reqs = nl_malloc(nseg * sizeof *reqs, "reduce requests");
    if (!acc || (!tail && !tmp) || !reqs) {
        nl_free(reqs);
        return NL_ERR_NOMEM;
    }
    int nreq = 0, rc = MPI_SUCCESS;
    for (size_t k = 0; k < nseg && rc == MPI_SUCCESS; k++) {
        size_t off = k * seg, len = n - off < seg ? n - off : seg;
        if (!tail) {
            wd_begin(c, next, "reduce");
            rc = MPI_Recv(tmp, (int)(len * es), MPI_BYTE, next, tag, c->mpi, MPI_STATUS_IGNORE);
            wd_end();
            if (rc != MPI_SUCCESS) break;
            *recvd += len * es;
            add_into(acc + off * es, send + off * es, tmp, len, dt);
        }
        if (pos > 0) {
            rc = MPI_Isend(acc + off * es, (int)(len * es), MPI_BYTE, prev, tag, c->mpi, &reqs[nreq++]);
            if (rc == MPI_SUCCESS) *sent += len * es;
        }
    }
    nl_status st = rc == MPI_SUCCESS ? wait_all(c, "reduce", nreq, reqs) : mpi_fail(c, "reduce", rc);
    nl_free(reqs);
    return st;
}

/* Pairwise exchange: step s sends block (r+s) to rank r+s and receives block (r-s) from r-s. */
static nl_status pairwise_all_to_all(nl_comm *c, const char *send, const size_t *scounts, const size_t *soffs,
                                     char *recv, const size_t *rcounts, const size_t *roffs, nl_comm_dtype dt, int tag,
                                     uint64_t *sent, uint64_t *recvd) {
    int p = c->size, r = c->rank;
    size_t es = nl_comm_dtype_bytes(dt);
    if (rcounts[r] != scounts[r])
        return nl_fail(NL_ERR_INVALID, "all-to-all on '%s': rank %d sends %zu elements to itself but expects %zu",
                       c->name, r, scounts[r], rcounts[r]);
    memmove(recv + roffs[r] * es, send + soffs[r] * es, scounts[r] * es);
    for (int s = 1; s < p; s++) {
        int to = mod(r + s, p), from = mod(r - s, p);
        NL_TRY(sendrecv(c, "all-to-all", send + soffs[to] * es, scounts[to], to, recv + roffs[from] * es, rcounts[from],
                        from, tag, dt, sent, recvd));
    }
    return NL_OK;
}

/* ---- the bytes our algorithms move, recorded for the native calls --------------------------------- */

static void nominal_bytes(nl_comm_op k, const nl_comm *c, size_t n, int root, nl_comm_dtype dt, uint64_t *sent,
                          uint64_t *recvd) {
    int p = c->size, r = c->rank, pos = mod(r - root, p);
    size_t es = nl_comm_dtype_bytes(dt);
    uint64_t s = 0, v = 0;
    if (p > 1) switch (k) {
        case NL_COMM_OP_BROADCAST:
            s = pos < p - 1 ? n : 0;
            v = pos > 0 ? n : 0;
            break;
        case NL_COMM_OP_REDUCE:
            s = pos > 0 ? n : 0;
            v = pos < p - 1 ? n : 0;
            break;
        case NL_COMM_OP_REDUCE_SCATTER:
            s = n - nl_comm_chunk_count(n, p, r);
            v = n - nl_comm_chunk_count(n, p, mod(r - 1, p));
            break;
        case NL_COMM_OP_ALL_GATHER:
            s = n - nl_comm_chunk_count(n, p, mod(r + 1, p));
            v = n - nl_comm_chunk_count(n, p, r);
            break;
        case NL_COMM_OP_ALL_REDUCE:
            s = 2 * n - nl_comm_chunk_count(n, p, r) - nl_comm_chunk_count(n, p, mod(r + 1, p));
            v = 2 * n - nl_comm_chunk_count(n, p, mod(r - 1, p)) - nl_comm_chunk_count(n, p, r);
            break;
        default: break;
        }
    *sent = s * es;
    *recvd = v * es;
}

/* ---- public collectives ------------------------------------------------------------------------------ */

#define NL_NATIVE(call, what)                                                                                          \
    do {                                                                                                               \
        wd_begin(c, -1, what);                                                                                         \
        int rc_ = (call);                                                                                              \
        wd_end();                                                                                                      \
        if (rc_ != MPI_SUCCESS) return mpi_fail(c, what, rc_);                                                         \
    } while (0)

static nl_status need_comm(const nl_comm *c, const char *what) {
    if (!c) return nl_fail(NL_ERR_INVALID, "%s: no communicator (call nl_comm_init)", what);
    return NL_OK;
}

nl_status nl_comm_broadcast(nl_comm *c, void *buf, size_t n, nl_comm_dtype dt, int root, nl_comm_impl impl) {
    NL_TRY(need_comm(c, "broadcast"));
    NL_TRY(check_root(c, "broadcast", root));
    NL_TRY(check_count(c, "broadcast", n, dt));
    double t0 = nl_time_s();
    uint64_t s = 0, v = 0;
    int tag = next_tag(c);
    if (impl == NL_COMM_OURS) {
        NL_TRY(chain_broadcast(c, buf, n, dt, root, tag, &s, &v));
    } else {
        NL_NATIVE(MPI_Bcast(buf, (int)n, mpi_type(dt), root, c->mpi), "MPI_Bcast");
        nominal_bytes(NL_COMM_OP_BROADCAST, c, n, root, dt, &s, &v);
    }
    count(c, NL_COMM_OP_BROADCAST, s, v, nl_time_s() - t0, 1);
    return NL_OK;
}

nl_status nl_comm_reduce(nl_comm *c, const void *send, void *recv, size_t n, nl_comm_dtype dt, int root,
                         nl_comm_impl impl) {
    NL_TRY(need_comm(c, "reduce"));
    NL_TRY(check_root(c, "reduce", root));
    NL_TRY(check_count(c, "reduce", n, dt));
    double t0 = nl_time_s();
    uint64_t s = 0, v = 0;
    int tag = next_tag(c);
    if (impl == NL_COMM_OURS) {
        NL_TRY(chain_reduce(c, send, recv, n, dt, root, tag, &s, &v));
    } else {
        const void *sb = (c->rank == root && send == recv) ? MPI_IN_PLACE : send;
        NL_NATIVE(MPI_Reduce(sb, recv, (int)n, mpi_type(dt), mpi_sum(dt), root, c->mpi), "MPI_Reduce");
        nominal_bytes(NL_COMM_OP_REDUCE, c, n, root, dt, &s, &v);
    }
    count(c, NL_COMM_OP_REDUCE, s, v, nl_time_s() - t0, 1);
    return NL_OK;
}

nl_status nl_comm_all_reduce(nl_comm *c, void *buf, size_t n, nl_comm_dtype dt, nl_comm_impl impl) {
    NL_TRY(need_comm(c, "all-reduce"));
    NL_TRY(check_count(c, "all-reduce", n, dt));
    double t0 = nl_time_s();
    uint64_t s = 0, v = 0;
    int tag = next_tag(c);
    if (impl == NL_COMM_OURS) {
        char *b = buf;
        size_t es = nl_comm_dtype_bytes(dt);
        char *own = b + nl_comm_chunk_offset(n, c->size, c->rank) * es;
        NL_TRY(ring_reduce_scatter(c, "all-reduce", b, own, n, dt, 1, tag, &s, &v));
        NL_TRY(ring_all_gather(c, "all-reduce", b, n, dt, tag, &s, &v));
    } else {
        NL_NATIVE(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, mpi_type(dt), mpi_sum(dt), c->mpi), "MPI_Allreduce");
        nominal_bytes(NL_COMM_OP_ALL_REDUCE, c, n, 0, dt, &s, &v);
    }
    count(c, NL_COMM_OP_ALL_REDUCE, s, v, nl_time_s() - t0, 1);
    return NL_OK;
}

static int *int_counts(int p, size_t n, int with_offsets, int **offs) {
    int *cnt = nl_malloc((size_t)p * 2 * sizeof(int), "chunk counts");
    if (!cnt) return NULL;
    for (int i = 0; i < p; i++) {
        cnt[i] = (int)nl_comm_chunk_count(n, p, i);
        cnt[p + i] = (int)nl_comm_chunk_offset(n, p, i);
    }
    if (with_offsets) *offs = cnt + p;
    return cnt;
}

nl_status nl_comm_reduce_scatter(nl_comm *c, const void *send, void *recv, size_t n, nl_comm_dtype dt,
                                 nl_comm_impl impl) {
    NL_TRY(need_comm(c, "reduce-scatter"));
    NL_TRY(check_count(c, "reduce-scatter", n, dt));
    double t0 = nl_time_s();
    uint64_t s = 0, v = 0;
    int tag = next_tag(c);
    size_t es = nl_comm_dtype_bytes(dt);
    if (impl == NL_COMM_OURS) {
        NL_TRY(ring_reduce_scatter(c, "reduce-scatter", (char *)send, recv, n, dt, 0, tag, &s, &v));
    } else {
        int *cnt = int_counts(c->size, n, 0, NULL);
        if (!cnt) return NL_ERR_NOMEM;
        const char *own = (const char *)send + nl_comm_chunk_offset(n, c->size, c->rank) * es;
        int rc;
        if (own == recv) { /* MPI_IN_PLACE for reduce-scatter wants the whole array in recv */
            char *tmp = scratch(c, 0, (size_t)cnt[c->rank] * es);
            if (!tmp) {
                nl_free(cnt);
                return NL_ERR_NOMEM;
            }
            rc = MPI_Reduce_scatter(send, tmp, cnt, mpi_type(dt), mpi_sum(dt), c->mpi);
            if (rc == MPI_SUCCESS) memcpy(recv, tmp, (size_t)cnt[c->rank] * es);
        } else {
            rc = MPI_Reduce_scatter(send, recv, cnt, mpi_type(dt), mpi_sum(dt), c->mpi);
        }
        nl_free(cnt);
        if (rc != MPI_SUCCESS) return mpi_fail(c, "MPI_Reduce_scatter", rc);
        nominal_bytes(NL_COMM_OP_REDUCE_SCATTER, c, n, 0, dt, &s, &v);
    }
    count(c, NL_COMM_OP_REDUCE_SCATTER, s, v, nl_time_s() - t0, 1);
    return NL_OK;
}

nl_status nl_comm_all_gather(nl_comm *c, const void *send, void *recv, size_t n, nl_comm_dtype dt, nl_comm_impl impl) {
    NL_TRY(need_comm(c, "all-gather"));
    NL_TRY(check_count(c, "all-gather", n, dt));
    double t0 = nl_time_s();
    uint64_t s = 0, v = 0;
    int tag = next_tag(c);
    size_t es = nl_comm_dtype_bytes(dt);
    char *own = (char *)recv + nl_comm_chunk_offset(n, c->size, c->rank) * es;
    size_t nown = nl_comm_chunk_count(n, c->size, c->rank);
    if (impl == NL_COMM_OURS) {
        if (own != send) memmove(own, send, nown * es);
        NL_TRY(ring_all_gather(c, "all-gather", recv, n, dt, tag, &s, &v));
    } else {
        int *offs = NULL, *cnt = int_counts(c->size, n, 1, &offs);
        if (!cnt) return NL_ERR_NOMEM;
        const void *sb = own == send ? MPI_IN_PLACE : send;
        int rc = MPI_Allgatherv(sb, (int)nown, mpi_type(dt), recv, cnt, offs, mpi_type(dt), c->mpi);
        nl_free(cnt);
        if (rc != MPI_SUCCESS) return mpi_fail(c, "MPI_Allgatherv", rc);
        nominal_bytes(NL_COMM_OP_ALL_GATHER, c, n, 0, dt, &s, &v);
    }
    count(c, NL_COMM_OP_ALL_GATHER, s, v, nl_time_s() - t0, 1);
    return NL_OK;
}

nl_status nl_comm_all_to_allv(nl_comm *c, const void *send, const size_t *send_counts, const size_t *send_offsets,
                              void *recv, const size_t *recv_counts, const size_t *recv_offsets, nl_comm_dtype dt,
                              nl_comm_impl impl) {
    NL_TRY(need_comm(c, "all-to-all"));
    int p = c->size;
    for (int i = 0; i < p; i++) {
        NL_TRY(check_count(c, "all-to-all", send_counts[i], dt));
        NL_TRY(check_count(c, "all-to-all", recv_counts[i], dt));
    }
    double t0 = nl_time_s();
    uint64_t s = 0, v = 0;
    int tag = next_tag(c);
    if (impl == NL_COMM_OURS) {
        NL_TRY(
            pairwise_all_to_all(c, send, send_counts, send_offsets, recv, recv_counts, recv_offsets, dt, tag, &s, &v));
    } else {
        int *a = nl_malloc((size_t)p * 4 * sizeof(int), "all-to-all counts");
        if (!a) return NL_ERR_NOMEM;
        for (int i = 0; i < p; i++) {
            if (send_offsets[i] > INT_MAX || recv_offsets[i] > INT_MAX) {
                nl_free(a);
                return nl_fail(NL_ERR_INVALID, "all-to-all on '%s': offset for rank %d exceeds an MPI int", c->name, i);
            }
            a[i] = (int)send_counts[i];
            a[p + i] = (int)send_offsets[i];
            a[2 * p + i] = (int)recv_counts[i];
            a[3 * p + i] = (int)recv_offsets[i];
            if (i != c->rank) {
                s += send_counts[i] * nl_comm_dtype_bytes(dt);
                v += recv_counts[i] * nl_comm_dtype_bytes(dt);
            }
        }
        int rc = MPI_Alltoallv(send, a, a + p, mpi_type(dt), recv, a + 2 * p, a + 3 * p, mpi_type(dt), c->mpi);
        nl_free(a);
        if (rc != MPI_SUCCESS) return mpi_fail(c, "MPI_Alltoallv", rc);
    }
    count(c, NL_COMM_OP_ALL_TO_ALL, s, v, nl_time_s() - t0, 1);
    return NL_OK;
}

nl_status nl_comm_all_to_all(nl_comm *c, const void *send, void *recv, size_t cnt, nl_comm_dtype dt,
                             nl_comm_impl impl) {
    NL_TRY(need_comm(c, "all-to-all"));
    int p = c->size;
    size_t *a = nl_malloc((size_t)p * 2 * sizeof(size_t), "all-to-all counts");
    if (!a) return NL_ERR_NOMEM;
    for (int i = 0; i < p; i++) {
        a[i] = cnt;
        a[p + i] = (size_t)i * cnt;
    }
    nl_status st = nl_comm_all_to_allv(c, send, a, a + p, recv, a, a + p, dt, impl);
    nl_free(a);
    return st;
}

nl_status nl_comm_send(nl_comm *c, const void *buf, size_t n, nl_comm_dtype dt, int dest, int tag) {
    NL_TRY(need_comm(c, "send"));
    NL_TRY(check_count(c, "send", n, dt));
    if (dest < 0 || dest >= c->size || tag < 0 || tag > NL_TAG_P2P_MAX)
        return nl_fail(NL_ERR_INVALID, "send on '%s': bad destination %d or tag %d", c->name, dest, tag);
    double t0 = nl_time_s();
    size_t bytes = n * nl_comm_dtype_bytes(dt);
    NL_NATIVE(MPI_Send(buf, (int)bytes, MPI_BYTE, dest, NL_TAG_P2P_BASE + tag, c->mpi), "MPI_Send");
    count(c, NL_COMM_OP_SEND_RECV, bytes, 0, nl_time_s() - t0, 1);
    return NL_OK;
}

nl_status nl_comm_recv(nl_comm *c, void *buf, size_t n, nl_comm_dtype dt, int src, int tag) {
    NL_TRY(need_comm(c, "recv"));
    NL_TRY(check_count(c, "recv", n, dt));
    if (src < 0 || src >= c->size || tag < 0 || tag > NL_TAG_P2P_MAX)
        return nl_fail(NL_ERR_INVALID, "recv on '%s': bad source %d or tag %d", c->name, src, tag);
    double t0 = nl_time_s();
    size_t bytes = n * nl_comm_dtype_bytes(dt);
    NL_NATIVE(MPI_Recv(buf, (int)bytes, MPI_BYTE, src, NL_TAG_P2P_BASE + tag, c->mpi, MPI_STATUS_IGNORE), "MPI_Recv");
    count(c, NL_COMM_OP_SEND_RECV, 0, bytes, nl_time_s() - t0, 1);
    return NL_OK;
}

nl_status nl_comm_barrier(nl_comm *c) {
    NL_TRY(need_comm(c, "barrier"));
    NL_NATIVE(MPI_Barrier(c->mpi), "MPI_Barrier");
    return NL_OK;
}

nl_status nl_comm_max_double(nl_comm *c, double *v) {
    NL_TRY(need_comm(c, "max"));
    NL_NATIVE(MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_DOUBLE, MPI_MAX, c->mpi), "MPI_Allreduce(max)");
    return NL_OK;
}

nl_status nl_comm_max_int(nl_comm *c, int *v) {
    NL_TRY(need_comm(c, "max"));
    NL_NATIVE(MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_INT, MPI_MAX, c->mpi), "MPI_Allreduce(max)");
    return NL_OK;
}

nl_status nl_comm_sum_double(nl_comm *c, double *v) {
    NL_TRY(need_comm(c, "sum"));
    NL_NATIVE(MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_DOUBLE, MPI_SUM, c->mpi), "MPI_Allreduce(sum)");
    return NL_OK;
}

/* ---- non-blocking all-reduce ----------------------------------------------------------------------- */

/* Posts the messages of the request's current ring step. */
static nl_status req_post(nl_comm_request *q) {
    nl_comm *c = q->c;
    int p = c->size, r = c->rank, s = q->step;
    size_t es = nl_comm_dtype_bytes(q->dt), n = q->n;
    int cs, cr;
    if (s < p - 1) { /* reduce-scatter phase, in place */
        cs = mod(r - s - 1, p);
        cr = mod(r - s - 2, p);
    } else { /* all-gather phase */
        int g = s - (p - 1);
        cs = mod(r - g, p);
        cr = mod(r - g - 1, p);
    }
    size_t ns = nl_comm_chunk_count(n, p, cs), nr = nl_comm_chunk_count(n, p, cr);
    char *rbuf = s < p - 1 ? q->tmp : q->buf + nl_comm_chunk_offset(n, p, cr) * es;
    int rc = MPI_Irecv(rbuf, (int)(nr * es), MPI_BYTE, mod(r - 1, p), q->tag, c->mpi, &q->r[0]);
    if (rc == MPI_SUCCESS)
        rc = MPI_Isend(q->buf + nl_comm_chunk_offset(n, p, cs) * es, (int)(ns * es), MPI_BYTE, mod(r + 1, p), q->tag,
                       c->mpi, &q->r[1]);
    if (rc != MPI_SUCCESS) return mpi_fail(c, "non-blocking all-reduce", rc);
    q->sent += ns * es;
    q->recvd += nr * es;
    q->cr = cr;
    q->posted = 1;
    return NL_OK;
}

/* Finishes the current step once its messages are complete (add for reduce-scatter steps). */
static void req_finish_step(nl_comm_request *q) {
    int p = q->c->size;
    if (q->step < p - 1) {
        size_t es = nl_comm_dtype_bytes(q->dt);
        char *own = q->buf + nl_comm_chunk_offset(q->n, p, q->cr) * es;
        add_into(own, own, q->tmp, nl_comm_chunk_count(q->n, p, q->cr), q->dt);
    }
    q->posted = 0;
    q->step++;
}

nl_status nl_comm_all_reduce_start(nl_comm *c, void *buf, size_t n, nl_comm_dtype dt, nl_comm_impl impl,
                                   nl_comm_request **req) {
    *req = NULL;
    NL_TRY(need_comm(c, "all-reduce"));
    NL_TRY(check_count(c, "all-reduce", n, dt));
    nl_comm_request *q = nl_calloc(1, sizeof *q, "all-reduce request");
    if (!q) return NL_ERR_NOMEM;
    q->c = c;
    q->buf = buf;
    q->n = n;
    q->dt = dt;
    q->impl = impl;
    q->tag = next_tag(c);
    q->t0 = nl_time_s();
    q->r[0] = q->r[1] = MPI_REQUEST_NULL;
    if (impl == NL_COMM_NATIVE) {
        int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, mpi_type(dt), mpi_sum(dt), c->mpi, &q->r[0]);
        if (rc != MPI_SUCCESS) {
            nl_free(q);
            return mpi_fail(c, "MPI_Iallreduce", rc);
        }
        nominal_bytes(NL_COMM_OP_ALL_REDUCE, c, n, 0, dt, &q->sent, &q->recvd);
    } else if (c->size > 1) {
        q->tmp = nl_malloc(nl_comm_chunk_count(n, c->size, 0) * nl_comm_dtype_bytes(dt) + 64, "all-reduce buffer");
        if (!q->tmp) {
            nl_free(q);
            return NL_ERR_NOMEM;
        }
        nl_status st = req_post(q);
        if (st) {
            nl_free(q->tmp);
            nl_free(q);
            return st;
        }
    }
    count(c, NL_COMM_OP_ALL_REDUCE, 0, 0, nl_time_s() - q->t0, 1);
    *req = q;
    return NL_OK;
}

nl_status nl_comm_send_start(nl_comm *c, const void *buf, size_t n, nl_comm_dtype dt, int dest, int tag,
                             nl_comm_request **req) {
    *req = NULL;
    NL_TRY(need_comm(c, "send"));
    NL_TRY(check_count(c, "send", n, dt));
    if (dest < 0 || dest >= c->size || tag < 0 || tag > NL_TAG_P2P_MAX)
        return nl_fail(NL_ERR_INVALID, "send on '%s': bad destination %d or tag %d", c->name, dest, tag);
    nl_comm_request *q = nl_calloc(1, sizeof *q, "send request");
    if (!q) return NL_ERR_NOMEM;
    q->c = c;
    q->p2p = 1;
    q->impl = NL_COMM_NATIVE; /* completes through MPI_Test / MPI_Wait on r[0] */
    q->t0 = nl_time_s();
    size_t bytes = n * nl_comm_dtype_bytes(dt);
    int rc = MPI_Isend(buf, (int)bytes, MPI_BYTE, dest, NL_TAG_P2P_BASE + tag, c->mpi, &q->r[0]);
    if (rc != MPI_SUCCESS) {
        nl_free(q);
        return mpi_fail(c, "MPI_Isend", rc);
    }
    q->sent = bytes;
    count(c, NL_COMM_OP_SEND_RECV, 0, 0, nl_time_s() - q->t0, 1);
    *req = q;
    return NL_OK;
}

static int req_done(const nl_comm_request *q) {
    if (q->impl == NL_COMM_NATIVE) return q->r[0] == MPI_REQUEST_NULL;
    return q->c->size == 1 || q->step >= 2 * (q->c->size - 1);
}

nl_status nl_comm_progress(nl_comm_request *q, int *done) {
    double t0 = nl_time_s();
    *done = 0;
    if (q->impl == NL_COMM_NATIVE) {
        if (q->r[0] != MPI_REQUEST_NULL) {
            int flag = 0, rc = MPI_Test(&q->r[0], &flag, MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS) return mpi_fail(q->c, "MPI_Test", rc);
        }
    } else {
        while (!req_done(q)) {
            int flag = 0, rc = MPI_Testall(2, q->r, &flag, MPI_STATUSES_IGNORE);
            if (rc != MPI_SUCCESS) return mpi_fail(q->c, "MPI_Testall", rc);
            if (!flag) break;
            req_finish_step(q);
            if (!req_done(q)) NL_TRY(req_post(q));
        }
    }
    *done = req_done(q);
    count(q->c, q->p2p ? NL_COMM_OP_SEND_RECV : NL_COMM_OP_ALL_REDUCE, 0, 0, nl_time_s() - t0, 0);
    return NL_OK;
}

nl_status nl_comm_wait(nl_comm_request *q) {
    if (!q) return NL_OK;
    double t0 = nl_time_s();
    nl_status st = NL_OK;
    if (q->impl == NL_COMM_NATIVE) {
        wd_begin(q->c, -1, q->p2p ? "send" : "all-reduce");
        int rc = MPI_Wait(&q->r[0], MPI_STATUS_IGNORE);
        wd_end();
        if (rc != MPI_SUCCESS) st = mpi_fail(q->c, "MPI_Wait", rc);
    } else {
        while (!st && !req_done(q)) {
            wd_begin(q->c, (q->c->rank + q->c->size - 1) % q->c->size, "all-reduce");
            int rc = MPI_Waitall(2, q->r, MPI_STATUSES_IGNORE);
            wd_end();
            if (rc != MPI_SUCCESS) {
                st = mpi_fail(q->c, "MPI_Waitall", rc);
                break;
            }
            req_finish_step(q);
            if (!req_done(q)) st = req_post(q);
        }
    }
    count(q->c, q->p2p ? NL_COMM_OP_SEND_RECV : NL_COMM_OP_ALL_REDUCE, st ? 0 : q->sent, st ? 0 : q->recvd,
          nl_time_s() - t0, 0);
    nl_free(q->tmp);
    nl_free(q);
    return st;
}

/* ---- counters ------------------------------------------------------------------------------------- */

void nl_comm_get_stats(const nl_comm *c, nl_comm_stats *out) {
    if (c)
        *out = c->stats;
    else
        memset(out, 0, sizeof *out);
}
void nl_comm_get_total_stats(nl_comm_stats *out) { *out = g_total; }
void nl_comm_reset_stats(nl_comm *c) {
    if (c) memset(&c->stats, 0, sizeof c->stats);
}
void nl_comm_reset_total_stats(void) { memset(&g_total, 0, sizeof g_total); }
uint64_t nl_comm_stats_sent_bytes(const nl_comm_stats *s) {
    uint64_t t = 0;
    for (int k = 0; k < NL_COMM_OP_COUNT; k++) t += s->coll[k].sent_bytes;
    return t;
}
uint64_t nl_comm_stats_recv_bytes(const nl_comm_stats *s) {
    uint64_t t = 0;
    for (int k = 0; k < NL_COMM_OP_COUNT; k++) t += s->coll[k].recv_bytes;
    return t;
}
