#!/usr/bin/env bash
# Creates (or reuses) the Python virtual environment of the framework and
# Python tests under build/venv, with the packages of tools/requirements.txt
# (RESHARD_VENV and RESHARD_VENV_REQUIREMENTS choose another: tools/vllm_venv.sh).
# The environment is cached: it is rebuilt only when the requirements file
# changes. A requirement whose line ends in "# no-deps" is installed alone,
# after the others, without its dependencies.
# Prints the venv's python (an absolute path) on stdout. Exit 3 when the package registry cannot
# be reached (callers skip with a message); any other failure exits 1.
#
#   PY=$(tools/venv.sh) && "$PY" -c 'import megatron.core'
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(realpath -m "${RESHARD_VENV:-build/venv}")  # absolute: callers change directory
req=${RESHARD_VENV_REQUIREMENTS:-tools/requirements.txt}
name=$(basename "$venv")
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$req" | cut -d' ' -f1)
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9  # one creator at a time; the others wait and reuse its result
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "$venv/bin/python"; exit 0
fi
# Python 3.12 (the machine's pyenv) if there is one, else Debian's python3.
py=""
for c in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12; do
  if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import venv' >/dev/null 2>&1; then py=$(command -v "$c"); break; fi
done
if [ -z "$py" ]; then
  if ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >&2
  fi
  py=$(command -v python3)
fi
echo "$name: creating $venv with $("$py" --version 2>&1) ($py)" >&2
rm -rf "$venv"
"$py" -m venv "$venv" >&2
if ! "$venv/bin/python" -m pip download --no-deps -q -d /tmp/reshard-probe "pytest" >/dev/null 2>&1; then
  echo "$name: the Python package registry cannot be reached" >&2
  rm -rf "$venv"; exit 3
fi
start=$(date +%s)
grep -v -- '# no-deps$' "$req" > "$venv/requirements.txt" || true
"$venv/bin/python" -m pip install -q -r "$venv/requirements.txt" >&2
# (grep exits 1 when no line matches: not a failure here)
{ grep -- '# no-deps$' "$req" || true; } | sed 's/#.*//' | while read -r alone; do
  "$venv/bin/python" -m pip install -q --no-deps "$alone" >&2
done
echo "$name: installed $req in $(( $(date +%s) - start )) s" >&2
echo "$want" > "$stamp"
echo "$venv/bin/python"
