"""The `atgrpo` command and what only it uses: the local launcher (runner.py, launcher.py), the
run's resource plan and placement (sizing.py, placement.py), reports (report.py) and the
kubectl-style contexts (context.py). The library below it (config, contract, rpc, sdk, algo)
knows nothing of it."""

from atgrpo.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
