#!/usr/bin/env bash
# Create bench/.venv-plot, the soak run's plotting virtualenv (matplotlib only;
# bench/soak.py --plot-only runs in it). Never a dependency of the project.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
venv=.venv-plot
if [[ -x $venv/bin/python ]] && "$venv/bin/python" -c "import matplotlib" 2>/dev/null; then
    exit 0
fi
rm -rf "$venv"
if command -v python3.11 >/dev/null 2>&1; then base_python=python3.11; else base_python=python3; fi
echo "plot-venv.sh: creating bench/$venv with matplotlib"
"$base_python" -m venv "$venv"
"$venv/bin/python" -m pip install --disable-pip-version-check --quiet "matplotlib==3.9.*"
