"""The environment's host-side copies and scrub (``harbor/environment.py``) on strings instead of ``Path`` objects
(bench/README.md, round 9): the same files, contents, modes, errors and counts as the ``pathlib`` code before, on
random trees with symlinks, fifos, nested directories, a skip list, a byte budget and destinations already holding
files, directories and symlinks where the copy goes."""

from __future__ import annotations

import os
import random
import shutil
import stat
from pathlib import Path

import pytest

from rsigym_env.worlds.local.harbor import environment


# --- the code before (round 8), kept as the reference -------------------------------------------------------------

def _no_symlinks_ref(base: Path, parts: tuple[str, ...]) -> Path:
    path = base
    for part in parts:
        path = path / part
        if path.is_symlink():
            raise PermissionError(f"{path} is a symlink made inside the sandbox; not followed")
    return path


def copy_file_ref(src: Path, dst: Path) -> None:
    if dst.is_symlink() or (dst.exists() and not dst.is_dir()):
        dst.unlink()
    shutil.copyfile(src, dst, follow_symlinks=False)
    mode = stat.S_IMODE(src.stat().st_mode) | 0o644
    if src.suffix == ".sh" or mode & 0o100:
        mode |= 0o755
    os.chmod(dst, mode)


def copy_tree_ref(src: Path, dst: Path, *, skip: frozenset[str] = frozenset(), max_bytes: int | None = None) -> int:
    n = 0
    left = max_bytes
    for root, dirs, files in os.walk(src, followlinks=False):
        rel = Path(root).relative_to(src)
        target = _no_symlinks_ref(dst, rel.parts)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            if rel == Path(".") and name in skip:
                continue
            source = Path(root) / name
            st = os.lstat(source)
            if not stat.S_ISREG(st.st_mode):
                continue
            if left is not None:
                if st.st_size > left:
                    continue
                left -= st.st_size
            destination = target / name
            if destination.is_dir() and not destination.is_symlink():
                shutil.rmtree(destination)
            copy_file_ref(source, destination)
            n += 1
        dirs[:] = [d for d in dirs if not (Path(root) / d).is_symlink()]
    return n


def scrub_ref(root: Path) -> int:
    removed = 0
    if not root.is_dir() or root.is_symlink():
        return 0
    for current, dirs, files in os.walk(root, followlinks=False):
        for name in files + dirs:
            path = Path(current) / name
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(mode) or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                path.unlink()
                removed += 1
        dirs[:] = [d for d in dirs if (Path(current) / d).is_dir() and not (Path(current) / d).is_symlink()]
    return removed


# --- random trees ------------------------------------------------------------------------------------------------

NAMES = ["a", "b.sh", ".sh", "run.sh", "x.py", "sub", "Dockerfile", "data.bin", "n.tar.sh", "e."]


def make_tree(root: Path, rng: random.Random, outside: Path, depth: int = 0) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for name in rng.sample(NAMES, rng.randint(1, 6)):
        path, kind = root / name, rng.random()
        if kind < 0.45:
            path.write_bytes(rng.randbytes(rng.choice([0, 1, 7, 300, 5000])))
            path.chmod(rng.choice([0o600, 0o644, 0o700, 0o755, 0o640, 0o444]))
        elif kind < 0.65 and depth < 3:
            make_tree(path, rng, outside, depth + 1)
        elif kind < 0.8:
            path.symlink_to(rng.choice([outside, outside / "secret", root / "a", "/etc/passwd", "nowhere"]))
        elif kind < 0.9:
            os.mkfifo(path)
        else:
            path.symlink_to(outside, target_is_directory=True)


def snapshot(root: Path) -> dict[str, tuple]:
    out = {}
    for current, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            path = Path(current) / name
            st = os.lstat(path)
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path).replace(str(root), "ROOT"))
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
            else:
                out[rel] = ("dir" if stat.S_ISDIR(st.st_mode) else "other", stat.S_IMODE(st.st_mode))
    return out


