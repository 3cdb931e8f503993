#!/bin/sh
# criu role self-test: dump a throw-away process that counts into a file, check that it is gone,
# restore it detached and check that it counts on from where it stopped; then stop it. The process
# also holds a memfd of 16 MiB (mapped shared, a 1 MiB hole in it), filled with a pattern: its
# sha256 after the restore must be the one before the dump (the memfd restore path, which the
# parallel-shmem-restore patch changes; the JSON says how many threads read it: 1 = serially).
# Prints one JSON line; exits non-zero (with the log tail) on any failure. Usage: criu-selftest.sh CRIU WORKDIR
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
setsid python3 -c 'import mmap, os, sys, time
size = (16 << 20) + 123
fd = os.memfd_create("criu-selftest")
os.ftruncate(fd, size)
m = mmap.mmap(fd, size)
pattern = bytes(range(251)) * (size // 251 + 1)
m[:4 << 20] = pattern[:4 << 20]
m[5 << 20:] = pattern[5 << 20:size]
del pattern
with open(sys.argv[1] + ".memfd", "w") as fh:
    fh.write(f"{fd}\n")
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
memfd=/proc/$pid/fd/$(cat "$counter.memfd")
memfd_sum=$(sha256sum < "$memfd") || fail memfd-read img/dump.log
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
[ "$(sha256sum < "$memfd")" = "$memfd_sum" ] && memfd_ok=true || memfd_ok=false
memfd_bytes=$(stat -L -c %s "$memfd")
# A patched CRIU logs "Restored shmem <id> in parallel: <bytes> bytes, <n> threads, ..."; none: read serially.
threads=$(sed -n 's/.* in parallel: [0-9]* bytes, \([0-9]*\) threads.*/\1/p' "$work/img/restore.log" | sort -n | tail -n 1)
kill "$pid"
printf '{"ok": true, "pid": %s, "frozen_at": %s, "counted_to": %s, "dump_ms": %s, "restore_ms": %s, "cuda_plugin_log_lines": %s, "image_bytes": %s, "memfd_ok": %s, "memfd_bytes": %s, "memfd_threads": %s}\n' \
  "$pid" "$frozen" "$after" $(( (t1 - t0) / 1000000 )) $(( (t3 - t2) / 1000000 )) "$plugin" "$(du -sb "$work/img" | cut -f1)" \
  "$memfd_ok" "$memfd_bytes" "${threads:-1}"
rm -rf "$work"
