#!/usr/bin/env bash
# One GPU check (issue 40): speed, memory, train.py and the model tests on one CUDA device, in under 9 minutes.
#
#     bash bench/gpu_check.sh                          # a GPU machine (one H100): torch and timm installed
#     DEVICE=cpu bash bench/gpu_check.sh               # the dry run: every step at tiny sizes on the CPU
#     OUT=/some/folder PYTHON=.venv/bin/python bash bench/gpu_check.sh
#     bash bench/gpu_check.sh benchmark                # the trained benchmark at ViT-Ti instead (see below)
#     bash bench/gpu_check.sh probe                    # the rotation kernel, RoPE against APE (about 4 min)
#
# `benchmark` runs configs/protocol_fashion_gpu.yaml (docs/results.md's protocol, ViT-Ti) on the Fashion-MNIST IDX
# files in data/fashion-mnist (git-ignored: copy them there and carry the folder to the GPU machine), within
# BENCH_BUDGET seconds (360): on one H100 (2026-11-27) its six models take about 12 minutes eager, so three run in one
# call (docs/speed.md). The speed check and the benchmark each fill one session's device time, not both. BENCH_ARGS
# adds train.py flags, e.g. the levers not yet timed on a GPU (the step is launch-bound, ~40 ms of ~2 ms arithmetic):
#
#     BENCH_ARGS="--models vit_ape_tiny vit_rope_tiny --compile" bash bench/gpu_check.sh benchmark
#
# `levers` times those levers on that config's axial RoPE, two epochs each (the first holds compiling, the second is
# the steady state), no evaluation: eager and --compile, at batch 256 (the config's) and 1024 (about 5 minutes).
# `probe` is the speed check's first steps (the rotation kernel alone, RoPE against APE eager) and our two models
# compiled, with the kernel and with PyTorch's rotation:
#
#     TOTAL_BUDGET=300 bash bench/gpu_check.sh probe
#
# It installs nothing but the wheels carried in .whl (git-ignored; e.g. timm>=1.0.31, which the package needs and the
# H100 image of 2026-11 lacks, with 1.0.29), into a private folder put first on PYTHONPATH:
#
#     echo /.whl/ >> .git/info/exclude; python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#         --platform manylinux2014_x86_64 -d .whl timm==1.0.31          # here; then carry .whl (and data/fashion-mnist)
#
# A timm older than the package takes stops the check at once, before any step (summary.txt says why); a step whose
# packages are missing (pytest for the tests; pyyaml, safetensors, tqdm, matplotlib for train.py) says so and is
# skipped. Every step has a time budget (`timeout`), and the whole run one (TOTAL_BUDGET seconds, 540 on a GPU): a step
# that hangs costs its budget, not the run, and a step that would start past the total is skipped with a note. The steps
# run cheapest and most telling first, the compiled benchmarks (the slowest to start) last. Each step's output is shown
# and kept in $OUT/<step>.log; train.py's run is $OUT/train; a summary of every step (exit status, seconds) ends the
# output and is $OUT/summary.txt.

set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
DEVICE=${DEVICE:-cuda}
MODE=${1:-speed}
case "$MODE" in
    speed | benchmark | probe | levers) ;;
    *) echo "usage: bash bench/gpu_check.sh [speed|benchmark|probe|levers]" >&2; exit 2 ;;
