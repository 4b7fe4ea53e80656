/* --predict-chapters: the planner's arithmetic against this project's own runs.
 *
 * For bench256 (layers 4, heads 4, dim 256, ctx 64, batch 8, vocab 256) on 2 and 4
 * ranks it predicts, per strategy, the bytes the largest rank holds and the step time,
 * then runs the chapter programs as they are (chapter 1: ddp, chapter 2: zero1-3,
 * chapter 3: tp) with --json and reads their memory_per_rank and ms_per_step.
 *
 * Model states are this project's: fp32 parameters, gradients and Adam m, v (16 bytes
 * per parameter), or with --precision bf16|fp16 16-bit compute weights 2, fp32
 * gradients 4 and fp32 master, m, v 12; sharded per slab as chapter 2 does, with the
 * working buffers its stages hold (ZeRO-2/3: a block's and the tied embedding's full
 * gradient; ZeRO-3: the largest gathered slab). They must match to the byte. TP splits
 * the vocabulary in every precision; in 16 bits its head also widens its slice of the
 * logits into fp32 (tokens x vocab/t x 4 B of activations).
 * Activations: Korthikanti's per-layer count with fp32 elements and no dropout,
 *     4 [s b (4h + 12h/t + 4) + a s^2 b / t] bytes per layer
 * (16 bits: 2 [s b (4h + 12h/t) + a s^2 b / t] + 4 [4 s b], the statistics fp32)
 * (the 4 h whole: layer input, LayerNorm outputs, residual; the 12 h / t split: q, k,
 * v, attention output, MLP input and GELU output; 4: LayerNorm means and 1/std; the
 * softmax output a s^2 b / t), plus the head (final LayerNorm, logits, losses), the
 * tokens, and one layer's backward workspace. Within 10%.
 * Time: FLOPs per rank over this machine's measured sgemm rate (ranks beyond the cores
 * share them), plus the link model's time for the collectives; reported only.
 *
 * Pipeline (chapter 4: 1F1B, 2 stages on 2 ranks, 4 on 4) and 3D (chapter 5: tp 2 x
 * pp 2 on 4 ranks): each stage's own blocks (the first with the embedding, the last
 * with the final LayerNorm and its copy of the tied embedding), and the activations of
 * the micro-batches 1F1B holds on the stage at once (p - r on stage r) plus one
 * backward workspace; the largest rank is compared.
 *
 * The pieces: predict_formulas.c (the arithmetic), predict_runner.c (a chapter run with
 * a deadline), predict_measured.c (its --json read), predict_floor.c (the sgemm rate),
 * predict_report.c (the table and JSON), predict.c (the comparison). */
#ifndef PREDICT_H
#define PREDICT_H

#include "comm.h"
#include "model.h"
#include "planner.h"
#include "precision.h"

/* Seconds a chapter's run may take before it is stopped (a few on an idle machine). */
#define PREDICT_TIMEOUT_SECONDS 300

enum { PREDICT_MESH_RANKS = 8, PREDICT_MESH_GROUPS = 7 };
#define PREDICT_MESH_ACTIVATION_TOLERANCE 0.15
typedef struct {
    double bytes[PREDICT_MESH_GROUPS];   /* tp, pp, dp, embedding, cp, dp_replicate,
                                            expert_dp */
    plan_bytes state;                    /* params, grads, optimizer, activations */
} predict_mesh_figures;
/* The planner's mesh and what chapter 11 measured on it (ranks: of the run and of the
 * request the mesh was planned for). */
typedef struct {
    plan_mesh mesh;
    int ranks;
    predict_mesh_figures measured;
} predict_mesh_run;
/* The meshes trained: the search's, then the ZeRO-3 mesh, the ring CP mesh, the TP + SP
 * mesh, the Ulysses CP mesh and the MoE mesh given to the planner (predict_mesh.c). */
enum { PREDICT_MESH_SEARCHED, PREDICT_MESH_ZERO3, PREDICT_MESH_CP, PREDICT_MESH_TP,
       PREDICT_MESH_ULYSSES, PREDICT_MESH_MOE, PREDICT_MESH_RUNS };

