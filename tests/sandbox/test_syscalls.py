"""The syscall policy compiled by libseccomp: every refused call is in the filter with its errno,
whatever this host's sysctls would do anyway; what test programs need stays allowed (their runs in
test_hostile.py and test_bwrap_backend.py show it)."""

import errno
import tempfile

from sandbox_svc import syscalls


def _pfc() -> str:
    with tempfile.TemporaryFile() as out:
        syscalls.build_filter().export_pfc(out)
        out.seek(0)
        return out.read().decode()


def test_every_refused_call_is_in_the_filter_with_its_errno():
    pfc = _pfc()
    for names, code in (
        (syscalls.DENIED, errno.EPERM),
        (syscalls.NO_SUCH_CALL + syscalls.CLONE_FALLBACK, errno.ENOSYS),
    ):
        for name in names:
            nr = syscalls._known(name)
            if nr is None:
                continue  # not a call of this architecture
            block = pfc.split(f'# filter for syscall "{name}" ({nr})', 1)
            assert len(block) == 2, f"{name} is not in the filter"
            assert f"action ERRNO({code});" in block[1].split("# filter for syscall", 1)[0], name


def test_foreign_abis_and_namespace_clones_are_refused():
    pfc = _pfc()
    assert "# default action\n  action ALLOW;" in pfc
    assert "# invalid architecture action\naction ERRNO(38);" in pfc  # i386, x32: ENOSYS
    clone = pfc.split('# filter for syscall "clone"', 1)[1].split("# filter for syscall", 1)[0]
    assert clone.count("action ERRNO(1);") == 7  # one per namespace flag


def test_the_launchers_get_the_compiled_program():
    spec = syscalls.launcher_seccomp()
    import base64

    assert (
        base64.b64decode(spec["bpf"]) == syscalls.filter_bpf()
        and len(syscalls.filter_bpf()) % 8 == 0
    )
    assert spec["keyctl"] == syscalls._known("keyctl")
