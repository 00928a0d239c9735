r"""Deep equilibrium models: root solvers, implicit differentiation and the :class:`DEQ` module.

Example::

    >>> import torch
    >>> from revgnn.deq import DEQ
    >>> class Map(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.lin = torch.nn.Linear(4, 4)
    ...     def forward(self, z, x):
    ...         return torch.tanh(0.5 * self.lin(z) + x)
    >>> deq = DEQ(Map(), solver="anderson", tol=1e-6)
    >>> z = deq(torch.randn(10, 4))          # z = tanh(0.5 * lin(z) + x) at equilibrium
    >>> z.sum().backward()                   # implicit differentiation
"""

from .implicit import implicit_equilibrium, phantom_grad, unroll
from .module import BACKWARD_MODES, DEQ, DEQConvergenceWarning
from .norm import apply_norm, remove_norm, reset_norm
from .regularize import jacobian_frobenius, power_iteration, spectral_radius, spectral_radius_penalty
from .solvers import (
    SOLVERS,
    SolverDivergenceError,
    SolverResult,
    anderson,
    broyden,
    check_solver_options,
    fixed_point,
    get_solver,
    register_solver,
    solver_options,
)

__all__ = [
    "DEQ",
    "DEQConvergenceWarning",
    "BACKWARD_MODES",
    "SOLVERS",
    "SolverDivergenceError",
    "SolverResult",
    "anderson",
    "broyden",
    "fixed_point",
    "get_solver",
    "register_solver",
    "jacobian_frobenius",
    "power_iteration",
    "apply_norm",
    "reset_norm",
    "remove_norm",
    "spectral_radius",
    "spectral_radius_penalty",
    "solver_options",
    "check_solver_options",
    "implicit_equilibrium",
    "phantom_grad",
    "unroll",
]
