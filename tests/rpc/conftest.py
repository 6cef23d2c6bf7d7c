import os

import pytest

from tests.rpc.fuzz_harness import Services, start_services


@pytest.fixture(scope="module")
def fuzz_services(tiny_model, tmp_path_factory) -> Services:
    """The five services, started once for test_rpc_fuzz.py (and stopped after it: its bwrap
    sandbox must not outlive that module, the sandbox tests count every process of the sandbox
    uids), in a scratch working directory: the
    fuzzer sends relative paths (checkpoint dirs, run dirs) that the services then write to."""
    work = tmp_path_factory.mktemp("fuzz-cwd")
    saved_cwd, saved_offline = os.getcwd(), os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"  # a random model_path must never become a hub download
    os.chdir(work)
    services = None
    try:
        services = start_services(tiny_model)
        yield services
    finally:
        if services is not None:
            services.close()
        os.chdir(saved_cwd)
        if saved_offline is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = saved_offline
