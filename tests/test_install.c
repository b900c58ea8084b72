/* `make install` as a user gets it: this build installed (cmake --install, DESTDIR honoured)
 * into a temporary staging folder, then a small C program built against the installed copy with
 * `pkg-config --cflags --libs nanolm` (PKG_CONFIG_PATH pointing into the staging folder), run
 * against the installed libnanolm.so; the installed CLI runs; libnanolm.a links statically. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs a shell command, captures stdout+stderr (malloc'd) and returns the exit status. */
static int sh(const char *cmd, char **out) {
    char full[8192];
    int n = snprintf(full, sizeof full, "(%s) 2>&1", cmd);
    if (n < 0 || (size_t)n >= sizeof full) fail_msg("command too long: %s", cmd);
    char *buf = NULL;
    int st = tu_run_shell(full, &buf);
    assert_non_null(buf);
    print_message("$ %s\n%s", cmd, buf);
    if (out)
        *out = buf;
    else
        free(buf);
    return st;
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static const char *PROGRAM =
    "#include <stdio.h>\n"
    "#include <nanolm/formats.h>\n"
    "int main(void) {\n"
    "    uint32_t code = 0;\n"
    "    if (nl_fmt_encode(NL_FMT_BF16, 257.0f, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_SATURATE, 0, &code)) return 1;\n"
    "    printf(\"%s 0x%04x %g\\n\", nl_fmt_name(NL_FMT_BF16), (unsigned)code, (double)nl_fmt_decode(NL_FMT_BF16, "
    "code));\n"
    "    return 0;\n"
    "}\n";

static void test_install_and_build_against_it(void **state) {
    (void)state;
    const char *build = getenv("NANOLM_BUILD_DIR");
    const char *san = getenv("NANOLM_SANITIZED");
    if (san && strcmp(san, "0") != 0) {
        /* An ASan-instrumented libnanolm.so cannot be loaded by an uninstrumented program. */
        print_message("[  SKIP    ] a sanitizer build's library is not installable as it is\n");
        skip();
        return;
    }
    if (!build) {
        print_message("[  SKIP    ] NANOLM_BUILD_DIR not set (run under ctest)\n");
        skip();
        return;
    }
    char *dir = tu_tmpdir();
    assert_non_null(dir);
    char cmd[8192], path[2100], *out = NULL;
    /* DESTDIR staging, the way a package build does it: files land in DIR/stage/opt/nanolm. */
    snprintf(cmd, sizeof cmd, "DESTDIR='%s/stage' cmake --install '%s' --prefix /opt/nanolm", dir, build);
    assert_int_equal(sh(cmd, NULL), 0);
    char root[512];
    snprintf(root, sizeof root, "%s/stage/opt/nanolm", dir);
    snprintf(path, sizeof path, "%s/bin/nanolm", root);
    assert_true(exists(path));
    snprintf(path, sizeof path, "%s/include/nanolm/base.h", root);
    assert_true(exists(path));
    /* The pkg-config file lies in <libdir>/pkgconfig; libdir is lib or lib/<multiarch>. */
    snprintf(cmd, sizeof cmd, "dirname \"$(find '%s' -name nanolm.pc | head -1)\"", root);
    assert_int_equal(sh(cmd, &out), 0);
    out[strcspn(out, "\n")] = '\0';
    char pcdir[1024];
    snprintf(pcdir, sizeof pcdir, "%s", out);
    free(out);
    assert_non_null(strstr(pcdir, "/pkgconfig"));
    char libdir[1024];
    snprintf(libdir, sizeof libdir, "%.*s", (int)(strlen(pcdir) - strlen("/pkgconfig")), pcdir);
    snprintf(path, sizeof path, "%s/libnanolm.a", libdir);
    assert_true(exists(path));
    snprintf(path, sizeof path, "%s/libnanolm.so", libdir);
    assert_true(exists(path));

    /* The installed CLI runs. */
    snprintf(cmd, sizeof cmd, "'%s/bin/nanolm' formats cast 257 --to bf16", root);
    assert_int_equal(sh(cmd, &out), 0);
    assert_non_null(strstr(out, "0x4380"));
    free(out);

    /* pkg-config describes the staged copy (its prefix follows the file's location). */
    snprintf(cmd, sizeof cmd, "PKG_CONFIG_PATH='%s' pkg-config --cflags --libs nanolm", pcdir);
    assert_int_equal(sh(cmd, &out), 0);
    assert_non_null(strstr(out, "/stage/opt/nanolm/")); /* prefix from the .pc location */
    assert_non_null(strstr(out, "-lnanolm"));
    free(out);
    snprintf(cmd, sizeof cmd, "PKG_CONFIG_PATH='%s' pkg-config --modversion nanolm", pcdir);
    assert_int_equal(sh(cmd, &out), 0);
    free(out);

    /* A C program against the installed headers and shared library. */
    snprintf(path, sizeof path, "%s/hello.c", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(PROGRAM, f);
    fclose(f);
    snprintf(cmd, sizeof cmd,
             "cd '%s' && cc -std=c11 -Wall -Werror hello.c -o hello $(PKG_CONFIG_PATH='%s' pkg-config --cflags --libs "
             "nanolm)"
             " && export LD_LIBRARY_PATH='%s' && ./hello && ldd ./hello | grep libnanolm",
             dir, pcdir, libdir);
    assert_int_equal(sh(cmd, &out), 0);
    assert_non_null(strstr(out, "bf16 0x4380 256"));
    assert_non_null(strstr(out, libdir)); /* the staged .so, not some other copy */
    free(out);

    /* And statically, against libnanolm.a with the private dependencies. */
    snprintf(cmd, sizeof cmd,
             "cd '%s' && cc -std=c11 hello.c -o hello_static $(PKG_CONFIG_PATH='%s' pkg-config --cflags nanolm) "
             "'%s/libnanolm.a' $(PKG_CONFIG_PATH='%s' pkg-config --static --libs-only-other --libs-only-l nanolm | "
             "sed 's/-lnanolm//') && ./hello_static",
             dir, pcdir, libdir, pcdir);
    assert_int_equal(sh(cmd, &out), 0);
    assert_non_null(strstr(out, "bf16 0x4380 256"));
    free(out);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_install_and_build_against_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
