/* The checks every program runs on its flags before any rank starts, for the things
 * the flags name: the data file and the checkpoint directories. */
#ifndef CLI_CHECKS_H
#define CLI_CHECKS_H
#include "data.h"
#include "run_config.h"

/* The data set the flags ask for (exits 2 with a clear line if --data can't be used). */
dataset *dataset_from_config(const run_config *cfg);

/* For main: the global batch splits into ranks x grad_accum equal micro-batches
 * (ddp_check_batch), or its line (under mpirun from world rank 0's process only) and
 * exit status 2, before any rank starts. */
void cli_check_batch(int batch, int ranks, int grad_accum);

/* In cli_parse: --save-every needs --save, --save is a directory this process can
 * create or write, and --resume names a sound checkpoint of this model whose step is
 * below --steps (cli_fail otherwise), as do DIR's latest-STRATEGY pointers and, on a
 * restart, --save's (there a strategy that had finished may be at --steps). --resume
 * DIR is then pinned to the checkpoint DIR/latest names now, and resume_base set to DIR
 * (checkpoint_resume_source). */
void checkpoint_cli_check(run_config *cfg);

/* For a program or part whose work reads host memory (`what`, e.g. "ZeRO++'s block
 * codecs read"): on a GPU that --device auto found (`asked` NULL or "auto"), the CPU
 * runs it (cfg->comm.device set to the CPU) and NULL is returned; --device cuda asked by
 * name gets the reason, in one line naming what and what to give instead. */
const char *device_cpu_only(run_config *cfg, const char *asked, const char *what,
                            char *why, size_t n);
/* The same for main, with the --device given: the reason's line and exit 2. */
void cli_cpu_only(run_config *cfg, const char *what);

#endif
