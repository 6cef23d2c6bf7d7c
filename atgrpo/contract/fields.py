"""How a contract type's field appears in the run config, where the config holds that type
itself (one form per setting): atgrpo.config_parse reads these marks."""

# The field's dataclass's keys are written in the enclosing section, not under the field's name:
# algorithm.kl_coef is AlgorithmConfig.update.loss.kl_coef.
FLAT = {"flat": True}
# Set by code only, never by a run config (e.g. one request's sampling seed).
NOT_CONFIG = {"config": False}
