#!/bin/sh
# criu role self-test: dump a throw-away process that counts into a file, check that it is gone,
# restore it detached and check that it counts on from where it stopped; then stop it. Prints one
# JSON line; exits non-zero (with the log tail) on any failure. Usage: criu-selftest.sh CRIU WORKDIR
set -u
criu=$1
work=$2
rm -rf "$work"
mkdir -p "$work/img"
counter=$work/counter
# A plain process in its own session, no terminal: what `criu dump` can take without --shell-job.
# It forks nothing: a killed child left as a zombie (a slow PID 1 reaps late) would keep the
# session's PID in use, and the restore needs that PID back.
# The count is replaced, never rewritten in place, so a reader never sees an empty file.
setsid python3 -c 'import os, sys, time
i = 0
while True:
    i += 1
    with open(sys.argv[1] + ".tmp", "w") as fh:
        fh.write(f"{i}\n")
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(0.1)' "$counter" < /dev/null > /dev/null 2>&1 &
pid=$!
# Waits are bounded polls, not fixed sleeps: a loaded machine (CI, parallel scenarios) starts
# Python and resumes a restored process late.
waited=0
until [ -n "$(cat "$counter" 2>/dev/null)" ]; do
  [ $waited -ge 300 ] && { echo '{"ok": false, "step": "start"}'; exit 1; }
  sleep 0.1; waited=$((waited + 1))
done
fail() {
  printf '{"ok": false, "step": "%s", "pid": %s}\n' "$1" "$pid"
  tail -n 15 "$work/$2" 2>/dev/null >&2
  kill -9 "$pid" 2>/dev/null
  exit 1
}
t0=$(date +%s%N)
"$criu" dump -t "$pid" -D "$work/img" -o dump.log -v4 || fail dump img/dump.log
t1=$(date +%s%N)
# This shell is the dumped process's parent: reap it, or its zombie keeps the PID the restore needs.
wait "$pid" 2>/dev/null
# The dumped process is gone (a zombie, if any, counts as gone: PID 1 may reap it late).
state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -c1)
case $state in "" | Z) ;; *) fail still-running img/dump.log ;; esac
frozen=$(cat "$counter")
sleep 0.5
[ "$(cat "$counter")" = "$frozen" ] || fail counted-after-dump img/dump.log
t2=$(date +%s%N)
"$criu" restore -D "$work/img" -o restore.log -d -v4 || fail restore img/restore.log
t3=$(date +%s%N)
waited=0
after=$(cat "$counter")
until [ "$after" -gt "$frozen" ]; do
  [ $waited -ge 300 ] && fail not-counting img/restore.log
  sleep 0.1; waited=$((waited + 1)); after=$(cat "$counter")
done
plugin=$(grep -c 'cuda_plugin' "$work/img/dump.log")
kill "$pid"
printf '{"ok": true, "pid": %s, "frozen_at": %s, "counted_to": %s, "dump_ms": %s, "restore_ms": %s, "cuda_plugin_log_lines": %s, "image_bytes": %s}\n' \
  "$pid" "$frozen" "$after" $(( (t1 - t0) / 1000000 )) $(( (t3 - t2) / 1000000 )) "$plugin" "$(du -sb "$work/img" | cut -f1)"
rm -rf "$work"
