/* The roll call after a timeout under MPI (comm_mpi_roll_call.h). */
#include "comm_mpi_roll_call.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"

#define ROLL_CALL_SECONDS 1.0   /* how long a rank that timed out listens */
#define ROLL_CALL_TAG 77
enum { ROLL_SILENT, ROLL_TIMED_OUT, ROLL_RETURNED };

static void heard_from_others(MPI_Comm roll, char *heard, double seconds) {
    const double until = comm_now() + seconds;
    struct timespec nap = {.tv_nsec = 1000000};
    while (comm_now() < until) {
        int flag = 0, word;
        MPI_Status status;
        MPI_Iprobe(MPI_ANY_SOURCE, ROLL_CALL_TAG, roll, &flag, &status);
        if (!flag) {
            nanosleep(&nap, NULL);
            continue;
        }
        MPI_Recv(&word, 1, MPI_INT, status.MPI_SOURCE, ROLL_CALL_TAG, roll, MPI_STATUS_IGNORE);
        heard[status.MPI_SOURCE] = (char)word;
    }
}

/* A rank waiting for the others after rank_main: answer a roll call that it returned. */
void mpi_roll_call_answer(MPI_Comm roll_call_comm) {
    static const int returned = ROLL_RETURNED;
    int flag = 0, word;
    MPI_Status status;
    MPI_Request answer;
    MPI_Iprobe(MPI_ANY_SOURCE, ROLL_CALL_TAG, roll_call_comm, &flag, &status);
    if (!flag) return;
    MPI_Recv(&word, 1, MPI_INT, status.MPI_SOURCE, ROLL_CALL_TAG, roll_call_comm,
             MPI_STATUS_IGNORE);
    MPI_Isend(&returned, 1, MPI_INT, status.MPI_SOURCE, ROLL_CALL_TAG, roll_call_comm, &answer);
    MPI_Request_free(&answer);
}

/* "1, 3" for the ranks q with heard[q] == kind; returns how many. */
static int ranks_heard_as(const char *heard, int size, int kind, char *out, size_t len) {
    int count = 0;
    out[0] = 0;
    for (int q = 0; q < size; q++)
        if (heard[q] == kind && strlen(out) + 16 < len)
            snprintf(out + strlen(out), len - strlen(out), "%s%d", count++ ? ", " : "", q);
    return count;
}

void mpi_roll_call_name_silent(MPI_Comm roll_call_comm) {
    int me, size;
    if (roll_call_comm == MPI_COMM_NULL) return;
    MPI_Comm_rank(roll_call_comm, &me);
    MPI_Comm_size(roll_call_comm, &size);
    if (size < 2) return;
    static const int timed_out = ROLL_TIMED_OUT;
    char *heard = calloc((size_t)size, 1);
    MPI_Request *said = calloc((size_t)size, sizeof *said);
    if (!heard || !said) return;
    for (int q = 0; q < size; q++)   /* not waited for: MPI_Abort follows */
        if (q != me) MPI_Isend(&timed_out, 1, MPI_INT, q, ROLL_CALL_TAG, roll_call_comm, &said[q]);
    heard[me] = ROLL_TIMED_OUT;
    heard_from_others(roll_call_comm, heard, ROLL_CALL_SECONDS);
    int lowest = 0;
    while (heard[lowest] != ROLL_TIMED_OUT) lowest++;
    char silent[256], returned[256];
    const int n_silent = ranks_heard_as(heard, size, ROLL_SILENT, silent, sizeof silent);
    const int n_returned = ranks_heard_as(heard, size, ROLL_RETURNED, returned, sizeof returned);
    if (lowest == me && n_silent > 0)
        fprintf(stderr, "comm: rank%s %s reported no timeout within %.0f s of rank %d's: %s"
                " stopped (SIGSTOP, a debugger) or busy outside comm; the others waited for"
                " %s\n", n_silent > 1 ? "s" : "", silent, ROLL_CALL_SECONDS, me,
                n_silent > 1 ? "they were" : "it was", n_silent > 1 ? "them" : "it");
    if (lowest == me && n_returned > 0)
        fprintf(stderr, "comm: rank%s %s had returned from rank_main: %s skipped a collective"
                " the others are in\n", n_returned > 1 ? "s" : "", returned,
                n_returned > 1 ? "they" : "it");
    free(heard);
}
