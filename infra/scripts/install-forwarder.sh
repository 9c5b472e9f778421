#!/usr/bin/env bash
# Install or update the Scheduled Events Bridge forwarder on one Linux VM. Run as root; the
# Custom Script Extension (infra/modules/forwarder-*.bicep) runs it, and so can you.
#
# Idempotent: rerunning upgrades the package, rewrites the configuration and restarts the
# service. The command is linked as /usr/local/sbin/sebridge (on root's PATH, sudo's too). Configuration comes from the environment, never from arguments, so nothing ends up
# in `ps` output or shell history; and nothing secret is accepted at all: the forwarder signs
# in with the VM's user-assigned managed identity.
#
#   SEBRIDGE_NAMESPACE   required  Service Bus namespace FQDN (sbns-x.servicebus.windows.net)
#   AZURE_CLIENT_ID      required  client id of the forwarders' user-assigned identity
#   SEBRIDGE_PACKAGE     required  what pip installs, as root: the https URL of a wheel you
#                                  host, or a pinned requirement (scheduled-events-bridge==0.3.0)
#                                  when this VM's pip index-url is your own. No default: the
#                                  project is not published on PyPI, where anyone could take the
#                                  name. Not needed with --no-pip.
#   SEBRIDGE_PYTHON      optional  Python >= 3.11 to build the venv with (default: first found)
#   SEBRIDGE_TOPIC, SEBRIDGE_REPLY_QUEUE, SEBRIDGE_POLL_INTERVAL, SEBRIDGE_HEARTBEAT_INTERVAL,
#   SEBRIDGE_LOG_FORMAT, SEBRIDGE_LOG_LEVEL, SEBRIDGE_IMDS_ENDPOINT, SEBRIDGE_API_VERSION,
#   SEBRIDGE_VM_NAME, SEBRIDGE_REQUIRE_LISTED, SEBRIDGE_OUTBOX_MAX, SEBRIDGE_MAX_MESSAGE_SIZE,
#   SEBRIDGE_DRY_RUN, SEBRIDGE_HOOKS_FILE, SEBRIDGE_DRAIN_PROBE_PORT, SEBRIDGE_DRAIN_PROBE_ADDRESS,
#   SEBRIDGE_DRAIN_PROBE_UPSTREAM, SEBRIDGE_DRAIN_SECONDS, SEBRIDGE_DRAIN_IMPACTFUL_EVENT_TYPES,
#   SEBRIDGE_DRAIN_FREEZE_THRESHOLD_SECONDS, SEBRIDGE_DRAIN_LEAD,
#   SEBRIDGE_DRAIN_PROBE_MAX_UNHEALTHY_SECONDS, SEBRIDGE_DRAIN_PROBE_MIN_HEALTHY_SECONDS, SEBRIDGE_METRICS_PORT, SEBRIDGE_METRICS_ADDRESS,
#   SEBRIDGE_SERVICEBUS_TRANSPORT, SEBRIDGE_SERVICEBUS_ENDPOINT, SEBRIDGE_CREDENTIAL
#                        optional  copied to the configuration file when set
#                                  (SEBRIDGE_STATE_DIR is always /var/lib/sebridge, the unit's
#                                  StateDirectory)
#   SEBRIDGE_HOOKS_JSON  optional  the hooks file itself (JSON text): validated, installed as
#                                  /etc/sebridge/hooks.json (root:root 0644, the only owner the
#                                  forwarder accepts) and named in SEBRIDGE_HOOKS_FILE. Empty:
#                                  the configuration names no hooks file (a file of your own goes
#                                  in forwarder.local.env as SEBRIDGE_HOOKS_FILE=...)
#   SEBRIDGE_ROOT        optional  install under this directory instead of / (tests, images);
#                                  requires --no-start
#   SEBRIDGE_UNIT_FILE   optional  unit to install (default: sebridge-forwarder.service next to
#                                  this script)
#
# Options: --no-start (do not touch systemd), --no-user (do not create the system user),
#          --no-pip (do not create the venv or install the package), -h/--help.
# With SEBRIDGE_ROOT the system user is created in that root's /etc (useradd --root), never on
# the running system.
set -euo pipefail
umask 022

