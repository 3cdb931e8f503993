# Recipe: the VM's disk: Debian's own kernel (linux-image-amd64), systemd, udev, sshd, python3,
# mdadm and xfsprogs (as on an Ubuntu server node), on an ext4 root without partition table.
# tests/roles/vm.sh boots it with the kernel and initramfs it finds in the disk's /boot at each
# (re)boot, like a boot loader would, so an update-initramfs inside the guest takes effect.
# shellcheck shell=bash
RECIPE_DEPS=(rootfs)
RT_VM_PACKAGES="linux-image-amd64 systemd-sysv udev openssh-server python3 python3-apt initramfs-tools zstd kmod iproute2 \
mdadm xfsprogs util-linux fdisk dbus"

recipe_inputs() {
  echo "packages=$RT_VM_PACKAGES disk=3G"
  cat "$RT_KEY.pub"
}

recipe_build() {  # $1 = output folder
  local root=$1/root unit
  cp -a "$RT_CACHE/rootfs/root" "$root"
  # A small, lightly compressed initramfs (the drivers for the root disk plus what the mdadm hook
  # adds; zstd -1) keeps update-initramfs under TCG near a minute instead of two; the installed
  # system loads the other modules through udev. The role tests run the real update-initramfs.
  mkdir -p "$root/etc/initramfs-tools/conf.d"
  printf 'MODULES=list\nCOMPRESS=zstd\nCOMPRESSLEVEL=1\n' > "$root/etc/initramfs-tools/conf.d/rt-vm.conf"
  # shellcheck disable=SC2086
  rt_chroot_apt "$root" install --no-install-recommends $RT_VM_PACKAGES > "$1/apt.log" 2>&1 ||
    { tail -n 20 "$1/apt.log" >&2; return 1; }
  printf 'virtio_pci\nvirtio_blk\next4\n' >> "$root/etc/initramfs-tools/modules"
  echo '/dev/vda / ext4 defaults,errors=remount-ro 0 1' > "$root/etc/fstab"
  echo rt-vm > "$root/etc/hostname"
  printf '127.0.0.1 localhost\n127.0.1.1 rt-vm\n' > "$root/etc/hosts"
  # QEMU's user network, no DHCP wait: a fixed address (net.ifnames=0 on the kernel command line).
  cat > "$root/etc/systemd/system/rt-net.service" <<'UNIT'
[Unit]
Description=Address on the QEMU user network (role-test VM)
BindsTo=sys-subsystem-net-devices-eth0.device
After=sys-subsystem-net-devices-eth0.device
Before=network.target ssh.service
Wants=network.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/sbin/ip link set eth0 up
ExecStart=/sbin/ip addr replace 10.0.2.15/24 dev eth0
ExecStart=/sbin/ip route replace default via 10.0.2.2

[Install]
WantedBy=multi-user.target
UNIT
  ln -sf /etc/systemd/system/rt-net.service "$root/etc/systemd/system/multi-user.target.wants/rt-net.service"
  for unit in apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer e2scrub_reap.service \
      fstrim.timer systemd-timesyncd.service mdcheck_start.timer mdcheck_continue.timer mdmonitor-oneshot.timer \
      getty@tty1.service; do
    ln -sf /dev/null "$root/etc/systemd/system/$unit"
  done
  mkdir -p -m 0700 "$root/root/.ssh"
  install -m 0600 "$RT_KEY.pub" "$root/root/.ssh/authorized_keys"
  printf 'UseDNS no\nPermitRootLogin prohibit-password\n' > "$root/etc/ssh/sshd_config.d/rt.conf"
  # No apt source: the VM has no network, and everything the raid0_xfs role installs is present.
  rm -f "$root/etc/apt/sources.list" "$root"/etc/apt/sources.list.d/*
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
  mount -t proc proc "$root/proc"
  chroot "$root" update-initramfs -u -k all > "$1/initramfs.log" 2>&1 || { umount "$root/proc"; cat "$1/initramfs.log" >&2; return 1; }
  umount "$root/proc"
  (cd "$root/boot" && ls vmlinuz-*) | sed 's/^vmlinuz-//' > "$1/kver"
  mke2fs -q -t ext4 -L rt-root -d "$root" "$1/disk.raw" 3G
  rm -rf "$root"
}
