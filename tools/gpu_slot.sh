#!/usr/bin/env bash
# One command of a GPU slot (issue 29) on an offline machine that has its own CUDA torch, run
# from the checkout's root with wheelhouse/ carried beside it (make wheelhouse HAVE=...):
#
#   tools/gpu_slot.sh install                       install the wheelhouse once, print env
#   tools/gpu_slot.sh verdict GROUP [pytest args]   bf16 matmul rate, pytest tests/gpu -m gpu ARGS
#   tools/gpu_slot.sh reference MODEL [LADDER [ARGS]]  python3 -m tools.reference, budgeted
#                                                   (ARGS: e.g. --ignore-estimate; --autotune to
#                                                   let its compiled steps tune: without it they
#                                                   compile in default mode, issue 44)
#   tools/gpu_slot.sh tune MODEL STEP PART [LADDER] python -m fastdiff_helpers warm --only STEP
#                                                   --part PART (denoiser | vae | all) --autotune:
#                                                   tune one part of one compiled step
#
# Tuning is data (fastdiff_helpers/course/compiletime/bundle.py): warm and reference import every committed
# bundle of this GPU kind and torch build (results/*/tuning/<torch>/*.json.gz) before compiling,
# and grow results/<gpu>/tuning/<torch>/<model>.json.gz while they tune (every 30 s, at the end,
# and on the SIGTERM that `timeout` sends at T seconds), beside <model>.progress.json (where the
# time went). Both are copied under $OUT/tuning-<gpu>/ after every command, beside
# $OUT/cache-raw.tgz (the compile cache's timings file and best configs as they are: the
# by-hand fallback, committed as results/<gpu>/tuning/<torch>/<model>.cache-raw.tgz only when
# the bundle could not be written; import_matching takes it first): commit them before the
# next command starts.
#
# Between two commands, here: tools/gpu_bring.sh FILES_AT results/<gpu>/<folder> "message"
# unpacks what came back into the tree and commits it, before the next command starts.
#
# Every subcommand installs first if this machine has not been set up yet, so each command stands
# alone when the machine was given back in between. What it measured is copied under $OUT (the
# device tool brings that folder back): the machine's pip freeze, logs, junit XML, and a tarball
# of results/ (records, reference.json, charts, images). T= sets the time limit in seconds
# (default 540, inside the device's 10 minutes).
set -u -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TQDM_DISABLE=1
OUT=${OUT:-out/gpu-slot}
LOGS=out/gpu
mkdir -p "$OUT" "$LOGS"

install() {
  [ -f /tmp/site/.fastdiff-installed ] && return 0
  bash wheelhouse/install.sh --target /tmp/site || exit 1
  python3 -m pip freeze > "$OUT/pip-freeze.txt" 2>/dev/null
  touch /tmp/site/.fastdiff-installed
}

bring_back() {  # what this machine measured and tuned so far, whatever happened
  cp "$LOGS"/*.log "$LOGS"/*.xml "$OUT"/ 2>/dev/null
  tar czf "$OUT/results.tgz" results 2>/dev/null
  # the bundles and progress files as plain files too (small, committed as they are), one
  # folder down: the device tool brings back two levels and no '+' (the torch folder's name)
  for file in results/*/tuning/*/*.json.gz results/*/tuning/*/*.progress.json; do
    [ -f "$file" ] || continue
    gpu=$(basename "$(dirname "$(dirname "$(dirname "$file")")")")
    mkdir -p "$OUT/tuning-$gpu" && cp "$file" "$OUT/tuning-$gpu/"
  done
  local cache
  cache=$(python3 -c 'from fastdiff_helpers.course.planning.compile_cache import use_course_cache
print(use_course_cache(verbose=False))' 2>/dev/null) || return 0
  if [ -d "$cache/cache" ]; then
    (cd "$cache" && { find ./cache -type f; find . -name '*.best_config'; } > /tmp/raw-list.txt \
      && tar czf "$OUT/cache-raw.tgz" -T /tmp/raw-list.txt)
  fi
  return 0
}

install
status=0
case "${1:-}" in
  install) python3 -m fastdiff_helpers env ;;
  verdict)
    group=$2; shift 2
    python3 -m fastdiff_helpers env | tee "$OUT/env.txt"
    python3 -c 'import json, torch, fastdiff_helpers as f
print(json.dumps({"bf16_matmul_tflops": round(f.measure_matmul_tflops("cuda"), 1), "n": 8192,
                  "iters": 20, "device": torch.cuda.get_device_name(), "torch": torch.__version__}))' \
      | tee -a "$LOGS/matmul.jsonl"
    python3 -m fastdiff_helpers tuning import --matching results
    # the compiles of the tests grow a bundle of their own (tests/conftest.py)
    FASTDIFF_KEEP_TUNING=$(python3 -c 'from fastdiff_helpers.course.compiletime.bundle import bundle_path
print(bundle_path("gpu-tests"))') timeout -k 20 "${T:-540}" python3 -m pytest tests/gpu -m gpu \
      -q -rA -p no:cacheprovider --junitxml="$LOGS/junit-$group.xml" "$@" 2>&1 \
      | tee "$LOGS/pytest-$group.log"
    ;;
  reference)
    # LADDER left out: the model's own (blog for the four models the blog ran, flux for Flux)
    model=$2 ladder=${3:-}; shift; shift; [ $# -gt 0 ] && shift
    # the run's own budget ends first; timeout's SIGTERM (then SIGKILL 20 s later) is the backstop
    timeout -k 20 $(( ${T:-540} + 20 )) python3 -m tools.reference --model "$model" \
      ${ladder:+--ladder "$ladder"} --weights random --device cuda --no-progress \
      --budget-s "${T:-540}" "$@" 2>&1 | tee -a "$LOGS/reference-$model-${ladder:-own}.log"
    ;;
  tune)
    model=$2 step=$3 part=$4 ladder=${5:-}
    timeout -k 20 "${T:-540}" python3 -m fastdiff_helpers warm --model "$model" \
      ${ladder:+--ladder "$ladder"} --weights random --device cuda --no-progress \
      --only "$step" --part "$part" --autotune \
      2>&1 | tee -a "$LOGS/tune-$model.log"
    ;;
  *) echo "usage: tools/gpu_slot.sh install | verdict GROUP [pytest args] | reference MODEL [LADDER [ARGS]] | tune MODEL STEP PART [LADDER]" >&2
     exit 2 ;;
esac
status=$?  # the command's own (pipefail: not tee's), whatever bring_back does
bring_back
exit $status
