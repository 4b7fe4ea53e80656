/* Command-line flags shared by every program, plus a chapter's own.
 *
 * Bad input never reaches a rank: cli_parse prints one line naming the flag, the
 * value and what would be valid, and exits with status 2. A flag given twice is bad
 * input too ("--steps given twice (8, then 2): give it once"). */
#ifndef CLI_H
#define CLI_H
#include "cli_checks.h"
#include "cli_error.h"
#include "cli_given.h"
#include "run_config.h"

typedef enum { OPT_INT, OPT_FLOAT, OPT_STRING, OPT_FLAG, OPT_CHOICE } cli_type;

/* A chapter's own flag. For OPT_CHOICE, target is an int receiving the index of the
 * value in choices (a NULL-terminated list). Integers must be >= min_value. */
typedef struct {
    const char *name;     /* without the dashes */
    cli_type type;
    void *target;
    const char *help;
    const char *const *choices;
    double min_value;
} cli_option;

/* Parses argv into cfg and the extra options (extra may be NULL; ends with a zeroed
 * entry). --help prints usage and exits 0. Exits 2 on any bad input. */
void cli_parse(int argc, char **argv, run_config *cfg, const cli_option *extra,
               const char *program, const char *description);


/* A mode that ignores some flags refuses them: each of `flags` (NULL-terminated, names
 * without dashes) that was given is one line "--flag does nothing with <mode> (why)"
 * and exit 2. */
void cli_refuse_in_mode(const char *mode, const char *const *flags, const char *why);
/* The shared flags that only training reads (the model, the batch, the optimizer, the
 * data, the communicator's and the run's own), for a mode that trains nothing. */
extern const char *const cli_training_flags[];

#endif
