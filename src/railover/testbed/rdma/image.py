"""Guest image of the RDMA test bed: a Debian kernel plus an initramfs, built from Debian
packages at first use and cached.

Inputs (nothing else is fetched):

* the kernel package ``linux-image-<abi>-amd64`` named by the meta package of the chosen
  series (``linux-image-amd64`` for 6.1, ``linux-image-6.12-amd64`` for 6.12);
* the user-space packages :data:`GUEST_PACKAGES` (busybox-static, bash, iproute2, nftables,
  rdma-core's ``ibverbs-providers``/``ibverbs-utils``, perftest) and the closure of their
  ``Depends``/``Pre-Depends`` restricted to library packages (``lib*``), which is what
  their binaries load.

Packages come from the host's apt sources with ``apt-get download`` (so the host must be
Debian 12 or have bookworm sources) and are unpacked with ``dpkg-deb -x``; kernel modules
are picked with the host's ``modprobe --show-depends`` and indexed with ``depmod -b``.

The image lands in ``$XDG_CACHE_HOME/railover/rdma-image/<series>-<hash>/`` (default
``~/.cache``): ``vmlinuz``, ``initrd.img``, ``manifest.json``. ``<hash>`` covers every package
name and version, the module list and the sources of this module and of the guest's ``/init``
(:mod:`railover.testbed.rdma.guest`), so a changed input builds a new image; the project's
own binaries are not part of the image (the bed hands them in over a 9p share at boot).

Thread-safety: :func:`ensure_image` takes an exclusive ``flock`` on the cache directory, so
concurrent callers (two test processes) build once.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from railover.testbed.netns import TestBedError

__all__ = ["ImageError", "GuestImage", "KERNELS", "GUEST_PACKAGES", "cache_root", "ensure_image",
           "resolve_packages", "image_key"]


class ImageError(TestBedError):
    """Building or finding the guest image failed; the message names the step and the cause."""


#: Kernel series -> apt meta package whose ``Depends`` names the exact kernel package.
KERNELS: Dict[str, str] = {"6.1": "linux-image-amd64", "6.12": "linux-image-6.12-amd64"}

#: Top-level user-space packages of the guest (their library dependencies are added).
GUEST_PACKAGES: Tuple[str, ...] = (
    "busybox-static", "bash", "iproute2", "nftables", "ibverbs-providers", "ibverbs-utils",
    "perftest", "libgcc-s1", "libstdc++6",  # libgcc_s is dlopen()ed by glibc (pthread_exit)
)

#: Kernel modules loaded in the guest, in this order (dependencies come with them).
#: crc32_generic: rxe allocates the "crc32" shash, a module on Debian kernels.
GUEST_MODULES: Tuple[str, ...] = (
    "virtio_pci", "virtio_net", "virtio_console", "9pnet_virtio", "9p", "crc32_generic",
    "rdma_rxe", "ib_uverbs", "rdma_ucm", "sch_tbf", "sch_netem", "nf_tables",
)

#: Unpacked paths the guest never uses (docs, charset converters, OpenSSL plug-ins): a smaller
#: initramfs unpacks faster under TCG.
_SKIP_DIRS = ("usr/share/doc", "usr/share/man", "usr/share/locale", "usr/share/info",
              "usr/share/lintian", "usr/share/bash-completion", "usr/share/zsh", "usr/share/i18n",
              "usr/share/common-licenses", "usr/share/bug", "usr/share/perl5", "usr/share/menu",
              "usr/lib/x86_64-linux-gnu/gconv", "usr/lib/x86_64-linux-gnu/engines-3",
              "usr/lib/x86_64-linux-gnu/ossl-modules", "usr/lib/x86_64-linux-gnu/audit",
              "usr/lib/x86_64-linux-gnu/perl", "usr/lib/x86_64-linux-gnu/krb5")


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/railover/rdma-image`` (``~/.cache`` when the variable is unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "railover" / "rdma-image"


@dataclass(frozen=True)
class GuestImage:
    """A built image: ``kernel`` (vmlinuz path), ``initrd`` (gzip cpio path), ``kernel_version``
    (``uname -r`` in the guest), ``series`` (``6.1``/``6.12``), ``key`` (input hash),
    ``packages`` (name -> version), ``built`` (True when this call built it) and
    ``build_s`` (seconds the build took, or the recorded time of the cached build)."""

    kernel: Path
    initrd: Path
    kernel_version: str
    series: str
    key: str
    packages: Dict[str, str]
    built: bool
    build_s: float


def _run(argv: Sequence[str], what: str, cwd: Optional[Path] = None, timeout: float = 900) -> str:
    try:
        r = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise ImageError(f"{what}: {argv[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise ImageError(f"{what}: '{' '.join(argv)}' took longer than {timeout:.0f}s") from None
    if r.returncode != 0:
        raise ImageError(f"{what}: '{' '.join(argv[:6])}{' ...' if len(argv) > 6 else ''}' failed "
                         f"(exit {r.returncode}): {(r.stderr or r.stdout).strip()[-800:]}")
    return r.stdout


def _depends(pkgs: Sequence[str]) -> Dict[str, List[str]]:
    """Direct Depends/Pre-Depends of each package (first alternative, real packages only)."""
    out = _run(["apt-cache", "depends", "--no-recommends", "--no-suggests", "--no-conflicts",
                "--no-breaks", "--no-replaces", "--no-enhances"] + list(pkgs),
               "resolving guest package dependencies (apt-cache depends)")
    deps: Dict[str, List[str]] = {}
    cur: Optional[str] = None
    skip_alt = False
    for line in out.splitlines():
        if not line.startswith(" "):
            cur = line.strip()
            deps.setdefault(cur, [])
            skip_alt = False
            continue
        m = re.match(r"\s+(\|)?(Pre)?Depends: (\S+)", line)
        if not m or cur is None:
            continue
        name = m.group(3)
        if skip_alt:  # a later alternative of a group whose first member we took
            skip_alt = bool(m.group(1))
            continue
        if not name.startswith("<"):
            deps[cur].append(name)
        skip_alt = bool(m.group(1))
    return deps


def _candidate_versions(pkgs: Sequence[str]) -> Dict[str, str]:
    out = _run(["apt-cache", "policy"] + list(pkgs), "reading candidate versions (apt-cache policy)")
    vers: Dict[str, str] = {}
    cur = None
    for line in out.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            cur = line[:-1]
        m = re.match(r"\s+Candidate: (\S+)", line)
        if m and cur:
            vers[cur] = m.group(1)
    missing = [p for p in pkgs if vers.get(p) in (None, "(none)")]
    if missing:
        raise ImageError(f"no installable version of {', '.join(missing)} in the apt sources "
                         "(run 'apt-get update'; the guest image needs Debian 12 packages)")
    return vers


def _apt_fingerprint() -> str:
    """Changes whenever apt's package lists (hence candidate versions) may have changed."""
    h = hashlib.sha256()
    for d in (Path("/var/lib/apt/lists"), Path("/etc/apt/sources.list.d"), Path("/etc/apt/preferences.d")):
        if d.is_dir():
            for f in sorted(d.iterdir()):
                try:
                    st = f.stat()
                except OSError:
                    continue
                h.update(f"{f}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    for f in (Path("/etc/apt/sources.list"),):
        if f.exists():
            h.update(f.read_bytes())
    h.update(json.dumps([GUEST_PACKAGES, KERNELS]).encode())
    return h.hexdigest()


def resolve_packages(series: str = "6.1") -> Dict[str, str]:
    """Every package of the image (kernel included) -> candidate version. Raises ImageError
    for an unknown series or packages missing from the apt sources. Runs only local apt
    queries (no download); the answer is remembered in the cache directory until apt's
    package lists change (apt-cache is slow on a loaded machine)."""
    if series not in KERNELS:
        raise ImageError(f"unknown kernel series {series!r}; choose one of {', '.join(KERNELS)}")
    memo = cache_root() / f"resolved-{series}.json"
    fp = _apt_fingerprint()
    try:
        m = json.loads(memo.read_text())
        if m.get("fingerprint") == fp:
            return dict(m["packages"])
    except (OSError, ValueError, KeyError):
        pass
    pkgs = _resolve(series)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_suffix(".tmp")
        tmp.write_text(json.dumps({"fingerprint": fp, "packages": pkgs}))
        os.replace(tmp, memo)
    except OSError:
        pass
    return pkgs


def _resolve(series: str) -> Dict[str, str]:
    meta = KERNELS[series]
    kdeps = [d for d in _depends([meta]).get(meta, []) if d.startswith("linux-image-")]
    if not kdeps:
        raise ImageError(f"{meta} names no linux-image package (apt sources without bookworm?)")
    want = set(GUEST_PACKAGES)
    todo = list(GUEST_PACKAGES)
    while todo:
        deps = _depends(todo)
        todo = []
        for ds in deps.values():
            for d in ds:
                if d.startswith(("lib", "zlib")) and not d.endswith(("-bin", "-dev", "-common")) and d not in want:
                    want.add(d)
                    todo.append(d)
    pkgs = sorted(want) + [kdeps[0]]
    return _candidate_versions(pkgs)


def _sources_digest() -> str:
    from railover.testbed.rdma import guest
    h = hashlib.sha256()
    for mod in (__file__, guest.__file__):
        h.update(Path(mod).read_bytes())
    return h.hexdigest()


def image_key(packages: Dict[str, str]) -> str:
    """16 hex digits over package versions, module list and the build/guest sources."""
    h = hashlib.sha256()
    h.update(json.dumps(sorted(packages.items())).encode())
    h.update(json.dumps(GUEST_MODULES).encode())
    h.update(_sources_digest().encode())
    return h.hexdigest()[:16]


def _download(pkgs: Dict[str, str], debdir: Path, log) -> Dict[str, Path]:
    debdir.mkdir(parents=True, exist_ok=True)
    have = {}
    need = []
    for name, ver in pkgs.items():
        fn = f"{name}_{ver.replace(':', '%3a')}_"
        hits = [p for p in debdir.glob(f"{name}_*.deb") if p.name.startswith(fn)]
        if hits:
            have[name] = hits[0]
        else:
            need.append(f"{name}={ver}")
    if need:
        log(f"apt-get download: {len(need)} package(s)")
        _run(["apt-get", "download", "-q"] + need, "downloading guest packages (apt-get download)",
             cwd=debdir, timeout=1800)
        for name, ver in pkgs.items():
            fn = f"{name}_{ver.replace(':', '%3a')}_"
            hits = [p for p in debdir.glob(f"{name}_*.deb") if p.name.startswith(fn)]
            if not hits:
                raise ImageError(f"apt-get download left no .deb for {name}={ver} in {debdir}")
            have[name] = hits[0]
    return have


def _decompress_module(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.suffix == ".xz":
        dst.write_bytes(lzma.decompress(src.read_bytes()))
    elif src.suffix == ".zst":
        _run(["zstd", "-qdf", str(src), "-o", str(dst)], f"decompressing {src.name}")
    else:
        shutil.copyfile(src, dst)


def _modules(kroot: Path, kv: str, root: Path) -> List[str]:
    """Copy the dependency closure of GUEST_MODULES (uncompressed: busybox modprobe cannot
    read compressed modules); returns the insmod order."""
    order: List[str] = []
    mdir = kroot / "lib" / "modules" / kv
    _run(["depmod", "-b", str(kroot), kv], "indexing the kernel package's modules (depmod)")
    for m in GUEST_MODULES:
        out = _run(["modprobe", "-d", str(kroot), "-S", kv, "--show-depends", m],
                   f"finding kernel module {m} in {kv}")
        for line in out.splitlines():
            parts = line.split()
            if parts[:1] == ["insmod"] and parts[1] not in order:
                order.append(parts[1])
    names = []
    for ko in order:
        src = Path(ko)
        rel = src.relative_to(mdir)
        rel_plain = Path(str(rel).removesuffix(".xz").removesuffix(".zst"))
        _decompress_module(src, root / "lib" / "modules" / kv / rel_plain)
        names.append(rel_plain.name.removesuffix(".ko"))
    for f in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
        if (mdir / f).exists():
            shutil.copyfile(mdir / f, root / "lib" / "modules" / kv / f)
    _run(["depmod", "-b", str(root), kv], "indexing guest kernel modules (depmod)")
    return names


def _check_libraries(root: Path) -> None:
    """Every NEEDED soname of every ELF under bin/sbin dirs must exist in the image."""
    libdirs = [root / d for d in ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64",
                                  "usr/lib/x86_64-linux-gnu/libibverbs")]
    have = {p.name for d in libdirs if d.is_dir() for p in d.iterdir()}
    missing: Dict[str, List[str]] = {}
    for d in ("bin", "sbin", "usr/bin", "usr/sbin", "usr/lib/x86_64-linux-gnu/libibverbs",
              "lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu"):
        dd = root / d
        if not dd.is_dir():
            continue
        for f in dd.iterdir():
            if f.is_symlink() or not f.is_file():
                continue
            with open(f, "rb") as fh:
                if fh.read(4) != b"\x7fELF":
                    continue
            out = subprocess.run(["readelf", "-d", str(f)], capture_output=True, text=True).stdout
            for so in re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out):
                if so not in have:
                    missing.setdefault(so, []).append(f.name)
    if missing:
        raise ImageError("guest image is missing shared libraries: " +
                         "; ".join(f"{k} (needed by {', '.join(v[:3])})" for k, v in missing.items()))


