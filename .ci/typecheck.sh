#!/usr/bin/env bash
# mypy over the installed package layout. kernels/, search_spaces/ and cost_models/ install as tuner.kernels,
# tuner.search_spaces and tuner.cost_models (pyproject's package-dir), which mypy cannot map by itself, so it
# checks a throw-away tree of symlinks with that layout. Usage: .ci/typecheck.sh [PYTHON]  (default: python3)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-python3}
case "$py" in */*) py="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")" ;; esac
repo=$PWD
shadow=$(mktemp -d)
trap 'rm -rf "$shadow"' EXIT
mkdir "$shadow/tuner"
for e in tuner/*; do ln -s "$repo/$e" "$shadow/tuner/"; done
for s in kernels search_spaces cost_models; do ln -s "$repo/$s" "$shadow/tuner/$s"; done
cd "$shadow"
# Report paths as they are in the repository.
"$py" -m mypy --config-file "$repo/pyproject.toml" --cache-dir "$repo/.mypy_cache" -p tuner 2>&1 |
  sed -e 's#^tuner/kernels/#kernels/#' -e 's#^tuner/search_spaces/#search_spaces/#' -e 's#^tuner/cost_models/#cost_models/#'
exit "${PIPESTATUS[0]}"
