"""The built-in environments (the paper's workflows and a learnable toy task), by name.

Paths rather than imports, so that serving one environment never imports the others. They are
declared as entry points (pyproject.toml), as a third party's environments are.
"""

from atgrpo.sdk.registry import discovered

# pyproject.toml's "atgrpo.envs" entry points that are this package's (read from the tree when it
# runs uninstalled): one table for the service and the library.
BUILTIN = {name: path for name, path in discovered().items() if path.startswith("env_svc.envs.")}
