#!/usr/bin/env bash
# Quick developer build of the Cython modules into a scratch tree, without meson,
# for iterating while other modules are in flux:  tools/dev_build.sh [outdir]
# then PYTHONPATH=<outdir> python ...   (default outdir /tmp/gexmk-dev)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-/tmp/gexmk-dev}
mkdir -p "$out/gexmk" "$out/.c"
suffix=$(python3-config --extension-suffix)
for f in "$root"/gexmk/*.py "$root"/gexmk/*.pxd "$root"/gexmk/*.pyi "$root"/gexmk/py.typed; do
  [ -e "$f" ] && ln -sf "$f" "$out/gexmk/"
done
ln -sfn "$root/include" "$out/gexmk/include"
ln -sfn "$root/gexmk/lib" "$out/gexmk/lib" 2>/dev/null || true
for m in memory core; do
  cython -3 -X boundscheck=False -X wraparound=False -X cdivision=True -I "$root" \
    "$root/gexmk/$m.pyx" -o "$out/.c/$m.c"
  gcc -O2 -shared -fPIC $(python3-config --includes) -I"$root/include" "$out/.c/$m.c" \
    -o "$out/gexmk/$m$suffix"
done
if [ -e "$root/gexmk/ofi.pyx" ]; then
  cython -3 -I "$root" "$root/gexmk/ofi.pyx" -o "$out/.c/ofi.c" && \
  gcc -O2 -shared -fPIC $(python3-config --includes) -I"$root/include" "$out/.c/ofi.c" \
    -o "$out/gexmk/ofi$suffix" -lfabric || echo "dev_build: ofi module skipped" >&2
fi
echo "built into $out"
