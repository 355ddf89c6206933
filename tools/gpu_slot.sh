#!/usr/bin/env bash
# One command of a GPU slot (issue 29) on an offline machine that has its own CUDA torch.
#
#   tools/gpu_slot.sh install             wheels in .whl/ -> /tmp/site, on sys.path by a .pth file
#   tools/gpu_slot.sh verdict GROUP ARGS   env, bf16 matmul rate, pytest tests/gpu -m gpu ARGS
#   tools/gpu_slot.sh ladder MODEL LADDER STEP [STEP...]   one `ladder --only` piece, weights=random
#
# Every subcommand installs first if this machine has not been set up yet, so each command stands
# alone when the machine was given back in between. What it measured is copied under $OUT (the
# device tool brings that folder back): logs, junit XML, and a tarball of out/gpu/ (results.jsonl,
# images, charts). A .pth file rather than PYTHONPATH: a notebook kernel started with its own
# environment would not see PYTHONPATH-only packages.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TQDM_DISABLE=1
OUT=${OUT:-out/gpu-slot}
mkdir -p "$OUT" out/gpu

install() {
  [ -f /tmp/site/.fastdiff-installed ] && return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  printf '/tmp/site\n%s\n' "$PWD" > "$site/fastdiff-slot.pth"
  touch /tmp/site/.fastdiff-installed
}

bring_back() {  # results so far, whatever happened
  tar czf "$OUT/gpu-results.tgz" -C out gpu 2>/dev/null
}

install
case "${1:-}" in
  install) python3 -m fastdiff_helpers env ;;
  verdict)
    group=$2; shift 2
    python3 -m fastdiff_helpers env | tee "$OUT/env.txt"
    python3 -c 'import json, torch, fastdiff_helpers as f
rate = f.measure_matmul_tflops("cuda")
print(json.dumps({"bf16_matmul_tflops": round(rate, 1), "n": 8192, "iters": 20,
                  "device": torch.cuda.get_device_name(), "torch": torch.__version__}))' \
      | tee "out/gpu/matmul-$group.json"
    timeout "${T:-560}" python3 -m pytest tests/gpu -m gpu -q -rA -p no:cacheprovider \
      --junitxml="out/gpu/junit-$group.xml" "$@" 2>&1 | tee "out/gpu/pytest-$group.log"
    ;;
  ladder)
    model=$2 ladder=$3; shift 3
    only=(); for s in "$@"; do only+=(--only "$s"); done
    timeout "${T:-570}" python3 -m fastdiff_helpers ladder --model "$model" --weights random \
      --ladder "$ladder" --device cuda --no-progress --out "out/gpu/$model-$ladder" "${only[@]}" \
      2>&1 | tee -a "out/gpu/$model-$ladder.log"
    ;;
  *) echo "usage: tools/gpu_slot.sh install | verdict GROUP [pytest args] | ladder MODEL LADDER STEP..." >&2; exit 2 ;;
esac
bring_back
