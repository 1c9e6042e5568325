#!/usr/bin/env bash
# Create or refresh bench/.venv-peers, the benchmark's own virtualenv for the
# peers (bench/requirements-peers.txt). pip runs again only when that file
# changed: bench/.venv-peers/.stamp holds its sha256, written after success.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"

venv=.venv-peers
stamp=$venv/.stamp

if [[ -n "${PYTHON:-}" ]]; then
    base_python=$PYTHON
elif command -v python3.11 >/dev/null 2>&1; then
    base_python=python3.11
else
    base_python=python3
fi

if [[ -e $venv ]] && ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    echo "peers-venv.sh: $venv is broken; recreating it"
    rm -rf "$venv"
fi
if [[ ! -e $venv ]]; then
    echo "peers-venv.sh: creating $venv with $(command -v "$base_python")"
    "$base_python" -m venv "$venv"
fi

want=$(sha256sum requirements-peers.txt | cut -d' ' -f1)
have=$(cat "$stamp" 2>/dev/null || true)
if [[ "$want" != "$have" ]]; then
    echo "peers-venv.sh: installing the peers into bench/$venv"
    rm -f "$stamp"
    "$venv/bin/python" -m pip install --disable-pip-version-check --quiet -r requirements-peers.txt
    echo "$want" >"$stamp"
else
    echo "peers-venv.sh: bench/$venv is up to date"
fi