readonly PREFIX=/opt/sebridge
readonly VENV="$PREFIX/venv"
readonly CONF_DIR=/etc/sebridge
readonly ENV_FILE="$CONF_DIR/forwarder.env"
readonly HOOKS_FILE="$CONF_DIR/hooks.json"
readonly STATE_DIR=/var/lib/sebridge
readonly UNIT_NAME=sebridge-forwarder.service
readonly UNIT_DIR=/etc/systemd/system
readonly SERVICE_USER=sebridge
# On root's PATH (sudo's secure_path includes /usr/local/sbin), so `sudo sebridge status` and
# `sudo sebridge doctor` work; a link to the venv's command, so an upgrade needs no new link.
readonly COMMAND_LINK=/usr/local/sbin/sebridge
# Settings copied verbatim from the installer's environment to the forwarder's when set.
readonly PASSTHROUGH="SEBRIDGE_TOPIC SEBRIDGE_REPLY_QUEUE SEBRIDGE_POLL_INTERVAL SEBRIDGE_HEARTBEAT_INTERVAL SEBRIDGE_LOG_FORMAT SEBRIDGE_LOG_LEVEL SEBRIDGE_IMDS_ENDPOINT SEBRIDGE_API_VERSION SEBRIDGE_VM_NAME SEBRIDGE_REQUIRE_LISTED SEBRIDGE_OUTBOX_MAX SEBRIDGE_MAX_MESSAGE_SIZE SEBRIDGE_DRY_RUN SEBRIDGE_HOOKS_FILE SEBRIDGE_DRAIN_PROBE_PORT SEBRIDGE_DRAIN_PROBE_ADDRESS SEBRIDGE_DRAIN_PROBE_UPSTREAM SEBRIDGE_DRAIN_SECONDS SEBRIDGE_DRAIN_IMPACTFUL_EVENT_TYPES SEBRIDGE_DRAIN_FREEZE_THRESHOLD_SECONDS SEBRIDGE_DRAIN_LEAD SEBRIDGE_DRAIN_PROBE_MAX_UNHEALTHY_SECONDS SEBRIDGE_DRAIN_PROBE_MIN_HEALTHY_SECONDS SEBRIDGE_METRICS_PORT SEBRIDGE_METRICS_ADDRESS SEBRIDGE_SERVICEBUS_TRANSPORT SEBRIDGE_SERVICEBUS_ENDPOINT SEBRIDGE_CREDENTIAL"
readonly MAX_HOOKS_BYTES=65536

log() { printf 'install-forwarder: %s\n' "$*"; }
die() { printf 'install-forwarder: error: %s\n' "$*" >&2; exit 1; }

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

start=1 create_user=1 install_package=1
while [ $# -gt 0 ]; do
    case "$1" in
        --no-start) start=0 ;;
        --no-user) create_user=0 ;;
        --no-pip) install_package=0 ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown option: $1 (see --help)" ;;
    esac
    shift
done

root="${SEBRIDGE_ROOT:-}"
root="${root%/}"
if [ -n "$root" ]; then
    [ -d "$root" ] || die "SEBRIDGE_ROOT=$root is not a directory"
    # systemctl would act on the running system, not on the directory.
    [ "$start" -eq 0 ] || die "SEBRIDGE_ROOT needs --no-start"
    # useradd --root chroots into the directory, which only root may do.
    [ "$create_user" -eq 0 ] || [ "$(id -u)" -eq 0 ] \
        || die "creating the user in SEBRIDGE_ROOT needs root (useradd --root); or pass --no-user"
elif [ "$(id -u)" -ne 0 ]; then
    die "run as root (or set SEBRIDGE_ROOT for a throwaway root)"
fi

# --- validate the configuration before changing anything -----------------------------------

# Values go into a systemd EnvironmentFile: one line each, no quoting needed, no injection.
safe_value() { [[ "$1" =~ ^[A-Za-z0-9._:/,+=@%-]*$ ]]; }

namespace="${SEBRIDGE_NAMESPACE:-}"
client_id="${AZURE_CLIENT_ID:-}"
package="${SEBRIDGE_PACKAGE:-}"

[ -n "$namespace" ] || die "SEBRIDGE_NAMESPACE is required (the namespace FQDN, output serviceBusNamespace of main.bicep)"
[[ "$namespace" =~ ^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)+$ ]] \
    || die "SEBRIDGE_NAMESPACE must be a host name like sbns-x.servicebus.windows.net, got '$namespace'"
[ -n "$client_id" ] || die "AZURE_CLIENT_ID is required (output forwarderIdentityClientId of main.bicep)"
[[ "$client_id" =~ ^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$ ]] \
    || die "AZURE_CLIENT_ID must be a GUID, got '$client_id'"
if [ -n "${SEBRIDGE_CONNECTION_STRING:-}" ]; then
    die "SEBRIDGE_CONNECTION_STRING is not installed: the namespace has local auth disabled and the forwarder signs in with the managed identity (AZURE_CLIENT_ID)"
