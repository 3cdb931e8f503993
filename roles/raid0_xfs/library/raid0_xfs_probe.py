#!/usr/bin/python
# Copyright (c) the project contributors
# SPDX-License-Identifier: MIT

from __future__ import annotations

DOCUMENTATION = r"""
---
module: raid0_xfs_probe
short_description: Inspect RAID0 member devices and the md array before anything is written
description:
  - Resolves each member device (by-id links and other symlinks included) and reports whether it
    exists, is a block device, carries a signature (filesystem, partition table, md superblock;
    C(blkid --probe)), has partitions, holders (an md array, LVM) or mounts.
  - Reports the md array O(md_device) (active, level, chunk, members) and the filesystem on it.
  - Decides what the role has to do (RV(plan)) and lists the problems that must stop it before anything
    is written (RV(errors)), each with a kind and a message.
  - Only reads; runs the same in check mode and never reports a change.
version_added: "0.1.0"
author:
  - The project contributors
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing) in diff mode.
    support: none
  platform:
    description: Target OS/families that can be operated against.
    support: full
    platforms: posix
options:
  devices:
    description: Member block devices, in the order the array should use them.
    type: list
    elements: path
    required: true
  md_device:
    description: The md device of the array, for example C(/dev/md0).
    type: path
    required: true
  sysfs_root:
    description: Directory under which C(sys/) is read (tests point it at a fixture tree).
    type: path
    default: /
  mountinfo_path:
    description: The mount table to read.
    type: path
    default: /proc/self/mountinfo
notes:
  - Linux only. C(mdadm --examine) is used when mdadm is installed, to tell an array that only needs
    assembling from a stale superblock.
"""

EXAMPLES = r"""
- name: Probe the members and the array
  raid0_xfs_probe:
    devices: [/dev/disk/by-id/nvme-SAMSUNG_1, /dev/disk/by-id/nvme-SAMSUNG_2]
    md_device: /dev/md0
  register: probe

- name: Stop before anything is written
  ansible.builtin.assert:
    that: probe.errors | length == 0
    fail_msg: "{{ probe.errors | map(attribute='msg') | join('; ') }}"
"""

RETURN = r"""
plan:
  description: V(none) (the array is active with these members), V(assemble) (the members carry the
    superblocks of one stopped RAID0 array of this size), or V(create).
  returned: always
  type: str
errors:
  description: Problems that must stop the role before anything is written; C(kind) is one of
    V(missing), V(not_block), V(duplicate), V(foreign_array), V(busy), V(mismatch).
  returned: always
  type: list
  elements: dict
  sample: [{kind: foreign_array, device: /dev/nvme2n1, msg: "/dev/nvme2n1 is already in array /dev/md1"}]
signatures:
  description: Members that carry a signature, mapped to what it is (C(xfs), C(gpt), C(linux_raid_member)).
  returned: always
  type: dict
devices:
  description: One entry per member (path, real, exists, block, signature, partitions, holders, mounts).
  returned: always
  type: list
  elements: dict
md:
  description: The array (path, name, exists, active, level, chunk_kib, members, fs_type, fs_uuid, fs_label).
  returned: always
  type: dict
"""

import os  # noqa: E402
import stat  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def _read(path):
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def _listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _mounts(mountinfo_path):
    """Map 'major:minor' -> [mount points]."""
    out = {}
    try:
        with open(mountinfo_path) as fh:
            for line in fh:
                fields = line.split()
                if len(fields) > 4:
                    out.setdefault(fields[2], []).append(fields[4].replace("\\040", " "))
    except OSError:
        pass
    return out


def _blkid(module, path):
    """Signature keys of ``path`` from ``blkid --probe`` (TYPE, PTTYPE, UUID, LABEL, ...); {} when none."""
    blkid = module.get_bin_path("blkid", required=True)
    rc, out, err = module.run_command([blkid, "--probe", "--output", "export", path],
                                      environ_update={"LC_ALL": "C"})
    if rc == 2:  # nothing found
        return {}
    if rc != 0:
        module.fail_json(msg="blkid --probe %s failed: %s" % (path, err.strip()), rc=rc)
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _examine(module, path):
    """``mdadm --examine --export`` of a member carrying an md superblock; {} without mdadm."""
    mdadm = module.get_bin_path("mdadm")
    if not mdadm:
        return {}
    rc, out, _err = module.run_command([mdadm, "--examine", "--export", path], environ_update={"LC_ALL": "C"})
    if rc != 0:
        return {}
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _device(module, path, sys_block, mounts):
    real = os.path.realpath(path)
    dev = {"path": path, "real": real, "name": os.path.basename(real), "exists": os.path.exists(real),
           "block": False, "signature": {}, "partitions": [], "holders": [], "mounts": [], "examine": {}}
    if not dev["exists"]:
        return dev
    st = os.stat(real)
    dev["block"] = stat.S_ISBLK(st.st_mode)
    if not dev["block"]:
        return dev
    base = os.path.join(sys_block, dev["name"])
    dev["partitions"] = [p for p in _listdir(base) if p.startswith(dev["name"])
                         and os.path.exists(os.path.join(base, p, "partition"))]
    dev["holders"] = _listdir(os.path.join(base, "holders"))
    majmin = "%d:%d" % (os.major(st.st_rdev), os.minor(st.st_rdev))
    dev["mounts"] = list(mounts.get(majmin, []))
    for part in dev["partitions"]:
        dev["mounts"] += mounts.get(_read(os.path.join(base, part, "dev")) or "", [])
    dev["signature"] = _blkid(module, real)
    if dev["signature"].get("TYPE") == "linux_raid_member":
        dev["examine"] = _examine(module, real)
    return dev


