#!/usr/bin/env bash
# A PNG of a `kiln report` page, as a person sees it, from headless Chromium (Debian's
# `chromium` package, installed when missing; root or sudo needed for that).
#
#   scripts/report-screenshot.sh runs/quickstart/report.html [report.png] [width] [height]
set -euo pipefail
html=${1:?usage: report-screenshot.sh REPORT.html [OUT.png] [WIDTH] [HEIGHT]}
out=${2:-${html%.html}.png}
width=${3:-1600}
height=${4:-4000}
[ -f "$html" ] || { echo "no such file: $html" >&2; exit 2; }
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then
  echo "installing chromium (apt-get)..." >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
  browser=$(command -v chromium)
fi
abs=$(cd "$(dirname "$html")" && pwd)/$(basename "$html")
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars \
  --window-size="$width,$height" --screenshot="$out" "file://$abs" 2>/dev/null
echo "wrote $out"