fi
if [ -n "${SEBRIDGE_STATE_DIR:-}" ] && [ "$SEBRIDGE_STATE_DIR" != "$STATE_DIR" ]; then
    die "SEBRIDGE_STATE_DIR must be $STATE_DIR: the unit's StateDirectory= is the only place the service may write"
fi
for name in $PASSTHROUGH; do
    value="${!name:-}"
    safe_value "$value" || die "$name contains characters not allowed in the configuration file"
done
hooks_json="${SEBRIDGE_HOOKS_JSON:-}"
if [ -n "$hooks_json" ]; then
    [ -z "${SEBRIDGE_HOOKS_FILE:-}" ] \
        || die "give SEBRIDGE_HOOKS_JSON (installed as $HOOKS_FILE) or SEBRIDGE_HOOKS_FILE (a file of yours), not both"
    [ "${#hooks_json}" -le "$MAX_HOOKS_BYTES" ] || die "SEBRIDGE_HOOKS_JSON is larger than $MAX_HOOKS_BYTES bytes"
    checker="$(command -v python3 || true)"
    if [ -n "$checker" ]; then
        printf '%s' "$hooks_json" | "$checker" -c 'import json, sys; json.load(sys.stdin)' 2>/dev/null \
            || die "SEBRIDGE_HOOKS_JSON is not JSON"
    fi
fi
if [ "$install_package" -eq 1 ] && [ -z "$package" ]; then
    die "SEBRIDGE_PACKAGE is required: the https URL of a wheel you host, or a pinned requirement (scheduled-events-bridge==X.Y.Z) when this VM's pip index-url is your own (the project is not on PyPI, so the bare name there could be anyone's package, installed as root)"
