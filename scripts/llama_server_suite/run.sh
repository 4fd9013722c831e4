#!/usr/bin/env bash
# Runs llama.cpp's own server test suite (tools/server/tests of a llama.cpp tree) against `lamina serve`
# and prints passed / failed / skipped per file.
#
#   bash scripts/llama_server_suite/run.sh LLAMA_CPP_TREE [TEST_FILE...] [-- PYTEST_ARGS...]
#
# TEST_FILE defaults to the files whose models have local stand-ins (see lamina_suite_plugin.py).
# Needs: build/release/lamina, ../shared/models, Debian's python3-pytest python3-requests
# python3-numpy python3-aiohttp python3-prometheus-client python3-wget, and the `openai` Python
# package importable (PYTHONPATH) for the files that use it. Results: build/llama-suite/
# (LLAMA_SUITE_OUT to change); PORT sets the server's port (the suite's default 8080).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
tree="${1:?usage: run.sh LLAMA_CPP_TREE [TEST_FILE...] [-- PYTEST_ARGS...]}"
shift
tests_dir="$(cd "$tree/tools/server/tests" && pwd)"
files=()
while [[ $# -gt 0 && "$1" != "--" ]]; do files+=("unit/$1"); shift; done
[[ "${1:-}" == "--" ]] && shift
if [[ ${#files[@]} -eq 0 ]]; then
  for f in basic chat_completion completion ctx_shift ignore_eos security slot_save speculative tokenize; do
    files+=("unit/test_$f.py")
  done
fi
lamina="${LAMINA:-$repo/build/release/lamina}"
[[ -x "$lamina" ]] || { echo "run.sh: $lamina not built (cmake --build build/release --target lamina)" >&2; exit 2; }
out="${LLAMA_SUITE_OUT:-$repo/build/llama-suite}"
mkdir -p "$out"
shim="$out/llama-server"
printf '#!/bin/sh\nexec "%s" serve "$@"\n' "$lamina" > "$shim"
chmod +x "$shim"

commit="$(git -C "$tree" rev-parse --short HEAD 2>/dev/null || cat "$tree/COMMIT" 2>/dev/null || echo unknown)"
echo "llama.cpp tests from $tree ($commit), server: $lamina"
cd "$tests_dir"
set +e
LLAMA_SERVER_BIN_PATH="$shim" LLAMA_SUITE_TESTS_DIR="$tests_dir" LAMINA_REPO_ROOT="$repo" \
  PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1 \
  /usr/bin/python3 -m pytest -p lamina_suite_plugin -p no:cacheprovider -q -rfs \
  --junitxml="$out/junit.xml" "${files[@]}" "$@" > "$out/pytest.log" 2>&1
rc=$?
set -e
tail -n 60 "$out/pytest.log"
/usr/bin/python3 - "$out/junit.xml" <<'PY'
import collections, sys, xml.etree.ElementTree as ET
counts = collections.OrderedDict()
for case in ET.parse(sys.argv[1]).iter("testcase"):
    name = case.get("classname", "").split(".")[-1]
    c = counts.setdefault(name, [0, 0, 0])
    if case.find("failure") is not None or case.find("error") is not None: c[1] += 1
    elif case.find("skipped") is not None: c[2] += 1
    else: c[0] += 1
print(f"{'file':<22} passed failed skipped")
for name, (p, f, s) in counts.items():
    print(f"{name:<22} {p:>6} {f:>6} {s:>7}")
t = [sum(v[i] for v in counts.values()) for i in range(3)]
print(f"{'total':<22} {t[0]:>6} {t[1]:>6} {t[2]:>7}")
PY
exit $rc
