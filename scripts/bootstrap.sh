#!/usr/bin/env bash
# Prepare a fresh Debian machine for the tests and the local demo. Safe to run again:
# each step is skipped when its result is already there.
#   1. apt packages: rabbitmq-server, redis-server, postgresql (the result sink's tests start
#      their own server from /usr/lib/postgresql/<version>/bin), docker-compose (the v1 client, used
#      only to validate docker-compose.yml), kubectl (Debian's kubernetes-client: `kubectl
#      kustomize` renders deploy/k8s in tests/test_deploy.py), nginx (with its brotli filter),
#      tinyproxy and dante-server (the real web's proxy tests), strace (the local-mode
#      secrets test), chromium and chromium-driver (the web UI's browser tests), gcc and
#      python3-dev (step 3), python3-venv when venv is unavailable, and python3 itself when .venv is to be made and
#      /usr/bin/python3 is missing.
#   2. .venv with requirements-dev.lock: every package pinned with its sha256 hashes, checked by
#      pip (--require-hashes), wheels only; re-installed only when a lock changes. The locks are
#      generated from requirements.txt and requirements-dev.txt (see requirements.txt's header).
#      .venv is made on the oldest supported Python at hand, so that the suite (and CI, a fresh
#      Debian 12 whose `python3` on PATH is a newer pyenv build) proves it: the distribution's
#      /usr/bin/python3 (Debian 12: 3.11.2, Ubuntu 24.04: 3.12) when it is 3.11 or later, else
#      `python3` on PATH. FLEET_PYTHON=/path/to/python chooses another. An existing .venv is kept
#      whatever it runs on (it says so); `rm -rf .venv` and run again to make it anew.
#   3. The C text measures built into the checkout (python -m common.ops.native).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { echo "bootstrap: $*"; }

have() { command -v "$1" >/dev/null 2>&1; }

missing=()
[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || missing+=(rabbitmq-server)
have redis-server || [ -x /usr/bin/redis-server ] || missing+=(redis-server)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)
have docker-compose || missing+=(docker-compose)
have kubectl || missing+=(kubernetes-client)
have nginx || [ -x /usr/sbin/nginx ] || missing+=(nginx)
# The real web's tests (docs/real-web.md): nginx's brotli filter, an HTTP proxy and a SOCKS one.
[ -e /usr/lib/nginx/modules/ngx_http_brotli_filter_module.so ] || missing+=(libnginx-mod-http-brotli-filter)
have tinyproxy || [ -x /usr/bin/tinyproxy ] || missing+=(tinyproxy)
[ -x /usr/sbin/danted ] || missing+=(dante-server)
have strace || missing+=(strace)  # tests/ops/test_local_secrets.py traces every execve
# The C text measures (common/work/_text_measure.c, NOTES #83), built below into the checkout.
have cc || missing+=(gcc)
# Python.h of the Python .venv has or will have: the distribution's (under /usr/include) comes
# with python3-dev; another Python's headers are its own business (the build then says so).
headers_of() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null; }
for py in .venv/bin/python /usr/bin/python3; do
    if [ -x "$py" ]; then
        include="$(headers_of "$py")"
        [ -e "$include/Python.h" ] || [ "${include#/usr/include/}" = "$include" ] \
            || missing+=(python3-dev)
        break
    fi
done
# The web UI's browser tests (tests/api/test_ui_browser.py) drive Debian's Chromium through
# Selenium with this chromedriver: no browser is ever downloaded.
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
# The Python to make .venv with (see the header); the oldest supported is 3.11
# (pyproject.toml's requires-python).
python_ok() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; }
pick_python() {
    if [ -n "${FLEET_PYTHON:-}" ]; then
        python_ok "$FLEET_PYTHON" || {
            echo "bootstrap: FLEET_PYTHON=$FLEET_PYTHON is not a Python 3.11 or later" >&2
            exit 1
        }
        venv_python=$FLEET_PYTHON
    elif python_ok /usr/bin/python3; then
        venv_python=/usr/bin/python3
    elif python_ok python3; then
        venv_python=python3
    else
        echo "bootstrap: need Python 3.11 or later: /usr/bin/python3 and python3 are older" >&2
        exit 1
    fi
}
venv_package=()
if [ ! -x .venv/bin/python ]; then
    if [ -z "${FLEET_PYTHON:-}" ] && [ ! -e /usr/bin/python3 ]; then
        venv_package=(python3 python3-venv)  # the distribution's own Python, with venv's pip
    else
        pick_python
        # Debian and Ubuntu ship venv's pip (ensurepip) for /usr/bin/python3 in python3-venv.
        "$venv_python" -c 'import ensurepip, venv' >/dev/null 2>&1 || venv_package=(python3-venv)
    fi
fi

if [ "${#missing[@]}" -gt 0 ] || [ "${#venv_package[@]}" -gt 0 ]; then
    sudo_cmd=()
    if [ "$(id -u)" -ne 0 ]; then
        if have sudo; then
            sudo_cmd=(sudo)
        else
            echo "bootstrap: need root or sudo to install: ${missing[*]} ${venv_package[*]}" >&2
            exit 1
        fi
    fi
    log "missing: ${missing[*]} ${venv_package[*]}; installing with apt-get"
    "${sudo_cmd[@]}" apt-get update
    # The packages' post-install may print "policy-rc.d denied execution of start" on a
    # machine without an init system: harmless, the tests start their own servers.
    # Only what is missing: a kubectl from another source owns /usr/bin/kubectl, which
    # kubernetes-client would collide with.
    "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y \
        "${missing[@]}" "${venv_package[@]}"
else
    log "rabbitmq-server, redis-server, postgresql, docker-compose, kubectl and chromium" \
        "are installed"
fi

pick_python
if [ ! -x .venv/bin/python ]; then
    log "creating .venv with $venv_python ($("$venv_python" --version))"
    "$venv_python" -m venv .venv
else
    version='import sys; print(sys.version.split()[0], "from", sys.base_prefix)'
    running="$(.venv/bin/python -c "$version")"
    wanted_python="$("$venv_python" -c "$version")"
    if [ "$running" = "$wanted_python" ]; then
        log ".venv exists (Python $running)"
    else
        log ".venv exists with Python $running, not $wanted_python ($venv_python):" \
            "kept; rm -rf .venv and run again to make it anew"
    fi
fi

stamp=.venv/.requirements-dev.sha256
wanted="$(cat requirements.lock requirements-dev.lock | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$wanted" ]; then
    log "installing requirements-dev.lock into .venv (hash-checked)"
    .venv/bin/pip install -q --disable-pip-version-check \
        --require-hashes --only-binary=:all: -r requirements-dev.lock
    echo "$wanted" > "$stamp"
else
    log "requirements-dev.lock already installed in .venv"
fi

# The fleet's C module, built in place (common/ops/native.py): the text measures' one pass,
# ~2x cheaper than the Python pass the fleet falls back to without it. Always rebuilt (0.3 s):
# its source may have changed since.
.venv/bin/python -m common.ops.native