typedef struct {
    int steps;
    comm_link link;
    double link_scale;
    const char *data_path;   /* NULL: the built-in corpus */
    int json;
    double timeout_seconds;  /* 0: PREDICT_TIMEOUT_SECONDS */
    precision dtype;         /* what the chapters train in: fp32, bf16 or fp16 */
    double *sequence_sent;   /* NULL, or [PREDICT_SEQUENCE_ROWS]: chapter 9's measured
                                bytes sent per rank per step, in predict_sequence_in's
                                order (tp+sp, ring, ulysses on 2 ranks, then on 4), so
                                that a test can hold other formulas against them */
    predict_mesh_run *mesh_run;   /* NULL, or [PREDICT_MESH_RUNS]: receives the planner's
                                     meshes and chapter 11's figures (predict_mesh_in), for
                                     a test's controls (ranks 0: not run) */
} predict_options;
enum { PREDICT_SEQUENCE_ROWS = 6 };

/* Bytes per rank and milliseconds per step, predicted or measured. */
typedef struct {
    double params, grads, optimizer, activations;
    double ms_per_step;
} chapter_figures;

typedef struct {
    int chapter;             /* whose program runs it */
    const char *strategy;    /* its name in that program's --json */
    int tp;                  /* tensor-parallel size (the rest is data parallel) */
    int zero_stage;
    int pp;                  /* pipeline stages (1F1B); 0 or 1: none */
    int micro;               /* micro-batches per step, with pp */
} chapter_strategy;

extern const chapter_strategy PREDICT_STRATEGIES[];
extern const int PREDICT_NUM_STRATEGIES;

/* The prediction for one strategy of the model cfg (global batch `batch`) on `ranks`
 * ranks, at `gflops` per core with `cores` cores, trained in `dtype`. */
chapter_figures predict_chapter_run(const gpt_config *cfg, int batch, int ranks,
                                    const chapter_strategy *st, double gflops, int cores,
                                    comm_link link, double link_scale, precision dtype);
/* The measured figures of the run `strategy` in a chapter's --json output (parsed
 * with json.h; the keys: docs/json.md): ms_per_step and memory_per_rank's params,
 * grads, optimizer and activations. 0 if the text does not parse, has no such run, or
 * the run lacks one of them. */
int chapter_json_figures(const char *json, const char *strategy, chapter_figures *out);
/* Runs programs_dir/chapterN on `ranks` thread ranks with --preset bench256 --json
 * and returns its stdout (malloc'ed), or NULL with a line on stderr: when it fails, or
 * runs past o->timeout_seconds (then it is killed, and the line names the command). */
char *run_chapter_json(const char *programs_dir, int chapter, int ranks,
                       const predict_options *o);
/* The same with the chapter's own flags (" --part sp") in place of chapter_flags'. */
char *run_chapter_json_with(const char *programs_dir, int chapter, int ranks,
                            const predict_options *o, const char *flags);
/* Elements of the model on one of tp tensor-parallel ranks, as chapters 3 and 9 store
 * it in `dtype` (predict_formulas.c). */
double predict_tp_elements(const gpt_config *c, int tp, precision dtype);

/* Chapter 9 (predict_sequence.c): part sp's TP + SP and part context's balanced ring
 * and Ulysses on 2 and 4 ranks, bytes sent per rank per step predicted from the
 * library's formulas (tp_sequence_bytes_formula; cp_attention_bytes_formula and the
 * cp x dp gradient all-reduce) and TP + SP's activations; fp32 only (the context part
 * computes in fp32). Adds the rows' byte mismatches and worst activation error to
 * *mismatches and *worst; prints its table, or with o->json the value of a JSON key.
 * 0 when a run fails. */
int predict_sequence_in(const char *programs_dir, const predict_options *o, int *mismatches,
                        double *worst);
/* The bytes it predicts for one run on `ranks` ranks: cp_kind -1 TP + SP, else the
 * cp_attention_kind's. */
double predict_sequence_bytes(int cp_kind, int ranks);