def _array(module, md_device, sys_block):
    real = os.path.realpath(md_device)
    name = os.path.basename(real)
    md_dir = os.path.join(sys_block, name, "md")
    md = {"path": md_device, "real": real, "name": name, "exists": os.path.isdir(md_dir), "active": False,
          "level": None, "chunk_kib": None, "members": [], "fs_type": None, "fs_uuid": None, "fs_label": None}
    if not md["exists"]:
        return md
    state = _read(os.path.join(md_dir, "array_state")) or ""
    md["active"] = state not in ("", "clear", "inactive")
    md["level"] = _read(os.path.join(md_dir, "level")) or None
    chunk = _read(os.path.join(md_dir, "chunk_size"))
    md["chunk_kib"] = int(chunk) // 1024 if chunk and chunk.isdigit() else None
    md["members"] = sorted("/dev/" + s for s in _listdir(os.path.join(sys_block, name, "slaves")))
    if md["active"]:
        sig = _blkid(module, real)
        md["fs_type"], md["fs_uuid"], md["fs_label"] = sig.get("TYPE"), sig.get("UUID"), sig.get("LABEL")
    return md


def plan_array(md, devices):
    """What to do (none | assemble | create) and what must stop the role; pure, for unit tests."""
    errors = []

    def err(kind, device, msg):
        errors.append({"kind": kind, "device": device, "msg": msg})

    seen = {}
    for dev in devices:
        if not dev["exists"]:
            err("missing", dev["path"], "%s does not exist" % dev["path"])
        elif not dev["block"]:
            err("not_block", dev["path"], "%s (%s) is not a block device" % (dev["path"], dev["real"]))
        elif dev["real"] in seen:
            err("duplicate", dev["path"],
                "%s and %s are the same device %s" % (seen[dev["real"]], dev["path"], dev["real"]))
        seen.setdefault(dev["real"], dev["path"])
    usable = [d for d in devices if d["exists"] and d["block"]]
    for dev in usable:
        foreign = [h for h in dev["holders"] if h != md["name"]]
        for holder in foreign:
            if holder.startswith("md"):
                err("foreign_array", dev["path"], "%s is already in array /dev/%s" % (dev["path"], holder))
            else:
                err("busy", dev["path"], "%s is held by %s (LVM or device-mapper?)" % (dev["path"], holder))
        if dev["mounts"]:
            err("busy", dev["path"], "%s is mounted at %s" % (dev["path"], ", ".join(dev["mounts"])))
    signatures = {}
    plan = "create"
    wanted = sorted(d["real"] for d in usable)
    if md["active"]:
        plan = "none"
        if md["level"] != "raid0":
            err("mismatch", md["path"], "%s exists as %s, not raid0; it is never re-created "
                "(see the raid0_xfs_rebuild tag)" % (md["path"], md["level"]))
        elif md["members"] != wanted:
            err("mismatch", md["path"], "%s exists with members %s, not %s; it is never re-created "
                "(see the raid0_xfs_rebuild tag)" % (md["path"], ", ".join(md["members"]), ", ".join(wanted)))
    elif md["exists"]:
        plan = "none"
        err("mismatch", md["path"], "%s exists but is not running (members: %s); stop it with mdadm --stop and run "
            "the role again, or see the raid0_xfs_rebuild tag" % (md["path"], ", ".join(md["members"]) or "none"))
    else:
        uuids = {d["examine"].get("MD_UUID") for d in usable}
        levels = {d["examine"].get("MD_LEVEL") for d in usable}
        counts = {d["examine"].get("MD_DEVICES") for d in usable}
        if (usable and len(usable) == len(devices) and None not in uuids and len(uuids) == 1
                and levels == {"raid0"} and counts == {str(len(devices))}):
            plan = "assemble"
        else:
            for dev in usable:
                sig = dev["signature"]
                kind = sig.get("TYPE") or sig.get("PTTYPE")
                if kind or dev["partitions"]:
                    signatures[dev["path"]] = kind or "partitions"
    return plan, errors, signatures


def main():
    module = AnsibleModule(
        argument_spec={
            "devices": {"type": "list", "elements": "path", "required": True},
            "md_device": {"type": "path", "required": True},
            "sysfs_root": {"type": "path", "default": "/"},
            "mountinfo_path": {"type": "path", "default": "/proc/self/mountinfo"},
        },
        supports_check_mode=True,
    )
    sys_block = os.path.join(module.params["sysfs_root"], "sys", "class", "block")
    mounts = _mounts(module.params["mountinfo_path"])
    devices = [_device(module, p, sys_block, mounts) for p in module.params["devices"]]
    md = _array(module, module.params["md_device"], sys_block)
    plan, errors, signatures = plan_array(md, devices)
    module.exit_json(changed=False, plan=plan, errors=errors, signatures=signatures, devices=devices, md=md)


if __name__ == "__main__":
    main()