fi
if [ -n "$package" ]; then
    [[ "$package" != *$'\n'* ]] || die "SEBRIDGE_PACKAGE must be one line"
    # Root runs what this downloads: no plaintext transport anyone on the path could rewrite.
    [[ "${package,,}" != *http://* ]] || die "SEBRIDGE_PACKAGE must not use http://: serve the wheel over https"
    # The value is logged (and shown in the extension's status): no user:password@ or token@.
    [[ ! "$package" =~ ://[^/[:space:]]*@ ]] || die "SEBRIDGE_PACKAGE must not carry credentials: it is logged; serve the wheel from a location the VMs can read without them"
fi

unit_source="${SEBRIDGE_UNIT_FILE:-$(cd "$(dirname "$0")" && pwd)/$UNIT_NAME}"
[ -f "$unit_source" ] || die "unit file not found: $unit_source"

log "root: ${root:-/}"
log "namespace: $namespace"
log "client id: $client_id"
[ -z "$package" ] || log "package: $package"

# --- system user -----------------------------------------------------------------------------

# In a throwaway root the user lives in that root's /etc, not in the running system's.
user_exists() {
    if [ -n "$root" ]; then
        [ -f "$root/etc/passwd" ] \
            && awk -F: -v u="$SERVICE_USER" '$1 == u { found = 1 } END { exit !found }' "$root/etc/passwd"
    else
        getent passwd "$SERVICE_USER" >/dev/null
    fi
}

service_gid() {
    if [ -n "$root" ]; then
        awk -F: -v g="$SERVICE_USER" '$1 == g { print $3; exit }' "$root/etc/group" 2>/dev/null || true
    else
        { getent group "$SERVICE_USER" || true; } | cut -d: -f3
    fi
}

if [ "$create_user" -eq 1 ]; then
    root_args=()
    # useradd --root chroots into the directory before touching any account database.
    [ -z "$root" ] || root_args=(--root "$root")
    if user_exists; then
        log "user $SERVICE_USER exists"
    else
        nologin=/usr/sbin/nologin
        [ -x "$root$nologin" ] || nologin=/sbin/nologin
        useradd "${root_args[@]}" --system --user-group --no-create-home \
            --home-dir "$STATE_DIR" --shell "$nologin" \
            --comment "Scheduled Events Bridge forwarder" "$SERVICE_USER"
        log "created system user $SERVICE_USER"
    fi
fi

# --- virtual environment and package ---------------------------------------------------------

find_python() {
    local candidate
    for candidate in ${SEBRIDGE_PYTHON:-} python3.13 python3.12 python3.11 python3; do
        if command -v "$candidate" >/dev/null 2>&1 \
            && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

if [ "$install_package" -eq 1 ]; then
    python="$(find_python)" || die "no Python >= 3.11 found (Ubuntu 24.04 and Debian 12 ship one; on RHEL 9 install python3.11; or set SEBRIDGE_PYTHON)"
    if [ ! -x "$root$VENV/bin/python" ]; then
        if ! "$python" -m venv "$root$VENV" 2>/dev/null; then
            # Debian and Ubuntu split ensurepip into pythonX.Y-venv.
            command -v apt-get >/dev/null 2>&1 || die "$python cannot create a virtual environment"
            version="$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
            log "installing python$version-venv"
            DEBIAN_FRONTEND=noninteractive apt-get install -y "python$version-venv" >/dev/null
            rm -rf "$root$VENV"
            "$python" -m venv "$root$VENV"
        fi
        log "created virtual environment $VENV with $python"
    fi
    "$root$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input --upgrade "$package"
    # pip keeps an installed version it is given again: a rebuilt wheel of the same version
    # (forceUpdateTag with an unchanged packageSource) must still replace it, so the package
    # itself (not its dependencies) is always installed anew.
    "$root$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
        --force-reinstall --no-deps "$package"
    [ -x "$root$VENV/bin/sebridge" ] || die "$package did not install the sebridge command"
    log "installed $("$root$VENV/bin/sebridge" --version 2>/dev/null || echo "$package")"
fi

# --- the command on root's PATH ----------------------------------------------------------------

install -d -m 0755 "$root$(dirname "$COMMAND_LINK")"
if [ -L "$root$COMMAND_LINK" ] || [ ! -e "$root$COMMAND_LINK" ]; then
    ln -sfn "$VENV/bin/sebridge" "$root$COMMAND_LINK"
    log "linked $COMMAND_LINK -> $VENV/bin/sebridge"
else
    log "warning: $COMMAND_LINK exists and is not a link: left as it is (the command is $VENV/bin/sebridge)"
fi

# --- configuration ---------------------------------------------------------------------------

install -d -m 0755 "$root$CONF_DIR"
tmp="$(mktemp "$root$CONF_DIR/.forwarder.env.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
# The hooks file decides what the forwarder runs: root-owned, not writable by anyone else, or
# the forwarder refuses it. Checked with the installed forwarder's own validation when present.
if [ -n "$hooks_json" ]; then
    hooks_tmp="$(mktemp "$root$CONF_DIR/.hooks.json.XXXXXX")"
    trap 'rm -f "$tmp" "$hooks_tmp"' EXIT
    printf '%s\n' "$hooks_json" >"$hooks_tmp"
    if [ -x "$root$VENV/bin/python" ]; then
        "$root$VENV/bin/python" -m sebridge.forwarder.local.hooks_file --content-only "$hooks_tmp" \
            || die "SEBRIDGE_HOOKS_JSON is not a valid hooks file (above)"
    fi
    chmod 0644 "$hooks_tmp"
    [ "$(id -u)" -ne 0 ] || chown 0:0 "$hooks_tmp"
    mv -f "$hooks_tmp" "$root$HOOKS_FILE"
    trap 'rm -f "$tmp"' EXIT
    log "wrote $HOOKS_FILE"
fi

{
    echo "# Written by install-forwarder.sh; rerun it to change these values."
    echo "# Your own overrides go to $CONF_DIR/forwarder.local.env, which it never touches."
    echo "SEBRIDGE_NAMESPACE=$namespace"
    echo "AZURE_CLIENT_ID=$client_id"
    echo "SEBRIDGE_STATE_DIR=$STATE_DIR"
    for name in $PASSTHROUGH; do
        if [ -n "${!name:-}" ]; then
            echo "$name=${!name}"
        fi
    done
    [ -z "$hooks_json" ] || echo "SEBRIDGE_HOOKS_FILE=$HOOKS_FILE"
} >"$tmp"
chmod 0640 "$tmp"
if [ "$create_user" -eq 1 ]; then
    gid="$(service_gid)"
    [ -n "$gid" ] || die "group $SERVICE_USER not found${root:+ in $root/etc/group}"
    chown "0:$gid" "$tmp"
fi
mv -f "$tmp" "$root$ENV_FILE"
trap - EXIT
log "wrote $ENV_FILE"

# --- systemd unit ----------------------------------------------------------------------------

install -D -m 0644 "$unit_source" "$root$UNIT_DIR/$UNIT_NAME"
log "installed $UNIT_DIR/$UNIT_NAME"

if [ "$start" -eq 1 ]; then
    systemctl daemon-reload
    systemctl enable "$UNIT_NAME" >/dev/null
    systemctl restart "$UNIT_NAME"
    log "started $UNIT_NAME (journalctl -u $UNIT_NAME)"
else
    log "not starting the service (--no-start)"
fi
