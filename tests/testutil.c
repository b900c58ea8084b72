#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char slots[8][4096];
static int slot_i;

static char *next_slot(void) { return slots[slot_i++ % 8]; }

const char *tu_data_path(const char *rel) {
    const char *roots[2] = {getenv("NANOLM_DATA"), getenv("NANOLM_DATA_EXTRA")};
    if (!roots[0]) roots[0] = "data";
    if (!roots[1]) roots[1] = "../shared/data";
    char *p = next_slot();
    for (int i = 0; i < 2; i++) {
        snprintf(p, 4096, "%s/%s", roots[i], rel);
        struct stat st;
        if (stat(p, &st) == 0) return p;
    }
    return NULL;
}

const char *tu_committed_data(const char *rel) {
    const char *root = getenv("NANOLM_DATA");
    char *p = next_slot();
    snprintf(p, 4096, "%s/%s", root ? root : "data", rel);
    struct stat st;
    if (stat(p, &st) != 0) fail_msg("%s is missing: it is committed under data/", p);
    return p;
}

const char *tu_src_path(const char *rel) {
    const char *root = getenv("NANOLM_SRC");
    char *p = next_slot();
    snprintf(p, 4096, "%s/%s", root ? root : ".", rel);
    return p;
}

/* Reads all of `p` into a malloc'd, NUL-terminated string; NULL when memory runs out (the
 * rest of the output is then drained so that the child never blocks on a full pipe). */
static char *read_all(FILE *p) {
    size_t cap = 1 << 16, len = 0, n;
    char *buf = malloc(cap);
    char sink[4096];
    while (buf && (n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += n;
        if (cap - len < 2) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    if (!buf)
        while (fread(sink, 1, sizeof sink, p) > 0) {}
    else
        buf[len] = '\0';
    return buf;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int tu_run_cli_ex(const tu_run_opts *o, const char *args, char **out, double *elapsed_s) {
    static const tu_run_opts plain = {0};
    if (!o) o = &plain;
    const char *bin = getenv("NANOLM_BIN");
    char timeout[64] = "", mpi[128] = "", cmd[16384];
    if (o->timeout_s > 0) snprintf(timeout, sizeof timeout, "timeout -k 10 %d ", o->timeout_s);
    if (o->np > 0) snprintf(mpi, sizeof mpi, "mpirun --allow-run-as-root --oversubscribe -np %d ", o->np);
    int n = snprintf(cmd, sizeof cmd, "%s%s%s%s %s%s", o->one_thread ? "OMP_NUM_THREADS=1 " : "", timeout, mpi,
                     bin ? bin : "build/nanolm", args, o->stdout_only ? "" : " 2>&1");
    if (out) *out = NULL;
    if (n < 0 || (size_t)n >= sizeof cmd) return -1;
    double t0 = now_s();
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char *buf = read_all(p);
    int st = pclose(p);
    if (elapsed_s) *elapsed_s = now_s() - t0;
    if (out)
        *out = buf;
    else
        free(buf);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int tu_run_cli(const char *args, char **out) { return tu_run_cli_ex(NULL, args, out, NULL); }

int tu_run_shell(const char *cmd, char **out) {
    if (out) *out = NULL;
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char *buf = read_all(p);
    int st = pclose(p);
    if (out)
        *out = buf;
    else
        free(buf);
    if (st == -1) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

char *tu_tmpdir(void) {
    char *t = malloc(64);
    snprintf(t, 64, "/tmp/nanolm-test-XXXXXX");
    if (!mkdtemp(t)) {
        free(t);
        return NULL;
    }
    return t;
}

void tu_rmdir(const char *dir) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

char *tu_read_file(const char *path, size_t *bytes) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b) b[n] = '\0';
    fclose(f);
    if (bytes) *bytes = (size_t)n;
    return b;
}

int tu_spawn_cli(const tu_run_opts *o, const char *const *argv, tu_proc *p) {
    static const tu_run_opts plain = {0};
    if (!o) o = &plain;
    const char *bin = getenv("NANOLM_BIN");
    const char *args[128];
    int k = 0;
    char np[16];
    if (o->np > 0) {
        snprintf(np, sizeof np, "%d", o->np);
        const char *mpi[] = {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", np};
        for (size_t i = 0; i < sizeof mpi / sizeof mpi[0]; i++) args[k++] = mpi[i];
    }
    args[k++] = bin ? bin : "build/nanolm";
    for (int i = 0; argv[i]; i++) {
        if (k >= 127) return -1;
        args[k++] = argv[i];
    }
    args[k] = NULL;
    int fds[2] = {-1, -1};
    if (!o->no_output && pipe(fds)) return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        if (!o->no_output) close(fds[0]), close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        int to = o->no_output ? open("/dev/null", O_WRONLY) : fds[1];
        if (to >= 0) {
            dup2(to, 1);
            if (!o->stdout_only) dup2(to, 2);
            close(to);
        }
        if (fds[0] >= 0) close(fds[0]);
        if (o->one_thread) setenv("OMP_NUM_THREADS", "1", 1);
        execvp(args[0], (char *const *)args);
        _exit(127);
    }
    p->pid = (int)pid;
    p->out = NULL;
    if (o->no_output) return 0;
    close(fds[1]);
    p->out = fdopen(fds[0], "r");
    if (!p->out) {
        close(fds[0]);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    return 0;
}

int tu_wait_for_output(tu_proc *p, const char *needle, int n) {
    char line[512];
    int seen = 0;
    while (p->out && seen < n && fgets(line, sizeof line, p->out))
        if (strstr(line, needle)) seen++;
    return seen;
}

int tu_proc_finish(tu_proc *p, char **rest) {
    char *buf = p->out ? read_all(p->out) : NULL;
    if (p->out) fclose(p->out);
    p->out = NULL;
    if (rest)
        *rest = buf;
    else
        free(buf);
    int status = 0;
    pid_t w;
    while ((w = waitpid((pid_t)p->pid, &status, 0)) < 0 && errno == EINTR) {}
    if (w != (pid_t)p->pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
}

int tu_children_of(int parent, int *out, int cap) {
    int n = 0;
    DIR *d = opendir("/proc");
    for (struct dirent *e; d && (e = readdir(d)) && n < cap;) {
        char path[300], buf[512];
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = 0;
        const char *rp = strrchr(buf, ')'); /* "pid (comm) state ppid ..." */
        char state;
        int ppid;
        if (rp && sscanf(rp + 1, " %c %d", &state, &ppid) == 2 && ppid == parent) out[n++] = atoi(e->d_name);
    }
    if (d) closedir(d);
    for (int i = 1; i < n; i++) /* increasing pids: the ranks in the order they started */
        for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
            int x = out[j];
            out[j] = out[j - 1];
            out[j - 1] = x;
        }
    return n;
}

int tu_count_tmp(const char *dir) {
    int n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));)
        if (strstr(e->d_name, ".tmp.")) n++;
    if (d) closedir(d);
    return n;
}

static void tu_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int tu_status(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0); }

