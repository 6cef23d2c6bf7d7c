"""The `atgrpo` command and what only it uses: the local launcher (runner.py, launcher.py,
services.py), the run's sizing and placement (sizing.py, trainer_fit.py, placement.py,
fit_report.py), reports (report.py) and the kubectl-style contexts (context.py). Each command's
module registers its own subcommands (add_command). The library below it (config, contract, rpc,
sdk, algo) knows nothing of it."""

from atgrpo.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
