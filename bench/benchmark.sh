#!/usr/bin/env bash
# The trained resolution benchmark of docs/results.md, in parts a session can finish, in order of what they tell:
#
#     bash bench/benchmark.sh              # start or continue: a part already recorded is skipped, a killed one resumed
#     THREADS=1 bash bench/benchmark.sh    # leave a core free (default: every core, shared out among JOBS)
#     JOBS=2 bash bench/benchmark.sh       # two parts at once, a thread each on 2 cores; Ctrl-C stops both
#     PARKED=DIR bash bench/benchmark.sh park  # before the machine goes: unfinished parts' resume state to DIR
#     ONLY='protocol_fashion_originals_8x_*_s0' bash bench/benchmark.sh  # only the parts these globs name, in order
#
# A part is one train.py run folder, runs/<part>. When it finishes, its record (config.yaml, log.csv, results.csv,
# results.md; not the weights) is copied to docs/runs/<part>/, which git tracks; a part recorded there is done, and
# is skipped. runs/ does not outlive the machine that trained it: a part killed before it ends resumes where it
# stopped on the same machine. Each is at most about 2 hours on 2 cores (the times below, measured on the machine of
# docs/results.md's cost table; a slower one took 145 s an epoch, not 80); one that cannot finish in a sitting is
# parked before the machine goes: `park` copies its resume state (config.yaml, log.csv, each model's checkpoint.pt:
# weights-only tensors, checked on load; results.json) to $PARKED/<part>/, storage outside the repository that
# outlives the machine (checkpoints stay out of git), and a later `PARKED=DIR bash bench/benchmark.sh` on any
# machine resumes from there (and deletes that folder once the part is recorded). Once every part of a step is
# recorded, bench/merge.py joins them into docs/runs/<step>/ (results.csv, results.md and the figures), where
# docs/results.md's tables come from.
# ONLY (globs, space-separated) trains the parts it names and skips the rest: a part a sitting holds before one
# that outlasts it, on a machine that may not outlive the sitting (steps are joined as ever, once whole); with park,
# it parks only those.
#
# JOBS=N starts N workers, each taking the next part no other is training (a part is claimed with flock on
# runs/.<part>.lock, which goes with the process that holds it, a killed one too), with cores / N threads each
# (THREADS: each worker's). The tiny models use two cores poorly: on the 2-core AVX2 machine one epoch of 100 steps
# of the papers' recipe took 34 s with two threads, 40 s with one, and 42-45 s with one each beside another such
# run: two parts side by side finish about 1.5 times as many epochs an hour as one at a time (2026-11-29; the parts'
# own epochs: docs/results.md, "What the benchmark costs"). A worker that finds every part of a step recorded joins
# it (merge.py writes the same files again where another did). One whose part fails stops; the others go on, and
# the script's exit status is then 1. Ctrl-C stops them all (each train.py with its one line); a `kill` of the
# script leaves the train.py runs going, as with one worker.
#
#   ELPV, six models, 5 seeds (~6 min a run): seeds 0-2, then 3-4          -> docs/runs/protocol_elpv
#   Fashion-MNIST, the convergence check (APE, axial RoPE, 20 epochs, seed 0), tested at every size (~35 min)
#   Fashion-MNIST, the papers' recipe 4x as long (40 epochs; APE, axial RoPE, RoPE-Mixed, seed 0; ~55 min a part)
#   Fashion-MNIST, the papers' recipe 8x as long, the 40-epoch runs' convergence check: APE and axial RoPE, seed 0
#   (~2 h a part, a model each)
#   Fashion-MNIST, the other families with APE and axial RoPE, 3 seeds (~11 min a run): two parts a seed, of five
#   and four models (about an hour each)                                     -> docs/runs/protocol_fashion_families
#   Fashion-MNIST, the papers' recipe at 80 epochs for RoPE-Mixed and seeds 1-2 (40 were short of capacity: APE
#   +2.3, axial RoPE +2.5 points at 1x from 40 to 80; ~2 h a part)      -> docs/runs/protocol_fashion_papers_8x_s0-2
#   Fashion-MNIST, the papers' crops without its multi-resolution training, APE and axial RoPE, 40 epochs, seed 0
#   (~1.8 h a part): does multi-size training make APE's lead at 4x?
#   then seeds 3-4 of the three: the recipe best at 2x and 4x gives README's headline, whose models the benchmark
#   trains at 5 seeds (the plain recipe's are)                           -> docs/runs/protocol_fashion_papers_8x
#   Fashion-MNIST, the papers' recipe with each batch drawn from the originals at its size, APE, axial RoPE and
#   RoPE-Mixed, 40 epochs, seed 0 (~1.8 h a part): with real detail in its 18-px batches, does a model gain above its
#   training size?                                                      -> docs/runs/protocol_fashion_originals_4x
#   Fashion-MNIST, the papers' recipe at 160 epochs, APE and axial RoPE, seed 0: the 80-epoch runs' convergence check
#   (~4.4 h a part; more than a sitting)
#   Fashion-MNIST, the originals at 80 epochs, APE, axial RoPE and RoPE-Mixed, seeds 0-2 (~2.3-3.8 h a part alone):
#   does the gain above the training size hold at three seeds?          -> docs/runs/protocol_fashion_originals_8x
#   Fashion-MNIST, the crops alone at 80 epochs, APE and axial RoPE, seeds 0-2 (~2.2 h a part alone) -> docs/runs/
#   protocol_fashion_crops_8x
#   Then the records of runs measured before the parts (docs/results.md's tables hold their figures; ~7 h):
#   Fashion-MNIST, the headline's six models, 5 seeds (~9 min a run): seeds 0-1, 2-3, 4 -> docs/runs/protocol_fashion
#   Fashion-MNIST, the papers' recipe, 3 seeds (~11 min a run)
#   ELPV's convergence check (APE, axial RoPE, 160 epochs, seed 0)
# ELPV's parts are skipped, with the command that installs it, where PyPI's elpv-dataset is not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
JOBS=${JOBS:-1}
case "$JOBS" in
    [1-9] | [1-9][0-9]) ;;
    *)
        echo "error: JOBS=$JOBS: the number of parts to train at once, a whole number from 1 (JOBS=2 on 2 cores)" >&2
        exit 1
        ;;
