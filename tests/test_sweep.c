/* nanolm scaling sweep: a tiny IsoFLOP grid killed mid-run (fork + SIGKILL) and resumed gives
 * the same rows as an uninterrupted sweep without redoing finished runs; approach 2 and 3
 * recover the exponents of a known L(N, D) from noisy synthetic IsoFLOP data. */
#include "testutil.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nanolm/isoflop.h"
#include "nanolm/scaling.h"
#include "nanolm/sweep.h"

#define SHAKES "tinyshakespeare/input.txt"

static int csv_rows(const char *path) {
    char *t = tu_read_file(path, NULL);
    if (!t) return 0;
    int n = -1;
    for (char *p = t; *p; p++) n += *p == '\n';
    free(t);
    return n < 0 ? 0 : n;
}

/* column `col` of every data row, joined */
static void csv_col(const char *path, int col, char *out, size_t cap) {
    char *t = tu_read_file(path, NULL);
    assert_non_null(t);
    out[0] = 0;
    char *save = NULL;
    int first = 1;
    for (char *line = strtok_r(t, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (first) {
            first = 0;
            continue;
        }
        const char *p = line;
        for (int c = 0; c < col; c++) p = strchr(p, ',') + 1;
        strncat(out, p, strcspn(p, ","));
        strncat(out, ";", cap - strlen(out) - 1);
    }
    free(t);
}

static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static void test_kill_and_resume(void **state) {
    (void)state;
    TU_REQUIRE_DATA(data, SHAKES);
    char *dir = tu_tmpdir(), ref[600], cut[600], csv_ref[700], csv_cut[700], ck[800], args[2048];
    snprintf(ref, sizeof ref, "%s/ref", dir);
    snprintf(cut, sizeof cut, "%s/cut", dir);
    snprintf(csv_ref, sizeof csv_ref, "%s/sweep.csv", ref);
    snprintf(csv_cut, sizeof csv_cut, "%s/sweep.csv", cut);
    /* uninterrupted reference */
    snprintf(args, sizeof args, "scaling sweep --grid tiny --data %s --out %s --bootstrap 0", data, ref);
    char *out = NULL;
    assert_int_equal(tu_run_cli(args, &out), 0);
    free(out);
    assert_int_equal(csv_rows(csv_ref), 6);
    /* the same sweep, killed while run c1_n0 (116 steps, a checkpoint every 29) is under way */
    const char *bin = getenv("NANOLM_BIN");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr)) _exit(127);
        execl(bin ? bin : "build/nanolm", "nanolm", "scaling", "sweep", "--grid", "tiny", "--data", data, "--out", cut,
              "--bootstrap", "0", (char *)NULL);
        _exit(127);
    }
    snprintf(ck, sizeof ck, "%s/runs/c1_n0.safetensors", cut);
    int killed = 0;
    for (int i = 0; i < 120000 && !killed; i++) { /* up to 20 min of polling */
        if (exists(ck) && csv_rows(csv_cut) == 3) {
            kill(pid, SIGKILL);
            killed = 1;
        } else {
            int st;
            if (waitpid(pid, &st, WNOHANG) == pid) break;
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    assert_true(killed);
    int st;
    waitpid(pid, &st, 0);
    assert_true(WIFSIGNALED(st));
    int before = csv_rows(csv_cut);
    print_message("killed with %d runs finished and c1_n0's checkpoint on disk\n", before);
    assert_true(before == 3 || before == 4);
    char *rows_before = tu_read_file(csv_cut, NULL);
    assert_non_null(rows_before);
    /* resume */
    snprintf(args, sizeof args, "scaling sweep --grid tiny --data %s --out %s --bootstrap 0", data, cut);
    assert_int_equal(tu_run_cli(args, &out), 0);
    assert_non_null(strstr(out, "c0_n0 done already"));
    assert_non_null(strstr(out, "c0_n2 done already"));
    if (before == 3) assert_non_null(strstr(out, "c1_n0 resuming"));
    assert_null(strstr(out, "c0_n1 training"));
    free(out);
    char *rows_after = tu_read_file(csv_cut, NULL);
    /* finished rows are kept byte for byte (wall time included: not redone) */
    assert_int_equal(strncmp(rows_before, rows_after, strlen(rows_before)), 0);
    assert_int_equal(csv_rows(csv_cut), 6);
    /* and the resumed sweep's losses are the uninterrupted sweep's, run for run */
    char la[512], lb[512];
    csv_col(csv_ref, 8, la, sizeof la);
    csv_col(csv_cut, 8, lb, sizeof lb);
    print_message("losses %s\n", la);
    assert_string_equal(la, lb);
    /* a third call trains nothing */
    assert_int_equal(tu_run_cli(args, &out), 0);
    assert_null(strstr(out, "training:"));
    assert_null(strstr(out, "resuming"));
    free(out);
    /* two worker processes share the runs: every run once, the same losses in the same order */
    char par[600], csv_par[700];
    snprintf(par, sizeof par, "%s/par", dir);
    snprintf(csv_par, sizeof csv_par, "%s/sweep.csv", par);
    snprintf(args, sizeof args, "scaling sweep --grid tiny --jobs 2 --data %s --out %s --bootstrap 0", data, par);
    assert_int_equal(tu_run_cli(args, &out), 0);
    free(out);
    assert_int_equal(csv_rows(csv_par), 6);
    char lp[512], ra[512], rp[512];
    csv_col(csv_par, 8, lp, sizeof lp);
    assert_string_equal(la, lp);
    csv_col(csv_ref, 0, ra, sizeof ra);
    csv_col(csv_par, 0, rp, sizeof rp);
    assert_string_equal(ra, rp);
    free(rows_before);
    free(rows_after);
    tu_rmdir(dir);
}

/* synthetic IsoFLOP data from a known law, 1% multiplicative noise */
static void test_recover_exponents(void **state) {
    (void)state;
    const nl_chinchilla law = {1.7, 400.0, 410.0, 0.34, 0.28};
    const double a_true = law.beta / (law.alpha + law.beta);
    static const double budgets[] = {1e17, 1e18, 1e19, 1e20};
    double N[64], C[64], L[64];
    nl_scaling_obs obs[64];
    int n = 0;
    nl_rng rng;
    nl_rng_seed(&rng, 2024);
    for (int b = 0; b < 4; b++) {
        double nopt, dopt;
        nl_scaling_optimal_law(&law, budgets[b], &nopt, &dopt);
        for (int k = -3; k <= 3; k++) {
            N[n] = nopt * pow(2.0, k * 0.75 + 0.2); /* not centred on the optimum */
            C[n] = budgets[b];
            double D = C[n] / (6 * N[n]);
            L[n] = nl_scaling_loss(&law, N[n], D) * (1 + 0.01 * nl_rng_normal(&rng));
            obs[n] = (nl_scaling_obs){N[n], D, L[n]};
            n++;
        }
    }
    nl_isoflop_fit f2;
    assert_int_equal(nl_isoflop_fit_run(N, C, L, n, 200, 5, &f2), NL_OK);
    print_message("approach 2: a %.4f [%.4f, %.4f] (true %.4f), %d resamples\n", f2.a, f2.a_lo, f2.a_hi, a_true,
                  f2.boot_used);
    assert_int_equal(f2.n_budgets, 4);
    assert_true(f2.boot_used >= 150);
    assert_true(f2.a_lo <= a_true && a_true <= f2.a_hi);
    assert_true(f2.a_hi - f2.a_lo < 0.3); /* an informative interval */
    nl_scaling_fit_opts fo = {1e-3, 40, 5};
    nl_scaling_fit_result f3;
    assert_int_equal(nl_scaling_fit(obs, (size_t)n, &fo, &f3), NL_OK);
    print_message("approach 3: alpha %.4f +- %.4f (true %.2f), beta %.4f +- %.4f (true %.2f)\n", f3.law.alpha,
                  1.96 * f3.se_alpha, law.alpha, f3.law.beta, 1.96 * f3.se_beta, law.beta);
    assert_true(fabs(f3.law.alpha - law.alpha) <= 1.96 * f3.se_alpha);
    assert_true(fabs(f3.law.beta - law.beta) <= 1.96 * f3.se_beta);
    assert_true(f3.se_alpha < 0.2 && f3.se_beta < 0.2);
    /* no budget with a minimum inside its sizes: an error naming the problem */
    double Nm[3] = {1e6, 2e6, 4e6}, Cm[3] = {1e18, 1e18, 1e18}, Lm[3] = {3.0, 2.9, 2.8};
    assert_int_equal(nl_isoflop_fit_run(Nm, Cm, Lm, 3, 0, 1, &f2), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "minimum"));
}

