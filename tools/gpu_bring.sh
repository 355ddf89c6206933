#!/usr/bin/env bash
# Between two commands of a GPU slot, here (not on the device): bring what one command of
# tools/gpu_slot.sh measured into the tree and commit it, before the next command starts
# (the device copies the working tree afresh for every command, and a warm machine goes
# back 30 s after a command ends):
#
#   tools/gpu_bring.sh FILES_AT OUT "commit message"
#
# FILES_AT: the folder the device tool returned ($OUT's files: results.tgz, the logs,
# pip-freeze.txt); OUT: the reference run's folder (e.g. results/h200/sdxl-course). Unpacks
# results/<gpu>/ and results/README.md from results.tgz (records, reference.json, charts,
# images, tuning bundles), copies the logs and pip-freeze.txt into OUT, commits results/.
# The images of every step but the first are ignored by git: name OUT/images in the next
# command's carry so that a later fp32 step can fill in their quality.
set -euo pipefail
if [ $# -ne 3 ]; then
  echo "usage: tools/gpu_bring.sh FILES_AT OUT \"commit message\"" >&2
  exit 2
fi
src=$1 out=${2%/} message=$3
cd "$(dirname "$0")/.."
[ -f "$src/results.tgz" ] || { echo "gpu_bring: no results.tgz in $src" >&2; exit 1; }
case "$out" in
  results/*/*) gpu_root=$(dirname "$out") ;;
  *) echo "gpu_bring: OUT must be results/<gpu>/<folder>, got $out" >&2; exit 2 ;;
esac
tar xzf "$src/results.tgz" "$gpu_root"
tar xzf "$src/results.tgz" results/README.md 2>/dev/null || true
mkdir -p "$out"
for file in "$src"/*.log "$src"/pip-freeze.txt; do
  [ -f "$file" ] && cp "$file" "$out/"
done
git add results
git commit -q -m "$message"
git log --oneline -1