esac
OUT=${OUT:-/tmp/gpu_check}
PYTHON=${PYTHON:-$(command -v python || command -v python3)}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # the package from this checkout, installed or not
if compgen -G ".whl/*.whl" > /dev/null; then  # carried wheels, installed where nothing else looks
    SITE=${SITE:-/tmp/gpu_check_site}
    if "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
    then
        export PYTHONPATH="$ROOT:$SITE${PYTHONPATH#"$ROOT"}" && echo "installed into $SITE:" .whl/*.whl
    else
        echo "the wheels in .whl were not installed (above): every step uses what $PYTHON has"
    fi
fi
export PYTHONDONTWRITEBYTECODE=1                      # (nothing written into the checkout)
mkdir -p "$OUT"
if ! "$PYTHON" -c "import vit_rope" 2> "$OUT/import.log"; then  # e.g. the image's timm, no wheel carried
    { tail -n 1 "$OUT/import.log"; echo "the package does not import: nothing else runs"; } | tee "$OUT/summary.txt" >&2
    exit 1
fi

if [ "$DEVICE" = cpu ]; then  # the dry run: the same commands at tiny sizes, shallow models
    DRY=1; SCALE=4; TOTAL=${TOTAL_BUDGET:-1800}
    SIZE=32; BATCH=2; REPEATS=2; DEPTH=(--depth 1); DTYPE=bfloat16
else
    DRY=0; SCALE=1; TOTAL=${TOTAL_BUDGET:-540}
    SIZE=224; BATCH=128; REPEATS=10; DEPTH=(); DTYPE=bfloat16
fi

START=$SECONDS
SUMMARY=()

# step NAME BUDGET COMMAND...: run COMMAND under `timeout` (BUDGET seconds, times SCALE, cut to what the total
# leaves), its output shown and kept in $OUT/NAME.log; record its exit status (124: over its budget) and time.
step() {
    local name=$1 budget=$(($2 * SCALE)) left
    shift 2
    left=$((TOTAL - (SECONDS - START)))
    echo
    echo "=================== [$name] budget ${budget}s (${left}s of the total left)"
    echo "\$ $*"
    if [ "$left" -lt 20 ]; then
        echo "[$name] skipped: the total budget is spent"
        SUMMARY+=("$(printf '%-18s skipped (total budget spent)' "$name")")
        return
    fi
    [ "$budget" -gt "$left" ] && budget=$left
    local t0=$SECONDS
    timeout --kill-after=10 "$budget" "$@" 2>&1 | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]} took=$((SECONDS - t0))
    local verdict=ok
    [ "$rc" -ne 0 ] && verdict="FAILED (exit $rc)"
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && verdict="OVER BUDGET (killed after ${budget}s)"
    echo "=================== [$name] $verdict in ${took}s"
    SUMMARY+=("$(printf '%-18s %-40s %4ds' "$name" "$verdict" "$took")")
}

# skip NAME WHY: a step left out, with the reason in the summary.
skip() {
    echo
    echo "=================== [$1] skipped: $2"
    SUMMARY+=("$(printf '%-18s skipped: %s' "$1" "$2")")
}

# summary: every step's verdict and time, shown and kept in $OUT/summary.txt.
summary() {
    {
        echo
        echo "=================== summary ($DEVICE, $((SECONDS - START))s of ${TOTAL}s; logs in $OUT)"
        printf '%s\n' "${SUMMARY[@]}"
    } | tee "$OUT/summary.txt"
}

# missing MODULE...: the modules of these that this Python cannot import (empty: all there).
missing() {
    "$PYTHON" - "$@" <<'EOF'
import importlib.util, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))
EOF
}

# train_missing: what train.py lacks here (empty: nothing).
train_missing() {
    local need
    need=$(missing yaml safetensors tqdm matplotlib)
    [ -z "$need" ] || echo "$need missing"
}

# fashion_ready NAME: whether train.py can run configs/protocol_fashion_gpu.yaml here (its IDX files in $DATA, the
# packages train.py needs); if not, NAME is skipped with the reason.
fashion_ready() {
    DATA=${DATA:-data/fashion-mnist}
    if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
        skip "$1" "no Fashion-MNIST IDX files in $DATA (cp -r /usr/share/datasets/fashion-mnist data/)"
        return 1
    fi
    local need
    need=$(train_missing)
    [ -z "$need" ] || { skip "$1" "train.py: $need"; return 1; }
}

# ------------------------------------------------------------------------------------------------------- setup
step env 30 "$PYTHON" - <<EOF
import platform, torch, timm
print("python", platform.python_version(), "| torch", torch.__version__, "| timm", timm.__version__)
print("device $DEVICE:", torch.cuda.get_device_name(0) if "$DEVICE".startswith("cuda") else platform.machine())
if "$DEVICE".startswith("cuda"):
    assert torch.cuda.is_available(), "torch sees no CUDA device"
    free, total = torch.cuda.mem_get_info()
    print(f"GPU memory {total / 2**30:.0f} GiB ({free / 2**30:.0f} free); bf16 {torch.cuda.is_bf16_supported()}")
try:
    import triton
    print("triton", triton.__version__)
except ImportError:
    print("triton missing: the PyTorch rotation path, no fused kernel")
EOF
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv

# ----------------------------------------------- g. the trained benchmark at ViT-Ti (`benchmark`), then nothing else
if [ "$MODE" = benchmark ]; then
    if fashion_ready g_benchmark; then
        SMALL=()  # the dry run: 256 images, one epoch of a one-block model
        [ "$DRY" = 1 ] && SMALL=(--train-subset 256 --val-subset 64 --epochs 1 --batch-size 32 --workers 0
                                 --model-kwargs patch_size=2 depth=1 embed_dim=32 num_heads=2 --finetune-steps 2)
        step g_benchmark "${BENCH_BUDGET:-360}" "$PYTHON" train.py --config configs/protocol_fashion_gpu.yaml \
            --data-dir "$DATA" --device "$DEVICE" "${SMALL[@]}" ${BENCH_ARGS:-} --output "$OUT/benchmark" --overwrite
        [ -f "$OUT/benchmark/results.md" ] && cat "$OUT/benchmark/results.md"
    fi
    summary
    exit 0
fi

# ------------------------------- l. the benchmark config's epoch, eager and compiled, two batch sizes (`levers`)
if [ "$MODE" = levers ]; then
    if fashion_ready l_levers; then
        SMALL=()  # the dry run: 256 images of a one-block model
        [ "$DRY" = 1 ] && SMALL=(--train-subset 256 --val-subset 64 --workers 0
                                 --model-kwargs patch_size=2 depth=1 embed_dim=32 num_heads=2)
        for lever in "eager 256" "compile 256" "eager 1024" "compile 1024"; do
            set -- $lever
            FLAGS=(--batch-size "$2")
            [ "$1" = compile ] && FLAGS+=(--compile)
            step "l_${1}_$2" 150 "$PYTHON" train.py --config configs/protocol_fashion_gpu.yaml --data-dir "$DATA" \
                --device "$DEVICE" --models vit_rope_tiny --epochs 2 --eval-sizes 14 --rope-scaling none \
                --finetune-sizes "${SMALL[@]}" "${FLAGS[@]}" --output "$OUT/levers_${1}_$2" --overwrite
        done
        echo "seconds an epoch (epoch 1 holds compiling; log.csv's last column):"
        for f in "$OUT"/levers_*/log.csv; do [ -f "$f" ] && echo "$f: $(cut -d, -f8 "$f" | tail -n +2 | xargs)"; done
    fi
    summary
    exit 0
