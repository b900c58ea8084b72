/* nanolm capture: runs a command's entry point in this process with its stdout and stderr going
 * to temporary files, and hands back what it wrote (plan validate runs its cases this way). */
#ifndef NANOLM_CAPTURE_H
#define NANOLM_CAPTURE_H

/* A command's entry point: argv[0] is its name, the return is its exit status. */
typedef int (*nl_capture_fn)(int argc, char **argv);

/* Runs fn(argc, argv) with file descriptors 1 and 2 on temporary files, then puts them back.
 * Sets *status to fn's return and returns what it wrote to stdout when that is 0, else what it
 * wrote to stderr (malloc'd, NUL-terminated; free() it), or NULL when the files cannot be made. */
char *nl_capture_run(nl_capture_fn fn, int argc, char **argv, int *status);

#endif
