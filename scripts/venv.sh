#!/usr/bin/env bash
# Create or refresh the project's virtualenvs:
#
# - .venv: Python 3.11, Django 5.2 LTS and the package with the extras the
#   suite needs (`pip install -e '.[test,postgres,environ,tasks]'
#   'Django>=5.2,<6.0'`): the django-tasks backport, soniq 0.1.0 included;
# - .venv-django6: Python 3.12, Django 6.0 and the same extras but `tasks`
#   (`-e '.[test,postgres,environ]' 'Django>=6.0,<6.1'`): no django-tasks
#   backport, so the suite there proves the built-in django.tasks path;
# - .venv-soniq-0.2: Soniq 0.2 alone (tests/requirements-soniq-0.2.txt), for
#   the Soniq side of tests/test_soniq_interop.py. It cannot live in .venv,
#   which holds soniq 0.1.0.
#
# Usage: scripts/venv.sh [VENV...]    (default: all three, e.g. `scripts/venv.sh .venv-django6`)
#
# Interpreters:
# - .venv and .venv-soniq-0.2: $PYTHON if set, else python3.11 if present, else python3.
# - .venv-django6: $PYTHON_DJANGO6 if set, else the newest pyenv 3.12.x
#   ("$(pyenv root)"/versions/3.12.*), else python3.12 on PATH. It must be a
#   Python 3.12. Without one, under CI=true this is a failure (exit 1, with a
#   banner); elsewhere a loud warning, and .venv-django6 is not made (so
#   scripts/run-tests skips the Django 6.0 passes, loudly too).
#
# For each venv:
# - A venv whose python (or pip) does not run, or (.venv-django6) whose
#   python is not 3.12, is deleted and recreated.
# - pip runs again only when what it installs changed since the last
#   successful install: <venv>/.soniq-install-stamp holds a sha256 of the
#   input file (pyproject.toml, or the requirements file) together with the
#   pip arguments (so the Django pin and the extras), written only after pip
#   succeeded, so an interrupted install is retried.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

case "${CI:-}" in
    true | TRUE | True | 1 | yes) in_ci=1 ;;
    *) in_ci=0 ;;
esac

banner() {
    # A message that must not be missed in a long log.
    local line='!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!'
    printf '\n%s\n' "$line" >&2
    printf '!!! %s\n' "$@" >&2
    printf '%s\n\n' "$line" >&2
}

# The Django each venv tests against (part of the stamp: a new pin reinstalls).
DJANGO_5_PIN='Django>=5.2,<6.0'
DJANGO_6_PIN='Django>=6.0,<6.1'

find_python311() {
    if [[ -n "${PYTHON:-}" ]]; then
        echo "$PYTHON"
    elif command -v python3.11 >/dev/null 2>&1; then
        echo python3.11
    elif command -v python3 >/dev/null 2>&1; then
        echo python3
    else
        return 1
    fi
}

is_python312() {
    # True when $1 runs and is a CPython 3.12.
    "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1
}

find_python312() {
    local candidate root
    if [[ -n "${PYTHON_DJANGO6:-}" ]]; then
        if is_python312 "$PYTHON_DJANGO6"; then
            echo "$PYTHON_DJANGO6"
            return 0
        fi
        echo "venv.sh: PYTHON_DJANGO6=$PYTHON_DJANGO6 does not run as Python 3.12" >&2
        return 1
    fi
    if command -v pyenv >/dev/null 2>&1 && root=$(pyenv root 2>/dev/null); then
        # shellcheck disable=SC2012  # version directories, names only
        for candidate in $(ls -d "$root"/versions/3.12.* 2>/dev/null | sort -V -r); do
            if is_python312 "$candidate/bin/python"; then
                echo "$candidate/bin/python"
                return 0
            fi
        done
    fi
    # A pyenv shim named python3.12 exists even when no 3.12 is selected; it
    # counts only if it runs.
    if command -v python3.12 >/dev/null 2>&1 && is_python312 python3.12; then
        command -v python3.12
        return 0
    fi
    return 1
}