/* the default grid's windows hold the reduced grid's measured optimum (55-100 tokens per
 * parameter, docs/scaling.md) strictly inside their sizes at every budget */
static void test_default_grid_centred(void **state) {
    (void)state;
    nl_sweep_grid g;
    assert_int_equal(nl_sweep_grid_preset("default", &g), NL_OK);
    assert_true(g.n_budgets >= 3 && g.n_budgets <= 4);
    for (int b = 0; b < g.n_budgets; b++) {
        int first, ns = nl_sweep_budget_shapes(&g, b, &first);
        assert_true(ns >= 4 && ns <= 6);
        assert_true(first >= 0 && first + ns <= g.n_shapes);
        double lo = INFINITY, hi = 0;
        for (int s = first; s < first + ns; s++) {
            nl_arch a;
            nl_sweep_arch(g.dims[s], g.layers[s], g.seq, &a);
            nl_arch_params ap;
            nl_arch_count_params(&a, &ap);
            lo = fmin(lo, (double)ap.non_embedding);
            hi = fmax(hi, (double)ap.non_embedding);
        }
        for (double tpp = 55; tpp <= 100; tpp += 45) {
            double n_opt = sqrt(g.budgets_flops[b] / (6 * tpp)); /* C = 6 N D, D = tpp N */
            print_message("C %.3g: N_opt %.0f at %.0f tokens/param, sizes %.0f .. %.0f\n", g.budgets_flops[b], n_opt,
                          tpp, lo, hi);
            assert_true(lo < n_opt / 2 && n_opt * 2 < hi); /* at least one size step either side */
        }
    }
    assert_int_equal(nl_sweep_grid_preset("nope", &g), NL_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_grid_centred),
        cmocka_unit_test(test_recover_exponents),
        cmocka_unit_test(test_kill_and_resume),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