fi

# ------------------------------------------ r. the rotation kernel alone against a copy of the same bytes
ROTATION=(--device "$DEVICE" --dtype "$DTYPE" --batch "$BATCH")
[ "$DRY" = 1 ] && ROTATION+=(--repeats 25)
step r_rotation 45 "$PYTHON" bench/rotation.py "${ROTATION[@]}"

# ---------------------------------------------------- a. RoPE against APE, DeiT-III and timm's RoPE ViT, eager
BENCH=(--device "$DEVICE" --dtype "$DTYPE" --batch "$BATCH" --repeats "$REPEATS" "${DEPTH[@]}")
step a_rope_eager 60 "$PYTHON" bench/throughput.py "${BENCH[@]}" --sizes "$SIZE" --sections rope

# ----------------------- `probe`: our two models compiled, then nothing else (the rest is the speed check's)
if [ "$MODE" = probe ]; then
    # with the kernel (auto), then with PyTorch's rotation, which inductor can fuse (it does timm's: 0.91x APE)
    for path in auto torch; do
        step "a_ours_compiled_$path" 120 env VIT_ROPE_FUSED=$path "$PYTHON" bench/throughput.py "${BENCH[@]}" \
            --repeats $((REPEATS > 6 ? 6 : REPEATS)) --sizes "$SIZE" --sections rope --compile --ours-only
    done
    summary
    exit 0
