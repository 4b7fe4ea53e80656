/* The planner's failures: how often a job fails, how long a checkpoint takes to save,
 * how often to save one and what the failures cost.
 *
 * A job of n GPUs fails when any of them does: with failures independent and at a
 * constant rate, the job's mean time between failures is the GPU's divided by n.
 * Meta's Llama 3 report (Dubey et al. 2024, arXiv:2407.21783, sec. 3.3.4): 419
 * unexpected interruptions in 54 days on 16,384 H100s, a job MTBF of 54 x 24 / 419 =
 * 3.09 hours, 50,678 hours (5.8 years) a GPU; the interruptions are of the whole job
 * (GPUs, hosts, network, software), counted here per GPU.
 *
 * Young 1974 ("A first order approximation to the optimum checkpoint interval"): with a
 * save that takes delta and failures every M on average, saving every
 *     T = sqrt(2 delta M)
 * minimises the time lost, to first order in delta / M. Daly 2006 adds the higher-order
 * terms (and the restart time); they change T by under a few percent while delta << M,
 * so the planner keeps the first-order formula. Per interval of work T, saving costs
 * delta; a failure, landing anywhere in the interval, loses T / 2 of work on average and
 * the restart R, and comes every M: the fraction of the run lost is
 *     delta / T + (T / 2 + R) / M,
 * which at T = sqrt(2 delta M) is sqrt(2 delta / M) + R / M.
 *
 * A checkpoint holds what resuming needs: the fp32 weights and Adam's m and v, 12 bytes
 * a parameter in either precision (mixed precision's fp32 masters; its 16-bit weights
 * are their rounding and gradients are not saved), as this project's checkpoints do. */
#ifndef PLAN_RESTART_H
#define PLAN_RESTART_H

/* Llama 3's interruptions, per GPU. */
#define PLAN_LLAMA3_INTERRUPTIONS 419
#define PLAN_LLAMA3_DAYS 54
#define PLAN_LLAMA3_GPUS 16384
/* 54 x 24 x 16384 / 419 GPU-hours between failures */
double plan_llama3_gpu_mtbf_hours(void);
/* The same report (sec. 3.3.1): its Tectonic file system sustains 2 TB/s (7 TB/s at its
 * peak), 0.122 GB/s for each of the 16,384 GPUs when they all write their share of a
 * checkpoint at once; in bytes/s. */
#define PLAN_LLAMA3_STORAGE_BYTES_PER_S 2e12
double plan_llama3_save_bandwidth_per_gpu(void);

/* Bytes of a checkpoint of P parameters: 12 P. */
double plan_checkpoint_bytes(double params);
/* The job's mean time between failures, in seconds, from one GPU's in hours. */
double plan_job_mtbf_seconds(double gpu_mtbf_hours, int gpus);
/* Young's interval: sqrt(2 x save x MTBF), in the units they are given in. */
double plan_young_interval(double save_seconds, double mtbf_seconds);

typedef struct {
    double save_seconds;        /* delta */
    double mtbf_seconds;        /* M, of the whole job */
    double restart_seconds;     /* R: from the failure back to training (loading included) */
} plan_failures;

typedef struct {
    double interval;            /* T, seconds of work between saves */
    double lost_per_failure;    /* T / 2 + R */
    double saving_fraction;     /* delta / T */
    double failure_fraction;    /* (T / 2 + R) / M */
    double lost_fraction;       /* their sum */
} plan_checkpointing;

/* What saving every `interval` seconds costs. */
plan_checkpointing plan_checkpointing_at(const plan_failures *f, double interval);
/* The same at Young's interval. */
plan_checkpointing plan_checkpointing_optimal(const plan_failures *f);

#endif