/* The planner's meshes (predict_mesh.c): plan_best_mesh for bench256 (global batch 8,
 * micro-batches of 1) on PREDICT_MESH_RANKS 80 GB GPUs of one node, and a mesh on 4
 * GPUs given to the planner (plan_evaluate), tp 1 x pp 2 x dp 2 at ZeRO-3 (the search
 * keeps ZeRO-3 to pp 1), in fp32 tp 1 x cp 2 x pp 2 with ring attention, and tp 2 + SP
 * x dp 2, in fp32 a Ulysses tp 2 + SP x cp 2, and the MoE mesh: tp 1 x dp 4 at ZeRO-1,
 * chapter 10's MoE every other block (4 experts, top-2, capacity 1.25) with ep 2 (two
 * experts a rank, each summed over expert_dp 2); each trained by chapter 11 with that tp, cp,
 * pp, dp shards and replicas, ZeRO stage, micro-batch count (1F1B) and precision. The
 * request's ZeRO-3 gathers once a step, as chapter 11's (PLAN_GATHER_PER_STEP), and its
 * activations and its TP ranks are this model's (PLAN_ACTS_THIS_MODEL,
 * PLAN_TP_THIS_MODEL: the row-parallel biases and the LayerNorms whole, the
 * vocab-parallel embedding's and head's all-reduces, SP's regathers). Bytes
 * sent per step on each group (the rank that sends the most) and the peak params, grads
 * and optimizer bytes in a step (the rank that holds the most) must equal the planner's
 * plan_bytes_sent and plan_model_states to the byte, and so must its activations (this
 * model's count, PLAN_ACTS_THIS_MODEL; *activation_error, the relative difference, is
 * also held within PREDICT_MESH_ACTIVATION_TOLERANCE). The tied embedding's all-reduce
 * between the first and last stage is measured, not planned. The MoE mesh is planned
 * with this model's MoE count (plan_moe_this_model.h: no MLP weights in the MoE blocks,
 * the routers with the dense part, the experts over expert_dp) and held the same way on
 * every group but ep, whose all-to-alls carry the rows the routing sends (data, not
 * formula: chapter 11 holds them against its own count of those rows). */
plan_request predict_mesh_request(int ranks, precision dtype);
/* The same for the MoE mesh (r.moe, r.ep: chapter 11's MoE model with ep 2). */
plan_request predict_mesh_moe_request(int ranks, precision dtype);
/* chapter 11's flags for the mesh (" --tp 1 --cp 1 ..."), or NULL with flags written:
 * else the reason chapter 11 cannot train it. */
const char *predict_mesh_flags(const plan_mesh *mesh, char *flags, size_t size);
/* What the planner's formulas give for the mesh (bytes[embedding] 0: not planned); with
 * r->moe, this model's MoE count. */
predict_mesh_figures predict_mesh_planned(const plan_request *r, const plan_mesh *mesh);
/* chapter 11's MoE flags for the request (" --ep 2 --experts 4 ..."; "" for a dense one). */
void predict_mesh_moe_flags(const plan_request *r, char *flags, size_t size);
/* chapter 11's run with a mesh in its --json: bytes_per_group_kind,
 * state_peak_largest_per_tag and state_largest_per_tag's activations; 0 when it does not
 * parse or lacks one. */
int mesh_json_figures(const char *json, predict_mesh_figures *out);
/* The figures that differ (bytes but the embedding's, params, grads, optimizer,
 * activations) and
 * *activation_error = |predicted / measured - 1| of the activations. */
int predict_mesh_compare(const predict_mesh_figures *predicted,
                         const predict_mesh_figures *measured, double *activation_error);
/* The mesh given to the planner for a run (PREDICT_MESH_ZERO3 .. PREDICT_MESH_MOE), on
 * *ranks GPUs, micro-batch and global batch not yet set (plan_evaluate sets them). */
plan_mesh predict_mesh_given(int which, int *ranks);
/* Searches, trains, compares and prints every mesh (table, or with o->json the keys
 * "mesh" and "given_meshes"); adds the differing figures to *mismatches, the largest
 * activation error to *activation_error. 0 when chapter 11 fails or cannot train one. */
int predict_mesh_in(const char *programs_dir, const predict_options *o, int *mismatches,
                    double *activation_error);

/* This machine's single-thread sgemm rate, GFLOP/s, at bench256's MLP shape. */
double measure_sgemm_gflops(int tokens, int dim);

/* Predicts, runs and compares every strategy on 2 and 4 ranks; prints the table (or
 * JSON). Returns 0 when every model state matched and every activation was within
 * 10%, 1 otherwise, 2 when a program is missing. */
int predict_chapters(const predict_options *o);
/* The same with the chapter programs in programs_dir; worst_activation receives the
 * largest |predicted / measured - 1| of the activations, state_mismatches the number
 * of model-state figures that differ. */
int predict_chapters_in(const char *programs_dir, const predict_options *o,
                        double *worst_activation, int *state_mismatches);

#endif
