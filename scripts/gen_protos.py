"""Generate the gRPC/protobuf stubs under atgrpo/_proto/ from protos/.

Generated files are committed (they are the wire contract every service imports). Run through
`make protos`; `--check` regenerates into a temporary folder and exits 1 when the committed
stubs differ, which a test and CI use to catch stale stubs.

protoc writes `from atgrpo.v1 import x_pb2`, a package that does not exist (the stubs live in
atgrpo._proto.v1), so the import lines are rewritten. Only import lines and .pyi files are
touched: the serialized descriptors inside *_pb2.py name the proto package "atgrpo.v1" and must
stay as they are.
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUT = ROOT / "atgrpo" / "_proto"
PROTO_PKG = "atgrpo/v1"

_IMPORT_FROM = re.compile(r"^(\s*)from atgrpo\.v1 import ", re.M)
_IMPORT_MOD = re.compile(r"^(\s*)import atgrpo\.v1\.(\w+)", re.M)


def _plugin(name: str) -> str:
    scripts = Path(sysconfig.get_path("scripts"))
    path = scripts / name
    if not path.exists():
        sys.exit(f"{name} not found in {scripts}: install the dev extra (pip install -e '.[dev]')")
    return str(path)


def _run_protoc(dest: Path) -> None:
    from grpc_tools import protoc

    include = Path(protoc.__file__).parent / "_proto"  # google/protobuf/*.proto
    protos = sorted(
        str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / PROTO_PKG).glob("*.proto")
    )
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={dest}",
        f"--grpc_python_out={dest}",
        f"--mypy_out={dest}",
        f"--mypy_grpc_out={dest}",
        *protos,
    ]
    if protoc.main(args) != 0:
        sys.exit("protoc failed; see the messages above")


def _fix_imports(path: Path) -> None:
    text = path.read_text()
    text = _IMPORT_FROM.sub(r"\1from atgrpo._proto.v1 import ", text)
    text = _IMPORT_MOD.sub(r"\1import atgrpo._proto.v1.\2", text)
    if path.suffix == ".pyi":
        text = re.sub(r"\batgrpo\.v1\.(\w+_pb2)", r"atgrpo._proto.v1.\1", text)
    path.write_text(text)


def generate(out: Path) -> None:
    """Write the stubs as atgrpo/_proto/v1/*.py(i) under `out`."""
    with tempfile.TemporaryDirectory() as tmp:
        _run_protoc(Path(tmp))
        target = out / "v1"
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for f in sorted((Path(tmp) / PROTO_PKG).iterdir()):
            shutil.copy(f, target / f.name)
            _fix_imports(target / f.name)
        (target / "__init__.py").write_text("")
        (out / "__init__.py").write_text(
            '"""Generated protobuf/gRPC stubs: run `make protos`, never edit."""\n'
        )


def stale_files(out: Path = OUT) -> list[str]:
    """Files that differ between `out` and a fresh generation (empty when fresh)."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        fresh, committed = Path(tmp), out
        names = {p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file()}
        names |= {
            p.relative_to(committed)
            for p in committed.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }
        return sorted(
            str(n)
            for n in names
            if not (fresh / n).exists()
            or not (committed / n).exists()
            or not filecmp.cmp(fresh / n, committed / n, shallow=False)
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--check", action="store_true", help="exit 1 when the committed stubs are stale"
    )
    args = ap.parse_args()
    if args.check:
        stale = stale_files()
        if stale:
            sys.exit(f"stale protobuf stubs: {', '.join(stale)}; run `make protos` and commit them")
        print("protobuf stubs are fresh")
        return
    generate(OUT)
    print(f"wrote stubs to {OUT.relative_to(ROOT)}/v1")


if __name__ == "__main__":
    main()
