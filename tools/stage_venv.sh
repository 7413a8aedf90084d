# Sourced by the test stages that need a cached venv (tools/test.d/*.sh):
#   . tools/stage_venv.sh
#   PY=$(stage_venv tools/venv.sh "Megatron-Core") || exit $?
# prints the venv's python; when the package registry cannot be reached
# (the venv script's exit 3) prints the stage's SKIPPED line to stderr and
# returns 100, on which the stage exits 0; any other failure is named and
# returns 1.
stage_venv() {  # VENV_SCRIPT WHAT
  local py rc stage
  stage=$(basename "$0")
  py=$("$1")
  rc=$?
  if [ "$rc" -eq 3 ]; then
    echo "SKIPPED tools/test.d/$stage: the Python package registry cannot be reached, so $2 cannot be installed" >&2
    return 100
  fi
  if [ "$rc" -ne 0 ]; then
    echo "tools/test.d/$stage: $1 failed (exit $rc)" >&2
    return 1
  fi
  echo "$py"
}
# The stage's exit status after `stage_venv` failed with $1: 0 for a skip.
stage_venv_exit() { [ "$1" -eq 100 ] && exit 0; exit "$1"; }
