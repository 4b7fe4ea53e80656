/* Checkpoint save and load against this disk: ZeRO-3 on N thread ranks (--ranks,
 * default 4) saves its shards, then loads them back (each rank its own pieces) and a
 * single rank loads the whole model from them (resharding N -> 1). Next to it, the
 * disk's write bandwidth measured the same way: N files of the same total size written
 * in parallel and fsynced. Best of 3; the page cache holds what was just written, so
 * the loads read memory, not the disk.
 *
 *   bench_checkpoint --preset bench256 [--ranks 4] [--save DIR]   (default: a temp dir) */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "checkpoint.h"
#include "baseline.h"
#include "cli.h"
#include "floats.h"
#include "replica.h"
#include "zero_state.h"

enum { REPEATS = 3 };

typedef struct {
    const run_config *cfg;
    size_t file_bytes;      /* per rank, for the disk's own figure */
    double disk_seconds[REPEATS], save_seconds[REPEATS], load_seconds[REPEATS];
    float load_diff;        /* largest |loaded - saved| over the ranks */
} bench_job;

static double best(const double *s) {
    double b = s[0];
    for (int i = 1; i < REPEATS; i++) b = s[i] < b ? s[i] : b;
    return b;
}

/* Writes `bytes` to this rank's own file and fsyncs it, as a checkpoint's rank does. */
static void write_plain_file(const char *dir, int rank, size_t bytes) {
    char path[4200];
    ckpt_fits(snprintf(path, sizeof path, "%s/disk-%d.bin", dir, rank), sizeof path);
    char *block = calloc(1, 1 << 20);
    FILE *f = fopen(path, "wb");
    if (!f || !block) {
        perror(path);
        exit(1);
    }
    for (size_t done = 0; done < bytes;) {
        size_t n = bytes - done < (1u << 20) ? bytes - done : (1u << 20);
        block[0] = (char)done;   /* not all zeros */
        if (fwrite(block, 1, n, f) != n) exit(1);
        done += n;
    }
    if (fflush(f) != 0 || fsync(fileno(f)) != 0 || fclose(f) != 0) exit(1);
    unlink(path);
    free(block);
}

static float max_over(comm *world, float x) {
    comm_allreduce(world, &x, 1, COMM_F32, COMM_MAX);
    return x;
}

static int bench_rank(comm *world, void *arg) {
    bench_job *job = arg;
    const run_config *cfg = job->cfg;
    const int rank = comm_rank(world);
    const gpt_shape shape = gpt_shape_make(&cfg->model, 1, 0);
    dp_grads g;   /* ZeRO-3's state, as chapter 2's trainer holds it */
    dp_grads_init(&g, world, &shape, cfg->seed, &(dp_grads_options){.zero = 3});
    ckpt_state state = {.count = 1};
    state.parts[0] = dp_grads_checkpoint_part(&g, rank == 0);
    state.adam_steps[0] = &g.adam_step;
    const size_t n = g.layout.shard_len;
    float *saved = mem_alloc(MEM_OTHER, n * sizeof(float));
    float *loaded = mem_alloc(MEM_OTHER, n * sizeof(float));
    ops_download(saved, g.params, n * sizeof(float));
    for (int r = 0; r < REPEATS; r++) {
        comm_barrier(world);
        double start = comm_now();
        write_plain_file(cfg->save_dir, rank, job->file_bytes);
        comm_barrier(world);
        if (rank == 0) job->disk_seconds[r] = comm_now() - start;

        start = comm_now();
        checkpoint_save(world, cfg, "zero3", &state, r + 1);   /* ends with a barrier */
        if (rank == 0) job->save_seconds[r] = comm_now() - start;

        comm_barrier(world);
        start = comm_now();
        checkpoint_load(cfg->save_dir, &state);
        const float seconds = max_over(world, (float)(comm_now() - start));
        if (rank == 0) job->load_seconds[r] = seconds;
    }
    ops_download(loaded, g.params, n * sizeof(float));
    const float diff = max_over(world, (float)max_abs_diff(saved, loaded, n));
    if (rank == 0) job->load_diff = diff;
    mem_free(saved);
    mem_free(loaded);
    dp_grads_free(&g);
    return 0;
}