esac
threads=$(($(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) / JOBS))  # (nproc counts OMP_NUM_THREADS)
export OMP_NUM_THREADS=${THREADS:-$((threads > 0 ? threads : 1))}
if ! command -v flock > /dev/null; then
    if [ "$JOBS" != 1 ]; then
        echo "error: JOBS=$JOBS needs flock (util-linux) to share the parts out; without it, JOBS=1" >&2
        exit 1
    fi
    flock() { :; }  # one worker: nothing to share out
fi
if [ "$JOBS" != 1 ] && ! env --default-signal=INT true 2> /dev/null; then
    echo "error: JOBS=$JOBS needs GNU env (coreutils 8.31 or later) for Ctrl-C to reach its workers; JOBS=1" >&2
    exit 1
fi

# only NAME: whether ONLY (unset: every part) names the part NAME, one of its globs matching it
read -rd "" -a only_globs <<< "${ONLY:-}" || true  # (split on blanks and newlines, never expanded as globs here)
named=0  # the parts ONLY named
only() {
    local glob
    [ ${#only_globs[@]} = 0 ] && return 0
    for glob in "${only_globs[@]}"; do
        # shellcheck disable=SC2053  # (a glob, matched as one)
        [[ $1 == $glob ]] && named=$((named + 1)) && return 0
    done
    return 1
}

# part NAME ARGS...: train.py ARGS into runs/NAME (resuming the run there if there is one), its record then copied
# to docs/runs/NAME; nothing where that record is already there.
part() {
    local name=$1
    shift
    only "$name" || return 0
    if [ -f "docs/runs/$name/results.csv" ]; then
        echo "=== $name: recorded in docs/runs/$name (delete that folder to train it again)"
        return
    fi
    local resume=() parked="${PARKED:-/nonexistent}/$name" lock
    mkdir -p runs
    exec {lock}> "runs/.$name.lock"  # (train.py inherits it: the claim lasts as long as the training does)
    if ! flock -n "$lock"; then
        exec {lock}>&-
        echo "=== $name: another worker is training it (JOBS); skipped here"
        return 0
    fi
    if [ -f "docs/runs/$name/results.csv" ]; then  # recorded by the worker that held it a moment ago
        exec {lock}>&-
        return 0
    fi
    # parked on another machine (PARKED set): resume from there
    if [ -n "${PARKED:-}" ] && [ ! -d "runs/$name" ] && [ -f "$parked/config.yaml" ]; then
        if [ -L "$parked" ] || [ -n "$(find "$parked" ! -type f ! -type d -print -quit)" ]; then
            echo "error: $parked holds a link or a special file, where park leaves plain files only; delete it to" \
                "train $name anew" >&2
            exit 1
        fi
        mkdir -p runs
        cp -r "$parked" "runs/$name"
        echo "=== $name: resumed from $parked"
    fi
    [ -d "runs/$name" ] && resume=(--resume)  # a folder without config.yaml yet: train.py starts the run
    echo "=== $(date -u +%H:%M:%S) train.py $* --output runs/$name ${resume[*]}"
    "$PYTHON" train.py "$@" --output "runs/$name" "${resume[@]}"
    # the record copied whole into place: a worker joining the step never reads half a file
    rm -rf "docs/runs/.$name.tmp" "docs/runs/$name"
    mkdir -p "docs/runs/.$name.tmp"
    cp "runs/$name"/{config.yaml,log.csv,results.csv,results.md} "docs/runs/.$name.tmp/"
    mv "docs/runs/.$name.tmp" "docs/runs/$name"
    [ -n "${PARKED:-}" ] && rm -rf "$parked"
    exec {lock}>&-
    return 0
}

# park: each started, unrecorded part's resume state copied to $PARKED/<part>/ (checkpoints first, so
# that the log is never behind them: train.py drops a resumed log's rows past its checkpoint; a model's results.json
# where it has one).
park() {
    local run name tag root
    root=$(pwd -P)
    if [ -z "${PARKED:-}" ]; then
        echo "error: park needs PARKED=DIR, a folder outside the repository that outlives this machine" >&2
        exit 1
    fi
    mkdir -p "$PARKED"
    case "$(cd "$PARKED" && pwd -P)/" in
        "$root"/*)
            echo "error: PARKED=$PARKED is inside the repository; checkpoints belong outside it (git keeps none)" >&2
            exit 1
            ;;
    esac
    for run in runs/protocol_*/; do
        name=$(basename "$run")
        [ -f "$run/config.yaml" ] && [ ! -f "docs/runs/$name/results.csv" ] && only "$name" || continue
        rm -rf "${PARKED:?}/$name"
        for tag in "$run"*/; do
            [ -f "$tag/checkpoint.pt" ] || continue
            mkdir -p "$PARKED/$name/$(basename "$tag")"
            cp "$tag/checkpoint.pt" "$PARKED/$name/$(basename "$tag")/"
            # a model of the part that is trained and tested already keeps its results (train.py checks them)
            if [ -f "$tag/results.json" ]; then
                cp "$tag/results.json" "$PARKED/$name/$(basename "$tag")/"
            fi
        done
        cp "$run"/{config.yaml,log.csv} "$PARKED/$name/"
        echo "=== $name parked in $PARKED/$name: PARKED=$PARKED bash bench/benchmark.sh resumes it on any machine"
    done
    if [ ${#only_globs[@]} != 0 ] && [ $named = 0 ]; then
        echo "error: ONLY=$ONLY names no started, unrecorded part in runs/: nothing parked" >&2
        exit 1
    fi
}
if [ "${1:-}" = park ]; then
    park
    exit
fi

if [ "$JOBS" -gt 1 ]; then  # N workers of JOBS=1, each line of a worker's output led by its number
    workers=()
    for worker in $(seq "$JOBS"); do
        # (a command started with & ignores SIGINT; env restores it, so that Ctrl-C reaches every train.py)
        JOBS=1 THREADS=$OMP_NUM_THREADS env --default-signal=INT bash "$0" "$@" 2>&1 | sed -u "s/^/[$worker] /" &
        workers+=($!)
        sleep 1  # (in order: worker 1 claims the first part that is not recorded)
    done
    failed=0
    for pid in "${workers[@]}"; do
        wait "$pid" || failed=1
    done
    exit $failed
fi

# join STEP PARTS...: the parts' records joined into docs/runs/STEP, once every one of them is recorded.
join() {
    local step=$1 parts=() lock
    shift
    for name in "$@"; do
        [ -f "docs/runs/$name/results.csv" ] || return 0
        parts+=("docs/runs/$name")
    done
    mkdir -p runs
    exec {lock}> "runs/.$step.lock"  # (two workers reaching it at once join it one after the other)
    flock "$lock"
    "$PYTHON" bench/merge.py "${parts[@]}" --output "docs/runs/$step" > /dev/null
    exec {lock}>&-
    echo "=== $step: its parts joined in docs/runs/$step"
}

ELPV=1
if ! "$PYTHON" -c "import elpv_dataset" 2>/dev/null; then
    ELPV=0
    echo "=== skipping ELPV's parts: PyPI's elpv-dataset is missing (uv sync --inexact --extra elpv installs it)"
fi
elpv=(--config configs/protocol_elpv.yaml)
if [ $ELPV = 1 ]; then
    part protocol_elpv_s0-2 "${elpv[@]}" --seeds 0 1 2
    part protocol_elpv_s3-4 "${elpv[@]}" --seeds 3 4
    join protocol_elpv protocol_elpv_s0-2 protocol_elpv_s3-4
fi

papers=(--config configs/protocol_fashion_papers.yaml)
plain=(--config configs/protocol_fashion.yaml)  # the plain recipe twice as long, at every size: does it move?
part protocol_fashion_2x "${plain[@]}" --models vit_ape_tiny vit_rope_tiny --seeds 0 --epochs 20 --finetune-sizes
# recipe_part STEP EPOCHS NAME MODEL SEED [FLAGS...]: the papers' recipe EPOCHS long (4x, 8x or 16x its 10) with
# FLAGS, one model and seed a part, into runs/protocol_fashion_STEP_<EPOCHS/10>x_NAME_sSEED
recipe_part() {
    local step=$1 epochs=$2 name=$3 model=$4 seed=$5
    shift 5
    part "protocol_fashion_${step}_$((epochs / 10))x_${name}_s$seed" "${papers[@]}" "$@" --epochs "$epochs" \
        --models "$model" --seeds "$seed" --finetune-sizes
}
papers_part() { recipe_part papers "$@"; }  # papers_part EPOCHS NAME MODEL SEED: the recipe as it is
papers_part 40 ape vit_ape_tiny 0
papers_part 40 rope vit_rope_tiny 0
papers_part 40 mixed vit_rope_mixed_tiny 0
papers_part 80 ape vit_ape_tiny 0  # the 40-epoch runs' convergence check
papers_part 80 rope vit_rope_tiny 0

families=(--config configs/protocol_fashion_families.yaml)
families_a=(vit_ape_tiny vit_rope_tiny "vit_rope_tiny:rope_options={p: 0.75}" vit_spiral_tiny vit_goldengate_tiny)
families_b=(vit_string_tiny vit_liere_tiny vit_lookhere_tiny vit_pape_tiny)  # (the config's models, in two parts)
for seed in 0 1 2; do
    part "protocol_fashion_families_s${seed}a" "${families[@]}" --models "${families_a[@]}" --seeds "$seed"
    part "protocol_fashion_families_s${seed}b" "${families[@]}" --models "${families_b[@]}" --seeds "$seed"
done
join protocol_fashion_families protocol_fashion_families_s{0,1,2}{a,b}

# papers_8x SEEDS...: the papers' recipe at 80 epochs for its three models, a part a model and seed
papers_8x() {
    local seed
    for seed in "$@"; do
        papers_part 80 ape vit_ape_tiny "$seed"
        papers_part 80 rope vit_rope_tiny "$seed"
        papers_part 80 mixed vit_rope_mixed_tiny "$seed"
    done
}
papers_part 80 mixed vit_rope_mixed_tiny 0
papers_8x 1 2  # 3 seeds, then 5
join protocol_fashion_papers_8x_s0-2 protocol_fashion_papers_8x_{ape,rope,mixed}_s{0,1,2}
# crops_part EPOCHS NAME MODEL SEED: the papers' recipe without its multi-resolution training (every batch at 14 px):
# is APE's lead at 4x under the papers' recipe (+4.6 over axial RoPE at 80 epochs, 3 seeds) its table resampled to
# the 10- and 18-px grids in training? Paired with the papers' 40-epoch runs of seed 0 (~1.8 h a part, two at once)
crops_part() { recipe_part crops "$@" --train-sizes; }
crops_part 40 ape vit_ape_tiny 0
crops_part 40 rope vit_rope_tiny 0
papers_8x 3 4
join protocol_fashion_papers_8x protocol_fashion_papers_8x_{ape,rope,mixed}_s{0,1,2,3,4}
# originals_part EPOCHS NAME MODEL SEED: the papers' recipe with each batch's images drawn from their originals at the
# batch's size, not its 14-px crops resized (an 18-px batch then holds 18 px of detail, as a large batch cropped from
# ImageNet's larger originals does): does a gain above the training size appear? Paired with the papers' 40-epoch runs
# of seed 0 (the same crops in the same order from the same initial weights; ~1.8 h a part)
originals_part() { recipe_part originals "$@" --train-sizes-from originals; }
originals_part 40 ape vit_ape_tiny 0
originals_part 40 rope vit_rope_tiny 0
originals_part 40 mixed vit_rope_mixed_tiny 0  # RoPE-Mixed's paper: its gain at 1.4-2x, from ImageNet's originals
join protocol_fashion_originals_4x protocol_fashion_originals_4x_{ape,rope,mixed}_s0
# the 80-epoch runs' own convergence check (README's headline comes from this recipe: is it trained to capacity?):
# 160 epochs, ~4.4 h a part alone, ~5.8 h two at once: more than a sitting, so it resumes only on the same machine or
# from PARKED. After the originals, whose parts a sitting holds one at a time (~1.8 h a part alone on the slower
# machine of 2026-12-02): a machine that does not outlive its sitting, as on 2026-12-02 (its 160-epoch parts gone
# with it, unfinished), then still records a part (JOBS=1: two at once may finish neither in a sitting)
papers_part 160 ape vit_ape_tiny 0
papers_part 160 rope vit_rope_tiny 0
# the originals at 80 epochs, seeds 0-2, paired with the papers' 80-epoch runs of the same seeds: trained twice as
# long, at three seeds, does every model still gain above its training size (seed 0 at 40 epochs: at 1.14-1.43x), and
# is APE's lead at 4x still gone? ~2.3-3.8 h a part alone on the machine of 2026-12-02
for seed in 0 1 2; do
    originals_part 80 ape vit_ape_tiny "$seed"
    originals_part 80 rope vit_rope_tiny "$seed"
    originals_part 80 mixed vit_rope_mixed_tiny "$seed"
done
join protocol_fashion_originals_8x protocol_fashion_originals_8x_{ape,rope,mixed}_s{0,1,2}
# the crops alone at 80 epochs, seeds 0-2, paired with the papers' 80-epoch runs of the same seeds: is APE's lead at
# 4x (+4.5 over axial RoPE under YaRN, 5 seeds) the multi-size batches' at more seeds than seed 0's 40 epochs, and
# under every mode (there: 1.50 behind axial RoPE under normalized, 3.60 ahead under YaRN)? ~2.9 h a part, two at once
for seed in 0 1 2; do
    crops_part 80 ape vit_ape_tiny "$seed"
    crops_part 80 rope vit_rope_tiny "$seed"
done
join protocol_fashion_crops_8x protocol_fashion_crops_8x_{ape,rope}_s{0,1,2}

part protocol_fashion_s0-1 "${plain[@]}" --seeds 0 1
part protocol_fashion_s2-3 "${plain[@]}" --seeds 2 3
part protocol_fashion_s4 "${plain[@]}" --seeds 4
join protocol_fashion protocol_fashion_s0-1 protocol_fashion_s2-3 protocol_fashion_s4
part protocol_fashion_papers "${papers[@]}"

[ $ELPV = 1 ] && part protocol_elpv_2x "${elpv[@]}" --models vit_ape_tiny vit_rope_tiny --seeds 0 --epochs 160 \
    --eval-sizes 144 --finetune-sizes
if [ ${#only_globs[@]} != 0 ] && [ $named = 0 ]; then
    echo "error: ONLY=$ONLY names no part; a part's name is its run folder's, as runs/<part> and docs/runs/<part>" >&2
    exit 1
fi
echo "=== $(date -u +%H:%M:%S) done"
