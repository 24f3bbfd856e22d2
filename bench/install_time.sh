#!/usr/bin/env bash
# How long the README's set-up takes on this machine: a fresh venv, an empty pip cache, a copy of this clone.
#
#     bash bench/install_time.sh            # prints one line per part, then the total; removes what it made
#
# It runs the README's `ci:test` block (what .ci/run runs) up to, not including, its test command, one part
# at a time ("python3 -m venv …", ". .venv/bin/activate", "python -m pip install -U pip", "pip install …"),
# in a temporary copy of the tracked files, with PIP_NO_CACHE_DIR=1 so nothing comes from an earlier
# download. The load average before and after is printed too: on a shared machine it moves every figure.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
block=$(awk '/<!-- ci:test -->/{armed=1; next} armed && /^```/{if (inside) exit; inside=1; next} inside {print}' \
    "$repo/README.md")
install=${block%% && python -m pytest*}
if [ -z "$install" ] || [ "$install" = "$block" ]; then
    echo "README.md's ci:test block does not end in '&& python -m pytest': $block" >&2
    exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/verlflow-install-XXXXXX")
trap 'rm -rf "$work"' EXIT
(cd "$repo" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar -cf - 2>/dev/null) \
    | tar -xf - -C "$work"
cd "$work"
export PIP_NO_CACHE_DIR=1

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs)"
echo "python: $(python3 --version 2>&1)"
total_start=$(date +%s.%N)
IFS=$'\n' read -r -d '' -a parts < <(printf '%s' "$install" | sed 's/ && /\n/g'; printf '\0')
for part in "${parts[@]}"; do
    start=$(date +%s.%N)
    # Sourcing the activate script must stay in this shell; everything else runs as the README writes it.
    eval "$part" > "$work/part.log" 2>&1 || { echo "failed: $part"; tail -20 "$work/part.log"; exit 1; }
    printf '%8.1f s  %s\n' "$(echo "$(date +%s.%N) - $start" | bc)" "$part"
done
printf '%8.1f s  total (%s)\n' "$(echo "$(date +%s.%N) - $total_start" | bc)" "$(pip --version | cut -d' ' -f1-2)"
echo "torch: $(python -c 'import torch; print(torch.__version__)')"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