int tu_server_start(tu_server *s, const char *dir, const char *name, const char *args, char **why) {
    char port_file[700], cmd[8192];
    memset(s, 0, sizeof *s);
    s->pid = -1;
    if (why) *why = NULL;
    snprintf(port_file, sizeof port_file, "%s/%s.port", dir, name);
    snprintf(s->log, sizeof s->log, "%s/%s.log", dir, name);
    snprintf(cmd, sizeof cmd, "exec '%s' serve %s --port 0 --port-file '%s' >/dev/null 2>'%s'", getenv("NANOLM_BIN"),
             args, port_file, s->log);
    s->pid = fork();
    if (s->pid < 0) return -1;
    if (s->pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 600; i++) { /* up to 60 s (a loaded machine) */
        char *p = tu_read_file(port_file, NULL);
        if (p) {
            s->port = atoi(p);
            free(p);
            if (s->port > 0) return 0;
        }
        int st;
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            s->pid = -1;
            char *l = tu_read_file(s->log, NULL);
            if (why &&
                asprintf(why, "%s exited (status %d) before listening: %s", name, tu_status(st), l ? l : "?") < 0)
                *why = NULL;
            free(l);
            return -1;
        }
        tu_sleep_ms(100);
    }
    tu_server_kill(s);
    if (why && asprintf(why, "%s did not write its port file in 60 s", name) < 0) *why = NULL;
    return -1;
}

int tu_server_stop(tu_server *s) {
    if (s->pid <= 0) return -1;
    kill(s->pid, SIGTERM);
    int st = -1;
    /* 240 s: a drain of requests in flight under NANOLM_ISA=scalar on a loaded 2-core machine
     * takes more than one */
    for (int i = 0; i < 2400; i++) {
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) break;
        tu_sleep_ms(100);
        if (i == 2399) {
            kill(s->pid, SIGKILL);
            waitpid(s->pid, &st, 0);
        }
    }
    s->pid = -1;
    return tu_status(st);
}

void tu_server_kill(tu_server *s) {
    if (s->pid <= 0) return;
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = -1;
}
