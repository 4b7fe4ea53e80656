/* The command line's one way of refusing: a line that names the flag, exit status 2. */
#include "cli_error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli_given.h"
#include "comm.h"

static const char *program_name = "program";

void cli_set_program_name(const char *program) {
    const char *base = strrchr(program, '/');
    program_name = base ? base + 1 : program;
}

const char *cli_program_name(void) { return program_name; }

_Noreturn void cli_fail(const char *fmt, ...) {
    /* Under mpirun every process parses the same flags: one of them says why, in one
     * write (mpirun forwards what it reads; a line in pieces could be split by its
     * banners). The others wait: mpirun stops them once that process has exited, so
     * the line is out before mpirun notices an exit and starts a banner, whatever
     * grace mpirun gives between its SIGTERM and SIGKILL. They leave by themselves
     * after 20 s, should the first process not fail: 3 s was too short on 2 cores
     * loaded twelve deep, where the first process had not printed when the others
     * left, and mpirun stopped it with its line unsaid (exit 2, nothing on stderr). */
    if (process_hosts_rank0()) {
        char line[1024];
        int n = snprintf(line, sizeof line, "%s: error: ", program_name);
        va_list args;
        va_start(args, fmt);
        if (n >= 0 && (size_t)n < sizeof line) vsnprintf(line + n, sizeof line - (size_t)n, fmt, args);
        va_end(args);
        fprintf(stderr, "%s\n", line);
        fflush(stderr);
    } else {
        struct timespec moment = {.tv_sec = 20};
        nanosleep(&moment, NULL);
    }
    exit(2);
}

void cli_check_at_most(const char *flag, double value, double most, const char *why) {
    if (value <= most) return;
    const char *typed = cli_given_text(flag);   /* the value as the user wrote it */
    if (typed) cli_fail("--%s %s: must be at most %g (%s)", flag, typed, most, why);
    cli_fail("--%s %.15g: must be at most %g (%s)", flag, value, most, why);
}

void check_writable(const char *flag, const char *path) {
    struct stat st;
    const int existed = stat(path, &st) == 0;
    if (existed && S_ISDIR(st.st_mode))
        cli_fail("--%s %s: is a directory; give a file name", flag, path);
    FILE *f = fopen(path, "a");   /* "a": an existing file is not truncated yet */
    if (!f) cli_fail("--%s %s: cannot write there (%s)", flag, path, strerror(errno));
    fclose(f);
    if (!existed) unlink(path);
}
