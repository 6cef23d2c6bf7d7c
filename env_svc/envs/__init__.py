"""The built-in environments (the paper's workflows and a learnable toy task), by name.

Paths rather than imports, so that serving one environment never imports the others.
"""

BUILTIN = {
    "toy": "env_svc.envs.toy:ToyEnv",
    "plan_path": "env_svc.envs.plan_path:PlanPathEnv",
    "sokoban": "env_svc.envs.sokoban:SokobanEnv",
    "sudoku": "env_svc.envs.sudoku:SudokuEnv",
    "code": "env_svc.envs.code:CodeEnv",
    "math": "env_svc.envs.math:MathEnv",
    "reasoning_gym": "env_svc.envs.reasoning_gym:ReasoningGymEnv",
}