def _build(pkgs: Dict[str, str], debs: Dict[str, Path], out: Path, series: str, log) -> Tuple[str, List[str]]:
    from railover.testbed.rdma import guest
    kpkg = next(p for p in pkgs if p.startswith("linux-image-"))
    with tempfile.TemporaryDirectory(prefix="railover-rdma-image-") as tmp:
        t = Path(tmp)
        kroot, root = t / "kernel", t / "root"
        _run(["dpkg-deb", "-x", str(debs[kpkg]), str(kroot)], f"unpacking {kpkg}")
        kvs = sorted(p.name for p in (kroot / "lib" / "modules").iterdir())
        if len(kvs) != 1:
            raise ImageError(f"{kpkg} holds {len(kvs)} module trees, expected 1")
        kv = kvs[0]
        root.mkdir()
        for name, deb in sorted(debs.items()):
            if name != kpkg:
                _run(["dpkg-deb", "-x", str(deb), str(root)], f"unpacking {name}")
        for d in _SKIP_DIRS:
            shutil.rmtree(root / d, ignore_errors=True)
        # busybox applets for everything no package provides (real binaries win in PATH)
        bb = root / "bin" / "busybox"
        if not bb.exists():
            raise ImageError("busybox-static did not provide /bin/busybox")
        appl = subprocess.run([str(bb), "--list"], capture_output=True, text=True).stdout.split()
        (root / "opt" / "busybox").mkdir(parents=True)
        for a in appl:
            os.symlink("/bin/busybox", root / "opt" / "busybox" / a)
        for d in ("proc", "sys", "dev", "run", "tmp", "root", "etc", "var", "mnt/build", "mnt/io"):
            (root / d).mkdir(parents=True, exist_ok=True)
        (root / "sbin").mkdir(exist_ok=True)
        if not (root / "sbin" / "modprobe").exists():  # request_module() execs /sbin/modprobe
            os.symlink("/bin/busybox", root / "sbin" / "modprobe")
        (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
        (root / "etc" / "group").write_text("root:x:0:\n")
        (root / "etc" / "ld.so.conf").write_text("/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n")
        order = _modules(kroot, kv, root)
        # modprobe pulls in the dependencies; only the wanted modules are listed
        (root / "etc" / "railover-modules").write_text("\n".join(GUEST_MODULES) + "\n")
        _check_libraries(root)
        if shutil.which("ldconfig"):
            _run(["ldconfig", "-r", str(root)], "building the guest's ld.so cache")
        init = root / "init"
        init.write_text(guest.INIT_SCRIPT)
        init.chmod(0o755)
        out.mkdir(parents=True, exist_ok=True)
        initrd_tmp = out / "initrd.img.tmp"
        files = subprocess.run(["find", ".", "-print0"], cwd=root, capture_output=True, check=True).stdout
        with open(initrd_tmp, "wb") as f:
            cp = subprocess.Popen(["cpio", "--null", "-o", "-H", "newc", "--quiet"], cwd=root,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            gz = subprocess.Popen(["gzip", "-1"], stdin=cp.stdout, stdout=f)
            assert cp.stdin is not None and cp.stdout is not None
            cp.stdout.close()
            cp.stdin.write(files)
            cp.stdin.close()
            if cp.wait(600) != 0 or gz.wait(600) != 0:
                raise ImageError("packing the initramfs (cpio | gzip) failed")
        os.replace(initrd_tmp, out / "initrd.img")
        shutil.copyfile(kroot / "boot" / f"vmlinuz-{kv}", out / "vmlinuz")
    return kv, order


def ensure_image(series: str = "6.1", log=print, rebuild: bool = False) -> GuestImage:
    """Return the cached image for ``series`` (``"6.1"`` default, or ``"6.12"``), building it
    first when its inputs changed or it does not exist. ``log(str)`` receives progress lines.
    Raises :class:`ImageError` naming the failing step (apt, dpkg-deb, modprobe, cpio)."""
    pkgs = resolve_packages(series)
    key = image_key(pkgs)
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    out = root / f"{series}-{key}"
    with open(root / ".lock", "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        man = out / "manifest.json"
        if man.exists() and not rebuild:
            m = json.loads(man.read_text())
            return GuestImage(out / "vmlinuz", out / "initrd.img", m["kernel_version"], series, key,
                              m["packages"], False, float(m["build_s"]))
        t0 = time.monotonic()
        log(f"building guest image {series}-{key} ({len(pkgs)} packages) in {out}")
        debs = _download(pkgs, root / "debs", log)
        kv, mods = _build(pkgs, debs, out, series, log)
        build_s = time.monotonic() - t0
        (out / "manifest.json").write_text(json.dumps(
            {"series": series, "key": key, "kernel_version": kv, "packages": pkgs, "modules": mods,
             "build_s": round(build_s, 1)}, indent=1))
        # older images of the same series are stale: remove them (their inputs changed)
        for old in root.glob(f"{series}-*"):
            if old != out and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        log(f"guest image built in {build_s:.1f} s: kernel {kv}, initrd "
            f"{(out / 'initrd.img').stat().st_size / 2**20:.1f} MiB")
        return GuestImage(out / "vmlinuz", out / "initrd.img", kv, series, key, pkgs, True, build_s)
