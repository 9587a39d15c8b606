#!/usr/bin/env bash
# A job that outlives the device command which starts it (a real-size headline run takes longer than a
# command's 10 minutes): `start` runs it in a session of its own (setsid), which the device machine lets run
# on until the machine goes back; later commands on the warm machine `wait` for it.
#
#   bash benchmarks/gpu/detached.sh start NAME CMD...   # returns at once; log in $DETACHED/NAME.log
#   bash benchmarks/gpu/detached.sh wait NAME SECONDS   # until NAME ends or SECONDS pass; exit 0 when it
#                                                       # ended (its status in NAME.rc), 3 while it runs
#   bash benchmarks/gpu/detached.sh status NAME         # running, or its exit status; the log's last lines
#
# DETACHED (default /tmp/detached) holds NAME.log, NAME.pid and, once it ends, NAME.rc. Leave the wait's
# SECONDS well inside the command's limit, and copy what the job wrote into $OUT in the same command. The
# limit is the call's timeout or the device time left after the machine's start, whichever is less, and a
# command stopped at it copies nothing more: near the end of the budget let the job write under $OUT itself
# (what is there when the command is stopped still comes back).
# The job inherits the environment of the command that starts it (source device_env.sh first). It runs in a
# copy of the working tree made at its start, $DETACHED/NAME.tree (all but .git and .venv), since every later
# command re-copies the tree it was started from: a job run there lost the ignored .traces midway.
set -euo pipefail
DETACHED="${DETACHED:-/tmp/detached}"
action="${1:?usage: detached.sh start NAME CMD... | wait NAME SECONDS | status NAME}"
name="${2:?detached.sh: a job name}"
shift 2
mkdir -p "$DETACHED"
DETACHED="$(cd "$DETACHED" && pwd)"  # the job runs elsewhere
log="$DETACHED/$name.log" rc="$DETACHED/$name.rc" pidfile="$DETACHED/$name.pid"

running() { [ -f "$pidfile" ] && [ ! -f "$rc" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

case "$action" in
  start)
    [ $# -gt 0 ] || { echo "detached.sh: start $name: no command" >&2; exit 2; }
    if running; then
      echo "detached.sh: $name is already running (pid $(cat "$pidfile"))" >&2
      exit 2
    fi
    rm -f "$rc"
    tree="$DETACHED/$name.tree"
    rm -rf "$tree" && mkdir -p "$tree"
    tar -c --exclude=./.git --exclude=./.venv . | tar -x -C "$tree"
    # PYTHONPATH entries naming the tree it was started from name the copy
    here="$PWD" paths=""
    IFS=: read -r -a entries <<< "${PYTHONPATH:-}"
    for e in "${entries[@]}"; do [ "$e" = "$here" ] && e="$tree"; paths="${paths:+$paths:}$e"; done
    [ -z "${PYTHONPATH:-}" ] || export PYTHONPATH="$paths"
    cd "$tree"
    # the job's status is written by the shell that ran it, so a job killed with that shell leaves no .rc;
    # nothing of it holds this command's output open, or the caller would wait for the job to end
    setsid bash -c '"$@"; echo $? > "$0.rc.tmp"; mv "$0.rc.tmp" "${0%.log}.rc"' "$log" "$@" \
      > "$log" 2>&1 < /dev/null &
    echo $! > "$pidfile"
    echo "detached.sh: $name started (pid $!) in $tree, log $log"
    ;;
  wait)
    seconds="${1:?detached.sh: wait $name SECONDS}"
    deadline=$((SECONDS + seconds))
    while [ ! -f "$rc" ] && [ "$SECONDS" -lt "$deadline" ]; do
      running || break
      sleep 1
    done
    "$0" status "$name"
    ;;
  status)
    if [ -f "$rc" ]; then
      echo "detached.sh: $name ended with status $(cat "$rc")"
      tail -n 5 "$log" 2>/dev/null || true
      exit 0
    fi
    if running; then
      echo "detached.sh: $name running"
      tail -n 5 "$log" 2>/dev/null || true
      exit 3
    fi
    echo "detached.sh: $name is not running and left no status (never started, or killed)" >&2
    exit 1
    ;;
  *)
    echo "detached.sh: unknown action '$action' (start, wait or status)" >&2
    exit 2
    ;;
esac
