# Sourced by ./run, tools/run-tests and tools/run-bench: choose_blas_kernel PROGRAM.
#
# OpenBLAS (0.3.21 in Debian 12) picks its kernels by the CPU's model number, and on a
# model it does not know it falls back to Prescott's SSE3 kernels: on a CPU of model 207
# with AVX-512 and AVX512_BF16, its sgemm then ran at 20-24 GFLOP/s at 512 x 512 x 128
# on one core, against 107-122 with its AVX-512 kernels (Cooperlake, SkylakeX), and the
# last bits of a product follow the kernel too. So where OpenBLAS says Prescott and the
# CPU's flags allow better, the kernels the flags allow are chosen through
# OPENBLAS_CORETYPE, read when the library loads (before any code of ours runs: hence
# out here). A machine that sets OPENBLAS_CORETYPE itself keeps its choice.
choose_blas_kernel() {
    [ -n "${OPENBLAS_CORETYPE+set}" ] && return 0
    local detected flags best
    detected=$(RUN_BLAS_PROBE=1 "$1" 2>/dev/null) || return 0
    [ "$detected" = Prescott ] || return 0
    flags=" $(grep -m 1 '^flags' "${RUN_CPUINFO:-/proc/cpuinfo}" 2>/dev/null) "
    case "$flags" in
        *" avx512_bf16 "*) best=Cooperlake ;;
        *" avx512bw "*) best=SkylakeX ;;   # (with AVX-512 F, CD, DQ and VL on every such CPU)
        *" avx2 "*) best=Haswell ;;
        *) return 0 ;;
    esac
    # the profile says why (op_profile.c): OpenBLAS's own pick, and ours
    export OPENBLAS_CORETYPE=$best RUN_BLAS_DETECTED=$detected
}
