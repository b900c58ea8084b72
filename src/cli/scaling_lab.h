/* Subcommands of `nanolm scaling` that train NanoLM (sweep, emergence, lr-transfer). */
#ifndef NANOLM_SCALING_LAB_H
#define NANOLM_SCALING_LAB_H
int nl_cmd_scaling_sweep(int argc, char **argv);
int nl_cmd_scaling_lr_transfer(int argc, char **argv);
int nl_cmd_scaling_emergence(int argc, char **argv);
#endif
