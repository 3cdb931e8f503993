#!/usr/bin/env bash
# A QEMU VM under software emulation (TCG: KVM here is PVM and hangs a stock kernel) booting
# Debian's own kernel with emulated NVMe drives, sshd reachable on a loopback-only port of the
# harness's network namespace. For molecule's create/destroy playbooks (tests/roles/molecule/).
#
#   vm.sh create NAME [NVME_COUNT [NVME_SIZE [MEMORY_MIB]]]   boot it; print molecule's instance config (JSON)
#   vm.sh destroy NAME                                         stop it and delete its disks
#
# The VM's disk is a copy of the cached image, its NVMe drives (serials rtn0, rtn1, ...; by-id
# names /dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_rtnN) are fresh sparse files. A supervisor restarts
# QEMU when the guest reboots, each time with the kernel and initramfs found in the disk's /boot,
# the way a boot loader would: a reboot inside the guest is a real reboot of the installed system.
set -euo pipefail
# shellcheck source=tests/roles/lib.sh
source "$(dirname "$0")/lib.sh"
rt_require_run

name=${2:?usage: $0 create|destroy NAME}
dir=$RT_RUN/vms/$name
image=$RT_CACHE/vm

create() {
  local count=${1:-2} size=${2:-1G} memory=${3:-1536} port i
  [ -f "$image/.recipe" ] || rt_die "no VM image: run tests/roles/build.sh first"
  mkdir -p "$dir"
  cp --sparse=always "$image/disk.raw" "$dir/disk.raw"
  for i in $(seq 0 $((count - 1))); do
    truncate -s "$size" "$dir/nvme$i.img"
  done
  # A free port on this namespace's loopback (the namespace is the harness's own).
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  printf 'count=%s\nmemory=%s\nport=%s\nkver=%s\n' "$count" "$memory" "$port" "$(cat "$image/kver")" > "$dir/vm.conf"
  setsid "$0" supervise "$name" > "$dir/supervisor.log" 2>&1 < /dev/null &
  echo $! > "$dir/supervisor.pid"
  if ! rt_wait_ssh 127.0.0.1 "$port" 240; then
    tail -n 30 "$dir"/console-*.log >&2 || true
    rt_infra_error "VM $name: no ssh on port $port after 240 s"
    rt_die "VM $name: no ssh on port $port after 240 s"
  fi
  printf '{"instance": "%s", "address": "127.0.0.1", "port": %s, "user": "root", "identity_file": "%s"}\n' \
    "$name" "$port" "$RT_KEY"
}

# Runs (detached) for the VM's whole life: boot, wait for QEMU to exit, boot again unless stopped.
supervise() {
  # shellcheck disable=SC1091
  source "$dir/vm.conf"
  local boot=0 started drives="" i
  for i in $(seq 0 $((count - 1))); do
    drives+=" -drive file=$dir/nvme$i.img,if=none,id=nvme$i,format=raw -device nvme,serial=rtn$i,drive=nvme$i"
  done
  while [ ! -e "$dir/stop" ]; do
    boot=$((boot + 1))
    # What a boot loader would load: the disk's current /boot (debugfs reads ext4 without mounting).
    debugfs -R "dump /boot/vmlinuz-$kver $dir/vmlinuz" "$dir/disk.raw" 2>/dev/null
    debugfs -R "dump /boot/initrd.img-$kver $dir/initrd.img" "$dir/disk.raw" 2>/dev/null
    echo "boot $boot: kernel $kver, initrd $(stat -c %s "$dir/initrd.img") bytes"
    started=$(date +%s)
    # -no-reboot: a guest reboot ends QEMU, and the loop boots the disk again. One vCPU, one TCG
    # thread: faster than two under TCG for the fork-heavy work of Ansible and update-initramfs.
    # shellcheck disable=SC2086
    qemu-system-x86_64 -accel "${RT_VM_ACCEL:-tcg,thread=single}" -smp "${RT_VM_SMP:-1}" -m "$memory" \
      -nodefaults -display none -serial "file:$dir/console-$boot.log" -monitor none -no-reboot \
      -kernel "$dir/vmlinuz" -initrd "$dir/initrd.img" \
      -append "root=/dev/vda rw console=ttyS0 net.ifnames=0 quiet loglevel=5 systemd.show_status=false mitigations=off" \
      -drive "file=$dir/disk.raw,if=virtio,format=raw" $drives \
      -netdev "user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:$port-:22" -device virtio-net-pci,netdev=net0 \
      -pidfile "$dir/qemu.pid" &
    # (loglevel=5: the kernel's warnings, such as NVMe I/O timeouts, reach the console log.)
    local qemu=$!
    # QEMU 7.2's emulated NVMe controller very occasionally stops completing I/O (the guest logs
    # "nvme nvmeN: I/O ... timeout", resets the controller, and the I/O times out again for
    # ever). A hung VM would hang the scenario; stop it instead and leave a note for the harness.
    while kill -0 "$qemu" 2>/dev/null; do
      if grep -qE 'nvme nvme[0-9]+: I/O [0-9]+ .*timeout' "$dir/console-$boot.log" 2>/dev/null; then
        echo "boot $boot: the emulated NVMe controller stopped completing I/O (QEMU); stopping the VM"
        rt_infra_error "VM $name, boot $boot: the emulated NVMe controller stopped completing I/O (QEMU)"
        touch "$dir/stop"
        kill "$qemu" 2>/dev/null || true
        break
      fi
      sleep 2
    done
    wait "$qemu" || echo "boot $boot: qemu exited with $?"
    echo "boot $boot: up $(($(date +%s) - started)) s"
    if [ $(($(date +%s) - started)) -lt 10 ] && [ ! -e "$dir/stop" ]; then
      echo "boot $boot: QEMU ended within 10 s; not restarting"
      break
    fi
  done
}

destroy() {
  [ -d "$dir" ] || return 0
  touch "$dir/stop"
  local pid
  for pidfile in "$dir/supervisor.pid" "$dir/qemu.pid"; do
    pid=$(cat "$pidfile" 2>/dev/null) || continue
    kill "$pid" 2>/dev/null || true
  done
  # The disks are thrown away: no need for a clean guest shutdown.
  for _ in $(seq 1 50); do
    pid=$(cat "$dir/qemu.pid" 2>/dev/null) || break
    case $(ps -o stat= -p "$pid" 2>/dev/null | cut -c1) in "" | Z) break ;; esac
    sleep 0.2
  done
  rm -rf "$dir"
}

case $1 in
  create) create "${3:-}" "${4:-}" "${5:-}" ;;
  supervise) supervise ;;
  destroy) destroy ;;
  *) echo "usage: $0 create|destroy NAME" >&2; exit 2 ;;
esac