def outcome(fn, *args, **kwargs):
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as exc:  # noqa: BLE001 - compared by class and message
        return ("error", type(exc).__name__, str(exc).replace(str(args[1]), "DST"))


@pytest.mark.parametrize("seed", range(40))
def test_copy_tree_does_what_the_pathlib_copy_did(tmp_path, seed):
    rng = random.Random(seed)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host file")
    src = tmp_path / "src"
    make_tree(src, rng, outside)
    skip = frozenset(rng.sample(NAMES, 2))
    max_bytes = rng.choice([None, 0, 300, 5000, 20000])
    dsts = []
    for side in ("ref", "new"):
        dst = tmp_path / side
        prefill = random.Random(seed + 1000)  # the same destination contents on both sides
        if prefill.random() < 0.7:
            make_tree(dst, prefill, outside)
        dsts.append(dst)
    ref = outcome(copy_tree_ref, src, dsts[0], skip=skip, max_bytes=max_bytes)
    new = outcome(environment._copy_tree, src, dsts[1], skip=skip, max_bytes=max_bytes)
    assert new == ref
    assert snapshot(dsts[1]) == snapshot(dsts[0])
    assert (outside / "secret").read_text() == "host file" and sorted(p.name for p in outside.iterdir()) == ["secret"]


def test_copy_tree_refuses_a_symlinked_directory_on_the_way_like_before(tmp_path):
    src, outside = tmp_path / "src", tmp_path / "outside"
    (src / "logs" / "deep").mkdir(parents=True)
    (src / "logs" / "deep" / "f").write_text("x")
    outside.mkdir()
    for side, copy in (("ref", copy_tree_ref), ("new", environment._copy_tree)):
        dst = tmp_path / side
        dst.mkdir()
        (dst / "logs").symlink_to(outside, target_is_directory=True)
        with pytest.raises(PermissionError, match="is a symlink made inside the sandbox"):
            copy(src, dst)
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("seed", range(12))
def test_copy_file_does_what_the_pathlib_copy_did(tmp_path, seed):
    rng = random.Random(seed)
    name = rng.choice(NAMES[:5] + ["x.SH", "archive.tar.sh", "e."])
    src = tmp_path / "src" / name
    src.parent.mkdir()
    src.write_bytes(rng.randbytes(rng.randint(0, 3000)))
    src.chmod(rng.choice([0o600, 0o700, 0o640, 0o444, 0o755]))
    results = []
    for side, copy in (("ref", copy_file_ref), ("new", environment._copy_file)):
        dst = tmp_path / side / "out"
        dst.parent.mkdir()
        kind = seed % 4  # what was there before: nothing, a file, a symlink to a host file, a directory
        if kind == 1:
            dst.write_text("old")
        elif kind == 2:
            (tmp_path / f"host-{side}").write_text("host")
            dst.symlink_to(tmp_path / f"host-{side}")
        elif kind == 3:
            dst.mkdir()
        results.append((outcome(copy, src, dst)[0], snapshot(dst.parent)))
        if kind == 2:
            assert (tmp_path / f"host-{side}").read_text() == "host"
    assert results[1] == results[0]


@pytest.mark.parametrize("seed", range(20))
def test_scrub_removes_what_the_pathlib_scrub_removed(tmp_path, seed):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host file")
    counts = []
    for side, scrub in (("ref", scrub_ref), ("new", environment.scrub)):
        root = tmp_path / side
        make_tree(root, random.Random(seed), outside)
        counts.append((scrub(root), snapshot(root)))
    assert counts[1] == counts[0]
    assert all(kind in ("file", "dir") for kind, *_ in counts[1][1].values())
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "new", target_is_directory=True)
    assert environment.scrub(link) == scrub_ref(link) == 0
    assert environment.scrub(tmp_path / "missing") == scrub_ref(tmp_path / "missing") == 0
