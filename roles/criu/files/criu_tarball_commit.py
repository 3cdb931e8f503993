"""criu role: print the commit a source tarball was made from, or nothing.

``git archive`` (and GitHub's archive downloads, which it makes) writes the commit first, as the
``comment`` of a pax global header; a release tarball repacked by a distribution usually has none.
The role compiles the commit into an extra build (``make GITID=<commit>``), whose ``criu --version``
then prints ``GitID: <commit>``. Reads only the tarball's first header, from a stream.

Usage: criu_tarball_commit.py TARBALL  (.tar, .tar.gz, .tgz, .tar.xz, .tar.bz2, .tar.zst)
Exit status: 0 with or without a commit; 1 when the file is not a tarball.
"""

import re
import subprocess
import sys
import tarfile
from pathlib import Path


def commit_of(stream):
    with tarfile.open(fileobj=stream, mode="r|*") as tar:
        comment = tar.pax_headers.get("comment", "")
    return comment if re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", comment) else ""


def main(path):
    try:
        if path.endswith(".zst"):  # tarfile reads zstd only from Python 3.14 on
            with subprocess.Popen(["zstd", "-dc", path], stdout=subprocess.PIPE) as unzstd:
                commit = commit_of(unzstd.stdout)
                unzstd.kill()
        else:
            with Path(path).open("rb") as stream:
                commit = commit_of(stream)
    except (OSError, tarfile.TarError) as error:
        print("criu_tarball_commit: %s is not a readable tarball: %s" % (path, error), file=sys.stderr)
        return 1
    if commit:
        print(commit)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: criu_tarball_commit.py TARBALL")
    sys.exit(main(sys.argv[1]))
