"""The built-in environments (the paper's workflows and a learnable toy task), by name.

Paths rather than imports, so that serving one environment never imports the others. They are
declared as entry points (pyproject.toml), as a third party's environments are.
"""

from importlib.metadata import entry_points

# pyproject.toml's "atgrpo.envs" entry points that are this package's: one table for the service
# and the library.
BUILTIN = {
    ep.name: ep.value
    for ep in entry_points(group="atgrpo.envs")
    if ep.value.startswith("env_svc.envs.")
}
