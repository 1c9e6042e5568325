#!/usr/bin/env bash
# Create or refresh the project's virtualenvs:
#
# - .venv: the package with its test extras (`pip install -e '.[test]'`),
#   soniq 0.1.0 included;
# - .venv-soniq-0.2: Soniq 0.2 alone (tests/requirements-soniq-0.2.txt), for
#   the Soniq side of tests/test_soniq_interop.py. It cannot live in .venv,
#   which holds soniq 0.1.0.
#
# For each:
# - The interpreter is $PYTHON if set, else python3.11 if present, else python3.
# - A venv whose python (or pip) does not run is deleted and recreated.
# - pip runs again only when its input file (pyproject.toml, or the
#   requirements file) changed since the last successful install:
#   <venv>/.soniq-install-stamp holds the sha256 of that file, written only
#   after pip succeeded, so an interrupted install is retried.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ -n "${PYTHON:-}" ]]; then
    base_python=$PYTHON
elif command -v python3.11 >/dev/null 2>&1; then
    base_python=python3.11
elif command -v python3 >/dev/null 2>&1; then
    base_python=python3
else
    echo "venv.sh: neither python3.11 nor python3 found on PATH" >&2
    exit 1
fi

# ensure_venv VENV INPUT WHAT PIP-INSTALL-ARGS...
#   Makes VENV usable and runs `pip install PIP-INSTALL-ARGS` in it unless
#   the sha256 of the file INPUT equals VENV's stamp. WHAT names the install
#   in messages.
ensure_venv() {
    local venv=$1 input=$2 what=$3
    shift 3
    local stamp=$venv/.soniq-install-stamp want have

    # A venv is usable when its interpreter starts and has pip. Anything else
    # (half-created venv, base interpreter removed or upgraded away) is rebuilt.
    if [[ -e $venv ]] && ! { "$venv/bin/python" -c 'import sys' && "$venv/bin/python" -m pip --version; } >/dev/null 2>&1; then
        echo "venv.sh: $venv is broken or incomplete; recreating it"
        rm -rf "$venv"
    fi

    if [[ ! -e $venv ]]; then
        echo "venv.sh: creating $venv with $(command -v "$base_python")"
        # An interrupted `python -m venv` leaves no working pip (ensurepip runs
        # last), which the check above catches on the next run.
        "$base_python" -m venv "$venv"
    fi

    want=$("$venv/bin/python" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$input")
    have=$(cat "$stamp" 2>/dev/null || true)

    if [[ "$want" != "$have" ]]; then
        echo "venv.sh: installing $what into $venv"
        rm -f "$stamp"
        "$venv/bin/python" -m pip install --disable-pip-version-check --quiet "$@"
        echo "$want" >"$stamp"
    else
        echo "venv.sh: $venv is up to date"
    fi
}

ensure_venv .venv pyproject.toml "soniq-django with test extras" -e '.[test,postgres,environ,tasks]'
ensure_venv .venv-soniq-0.2 tests/requirements-soniq-0.2.txt "Soniq 0.2 (tests/requirements-soniq-0.2.txt)" \
    -r tests/requirements-soniq-0.2.txt
