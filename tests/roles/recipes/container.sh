# Recipe: the systemd container image (systemd as PID 1, sshd, python3), imported into the test
# docker engine as rt/systemd:<recipe hash>. Its only apt source is the local repository of the
# packages the roles install (aptrepo), bind-mounted at /srv/rt-apt: the containers have no network.
# shellcheck shell=bash
RECIPE_DEPS=(rootfs)
# python3-apt: Ansible's apt module; xfsprogs: the containers' data filesystem (/dev/rtdata) is
# XFS, as on a node's RAID.
RT_CT_PACKAGES="systemd-sysv openssh-server python3 python3-apt dbus iproute2 xfsprogs"

recipe_inputs() {
  echo "packages=$RT_CT_PACKAGES"
}

recipe_build() {  # $1 = output folder
  local root=$1/root
  cp -a "$RT_CACHE/rootfs/root" "$root"
  # shellcheck disable=SC2086  # a word list of package names
  rt_chroot_apt "$root" install --no-install-recommends $RT_CT_PACKAGES > "$1/apt.log" 2>&1 ||
    { tail -n 20 "$1/apt.log" >&2; return 1; }
  rm -f "$root/etc/apt/sources.list" "$root"/etc/apt/sources.list.d/*
  echo 'deb [trusted=yes] file:/srv/rt-apt ./' > "$root/etc/apt/sources.list.d/rt-local.list"
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
  # Nothing in a test container needs these; they only slow the boot down.
  local unit
  for unit in apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer e2scrub_reap.service \
      fstrim.timer systemd-timesyncd.service getty@tty1.service console-getty.service; do
    ln -sf /dev/null "$root/etc/systemd/system/$unit"
  done
  printf 'UseDNS no\nPermitRootLogin prohibit-password\n' > "$root/etc/ssh/sshd_config.d/rt.conf"
  echo rt-container > "$root/etc/hostname"
}