/* Bytes of the files of the checkpoint dir/latest names. */
static double checkpoint_bytes(const char *dir) {
    char path[4200], err[512], file[4500];
    if (!checkpoint_resolve(dir, path, sizeof path, err, sizeof err)) return 0;
    DIR *d = opendir(path);
    double total = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        struct stat sb;
        ckpt_fits(snprintf(file, sizeof file, "%s/%s", path, e->d_name), sizeof file);
        if (e->d_name[0] != '.' && stat(file, &sb) == 0) total += (double)sb.st_size;
    }
    if (d) closedir(d);
    return total;
}

int main(int argc, char **argv) {
    run_config cfg = run_config_default();
    cfg.comm.ranks = 4;
    cli_parse(argc, argv, &cfg, NULL, argv[0], "Checkpoint save and load against the disk.");
    cfg.quiet = 1;
    char temp[] = "/tmp/bench_checkpoint.XXXXXX";
    const int own_dir = !cfg.save_dir;
    if (own_dir && !mkdtemp(temp)) return 1;
    if (own_dir) cfg.save_dir = temp;
    mkdir(cfg.save_dir, 0777);

    const gpt_shape whole = gpt_shape_make(&cfg.model, 1, 0);
    const size_t P = gpt_num_params(&whole);
    bench_job job = {.cfg = &cfg, .file_bytes = 3 * P * sizeof(float) / (size_t)cfg.comm.ranks};
    if (launch(&cfg.comm, bench_rank, &job) != 0) return 1;
    const double bytes = checkpoint_bytes(cfg.save_dir);

    /* resharding: one rank loads the whole model from the N ranks' files */
    double whole_seconds[REPEATS];
    replica rep;
    replica_init(&rep, &whole, cfg.seed + 1, 1);
    ckpt_state state;
    replica_checkpoint_state(&rep, 1, &state);
    for (int r = 0; r < REPEATS; r++) {
        const double start = comm_now();
        checkpoint_load(cfg.save_dir, &state);
        whole_seconds[r] = comm_now() - start;
    }
    replica_free(&rep);

    const double disk = 3 * (double)P * sizeof(float) / best(job.disk_seconds);
    printf("checkpoint of %zu parameters (+ AdamW m, v), ZeRO-3 on %d thread ranks, best of %d\n",
           P, cfg.comm.ranks, REPEATS);
    printf("  %-44s %10s %10s %10s %9s\n", "", "MB", "seconds", "MB/s", "of disk");
    printf("  %-44s %10.2f %10.4f %10.1f %8.0f%%\n", "disk: plain files written + fsynced",
           3 * P * 4 / 1e6, best(job.disk_seconds), disk / 1e6, 100.0);
    printf("  %-44s %10.2f %10.4f %10.1f %8.0f%%\n", "save (files, index, fsyncs, renames)",
           bytes / 1e6, best(job.save_seconds), bytes / best(job.save_seconds) / 1e6,
           100 * bytes / best(job.save_seconds) / disk);
    printf("  %-44s %10.2f %10.4f %10.1f %9s\n", "load into the same layout (slowest rank)",
           bytes / 1e6, best(job.load_seconds), bytes / best(job.load_seconds) / 1e6, "cached");
    printf("  %-44s %10.2f %10.4f %10.1f %9s\n", "load into one rank (all of it, resharded)",
           bytes / 1e6, best(whole_seconds), bytes / best(whole_seconds) / 1e6, "cached");
    printf("  loaded parameters against the saved ones: largest difference %g\n", job.load_diff);
    if (own_dir) {
        char cmd[200];
        snprintf(cmd, sizeof cmd, "rm -rf %s", temp);
        if (system(cmd) != 0) return 1;
    }
    return job.load_diff == 0 ? 0 : 1;
}