# ensure_venv VENV BASE_PYTHON INPUT WHAT PIP-INSTALL-ARGS...
#   Makes VENV usable (created with BASE_PYTHON) and runs `pip install
#   PIP-INSTALL-ARGS` in it unless the sha256 of the file INPUT and of the
#   arguments equals VENV's stamp. WHAT names the install in messages.
ensure_venv() {
    local venv=$1 base_python=$2 input=$3 what=$4
    shift 4
    local stamp=$venv/.soniq-install-stamp want have want_version

    # A venv is usable when its interpreter starts, has pip and is of the
    # base interpreter's major.minor version. Anything else (half-created
    # venv, base interpreter removed or upgraded away) is rebuilt.
    want_version=$("$base_python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [[ -e $venv ]] && ! { "$venv/bin/python" -c 'import sys; sys.exit("%d.%d" % sys.version_info[:2] != sys.argv[1])' "$want_version" &&
        "$venv/bin/python" -m pip --version; } >/dev/null 2>&1; then
        echo "venv.sh: $venv is broken, incomplete or not Python $want_version; recreating it"
        rm -rf "$venv"
    fi

    if [[ ! -e $venv ]]; then
        echo "venv.sh: creating $venv with $(command -v "$base_python") (Python $want_version)"
        # An interrupted `python -m venv` leaves no working pip (ensurepip runs
        # last), which the check above catches on the next run.
        "$base_python" -m venv "$venv"
    fi

    want=$("$venv/bin/python" - "$input" "$@" <<'PY'
import hashlib
import sys

digest = hashlib.sha256(open(sys.argv[1], "rb").read())
for argument in sys.argv[2:]:
    digest.update(b"\0" + argument.encode())
print(digest.hexdigest())
PY
)
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

want_venv() {
    # True when the caller asked for $1 (or asked for nothing in particular).
    local name
    [[ ${#requested[@]} -eq 0 ]] && return 0
    for name in "${requested[@]}"; do
        [[ ${name%/} == "$1" ]] && return 0
    done
    return 1
}

requested=("$@")
for name in "${requested[@]}"; do
    case ${name%/} in
        .venv | .venv-django6 | .venv-soniq-0.2) ;;
        *)
            echo "venv.sh: unknown venv $name (known: .venv .venv-django6 .venv-soniq-0.2)" >&2
            exit 2
            ;;
    esac
done

if want_venv .venv || want_venv .venv-soniq-0.2; then
    if ! python311=$(find_python311); then
        echo "venv.sh: neither python3.11 nor python3 found on PATH" >&2
        exit 1
    fi
fi

if want_venv .venv; then
    ensure_venv .venv "$python311" pyproject.toml "soniq-django with Django 5.2 and the backport" \
        -e '.[test,postgres,environ,tasks]' "$DJANGO_5_PIN"
fi

if want_venv .venv-django6; then
    if python312=$(find_python312); then
        ensure_venv .venv-django6 "$python312" pyproject.toml "soniq-django with Django 6.0" \
            -e '.[test,postgres,environ]' "$DJANGO_6_PIN"
    elif [[ $in_ci == 1 ]]; then
        banner "CI=true and no Python 3.12: the Django 6.0 passes cannot run." \
            "Set PYTHON_DJANGO6 to a Python 3.12, install one with pyenv, or put python3.12 on PATH." \
            "A missing Python 3.12 in CI is a failure, not a skip."
        exit 1
    else
        banner "No Python 3.12 found (PYTHON_DJANGO6, pyenv's 3.12.x, python3.12 on PATH):" \
            ".venv-django6 is not made and THE DJANGO 6.0 PASSES WILL BE SKIPPED." \
            "Set PYTHON_DJANGO6 to a Python 3.12 to run them."
    fi
fi

if want_venv .venv-soniq-0.2; then
    ensure_venv .venv-soniq-0.2 "$python311" tests/requirements-soniq-0.2.txt \
        "Soniq 0.2 (tests/requirements-soniq-0.2.txt)" -r tests/requirements-soniq-0.2.txt
fi
