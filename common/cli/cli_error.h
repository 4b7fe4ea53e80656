/* How the command line refuses input: one line "<program>: error: ..." and exit 2,
 * and the bounds checks that end that way. */
#ifndef CLI_ERROR_H
#define CLI_ERROR_H

/* The name errors and usage are printed under (argv[0] without its folder). */
void cli_set_program_name(const char *program);
const char *cli_program_name(void);

/* One error line "<program>: error: ..." and exit status 2. */
_Noreturn void cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* --flag's value must be at most `most` (why: what the bound is), else cli_fail: for
 * values whose results would overflow or whose waits would never end. */
void cli_check_at_most(const char *flag, double value, double most, const char *why);

/* The file an output flag names (--trace, --svg) can be written: a clear line and exit
 * 2 now, not a lost result after training. Leaves no file behind that was not there. */
void check_writable(const char *flag, const char *path);

#endif