fi

# -------------------------------------------------------------------------- b. every family against axial, eager
FAMILY_BATCH=$([ "$DRY" = 1 ] && echo "$BATCH" || echo 64)
step b_families 75 "$PYTHON" bench/throughput.py "${BENCH[@]}" --batch "$FAMILY_BATCH" --sizes "$SIZE" \
    --sections families

# ----------------------------------------------------------- d. peak memory of a train step, RoPE against APE
step d_memory 45 "$PYTHON" bench/memory.py --device "$DEVICE" --train --dtype "$DTYPE" --batch "$BATCH" \
    --sizes "$SIZE" --models vit_ape_small vit_rope_small

# ------------------------------------------------------------ f. the models' tests on the device (pytest)
NEED=$(missing pytest)
if [ -n "$NEED" ]; then
    skip f_tests "$NEED missing (this script installs nothing)"
else
    # the fused kernel compiled for the GPU (tests/conftest.py interprets Triton unless told otherwise)
    INTERPRET=$([ "$DEVICE" = cpu ] && echo 1 || echo 0)
    step f_tests 90 env TRITON_INTERPRET=$INTERPRET "$PYTHON" -m pytest -q -p no:cacheprovider --device "$DEVICE" \
        tests/test_device.py
fi

# ------------------------------------- e. train.py: a few hundred compiled, autocast train steps on synthetic data
NEED=$(train_missing)
if [ -n "$NEED" ]; then
    skip e_train "train.py: $NEED"
else
    if [ "$DRY" = 1 ]; then  # 4 steps of a one-block model
        TRAIN=(--models vit_rope_tiny --model-kwargs patch_size=8 depth=1 embed_dim=32 num_heads=2 --img-size 16
               --eval-sizes 16 --train-samples 128 --val-samples 32 --batch-size 32 --epochs 1 --workers 0)
    else  # 2 epochs of 160 steps of ViT-S at 32 px (64 tokens); the scenes are drawn by the CPU's workers
        WORKERS=$(($(nproc) > 13 ? 12 : $(nproc) - 1))
        TRAIN=(--models vit_rope_small --model-kwargs patch_size=4 --img-size 32 --eval-sizes 32
               --train-samples 10240 --val-samples 1024 --batch-size 64 --epochs 2 --workers "$WORKERS")
    fi
    step e_train 120 "$PYTHON" train.py --dataset synthetic --no-aug --no-native-eval --rope-scaling none \
        --warmup-epochs 1 --lr 1e-3 "${TRAIN[@]}" --device "$DEVICE" --compile --amp --output "$OUT/train" \
        --overwrite
    [ -f "$OUT/train/log.csv" ] && echo "log.csv:" && cat "$OUT/train/log.csv"
fi

# ---------------- h. where a compiled forward's time goes: the kernels of ours RoPE and APE, forward and train step
# (2026-11-27, one H100, after the pair kernel's row loads: compiled, our RoPE forward ran at 0.87x APE's, a train step
# at 0.90x; docs/speed.md)
step h_profile 120 "$PYTHON" bench/throughput.py --device "$DEVICE" --dtype "$DTYPE" --batch "$BATCH" --sizes "$SIZE" \
    "${DEPTH[@]}" --profile --compile

# -------------------------------------------------------------------------- a. the same, every model compiled
# (the H100 of 2026-11-27 compiled the four models in 154 s at 6 rounds; 10 rounds ran past 180 s)
step a_rope_compiled 200 "$PYTHON" bench/throughput.py "${BENCH[@]}" --repeats $((REPEATS > 6 ? 6 : REPEATS)) \
    --sizes "$SIZE" --sections rope --compile

# -------------------------------------------------------------------- c. NaFlex batches against images, compiled
step c_naflex 150 "$PYTHON" bench/naflex.py --device "$DEVICE" --dtype "$DTYPE" --batch "$BATCH" \
    --repeats "$REPEATS" "${DEPTH[@]}" --kinds rope --compile

summary
