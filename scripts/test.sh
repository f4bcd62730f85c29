#!/usr/bin/env bash
# The test command of the README and of CI: install the project and its test tools into
# .venv, install headless Chromium for the browser tests if it is missing, install msprobe
# (mindstudio-probe) in .venv-bench so a test runs msprobe's own compare on our dumps, run the
# whole suite, then run the MindSpore tests in their own venv (.venv-ms; mindspore needs numpy<2,
# so pyarrow<16 there).
#
#   bash scripts/test.sh                 # everything
#   PROBE_SKIP_MINDSPORE=1 bash scripts/test.sh   # skip the MindSpore stage
#   PROBE_SKIP_MSPROBE=1 bash scripts/test.sh     # skip installing msprobe for its acceptance test
#   bash scripts/test.sh -k compare      # extra arguments go to the main pytest run
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"

stage() { printf '\n== %s ==\n' "$*"; }

stage "install (.venv)"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 -e '.[dev,zoo]'
# the native helpers built once, ahead of the tests (a helper that cannot be built here is
# reported and its Python twin used: not a failure)
.venv/bin/python -m probe.native || true

if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  stage "install chromium (browser tests)"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
      || echo "chromium could not be installed: browser tests will skip"
  else
    echo "not root or no apt-get: browser tests will skip"
  fi
fi

if [ "${PROBE_SKIP_MSPROBE:-0}" != 1 ]; then
  stage "msprobe (.venv-bench): msprobe's own tools must accept our dumps"
  [ -x .venv-bench/bin/python ] || "$PY" -m venv .venv-bench
  .venv-bench/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 mindstudio-probe pyyaml \
    || echo "mindstudio-probe could not be installed: the msprobe acceptance test will skip"
  # the project itself, without its dependencies: benchmarks/bench_dump.py runs the bundled
  # engine under msprobe in this venv (probe.engine is importable only as installed)
  .venv-bench/bin/python -m pip install -q --disable-pip-version-check --no-deps -e . \
    || echo "the project could not be installed in .venv-bench: bench_dump's msprobe side will fail"
fi

stage "tests (the fast suite)"
.venv/bin/python -m pytest -q "$@"

stage "end-to-end tests (marked slow: real trainings, browsers on real runs, the README walk-through)"
.venv/bin/python -m pytest -q -m slow "$@"

stage "the zoo (marked zoo: Hugging Face models, LoRA, checkpointing, accumulation, compile under the dump)"
.venv/bin/python -m pytest -q -m zoo "$@"

if [ "${PROBE_SKIP_MINDSPORE:-0}" != 1 ]; then
  stage "mindspore tests (.venv-ms)"
  [ -x .venv-ms/bin/python ] || "$PY" -m venv .venv-ms
  if .venv-ms/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 -e '.[dev,mindspore]' mindstudio-probe; then
    # mindspore must load protobuf before the monitor's stubs do, or use the pure-Python protobuf
    PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python .venv-ms/bin/python -m pytest -q -m mindspore \
      -p no:cacheprovider || rc=$?
    # exit code 5 means no test was collected with the marker: not a failure of this stage
    if [ "${rc:-0}" != 0 ] && [ "${rc:-0}" != 5 ]; then exit "$rc"; fi
  else
    echo "mindspore could not be installed: its tests were skipped"
  fi
fi
