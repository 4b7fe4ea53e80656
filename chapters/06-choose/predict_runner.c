/* --predict-chapters' runner: a chapter program started with --json, its stdout read,
 * and the whole process group stopped if it runs past its deadline. */
#include "predict.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pp_schedule.h"

/* What each chapter's run is told beyond the common flags (PREDICT_STRATEGIES' sizes). */
static void chapter_flags(int chapter, char *flags, size_t size) {
    switch (chapter) {
    case 1: snprintf(flags, size, " --strategy ddp"); break;   /* DataParallel is fp32's */
    case 3: snprintf(flags, size, " --part train"); break;
    case 4:
        snprintf(flags, size, " --schedule %s --micro 8 --stage-ms 0", pp_schedule_name(PP_1F1B));
        break;
    case 5: snprintf(flags, size, " --tp 2 --pp 2 --dp 1 --micro 4"); break;
    default: flags[0] = 0;
    }
}

/* ---- running a chapter, with a deadline ------------------------------------------- */

enum { RUN_STARTED_NOT = -2, RUN_TIMED_OUT = -1 };

/* sh -c command in a process group of its own, stdout into *fd: a timeout then stops
 * the shell and everything it started. */
static pid_t start_command(const char *command, int *fd) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    const pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execl("/bin/sh", "sh", "-c", command, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    if (pid < 0) {
        close(fds[0]);
        return -1;
    }
    setpgid(pid, pid);   /* also here: the group exists whichever side runs first */
    *fd = fds[0];
    return pid;
}

/* Everything fd gives until its end or the deadline; NULL when out of memory.
 * *in_time: whether the end came first. */
static char *read_until(int fd, double deadline, int *in_time) {
    size_t length = 0, capacity = 1 << 16;
    char *text = malloc(capacity);
    *in_time = 0;
    while (text) {
        const double left = deadline - comm_now();
        if (left <= 0) break;
        struct pollfd ready = {.fd = fd, .events = POLLIN};
        if (poll(&ready, 1, (int)(left * 1000) + 1) <= 0) continue;   /* EINTR, or time */
        const ssize_t got = read(fd, text + length, capacity - length - 1);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            *in_time = 1;
            break;
        }
        length += (size_t)got;
        if (capacity - length < 4096) {
            char *grown = realloc(text, capacity *= 2);
            if (!grown) free(text);
            text = grown;
        }
    }
    if (text) text[length] = 0;
    return text;
}

/* Its exit status, waiting until the deadline at most; RUN_TIMED_OUT after. */
static int wait_until(pid_t pid, double deadline) {
    int status;
    const struct timespec moment = {.tv_nsec = 10 * 1000 * 1000};
    while (waitpid(pid, &status, WNOHANG) != pid) {
        if (comm_now() >= deadline) return RUN_TIMED_OUT;
        nanosleep(&moment, NULL);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The command's stdout (malloc'ed) and *status: its exit status, RUN_TIMED_OUT when it
 * ran past `seconds` (it is killed, with all it started) or RUN_STARTED_NOT. */
static char *run_with_deadline(const char *command, double seconds, int *status) {
    int fd;
    const pid_t pid = start_command(command, &fd);
    if (pid < 0) {
        *status = RUN_STARTED_NOT;
        return NULL;
    }
    const double deadline = comm_now() + seconds;
    int in_time;
    char *text = read_until(fd, deadline, &in_time);
    close(fd);
    *status = in_time ? wait_until(pid, deadline) : RUN_TIMED_OUT;
    if (*status == RUN_TIMED_OUT) {
        kill(-pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    return text;
}

/* The shell command that runs chapter N on `ranks` thread ranks; 0 with a line on
 * stderr when it cannot be built. */
static int chapter_command(const char *programs_dir, int chapter, int ranks,
                           const predict_options *o, const char *flags, char *program,
                           size_t program_size, char *command, size_t command_size) {
    static const char *const link_names[] = {"none", "nvlink", "ib", "ethernet"};
    snprintf(program, program_size, "%s/chapter%d", programs_dir, chapter);
    if (access(program, X_OK) != 0) {
        fprintf(stderr, "predict: %s is not built (make chapter1 ... chapter5 chapter9)\n", program);
        return 0;
    }
    char data[1100] = "";
    if (o->data_path) {
        if (strchr(o->data_path, '\'')) {
            fprintf(stderr, "predict: --data %s: a path with a quote cannot be passed on\n",
                    o->data_path);
            return 0;
        }
        snprintf(data, sizeof data, " --data '%s'", o->data_path);
    }
    snprintf(command, command_size,
             "'%s' --ranks %d --preset bench256 --steps %d --json --quiet --link %s"
             " --link-scale %g --precision %s%s%s", program, ranks, o->steps,
             link_names[o->link], o->link_scale, precision_name(o->dtype), flags, data);
    return 1;
}

char *run_chapter_json(const char *programs_dir, int chapter, int ranks,
                       const predict_options *o) {
    char flags[128];
    chapter_flags(chapter, flags, sizeof flags);
    return run_chapter_json_with(programs_dir, chapter, ranks, o, flags);
}

char *run_chapter_json_with(const char *programs_dir, int chapter, int ranks,
                            const predict_options *o, const char *flags) {
    char program[1024], command[2600];
    if (!chapter_command(programs_dir, chapter, ranks, o, flags, program, sizeof program,
                         command, sizeof command))
        return NULL;
    setenv("OPENBLAS_NUM_THREADS", "1", 1);   /* what ./run sets for every program */
    /* started by mpirun ourselves (MPI=1), the chapter must not take itself for one of
     * mpirun's processes: it runs its ranks as threads */
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const double limit = o->timeout_seconds > 0 ? o->timeout_seconds : PREDICT_TIMEOUT_SECONDS;
    int status;
    char *text = run_with_deadline(command, limit, &status);
    if (!text && status == RUN_STARTED_NOT) {
        fprintf(stderr, "predict: cannot start %s\n", program);
        return NULL;
    }
    if (status == RUN_TIMED_OUT) {
        fprintf(stderr, "predict: %s did not finish in %g s and was stopped (command: %s)\n",
                program, limit, command);
        free(text);
        return NULL;
    }
    if (!text || status != 0) {
        fprintf(stderr, "predict: %s failed (exit status %d)\n", command, status);
        free(text);
        return NULL;
    }
    return text;
}
